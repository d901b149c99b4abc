"""Real ``manage.py outbox_worker`` processes: crashes, signals, outages and many workers at once."""

from __future__ import annotations

import collections
import contextlib
import signal
import time

import pytest
from django.db import DatabaseError, connection

from django_outbox import outbox
from django_outbox.models import Attempt, Message
from tests.probe.models import Delivery
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def send_many(n: int, topic: str = "probe.bulk", **payload) -> None:
    Message.objects.bulk_create(
        [Message(topic=topic, payload={"n": i, **payload}, max_attempts=5) for i in range(n)], batch_size=1000
    )


def test_until_empty_exits_zero_and_reports_progress(worker_process):
    for n in range(20):
        outbox.send("probe.created", {"n": n})
    code, output = worker_process("--until-empty", "--batch-size", "7").wait(timeout=120)
    assert code == 0, output
    assert "delivered 20" in output
    assert Delivery.objects.count() == 20
    assert set(Message.objects.values_list("status", flat=True)) == {"delivered"}


def _open_transactions() -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """The other sessions of the test database, and those of them inside a transaction (MariaDB: one
    open for a second or more, so a heartbeat's statement caught mid-way does not count)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT pid, state, query FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
            sessions = cursor.fetchall()
            return sessions, [s for s in sessions if s[1] and s[1].startswith("idle in transaction")]
        cursor.execute(
            "SELECT id, command, info FROM information_schema.processlist WHERE db = DATABASE()"
            " AND id <> CONNECTION_ID()"
        )
        sessions = cursor.fetchall()
        cursor.execute(
            "SELECT t.trx_mysql_thread_id, t.trx_state, t.trx_query FROM information_schema.innodb_trx AS t"
            " JOIN information_schema.processlist AS p ON p.id = t.trx_mysql_thread_id"
            " WHERE p.db = DATABASE() AND p.id <> CONNECTION_ID() AND t.trx_started < NOW() - INTERVAL 1 SECOND"
        )
        return list(sessions), list(cursor.fetchall())


def test_no_transaction_is_open_while_a_handler_runs(server_database, worker_process):
    message = outbox.send("probe.slow", {"sleep": 4})
    worker = worker_process("--lease", "30")
    wait_for(lambda: Message.objects.filter(pk=message.pk, status="processing").exists(), timeout=30)
    time.sleep(1.5)  # the handler is now sleeping
    sessions, in_transaction = _open_transactions()
    assert sessions, "the worker's sessions should be visible"
    assert in_transaction == []
    wait_for(lambda: Message.objects.get(pk=message.pk).status == "delivered", timeout=30)
    worker.stop()


def test_killed_worker_loses_nothing(worker_process):
    message = outbox.send("probe.slow", {"sleep": 30})
    victim = worker_process("--lease", "2")
    wait_for(lambda: Message.objects.filter(pk=message.pk, status="processing").exists(), timeout=30)
    victim.kill()
    # the payload would make the next attempt sleep as well: let it succeed quickly instead
    Message.objects.filter(pk=message.pk).update(payload={"sleep": 0})
    rescuer = worker_process("--lease", "2", "--poll-interval", "0.2")
    wait_for(lambda: Message.objects.get(pk=message.pk).status == "delivered", timeout=60)
    rescuer.stop()
    attempts = list(Attempt.objects.filter(message=message).order_by("number").values_list("number", "outcome"))
    assert attempts == [(1, "abandoned"), (2, "delivered")]
    assert Delivery.objects.filter(message_id=message.pk).count() == 1


def test_sigterm_finishes_in_flight_and_releases_the_rest(worker_process):
    messages = [outbox.send("probe.slow", {"sleep": 2, "n": n}) for n in range(5)]
    worker = worker_process("--batch-size", "5", "--lease", "30", "--concurrency", "2")
    wait_for(lambda: Message.objects.filter(status="processing").count() == 5, timeout=30)
    time.sleep(0.5)  # each thread's first delivery is under way
    worker.send_signal(signal.SIGTERM)
    code, output = worker.wait(timeout=60)
    assert code == 0, output
    statuses = dict(Message.objects.values_list("pk", "status"))
    # Each delivery thread finishes the one message it had started (the lowest id of its batch; the two
    # threads may have split the five or one may have claimed them all), and starts no other.
    finished = [m.pk for m in messages if statuses[m.pk] == "delivered"]
    assert messages[0].pk in finished and len(finished) <= 2
    released = Message.objects.exclude(pk__in=finished).filter(pk__in=[m.pk for m in messages])
    assert released.count() == 5 - len(finished)
    assert {m.status for m in released} == {"pending"}
    assert {m.attempts for m in released} == {0}  # releasing does not count an attempt
    assert {m.locked_by for m in released} == {None}
    assert not Attempt.objects.filter(message__in=released).exists()


def test_worker_survives_losing_its_database_connections(server_database, worker_process):
    worker = worker_process("--poll-interval", "0.2")
    outbox.send("probe.created", {"n": 0})
    wait_for(lambda: Delivery.objects.count() == 1, timeout=30)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
            assert cursor.fetchone()[0] >= 1
        else:
            cursor.execute(
                "SELECT id FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()"
            )
            others = [row[0] for row in cursor.fetchall()]
            assert others, "the worker's connections should be visible"
            for session in others:
                with contextlib.suppress(DatabaseError):  # gone already (a thread closed it)
                    cursor.execute(f"KILL CONNECTION {int(session)}")
    for n in range(1, 11):
        outbox.send("probe.created", {"n": n})
    wait_for(lambda: Delivery.objects.count() == 11, timeout=60)
    assert worker.proc.poll() is None, "the worker must keep running"


def _run_workers(worker_process, count: int, *args: str):
    return [worker_process("--until-empty", "--batch-size", "50", *args) for _ in range(count)]


def test_many_workers_deliver_each_message_exactly_once(worker_process):
    """4 workers x 5,000 messages on PostgreSQL and MariaDB; 2 x 1,000 on SQLite (one writer at a time)."""
    workers_count, total = (4, 5000) if connection.vendor in ("postgresql", "mysql") else (2, 1000)
    send_many(total)
    workers = _run_workers(worker_process, workers_count)
    for worker in workers:
        code, output = worker.wait(timeout=300)
        assert code == 0, output
    assert Message.objects.filter(status="delivered").count() == total
    per_message = collections.Counter(Delivery.objects.values_list("message_id", flat=True))
    assert len(per_message) == total
    assert max(per_message.values()) == 1
    assert len(set(Delivery.objects.values_list("pid", flat=True))) == workers_count, "each worker takes a share"
    assert Attempt.objects.count() == total


def test_sigkill_mid_run_loses_nothing_and_duplicates_only_abandoned_attempts(server_database, worker_process):
    send_many(3000, sleep=0.002)
    workers = _run_workers(worker_process, 3, "--lease", "3")
    wait_for(lambda: Delivery.objects.count() > 300, timeout=60)
    held: set[int] = set()
    for _ in range(3):
        # Kill a worker while it holds a batch. It may still record that batch between the look and the
        # signal (each of its delivery threads is between batches only for a moment): then what it held
        # is empty, and the next worker is tried, with a fresh one started in its place.
        victim = workers.pop(0)
        holding = Message.objects.filter(status="processing", locked_by__contains=f":{victim.pid}:")
        wait_for(holding.exists, timeout=60, interval=0.001)
        victim.kill()
        victim.proc.wait(timeout=10)
        # A COMMIT the worker sent just before the signal still reaches the server after its death (a pooler
        # forwards what the client wrote): what it held is what stays processing under its name once that
        # has landed. Half a second, well inside its lease (3 s, renewed every second): nothing reaps it yet.
        time.sleep(0.5)
        held = set(holding.values_list("id", flat=True))
        workers.append(worker_process("--until-empty", "--batch-size", "50", "--lease", "3"))
        if held:
            break
    assert held, "no worker could be killed while it held a batch"
    for worker in workers:
        code, output = worker.wait(timeout=300)
        assert code == 0, output
    assert Message.objects.filter(status="delivered").count() == 3000
    per_message = collections.Counter(Delivery.objects.values_list("message_id", flat=True))
    assert len(per_message) == 3000  # none lost
    duplicated = {mid for mid, n in per_message.items() if n > 1}
    abandoned = set(Attempt.objects.filter(outcome="abandoned").values_list("message_id", flat=True))
    assert held <= abandoned, "every message the killed worker held has its attempt recorded as abandoned"
    assert duplicated <= abandoned
