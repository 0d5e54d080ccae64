"""A migration that changes its name keeps databases that applied it under the old one: the new
file `replaces` the old name, so such a database counts it as applied, runs none of its
operations again, and records the new name beside the old one."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder

pytestmark = pytest.mark.django_db

RENAMED = {("stopdesk", "0016_task_gate_function"): ("stopdesk", "0016_i15gate_task_gate")}


@pytest.mark.parametrize("new, old", RENAMED.items())
def test_a_database_that_applied_the_old_name_has_nothing_to_apply(new, old) -> None:
    recorder = MigrationRecorder(connection)
    recorder.record_unapplied(*new)
    recorder.record_applied(*old)

    executor = MigrationExecutor(connection)
    assert new in executor.loader.applied_migrations
    assert executor.migration_plan(executor.loader.graph.leaf_nodes()) == []

    executor.check_replacements()  # what `migrate` does first: record the new name too
    assert {new, old} <= set(recorder.applied_migrations())


@pytest.mark.parametrize("new, old", RENAMED.items())
def test_the_old_name_is_no_longer_a_file_and_dependants_name_the_new_one(new, old) -> None:
    loader = MigrationLoader(connection, ignore_no_migrations=True)
    assert old not in loader.disk_migrations
    assert loader.disk_migrations[new].replaces == [old]
    for key, migration in loader.disk_migrations.items():
        assert old not in migration.dependencies, f"{key} still depends on {old}"
