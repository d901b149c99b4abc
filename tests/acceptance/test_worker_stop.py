"""A real ``outbox_worker`` stopped by SIGTERM: an idle one exits without sitting out its waits, and says
what it did on the way out.

With every wait of the idle worker a minute long (its poll, its LISTEN), SIGTERM must cut them short, so the
worker exits in a fraction of that minute on any machine, however loaded; a worker that slept out a wait
would take the minute. No tighter bound: a test asserts the behaviour, not a speed."""

from __future__ import annotations

import re
import signal
import time

import pytest
from django.core.management import call_command
from django.db import connection

from django_outbox import outbox
from django_outbox.models import Message, Worker
from tests.support.processes import WorkerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: Every wait of the idle worker in the stop test: its poll interval (and so its LISTEN's timeout).
IDLE_WAIT = 60.0


def listening(worker: WorkerProcess) -> bool:
    """Idle: on PostgreSQL its listener has run ``LISTEN``; elsewhere its first heartbeat is written."""
    if connection.vendor != "postgresql":
        return Worker.objects.filter(pid=worker.pid).exists()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
        )
        return bool(cursor.fetchone()[0]) and Worker.objects.filter(pid=worker.pid).exists()


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_an_idle_worker_stops_at_once_on_sigterm(database):
    if connection.vendor != database:
        pytest.skip(f"runs on {database}")
    worker = WorkerProcess("--poll-interval", str(IDLE_WAIT))
    try:
        wait_for(lambda: listening(worker), timeout=60)
        time.sleep(1.0)  # idle: past its first poll and heartbeat, inside its minute-long waits
        started = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code, out = worker.wait(timeout=IDLE_WAIT * 2)
        elapsed = time.monotonic() - started
    finally:
        worker.stop()
    assert code == 0, out
    assert elapsed < IDLE_WAIT / 2, (elapsed, out)  # no wait sat out
    row = Worker.objects.get(pid=worker.pid)
    assert row.stopped_at is not None and row.in_flight == 0  # the last heartbeat was written


def test_the_closing_line_and_outbox_status_show_the_same_counts(worker_process, capsys):
    for n in range(4):
        outbox.send("probe.ok", {"n": n})
    for n in range(3):
        outbox.send("probe.retried", {"n": n, "fail_until": 1})  # one failed attempt each, then delivered
    outbox.send("probe.dead", {"permanent": True})  # one failed attempt that makes it dead
    worker = worker_process("--poll-interval", "0.2")
    wait_for(lambda: Message.objects.filter(status__in=["delivered", "dead"]).count() == 8, timeout=60)
    worker.send_signal(signal.SIGTERM)
    code, out = worker.wait(timeout=60)
    assert code == 0, out
    assert Message.objects.filter(status="delivered").count() == 7
    closing = out.strip().splitlines()[-1]
    printed = re.fullmatch(r"delivered (\d+)  failed (\d+) \(dead (\d+)\)  in flight 0  [\d.]+ msg/s", closing)
    assert printed, out
    assert tuple(map(int, printed.groups())) == (7, 4, 1)
    row = Worker.objects.get()
    assert (row.delivered, row.failed) == (7, 4)
    capsys.readouterr()
    call_command("outbox_status")
    status = capsys.readouterr().out
    assert f"delivered {row.delivered}  failed {row.failed}" in status, status
