from django.conf import settings
from django.db import migrations, models


def backfill(apps, schema_editor):
    """Label the events written before labels existed, from the users and tokens that still exist."""
    AuditEvent = apps.get_model("audit", "AuditEvent")
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    ApiToken = apps.get_model("accounts", "ApiToken")
    users = dict(User.objects.values_list("pk", "username"))
    tokens = dict(ApiToken.objects.values_list("pk", "name"))
    for event in AuditEvent.objects.filter(actor_label="").select_related("org").iterator():
        kind, _, ident = event.actor.partition(":")
        name = None
        if kind == "user" and ident.isdigit():
            name = users.get(int(ident))
        elif kind == "token" and ident.isdigit() and int(ident) in tokens:
            name = f"token {tokens[int(ident)]}"
        elif kind == "job" and ident.isdigit():
            name = f"job {ident}"
        if name:
            label = f"{name} ({event.org.slug})" if event.org is not None else name
            # The model's save() refuses updates (append-only); a migration backfill is the one exception.
            AuditEvent.objects.filter(pk=event.pk).update(actor_label=label[:200])


class Migration(migrations.Migration):

    dependencies = [
        ("audit", "0001_initial"),
        ("accounts", "0003_token_parent"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="auditevent",
            name="actor_label",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
