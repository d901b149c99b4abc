"""Real worker processes with the connection settings production sites use: Django's own pool, persistent
connections with and without health checks, a new connection per batch."""

from __future__ import annotations

import collections
import json
import signal
import time

import pytest

from django_outbox import outbox
from django_outbox.models import Message
from tests.probe.models import Delivery
from tests.support.processes import WorkerProcess, send_in_process
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("postgres"), pytest.mark.slow]

SETTINGS = {
    "django-pool": {"OPTIONS": {"pool": {"min_size": 1, "max_size": 4, "timeout": 10}}},
    "conn-max-age-0": {"CONN_MAX_AGE": 0},
    "persistent": {"CONN_MAX_AGE": None},
    "persistent-health-checks": {"CONN_MAX_AGE": None, "CONN_HEALTH_CHECKS": True},
    "max-age-1s": {"CONN_MAX_AGE": 1, "CONN_HEALTH_CHECKS": True},
}


def env_for(name: str) -> dict[str, str]:
    return {"TEST_DB_SETTINGS": json.dumps(SETTINGS[name]), "OUTBOX_LOG_LEVEL": "WARNING", "DEBUG": "false"}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_two_workers_deliver_every_message_exactly_once(name):
    total = 600
    for n in range(total):
        outbox.send("probe.conn", {"n": n}, key=f"k{n % 7}" if n % 3 == 0 else None)
    workers = [WorkerProcess("--until-empty", env=env_for(name)) for _ in range(2)]
    log = ""
    for worker in workers:
        code, out = worker.wait(timeout=120)
        log += out
        assert code == 0, out
    assert "unavailable" not in log and "Traceback" not in log, log
    per_message = collections.Counter(Delivery.objects.values_list("message_id", flat=True))
    assert len(per_message) == total and set(per_message.values()) == {1}
    assert Message.objects.filter(status="delivered", attempts=1).count() == total


@pytest.mark.parametrize("name", ["django-pool", "persistent-health-checks"])
def test_an_idle_worker_wakes_at_commit(name):
    worker = WorkerProcess("--poll-interval", "60", env=env_for(name))
    try:
        time.sleep(2.0)  # started, probed its listener, idle
        sent = send_in_process("probe.woken", env_for(name))
        wait_for(lambda: Delivery.objects.filter(topic="probe.woken").exists(), timeout=10)
        assert time.monotonic() - sent < 5, "woken by the NOTIFY, not the minute's poll"
    finally:
        worker.send_signal(signal.SIGTERM)
    code, out = worker.wait()
    assert code == 0 and "Traceback" not in out, out
