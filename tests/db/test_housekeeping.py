"""Retention: finished messages leave the hot table in batches; the archive keeps them for RETENTION."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_outbox.models import Attempt, Message
from django_outbox.retention import housekeeping
from django_outbox.retention.models import ArchivedAttempt, ArchivedMessage
from tests.support import logs
from tests.support.factories import MessageFactory, finished
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_archive")]


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


@contextmanager
def held_in_another_session(statement: str, params: Sequence[int] = ()) -> Iterator[None]:
    """The statement run in a transaction of another session, which stays open (its locks held) meanwhile."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic(), connections["default"].cursor() as cursor:
                cursor.execute(statement, params)
                held.set()
                release.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    try:
        yield
    finally:
        release.set()
        thread.join(10)


def test_new_partitions_do_not_wait_for_a_long_read_of_the_archive(postgres):
    """A report or the admin reading the archive holds a share lock on its table for as long as it reads.
    ``CREATE TABLE ... PARTITION OF`` needs the table to itself: it waited behind such a read (and every
    read of the archive queued behind it) until its lock wait ran out. Attached, a new day's partition
    coexists with readers and writers of the archive."""
    now = timezone.now()
    with held_in_another_session(f"SELECT count(*) FROM {housekeeping.ARCHIVED_MESSAGE}"):
        created = housekeeping.ensure_partitions(connection, now + dt.timedelta(days=30))
    day = (now + dt.timedelta(days=30)).astimezone(dt.UTC).date()
    assert housekeeping.partition_name(housekeeping.ARCHIVED_MESSAGE, day) in created
    assert day in housekeeping.partitions(connection, housekeeping.ARCHIVED_ATTEMPT).values()
    with connection.cursor() as cursor:  # each of the archive's indexes (the primary key among them) attached
        cursor.execute(
            "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE c.relkind = 'i' AND c.relname LIKE %s",
            [housekeeping.partition_name(housekeeping.ARCHIVED_MESSAGE, day) + "%"],
        )
        assert cursor.fetchone()[0] == 5, "primary key, uuid, idempotency key, key and topic"
    finished("delivered", dt.timedelta(hours=2))
    assert housekeeping.run("default").archived == 1, "the attached partitions take rows as created ones did"


def test_only_one_process_at_a_time_does_housekeeping_on_postgresql(postgres):
    finished("delivered", dt.timedelta(hours=2))
    # Held as another housekeeper holds it, for one transaction: that also holds behind a pooler.
    with held_in_another_session("SELECT pg_advisory_xact_lock(%s)", [housekeeping.ADVISORY_LOCK_ID]):
        assert housekeeping.run("default").skipped
        assert Message.objects.count() == 1
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


@pytest.mark.parametrize("use_tz", [True, False])
def test_switching_to_delete_mode_still_empties_the_archive_after_retention(use_tz):
    """An archive kept from an earlier archive mode is still forgotten after RETENTION in delete mode."""
    with override_settings(USE_TZ=use_tz):
        now = timezone.now()
        finished("delivered", dt.timedelta(days=11))
        housekeeping.run("default", now=now - dt.timedelta(days=10))  # archived ten days ago, archive mode
        assert ArchivedMessage.objects.count() == 1
        with override_settings(OUTBOX={"RETENTION_MODE": "delete", "RETENTION": dt.timedelta(days=7)}):
            housekeeping.run("default", now=now)
        assert not ArchivedMessage.objects.exists()
        assert not ArchivedAttempt.objects.exists()


@override_settings(USE_TZ=False)
def test_housekeeping_works_without_time_zones():
    old = finished("delivered", dt.timedelta(hours=2))
    report = housekeeping.run("default")
    assert report.archived == 1
    assert ArchivedMessage.objects.filter(pk=old.pk).exists()
    housekeeping.run("default", now=timezone.now() + dt.timedelta(days=10))
    assert not ArchivedMessage.objects.exists(), "and the archive forgets it after RETENTION"


@override_settings(OUTBOX={"RETENTION": dt.timedelta(hours=6)})
def test_short_retention_does_not_create_and_drop_partitions_every_round(postgres):
    housekeeping.run("default")
    with CaptureQueriesContext(connection) as queries:
        for _ in range(3):
            report = housekeeping.run("default")
            assert not report.partitions_created and not report.partitions_dropped
    ddl = [q["sql"] for q in queries.captured_queries if "CREATE TABLE" in q["sql"] or "DROP TABLE" in q["sql"]]
    assert ddl == []


def test_stopped_and_gone_worker_rows_are_pruned():
    from django_outbox.models import Worker

    now = timezone.now()
    common = {"hostname": "h", "pid": 1, "started_at": now - dt.timedelta(days=40)}
    Worker.objects.create(worker_id="old", last_seen=now - dt.timedelta(days=31), **common)
    Worker.objects.create(worker_id="recent", last_seen=now - dt.timedelta(days=2), **common)
    Worker.objects.create(worker_id="alive", last_seen=now, **common)
    report = housekeeping.run("default")
    assert report.workers_pruned == 1
    assert set(Worker.objects.values_list("worker_id", flat=True)) == {"recent", "alive"}


@contextmanager
def housekeeping_relay() -> Iterator[None]:
    """A relay in a thread of this process, its housekeeping every 0.2 s, stopped and joined at the end."""
    from django_outbox.worker import Relay, RelayConfig

    relay = Relay(
        RelayConfig.from_settings(poll_interval=0.05, notify=False, housekeeping_interval=0.2, lease_seconds=1)
    )
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        relay.stop()
        thread.join(15)
    assert not thread.is_alive()


def test_a_failing_housekeeping_round_is_reported_and_the_next_one_runs(monkeypatch, admin_client):
    """The housekeeper thread survives any error: logged, counted, shown in outbox_status and the overview."""
    import io
    import json

    from django.core.management import CommandError

    from django_outbox.models import Worker

    real_run = housekeeping.run
    broken = threading.Event()
    broken.set()
    rounds: list[str] = []

    def flaky_run(alias, **kwargs):
        rounds.append("broken" if broken.is_set() else "ok")
        if broken.is_set():
            raise TypeError("can't compare offset-naive and offset-aware datetimes")
        return real_run(alias, **kwargs)

    monkeypatch.setattr(housekeeping, "run", flaky_run)
    with logs.captured() as records, housekeeping_relay():
        wait_for(lambda: Worker.objects.filter(housekeeping_failures__gte=2).exists(), timeout=30)
        row = Worker.objects.get()
        assert "TypeError: can't compare" in row.housekeeping_error
        assert any(r.exc_info and "housekeeping round failed" in r.getMessage() for r in records), "with traceback"
        out = io.StringIO()
        with pytest.raises(CommandError, match="housekeeping failing on") as failed:
            call_command("outbox_status", "--json", "--fail-if-housekeeping-failing", stdout=out)
        assert failed.value.returncode == 1
        assert json.loads(out.getvalue())["housekeeping_failing"] == [row.worker_id]
        page = admin_client.get(reverse("admin:django_outbox_message_overview")).content.decode()
        assert "failing" in page and "can&#x27;t compare offset-naive" in page
        message = finished("delivered", dt.timedelta(hours=2))
        broken.clear()  # the next round succeeds and does its work
        wait_for(lambda: ArchivedMessage.objects.filter(pk=message.pk).exists(), timeout=30)
        wait_for(lambda: Worker.objects.get().housekeeping_error == "", timeout=30)
        call_command("outbox_status", "--fail-if-housekeeping-failing", stdout=io.StringIO())  # healthy again
    assert "ok" in rounds


def test_a_round_the_database_refused_is_a_warning_without_a_traceback_and_the_next_round_runs(monkeypatch):
    """A database error (a lock that ran out, a server restarting) is the usual way a round fails: it is
    counted and said in one line, not as a crash with its traceback; the round after it does its work."""
    from django.db import OperationalError

    from django_outbox.models import Worker

    real_run = housekeeping.run
    refused = threading.Event()
    refused.set()

    def refusing_run(alias, **kwargs):
        if refused.is_set():
            raise OperationalError("canceling statement due to lock timeout")
        return real_run(alias, **kwargs)

    monkeypatch.setattr(housekeeping, "run", refusing_run)
    with logs.captured() as records, housekeeping_relay():
        wait_for(lambda: Worker.objects.filter(housekeeping_failures__gte=1).exists(), timeout=30)
        assert "lock timeout" in Worker.objects.get().housekeeping_error
        # the heartbeat may carry the count before the round's thread has logged it
        wait_for(lambda: any("housekeeping could not run" in r.getMessage() for r in records), timeout=30)
        said = [r for r in records if "housekeeping could not run" in r.getMessage()]
        assert "lock timeout" in said[0].getMessage()
        assert all(r.exc_info is None for r in said), "a database error is one line, without a traceback"
        assert not any("housekeeping round failed" in r.getMessage() for r in records)
        message = finished("delivered", dt.timedelta(hours=2))
        refused.clear()
        wait_for(lambda: ArchivedMessage.objects.filter(pk=message.pk).exists(), timeout=30)


def test_a_late_record_for_a_message_archived_meanwhile_keeps_every_attempt():
    """Frozen worker, reap, cancel, archive, resume: the late record writes each attempt somewhere."""
    from django_outbox import store

    old = timezone.now() - dt.timedelta(hours=3)
    archived, other = MessageFactory.create(created_at=old), MessageFactory.create(created_at=old)
    claimed = store.claim("default", worker="frozen", limit=10, lease_seconds=1)
    assert {m.id for m in claimed} == {archived.id, other.id}
    Message.objects.filter(pk__in=[archived.pk, other.pk]).update(locked_until=timezone.now() - dt.timedelta(seconds=5))
    assert len(store.reap("default")) == 2  # the worker's lease ran out while it was frozen
    store.cancel("default", [archived.pk], reason="operator")
    later = timezone.now() + dt.timedelta(hours=2)  # ARCHIVE_AFTER (an hour) after the cancel
    assert housekeeping.run("default", now=later).archived == 1
    now = timezone.now()
    outcomes = [
        store.Outcome(message_id=m.id, number=1, status="delivered", started_at=now, finished_at=now)
        for m in (archived, other)
    ]
    lost = store.record("default", worker="frozen", outcomes=outcomes)  # the worker resumes
    assert lost == {archived.id, other.id}, "both leases were lost; neither message changes"
    assert list(Attempt.objects.filter(message=other).values_list("outcome", flat=True)) == ["abandoned", "delivered"]
    kept = ArchivedAttempt.objects.filter(message_id=archived.pk).order_by("id")
    assert [a.outcome for a in kept] == ["abandoned", "delivered"], "the late attempt is next to the archived message"
    late = kept.last()
    assert late is not None and late.worker == "frozen" and "left the message table" in late.error
    assert late.archived_at == ArchivedMessage.objects.get(pk=archived.pk).archived_at
    assert Message.objects.get(pk=other.pk).status == "pending"


@pytest.mark.parametrize("mode", ["delete", "archive"])
def test_a_message_cancelled_long_after_it_was_created_keeps_its_reason_for_retention_from_the_cancel(mode):
    """Retention counts from when a message became final, not from when it was sent."""
    from django_outbox import store

    with override_settings(OUTBOX={"RETENTION_MODE": mode, "RETENTION": dt.timedelta(days=7)}):
        dead = finished("dead", dt.timedelta(days=10), last_error="boom")
        store.cancel("default", [dead.pk], reason="gave up")
        housekeeping.run("default")
        assert Message.objects.filter(pk=dead.pk, status="cancelled").exists(), "cancelled just now: kept"
        assert Attempt.objects.filter(message_id=dead.pk).exists()
        housekeeping.run("default", now=timezone.now() + dt.timedelta(hours=2))
        if mode == "archive":  # ARCHIVE_AFTER (an hour) after the cancel, it moves with its attempts
            assert ArchivedMessage.objects.filter(pk=dead.pk).exists()
        else:
            assert Message.objects.filter(pk=dead.pk).exists()
        housekeeping.run("default", now=timezone.now() + dt.timedelta(days=8, hours=2))
        assert not Message.objects.filter(pk=dead.pk).exists()
        assert not ArchivedMessage.objects.filter(pk=dead.pk).exists()
