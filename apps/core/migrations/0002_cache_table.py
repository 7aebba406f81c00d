from django.core.management import call_command
from django.db import migrations


def create_cache_table(apps, schema_editor):
    # The database cache (login throttling, idempotency, hot health) needs its table
    # when REDIS_URL is not set; creating it here keeps `migrate` the only setup step.
    call_command("createcachetable", verbosity=0)


class Migration(migrations.Migration):
    dependencies = [("core", "0001_initial")]
    operations = [migrations.RunPython(create_cache_table, migrations.RunPython.noop)]
