"""Retention: finished messages leave the hot table in batches; the archive keeps them for RETENTION."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_outbox import housekeeping
from django_outbox.archive_models import ArchivedAttempt, ArchivedMessage
from django_outbox.models import Attempt, Message

from .conftest import wait_for
from .factories import AttemptFactory, MessageFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def empty_archive(django_db_blocker):
    """The archive tables are not Django-managed, so the test flush leaves them alone: empty them here."""
    yield
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        for table in (housekeeping.ARCHIVED_ATTEMPT, housekeeping.ARCHIVED_MESSAGE):
            cursor.execute(f"DELETE FROM {table}")
            if connection.vendor == "postgresql":
                for name in housekeeping.partitions(connection, table):
                    cursor.execute(f"DROP TABLE {name}")


def finished(status: str, age: dt.timedelta, **kwargs) -> Message:
    when = timezone.now() - age
    message = MessageFactory.create(
        status=status,
        created_at=when,
        available_at=when,
        delivered_at=when if status == "delivered" else None,
        attempts=1,
        key=kwargs.pop("key", None),
        **kwargs,
    )
    AttemptFactory(message=message, started_at=when, finished_at=when, outcome="delivered")
    return message


def test_finished_messages_move_to_the_archive_with_their_attempts():
    old = dt.timedelta(hours=2)
    delivered = finished("delivered", old, key="order-1", idempotency_key="idem-1", payload={"total": "9.90"})
    cancelled = finished("cancelled", old, last_error="cancelled: duplicate")
    young = finished("delivered", dt.timedelta(minutes=5))
    dead = finished("dead", dt.timedelta(days=30))
    pending = finished("pending", dt.timedelta(days=30))
    report = housekeeping.run("default")
    assert report.archived == 2
    assert set(Message.objects.values_list("id", flat=True)) == {young.id, dead.id, pending.id}
    assert set(Attempt.objects.values_list("message_id", flat=True)) == {young.id, dead.id, pending.id}
    archived = ArchivedMessage.objects.get(pk=delivered.pk)
    assert (archived.uuid, archived.key, archived.idempotency_key, archived.payload) == (
        delivered.uuid,
        "order-1",
        "idem-1",
        {"total": "9.90"},
    )
    assert archived.delivered_at == delivered.delivered_at and archived.status == "delivered"
    assert ArchivedMessage.objects.get(pk=cancelled.pk).last_error == "cancelled: duplicate"
    assert [a.message_id for a in ArchivedAttempt.objects.all()] == [delivered.pk, cancelled.pk]
    assert list(archived.attempt_log.values_list("number", "outcome")) == [(1, "delivered")]


def test_housekeeping_works_in_small_batches():
    for _ in range(7):
        finished("delivered", dt.timedelta(hours=3))
    with CaptureQueriesContext(connection) as queries:
        report = housekeeping.run("default", batch_size=3)
    assert report.archived == 7 and not Message.objects.exists()
    deletes = [q for q in queries.captured_queries if f"DELETE FROM {housekeeping.MESSAGE}" in q["sql"]]
    assert len(deletes) == 3, "7 messages in batches of 3: three transactions"


@override_settings(OUTBOX={"RETENTION_MODE": "delete", "RETENTION": dt.timedelta(days=2)})
def test_delete_mode_keeps_finished_messages_in_place_until_retention():
    gone = finished("delivered", dt.timedelta(days=3))
    kept = finished("delivered", dt.timedelta(days=1))
    dead = finished("dead", dt.timedelta(days=30))
    report = housekeeping.run("default")
    assert (report.deleted, report.archived) == (1, 0)
    assert set(Message.objects.values_list("id", flat=True)) == {kept.id, dead.id}
    assert not Attempt.objects.filter(message_id=gone.id).exists()
    assert not ArchivedMessage.objects.exists()


def test_the_archive_forgets_what_is_older_than_retention():
    now = timezone.now()
    finished("delivered", dt.timedelta(days=11))
    housekeeping.run("default", now=now - dt.timedelta(days=10))  # archived ten days ago
    recent = finished("delivered", dt.timedelta(hours=2))
    with CaptureQueriesContext(connection) as queries:
        housekeeping.run("default", now=now)
    assert list(ArchivedMessage.objects.values_list("id", flat=True)) == [recent.id]
    assert list(ArchivedAttempt.objects.values_list("message_id", flat=True)) == [recent.id]
    if connection.vendor == "postgresql":
        sql = " ".join(q["sql"] for q in queries.captured_queries)
        assert f"DELETE FROM {housekeeping.ARCHIVED_MESSAGE}" not in sql, "whole partitions are dropped instead"
        assert "DROP TABLE" in sql


def test_postgresql_archive_is_partitioned_by_day(postgres):
    now = timezone.now()
    housekeeping.run("default", now=now - dt.timedelta(days=9))
    report = housekeeping.run("default", now=now)
    today = now.astimezone(dt.UTC).date()
    days = sorted(housekeeping.partitions(connection, housekeeping.ARCHIVED_MESSAGE).values())
    # The first round made today-10 .. today-6; days that ended more than RETENTION (7 days) ago are gone.
    kept = [-7, -6, *range(-1, housekeeping.DAYS_AHEAD + 1)]
    assert days == [today + dt.timedelta(days=n) for n in kept]
    assert sorted(housekeeping.partitions(connection, housekeeping.ARCHIVED_ATTEMPT).values()) == days
    assert len(report.partitions_dropped) == 2 * 3, "today-10, -9 and -8, in both tables"
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE relname = %s", [housekeeping.ARCHIVED_MESSAGE])
        assert cursor.fetchone()[0] == "p"


def test_only_one_process_at_a_time_does_housekeeping_on_postgresql(postgres):
    finished("delivered", dt.timedelta(hours=2))
    held, release = threading.Event(), threading.Event()

    def hold_lock() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT pg_advisory_lock(%s)", [housekeeping.ADVISORY_LOCK_ID])
                held.set()
                release.wait(10)
                cursor.execute("SELECT pg_advisory_unlock(%s)", [housekeeping.ADVISORY_LOCK_ID])
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold_lock)
    thread.start()
    assert held.wait(10)
    try:
        assert housekeeping.run("default").skipped
        assert Message.objects.count() == 1
    finally:
        release.set()
        thread.join(10)
    assert housekeeping.run("default").archived == 1


def test_housekeeping_command(capsys):
    finished("delivered", dt.timedelta(hours=2))
    finished("cancelled", dt.timedelta(hours=2))
    call_command("outbox_housekeeping", "--batch-size", "1")
    assert "archived 2" in capsys.readouterr().out
    assert ArchivedMessage.objects.count() == 2


def test_a_running_worker_does_housekeeping(worker_process):
    message = finished("delivered", dt.timedelta(hours=2))
    worker = worker_process("--poll-interval", "0.5")
    wait_for(lambda: ArchivedMessage.objects.filter(pk=message.pk).exists(), timeout=30)
    assert not Message.objects.filter(pk=message.pk).exists()
    worker.stop()
