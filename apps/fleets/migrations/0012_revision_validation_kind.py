"""ConfigRevision.validation_kind: how a revision was judged, filled for existing rows from their output's
opening words (which the rollout compared before)."""

from django.db import migrations, models

PREFIXES = (
    ("Only certificate contents changed", "certificates_only"),
    ("Only map contents changed", "maps_only"),
    ("Route-only change on revision", "route_lane"),
    ("render refused:", "refused"),
)


def fill(apps, schema_editor):
    ConfigRevision = apps.get_model("fleets", "ConfigRevision")
    for prefix, kind in PREFIXES:
        ConfigRevision.objects.filter(validation_output__startswith=prefix).update(validation_kind=kind)


class Migration(migrations.Migration):
    dependencies = [("fleets", "0011_node_health_port")]

    operations = [
        migrations.AddField(
            model_name="configrevision",
            name="validation_kind",
            field=models.CharField(
                choices=[
                    ("haproxy", "haproxy -c -dW"),
                    ("certificates_only", "only certificate contents changed"),
                    ("maps_only", "only map contents changed"),
                    ("route_lane", "route lane: only moved map entries"),
                    ("refused", "refused by the renderer"),
                ],
                default="haproxy",
                max_length=24,
            ),
        ),
        migrations.RunPython(fill, migrations.RunPython.noop),
    ]
