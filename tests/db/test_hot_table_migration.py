"""Migration 0008 (the hot table's indexes) keeps every row, forward and backward, on a database with data."""

from __future__ import annotations

import importlib
import json
import uuid

import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from django_outbox import store
from django_outbox.models import Attempt, Message

pytestmark = pytest.mark.django_db(transaction=True)

APP = "django_outbox"
migration = importlib.import_module("django_outbox.migrations.0008_hot_table_indexes")
TARGET = (APP, "0008_hot_table_indexes")
BEFORE = next(dep for dep in migration.Migration.dependencies if dep[0] == APP)
STATUSES = ("pending", "processing", "delivered", "dead", "cancelled")


def migrate(target: tuple[str, str] | None) -> None:
    """Migrate the app to ``target``; None: to its latest migration, as the rest of the suite expects."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target] if target is not None else executor.loader.graph.leaf_nodes(APP))


def index_names(table: str) -> set[str]:
    with connection.cursor() as cursor:
        return set(connection.introspection.get_constraints(cursor, table))


def snapshot() -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, uuid, topic, {connection.ops.quote_name('key')}, idempotency_key, status, attempts,"
            " last_error, created_at"
            " FROM django_outbox_message ORDER BY id"
        )
        messages = [tuple(str(v) for v in row) for row in cursor.fetchall()]
        cursor.execute(
            "SELECT id, message_id, number, outcome, error, finished_at FROM django_outbox_attempt ORDER BY id"
        )
        attempts = [tuple(str(v) for v in row) for row in cursor.fetchall()]
    return messages, attempts


def fill_at_the_old_schema() -> None:
    """Rows as the schema before 0008 holds them, written with SQL (the models are the new schema's)."""
    now = timezone.now()
    with connection.cursor() as cursor:
        for i in range(50):
            status = STATUSES[i % len(STATUSES)]
            cursor.execute(
                f"INSERT INTO django_outbox_message (uuid, topic, {connection.ops.quote_name('key')}, payload,"
                " headers, idempotency_key, status,"
                " attempts, max_attempts, available_at, created_at, last_error)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [
                    str(uuid.uuid4()) if connection.vendor == "postgresql" else uuid.uuid4().hex,
                    f"topic.{i % 3}",
                    f"key-{i % 7}" if i % 2 else None,
                    json.dumps({"n": i}),
                    "{}",
                    f"idem-{i}" if i % 4 == 0 else None,
                    status,
                    1 if status in ("delivered", "dead") else 0,
                    5,
                    now,
                    now,
                    "refused" if status == "dead" else "",
                ],
            )
        cursor.execute(
            "INSERT INTO django_outbox_attempt (message_id, number, started_at, finished_at, worker, outcome, error)"
            " SELECT id, 1, created_at, created_at, 'w', CASE WHEN status = 'dead' THEN 'failed' ELSE 'delivered' END,"
            " '' FROM django_outbox_message WHERE status IN ('delivered', 'dead')"
        )


def test_a_database_with_rows_migrates_forward_and_back_without_loss():
    migrate(BEFORE)
    try:
        assert "outbox_msg_status_id_idx" in index_names("django_outbox_message")
        fill_at_the_old_schema()
        before = snapshot()
        assert len(before[0]) == 50 and len(before[1]) == 20

        migrate(TARGET)
        assert snapshot() == before
        names = index_names("django_outbox_message")
        assert {"outbox_msg_status_id_idx", "outbox_msg_status_topic_idx"}.isdisjoint(names)
        if connection.vendor != "mysql":  # Django makes no partial index there; 0009 gives it its own
            assert {"outbox_msg_settled_idx", "outbox_msg_created_idx", "outbox_msg_lease_idx"} <= names
        # The contracts read through the new shape: every message with its status, one attempt per attempt.
        assert sorted(Message.objects.values_list("status", flat=True)) == sorted(STATUSES * 10)
        dead = Message.objects.filter(status="dead").first()
        assert dead is not None and [a.outcome for a in dead.attempt_log.all()] == ["failed"]
        assert Message.objects.filter(status="delivered").count() == 10

        migrate(BEFORE)
        assert snapshot() == before
        assert "outbox_msg_status_id_idx" in index_names("django_outbox_message")
    finally:
        migrate(None)


def test_attempts_have_no_database_foreign_key_but_keep_the_relation():
    """The record checks that the message is there in its own statement; the database no longer does."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "django_outbox_attempt")
    assert not [name for name, c in constraints.items() if c["foreign_key"]], constraints
    message = Message.objects.create(topic="t", payload={}, max_attempts=5)
    now = timezone.now()
    Attempt.objects.create(message=message, number=1, started_at=now, finished_at=now, outcome="delivered")
    assert [a.number for a in message.attempt_log.all()] == [1]
    assert Attempt.objects.get().message == message


@pytest.mark.usefixtures("postgres")
def test_extending_a_lease_is_a_hot_update():
    """No index holds ``locked_until`` and the table keeps room on its pages, so the heartbeat rewrites
    no index entry."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'django_outbox_message'")
        (options,) = cursor.fetchone()
        assert f"fillfactor={migration.FILLFACTOR}" in options
    for i in range(20):
        Message.objects.create(topic="t", payload={"n": i}, max_attempts=5)
    claimed = store.claim("default", worker="w", limit=20, lease_seconds=60)
    assert len(claimed) == 20
    with connection.cursor() as cursor:
        cursor.execute("VACUUM django_outbox_message")  # the claim's old row versions, so each page has room
    counters = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'django_outbox_message'"
    with transaction.atomic(), connection.cursor() as cursor:  # the counters' difference in one transaction
        cursor.execute(counters)
        upd, hot = cursor.fetchone()
        assert store.extend_leases("default", worker="w", lease_seconds=120) == 20
        cursor.execute(counters)
        assert cursor.fetchone() == (upd + 20, hot + 20)
