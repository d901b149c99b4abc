"""Behind PgBouncer: the default worker settings through a pooler in transaction and session pooling."""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import time

import pytest
from django.db import connection

from django_outbox import outbox
from django_outbox.models import Message, Worker
from django_outbox.worker.listener import PROBE_TIMEOUT
from tests.probe.models import Delivery
from tests.support import ROOT, pgbouncer
from tests.support.processes import WorkerProcess, send_in_process, worker_env
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("postgres"), pytest.mark.slow]


def test_default_workers_deliver_every_message_once_through_the_pooler(bouncer):
    total = 2000
    for n in range(total):
        outbox.send("probe.pooled", {"n": n})
    # How fast they drain through the pooler is bench/topology.py's figure: no speed target in a test.
    workers = [WorkerProcess("--until-empty", env=pgbouncer.worker_env(bouncer)) for _ in range(2)]
    outputs = []
    for worker in workers:
        code, out = worker.wait(timeout=120)
        outputs.append(out)
        assert code == 0, out
    log = "\n".join(outputs)
    assert "unavailable" not in log and "could not record" not in log, log
    if bouncer.mode == "transaction":  # the workers found out, and said so once each
        assert 1 <= log.count("prepared statements do not survive") <= len(workers), log
    else:
        assert "prepared statements do not survive" not in log, "session pooling keeps them"
    per_message = collections.Counter(Delivery.objects.values_list("message_id", flat=True))
    assert len(per_message) == total and set(per_message.values()) == {1}, "every message exactly once"
    assert Message.objects.filter(status="delivered", attempts=1).count() == total


def check_output(env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check", "--database", "default"],
        cwd=ROOT,
        env={**worker_env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.stdout + result.stderr


def test_check_warns_when_the_listen_hears_nothing_and_listen_database_mends_it(bouncer):
    env = pgbouncer.worker_env(bouncer)
    if bouncer.mode == "session":
        assert "django_outbox.W002" not in check_output(env), "a session keeps its LISTEN"
        return
    out = check_output(env)
    assert "django_outbox.W002" in out and "will only poll" in out, out
    out = check_output({**env, "LISTEN_DATABASE_URL": pgbouncer.direct_url(connection.settings_dict["NAME"])})
    assert "django_outbox.W002" not in out, out


def test_an_idle_worker_behind_transaction_pooling_wakes_at_commit_through_listen_database(bouncer):
    """Sent through the pooler (NOTIFY is transactional, so it works there), heard on the direct alias."""
    env = pgbouncer.worker_env(bouncer)
    name = connection.settings_dict["NAME"]
    worker = WorkerProcess("--poll-interval", "60", env={**env, "LISTEN_DATABASE_URL": pgbouncer.direct_url(name)})
    try:
        wait_for(lambda: Worker.objects.filter(stopped_at__isnull=True).exists(), timeout=30)
        time.sleep(1.0)  # the probe, then idle: only a wake-up can explain a delivery within seconds
        sent = send_in_process("probe.woken", env)
        wait_for(lambda: Delivery.objects.filter(topic="probe.woken").exists(), timeout=10)
        assert time.monotonic() - sent < 5, "woken by the NOTIFY, not the minute's poll"
    finally:
        worker.send_signal(signal.SIGTERM)
    _code, out = worker.wait()
    assert "does not hear" not in out, out


def test_a_deaf_listener_says_so_once_and_the_worker_still_delivers_by_polling(bouncer):
    if bouncer.mode == "session":
        pytest.skip("a session keeps its LISTEN")
    worker = WorkerProcess("--poll-interval", "0.5", env=pgbouncer.worker_env(bouncer))
    try:
        outbox.send("probe.polled", {})
        wait_for(lambda: Delivery.objects.filter(topic="probe.polled").exists(), timeout=20)
        time.sleep(PROBE_TIMEOUT + 1)  # the listener's probe has given up by now
    finally:
        worker.send_signal(signal.SIGTERM)
    _code, out = worker.wait()
    assert out.count("does not hear notifications") == 1 and "poll every 0.5s" in out, out
