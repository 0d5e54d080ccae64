"""The database cache table: the sign-in rate limit counts there, shared by every web process."""

from django.core.management import call_command
from django.db import migrations


def create_cache_table(apps, schema_editor):  # type: ignore[no-untyped-def]
    # Creates the table of every database cache in CACHES (none when Redis is configured); it is
    # idempotent, so running `manage.py createcachetable` later is harmless.
    call_command("createcachetable", database=schema_editor.connection.alias, verbosity=0)


class Migration(migrations.Migration):
    dependencies = [("stopdesk", "0005_external_record_per_item")]

    operations = [migrations.RunPython(create_cache_table, migrations.RunPython.noop)]
