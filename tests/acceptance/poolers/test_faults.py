"""A pooler's own faults mid-drain: PgBouncer killed and restarted on its port, and paused from its console.

The server behind it never goes away; only the path does. Real worker processes reach the test database
through a private PgBouncer 1.18 (tests/support/pgbouncer.py), in transaction pooling with the listener on a
direct alias (``OUTBOX["LISTEN_DATABASE"]``, as docs/deploying.md recommends) and in session pooling with
the listener through the pooler too. tests/chaos/run.py ``--pooler`` runs the same faults among the others.
"""

from __future__ import annotations

import collections
import contextlib
import signal
import threading
import time

import psycopg
import pytest

from django_outbox import outbox
from django_outbox.models import Attempt, Message, Worker
from tests.probe.models import Delivery
from tests.support import pgbouncer
from tests.support.processes import WorkerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("postgres"), pytest.mark.slow]


#: These scenarios have always run with four server connections in transaction pooling (the others three).
TRANSACTION_POOL_SIZE = 4


def through(pooler: pgbouncer.PgBouncer) -> dict[str, str]:
    """Workers through the pooler; in transaction pooling the listener on a direct alias of its own."""
    return pgbouncer.worker_env(pooler, listen_direct=True)


def delivered() -> int:
    return Message.objects.filter(status="delivered").count()


def test_an_idle_worker_wakes_at_commit_again_after_the_pooler_restarts(bouncer):
    """After the kill every connection through the pooler is dead: the listener's too in session pooling.
    With a minute's poll interval only a listener that reconnected (and a worker that replaced its dead
    connection) explains a delivery within seconds of the commit."""
    worker = WorkerProcess("--poll-interval", "60", env=through(bouncer))
    try:
        wait_for(lambda: Worker.objects.filter(stopped_at__isnull=True).exists(), timeout=30)
        time.sleep(1.0)  # the listener's probe, then idle
        bouncer.restart()
        time.sleep(2.0)  # the listener notices at its next wait (0.5 s) and reconnects after 0.1 s
        outbox.send("probe.after_restart", {})  # on the test's direct connection: the NOTIFY is the server's
        sent = time.monotonic()
        wait_for(lambda: Delivery.objects.filter(topic="probe.after_restart").exists(), timeout=20)
        assert time.monotonic() - sent < 5, "woken by the NOTIFY after the restart, not the minute's poll"
    finally:
        worker.send_signal(signal.SIGTERM)
    _code, out = worker.wait()
    assert "does not hear" not in out, out
    if bouncer.mode == "session":
        assert "outbox listener lost its connection" in out, "the listener went through the pooler: it saw the kill"


def test_a_pooler_restart_mid_drain_loses_nothing_and_each_duplicate_has_an_unclean_attempt(bouncer):
    total = 600
    for n in range(total):
        outbox.send("probe.restart_drain", {"n": n})
    workers = [WorkerProcess("--lease", "2", "--poll-interval", "0.2", env=through(bouncer)) for _ in range(2)]
    try:
        wait_for(lambda: delivered() >= 50, timeout=60)
        assert delivered() < total, "the restart must strike mid-drain"
        bouncer.restart()
        wait_for(lambda: delivered() == total, timeout=120)
        assert all(w.proc.poll() is None for w in workers), "no worker died of the pooler's restart"
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
    out = "\n".join(w.wait()[1] for w in workers)
    assert "Traceback" not in out, out
    deliveries = Delivery.objects.filter(topic="probe.restart_drain")
    per_message = collections.Counter(deliveries.values_list("message_id", flat=True))
    assert len(per_message) == total, "every message reached the handler"
    assert Message.objects.filter(topic="probe.restart_drain").exclude(status="delivered").count() == 0
    # A second delivery of a message follows an attempt that did not end cleanly: abandoned (its lease
    # expired while the record could not be written), failed, or recorded after its lease was lost.
    unclean = collections.Counter(
        Attempt.objects.filter(message__topic="probe.restart_drain")
        .exclude(outcome="delivered", error="")
        .values_list("message_id", flat=True)
    )
    for message_id, count in per_message.items():
        assert count - 1 <= unclean[message_id], f"#{message_id}: {count} deliveries, {unclean[message_id]} unclean"


def pause(pooler: pgbouncer.PgBouncer) -> None:
    with contextlib.suppress(psycopg.Error):  # in session pooling it is still waiting when the pooler stops
        pooler.admin("PAUSE")


def test_a_pause_mid_drain_holds_the_workers_without_an_outage_or_a_duplicate(bouncer):
    """PAUSE makes every new transaction wait for RESUME: to the worker that is a slow database, not a
    lost one. Shorter than the lease (the default minute), so every message is delivered exactly once."""
    total = 600
    for n in range(total):
        outbox.send("probe.pause_drain", {"n": n})
    workers = [WorkerProcess("--poll-interval", "0.2", env=through(bouncer)) for _ in range(2)]
    try:
        wait_for(lambda: delivered() >= 50, timeout=60)
        # In session pooling PAUSE returns only once every client has let go of its server session, which
        # the workers never do: it waits on a thread while RESUME, on another console connection, ends it.
        pausing = threading.Thread(target=pause, args=(bouncer,), daemon=True)
        pausing.start()
        time.sleep(1.5)
        held = delivered()
        waiting = sum(int(row[3]) for row in bouncer.admin("SHOW POOLS") if row[0] != "pgbouncer")
        time.sleep(1.5)
        if bouncer.mode == "transaction":
            assert delivered() - held <= 20, "paused: at most the deliveries already claimed were recorded"
            assert waiting > 0, "the workers' transactions were waiting on the pause"
            assert held < total
        bouncer.admin("RESUME")
        wait_for(lambda: delivered() == total, timeout=120)
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
    out = "\n".join(w.wait()[1] for w in workers)
    assert "unavailable" not in out and "could not record" not in out, out
    deliveries = Delivery.objects.filter(topic="probe.pause_drain")
    per_message = collections.Counter(deliveries.values_list("message_id", flat=True))
    assert len(per_message) == total and set(per_message.values()) == {1}, "every message exactly once"
    assert Message.objects.filter(topic="probe.pause_drain", status="delivered", attempts=1).count() == total
