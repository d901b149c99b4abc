"""A database migrated from empty holds exactly the schema the models declare, on each database the suite
runs on, and the models need no migration that is not written.

The declared schema is what Django's schema editor makes for the models, in an empty namespace of the same
server, plus the initial migration's vendor shapes (tests/support/schema.py); what those shapes are is
pinned here too, for what no model declares.
"""

from __future__ import annotations

import importlib
import io

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.support import schema

initial = importlib.import_module("django_outbox.migrations.0001_initial")

APP = "django_outbox"


#: What the initial migration's vendor shapes may change in what the models declare, per database: a
#: table (the archive and the key lock rows, which no model manages), or a table's section or entry.
VENDOR_SHAPED: dict[str, set[tuple[str, ...]]] = {
    "postgresql": {
        ("django_outbox_archived_message",),
        ("django_outbox_archived_attempt",),
        ("django_outbox_message", "storage_parameters"),
    },
    "sqlite": {("django_outbox_archived_message",), ("django_outbox_archived_attempt",)},
    "mysql": {
        ("django_outbox_archived_message",),
        ("django_outbox_archived_attempt",),
        ("django_outbox_key_lock",),
        *(("django_outbox_message", "columns", column) for column in ("topic", "key", "idempotency_key", "claim_key")),
        ("django_outbox_message", "types", "claim_key"),
        ("django_outbox_inboxmessage", "columns", "source"),
        ("django_outbox_inboxmessage", "columns", "message_id"),
        ("django_outbox_idempotencyrecord", "columns", "scope"),
        ("django_outbox_idempotencyrecord", "columns", "key"),
        *(
            ("django_outbox_message", "constraints", index)
            for index in (
                "outbox_msg_idem_key_uniq",
                "outbox_msg_status_id_idx",
                "outbox_msg_pending_idx",
                "outbox_msg_key_open_idx",
                "outbox_msg_unkeyed_idx",
                "outbox_msg_claim_key_idx",
            )
        ),
    },
}


@pytest.mark.django_db
def test_the_migrated_database_has_the_schema_the_models_declare():
    difference = schema.diff(schema.declared(connection).shaped, schema.snapshot(connection))
    assert not difference, f"migrations and models disagree on {connection.vendor}:\n{difference}"


@pytest.mark.django_db
def test_the_vendor_shapes_change_only_what_no_model_can_declare():
    """A shape that drops, adds or changes anything else would pass the comparison above unseen, since the
    declared schema gets the same shapes."""
    unexpected = {
        where
        for where in schema.changed(schema.declared(connection).models, schema.snapshot(connection))
        if not any(where[: len(allowed)] == allowed for allowed in VENDOR_SHAPED[connection.vendor])
    }
    assert not unexpected, f"the vendor shapes on {connection.vendor} also change {sorted(unexpected)}"


@pytest.mark.django_db
def test_the_models_need_no_new_migration():
    out = io.StringIO()
    try:
        call_command("makemigrations", check=True, dry_run=True, stdout=out, stderr=out)
    except SystemExit:
        pytest.fail(f"makemigrations --check --dry-run finds changes:\n{out.getvalue()}")


@pytest.mark.django_db
@pytest.mark.usefixtures("postgres")
def test_postgresql_gives_the_message_table_its_storage_parameters():
    """Room on each page for a row's next version (HOT updates), and autovacuum after a fixed number of
    changes: no model can declare either."""
    tables = schema.snapshot(connection)
    expected = sorted(f"{name}={value}" for name, value in initial.PG_MESSAGE_STORAGE.items())
    assert tables["django_outbox_message"]["storage_parameters"] == expected
    assert not tables["django_outbox_attempt"]["storage_parameters"]


@pytest.mark.django_db
@pytest.mark.usefixtures("postgres")
def test_postgresql_partitions_the_archive_by_day():
    tables = schema.snapshot(connection)
    for table in ("django_outbox_archived_message", "django_outbox_archived_attempt"):
        assert tables[table]["kind"] == "p", table
        assert tables[table]["partition_key"] == "RANGE (archived_at)", table
        assert tables[table]["constraints"][f"{table}_pkey"]["columns"] == ["id", "archived_at"]


@pytest.mark.django_db
@pytest.mark.usefixtures("postgres")
def test_postgresql_time_columns_that_follow_insertion_are_block_range_indexed():
    definitions = {
        name: definition
        for table in schema.snapshot(connection).values()
        for name, definition in table["index_definitions"].items()
    }
    assert "USING brin (created_at)" in definitions["outbox_msg_created_idx"]
    assert "USING brin (finished_at)" in definitions["outbox_attempt_finished_idx"]


@pytest.mark.django_db
@pytest.mark.usefixtures("mysql")
def test_mariadb_compares_keys_topics_and_request_keys_byte_for_byte():
    collation = initial.bytewise_collation(connection)
    tables = schema.snapshot(connection)
    for table, column, *_ in initial.MYSQL_BYTEWISE:
        assert tables[table]["columns"][column.strip("`")]["collation"] == collation, (table, column)
    assert tables["django_outbox_key_lock"]["columns"]["key"]["collation"] == collation


@pytest.mark.django_db(transaction=True)
def test_the_initial_migration_goes_back_to_nothing_and_forward_to_the_same_schema():
    before = schema.snapshot(connection)
    executor = MigrationExecutor(connection)
    executor.migrate([(APP, None)])
    try:
        assert schema.snapshot(connection) == {}
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes(APP))
    difference = schema.diff(before, schema.snapshot(connection), labels=("before", "after"))
    assert not difference, difference
