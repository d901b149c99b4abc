"""Workers whose clocks are wrong: real worker processes under libfaketime, five minutes ahead or behind.

On PostgreSQL and MariaDB every lease, reap and due-time decision is taken on the database server's clock, so a
worker's own clock may be off by minutes: a host ahead must not reap live leases (duplicates), a host
behind must not hold dead ones for minutes, nor claim or schedule by its own idea of the time.

The shifted processes fake the wall clock only (``FAKETIME_DONT_FAKE_MONOTONIC=1``), as a host whose
clock is off does; ``tests/support/faketime_shim`` works around libfaketime's ``time.sleep`` bug in them.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_outbox import outbox
from django_outbox.models import Attempt, Message, Worker
from tests.probe.models import Delivery
from tests.support import IN_CI, ROOT
from tests.support.processes import WorkerProcess, worker_env
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
SHIM = ROOT / "tests" / "support" / "faketime_shim"
SHIFTS = {"+5m": 300.0, "-5m": -300.0}
LEASE = 3.0


@pytest.fixture(autouse=True)
def _libfaketime(server_database) -> None:
    """These tests are about a database server's clock (SQLite, one host, keeps the local clock) and need
    libfaketime."""
    if not LIBFAKETIME.exists():
        missing = f"libfaketime is not installed ({LIBFAKETIME}); apt-get install libfaketime (.ci/run does it)"
        if IN_CI:
            pytest.fail(f"{missing}; under CI=true this is a failure")
        pytest.skip(missing)


def shifted_env(shift: str) -> dict[str, str]:
    """The environment of a process whose wall clock runs ``shift`` (``+5m``, ``-5m``) off the true time."""
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": shift,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SHIM), os.environ.get("PYTHONPATH", "")])),
    }


#: The server's clock as seconds since the epoch, in a shifted process's own query.
EPOCH_SQL = {
    "postgresql": "SELECT extract(epoch FROM statement_timestamp())::float8",
    "mysql": "SELECT UNIX_TIMESTAMP(NOW(6))",  # NOW() is in the session's zone, which UNIX_TIMESTAMP undoes
}


def server_now() -> dt.datetime:
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("SELECT UTC_TIMESTAMP(6)")
            naive: dt.datetime = cursor.fetchone()[0]
            return naive.replace(tzinfo=dt.UTC)
        cursor.execute("SELECT statement_timestamp()")
        value: dt.datetime = cursor.fetchone()[0]
    return value


def run_python(code: str, *, shift: str) -> dict[str, float | str]:
    """Run Django code in a shifted process; it prints one JSON object."""
    prelude = "import django, json; django.setup()\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + code],
        cwd=ROOT,
        env={**worker_env(), **shifted_env(shift)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, float | str] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture
def workers(worker_process) -> Callable[..., WorkerProcess]:
    """Start a worker (shifted when ``shift`` is given) and wait until its first heartbeat is written."""

    def start(*args: str, shift: str | None = None) -> WorkerProcess:
        worker: WorkerProcess = worker_process(*args, env=shifted_env(shift) if shift else None)
        wait_for(lambda: Worker.objects.filter(pid=worker.pid).exists() or worker.proc.poll() is not None, 60)
        assert worker.proc.poll() is None, worker.wait()[1]
        return worker

    return start


def attempts_of(message: Message) -> list[tuple[int, str]]:
    return list(Attempt.objects.filter(message=message).order_by("number").values_list("number", "outcome"))


@pytest.mark.parametrize("shift", SHIFTS)
def test_a_shifted_process_sees_a_shifted_clock_and_still_reaches_the_server(shift):
    """The harness itself: Python's and Django's clocks are off by the shift, the database is reachable."""
    before = time.time()
    seen = run_python(
        "import time\nfrom django.db import connection\nfrom django.utils import timezone\n"
        f"with connection.cursor() as c:\n    c.execute({EPOCH_SQL[connection.vendor]!r})\n"
        "    server = float(c.fetchone()[0])\n"
        "print(json.dumps({'time': time.time(), 'django': timezone.now().timestamp(), 'server': server}))",
        shift=shift,
    )
    after = time.time()
    for clock in ("time", "django"):
        offset = float(seen[clock]) - float(seen["server"])
        assert abs(offset - SHIFTS[shift]) < 5, (clock, offset)
    assert before - 5 < float(seen["server"]) < after + 5


def test_workers_ahead_and_behind_share_a_backlog_without_early_reaps(workers):
    """A normal worker and two shifted ones drain the same slow backlog with a short lease: each message is
    delivered once, by one attempt, no lease of a live worker is reaped, and every worker takes a share."""
    started = [
        workers("--lease", str(LEASE), "--batch-size", "1", "--concurrency", "1", shift=shift)
        for shift in (None, *SHIFTS)
    ]
    with transaction.atomic():
        sent = [outbox.send("probe.slow", {"sleep": 1.5, "n": n}) for n in range(12)]
    wait_for(lambda: Message.objects.filter(status="delivered").count() == len(sent), timeout=120)
    abandoned = list(Attempt.objects.filter(outcome="abandoned").values_list("message_id", "error"))
    assert abandoned == [], "leases of live workers were reaped"
    per_message = collections.Counter(Delivery.objects.values_list("message_id", flat=True))
    assert per_message == {m.pk: 1 for m in sent}, "duplicate deliveries"
    assert Attempt.objects.count() == len(sent)
    shares = collections.Counter(Delivery.objects.values_list("pid", flat=True))
    assert {w.pid for w in started} <= set(shares), f"a worker claimed nothing due: {shares}"
    assert all(w.proc.poll() is None for w in started)


@pytest.mark.parametrize("shift", SHIFTS)
def test_a_killed_shifted_worker_is_reaped_after_its_lease_on_the_servers_clock(workers, shift):
    """Its lease runs LEASE seconds on the server's clock: not reaped while it lives, reaped soon after
    SIGKILL by a normal worker (not five minutes late), then delivered once."""
    victim = workers("--lease", str(LEASE), shift=shift)
    # due on every clock, so that even a worker behind claims it on its own clock
    message = outbox.send("probe.slow", {"sleep": 120}, available_at=timezone.now() - dt.timedelta(minutes=10))
    held = Message.objects.filter(pk=message.pk, status="processing", locked_by__contains=f":{victim.pid}:")
    wait_for(held.exists, timeout=30)
    workers("--lease", str(LEASE), "--poll-interval", "0.2")
    time.sleep(LEASE + 1)  # longer than a lease: only renewals keep it
    assert attempts_of(message) == [], "the lease of a live worker was reaped"
    lease_left = (Message.objects.get(pk=message.pk).locked_until - server_now()).total_seconds()
    Message.objects.filter(pk=message.pk).update(payload={"sleep": 0})  # the next attempt is quick
    victim.kill()
    killed_at = server_now()
    wait_for(lambda: Message.objects.filter(pk=message.pk, status="delivered").exists(), timeout=LEASE + 20)
    reaped = Attempt.objects.get(message=message, number=1)
    assert reaped.outcome == "abandoned"
    late = (reaped.finished_at - killed_at).total_seconds()
    assert 0 <= late <= LEASE + 4, f"reaped {late:.1f}s after the kill, with a {LEASE}s lease"
    assert attempts_of(message) == [(1, "abandoned"), (2, "delivered")]
    assert Delivery.objects.filter(message_id=message.pk).count() == 1
    assert 0 < lease_left <= LEASE + 0.5, f"the lease ended {lease_left:.1f}s after a look on the server's clock"


@pytest.mark.parametrize("shift", SHIFTS)
def test_a_retry_scheduled_by_a_shifted_worker_is_due_on_the_servers_clock(workers, shift):
    """The backoff delay (well under a second in the tests' settings) is added to the server's now."""
    workers(shift=shift)
    before = server_now()
    # due on every clock, so that even a worker behind claims it on its own clock
    message = outbox.send("probe.created", {"fail_until": 1}, available_at=timezone.now() - dt.timedelta(minutes=10))
    wait_for(lambda: Message.objects.filter(pk=message.pk, status="delivered").exists(), timeout=30)
    after = server_now()
    message.refresh_from_db()
    assert attempts_of(message) == [(1, "failed"), (2, "delivered")]
    assert before <= message.available_at <= after, (
        f"the retry was scheduled {(message.available_at - after).total_seconds():+.1f}s off the server's clock"
    )
    assert before <= message.delivered_at <= after


@pytest.mark.parametrize("shift", SHIFTS)
def test_a_shifted_worker_sleeps_until_a_scheduled_message_is_due_on_the_servers_clock(workers, shift):
    """Idle with a 30 s poll, it wakes when the message is due on the server: not early, not minutes late.

    On PostgreSQL the send's NOTIFY wakes the idle worker, which then sleeps until the due time; MariaDB
    has no NOTIFY (a message sent to an idle worker waits for its next poll), so there the message is
    sent first, with time to spare for the worker's start, and the worker's first sleep is the one tested.
    """
    if connection.vendor == "mysql":
        message = outbox.send("probe.scheduled", {"n": 1}, delay=10)
        workers("--poll-interval", "30", shift=shift)
    else:
        workers("--poll-interval", "30", shift=shift)
        message = outbox.send("probe.scheduled", {"n": 1}, delay=2)
    message.refresh_from_db()
    wait_for(lambda: Delivery.objects.filter(message_id=message.pk).exists(), timeout=25, interval=0.02)
    seen = server_now()
    early = (message.available_at - seen).total_seconds()
    assert early <= 0, f"delivered {early:.2f}s before it was due on the server's clock"
    assert -early < 5, f"delivered {-early:.2f}s after it was due"


@pytest.mark.parametrize("shift", SHIFTS)
def test_send_on_a_shifted_host_schedules_on_the_servers_clock(shift):
    """A web process whose clock is off: ``delay=`` and "now" are the server's, so nothing waits minutes."""
    before = server_now()
    sent = run_python(
        "from django_outbox import outbox\n"
        "now, later = outbox.send('probe.created', {'n': 1}), outbox.send('probe.created', {'n': 2}, delay=60)\n"
        "print(json.dumps({'now': now.pk, 'later': later.pk,"
        " 'now_at': now.available_at.isoformat(), 'later_at': later.available_at.isoformat()}))",
        shift=shift,
    )
    after = server_now()
    now, later = Message.objects.get(pk=sent["now"]), Message.objects.get(pk=sent["later"])
    assert before <= now.available_at <= after, (now.available_at - after).total_seconds()
    assert before <= now.created_at <= after
    minute = dt.timedelta(seconds=60)
    assert before + minute <= later.available_at <= after + minute, (later.available_at - after).total_seconds()
    # the returned Message says what was stored
    assert (sent["now_at"], sent["later_at"]) == (now.available_at.isoformat(), later.available_at.isoformat())


def test_a_delay_that_the_senders_clock_keeps_within_year_9999_is_capped_on_a_server_ahead():
    """The sender (two days behind) validates ``delay`` against its own clock, which send() keeps a day
    inside the year 9999; the server, ahead of it by more than that spare day, would pass the last time
    Python can read: the row is capped there, and the returned Message matches."""
    sent = run_python(
        "import datetime as dt\nfrom django.utils import timezone\nfrom django_outbox import outbox\n"
        "from django_outbox.api import LATEST_AVAILABLE_AT as last\n"
        "m = outbox.send('probe.created', {}, delay=(last - timezone.now()).total_seconds() - 60)\n"
        "print(json.dumps({'pk': m.pk, 'at': m.available_at.isoformat()}))",
        shift="-2d",
    )
    stored = Message.objects.get(pk=sent["pk"])
    assert stored.available_at == dt.datetime.max.replace(tzinfo=dt.UTC)
    assert sent["at"] == stored.available_at.isoformat()


@pytest.mark.parametrize("shift", SHIFTS)
def test_a_shifted_workers_liveness_is_judged_on_the_servers_clock(workers, shift):
    """``outbox_status`` and the admin overview: alive while it beats, gone ``stale_after`` after it died,
    whatever its clock (behind, it looked dead from the start; ahead, alive minutes after its death)."""
    from django_outbox.admin import overview

    def state() -> str:
        (mine,) = [w for w in overview.collect(stale_after=4).workers if w.pid == worker.pid]
        return mine.state

    worker = workers("--lease", str(LEASE), shift=shift)
    time.sleep(1)
    assert state() == "alive"
    started = (Worker.objects.get(pid=worker.pid).started_at - server_now()).total_seconds()
    worker.kill()
    wait_for(lambda: state() == "gone", timeout=15)
    assert abs(started) < 60, f"started_at is {started:+.0f}s off the server's clock"
