"""A migration written with the online operations, run by ``migrate`` on a message table of 100,000
finished messages while a producer sends every 5 ms and two worker processes of the code before the
migration drain: no ``send()`` fails, no worker errs, nothing is lost. The same at 10,000,000 rows, with
the longest ``send()`` measured, is ``bench/online_migrations.py``'s (docs/upgrading.md has its figures).
"""

from __future__ import annotations

import threading
import time

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import override_settings

from django_outbox import outbox
from django_outbox.models import Message, Worker
from tests.probe.models import Delivery
from tests.support import schema
from tests.support.processes import WorkerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

APP = "django_outbox"
FINISHED = 100_000
SAFE = "tests.support.migration_samples.safe"

FILL = {
    "postgresql": """
INSERT INTO django_outbox_message (uuid, topic, payload, headers, status, attempts, max_attempts,
    available_at, created_at, delivered_at, last_error)
SELECT md5(i::text)::uuid, 'probe.history', '{}'::jsonb, '{}'::jsonb, 'delivered', 1, 5, now(), now(), now(), ''
FROM generate_series(1, %(n)s) AS i
""",
    "mysql": """
INSERT INTO django_outbox_message (uuid, topic, payload, headers, status, attempts, max_attempts,
    available_at, created_at, delivered_at, last_error)
SELECT UUID(), 'probe.history', '{}', '{}', 'delivered', 1, 5, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
    UTC_TIMESTAMP(6), ''
FROM seq_1_to_%(n)s
""",
}


class Producer(threading.Thread):
    """``outbox.send()`` in a transaction of its own every 5 ms, as a busy site's requests."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stopping = threading.Event()
        self.sent: list[int] = []
        self.failures: list[str] = []
        self.longest = 0.0

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                started = time.monotonic()
                try:
                    with transaction.atomic():
                        message = outbox.send("probe.during", {"n": len(self.sent)})
                    self.sent.append(message.id)
                except Exception as exc:
                    self.failures.append(repr(exc))
                took = time.monotonic() - started
                self.longest = max(self.longest, took)
                self.stopping.wait(max(0.0, 0.005 - took))
        finally:
            connections.close_all()


def test_migrate_under_load_fails_no_send_and_stops_no_worker() -> None:
    if connection.vendor not in FILL:
        pytest.skip("one writer at a time on SQLite: nothing is online there")
    with connection.cursor() as cursor:
        cursor.execute(FILL[connection.vendor] % {"n": FINISHED})
    workers = [WorkerProcess("--poll-interval", "0.2") for _ in range(2)]
    # Both relaying (a heartbeat row each, written once their signal handlers are in place) before the load
    # starts: on a loaded machine a worker can take seconds to start.
    wait_for(lambda: Worker.objects.filter(stopped_at__isnull=True).count() >= 2, timeout=120, interval=0.1)
    producer = Producer()
    producer.start()
    migrated = False
    try:
        wait_for(lambda: len(producer.sent) >= 50, timeout=60, interval=0.05)
        with override_settings(MIGRATION_MODULES={APP: SAFE}):
            call_command("migrate", APP, "0004_check", verbosity=0)
            migrated = True
            sent_before = len(producer.sent)
            wait_for(lambda: len(producer.sent) >= sent_before + 50, timeout=60, interval=0.05)
            producer.stopping.set()
            producer.join(timeout=30)
            # the workers (the code before the migration, which knows nothing of its column) drain it all
            wait_for(lambda: Delivery.objects.filter(topic="probe.during").count() >= len(producer.sent), timeout=120)
            with connection.cursor() as cursor:
                made = set(connection.introspection.get_constraints(cursor, "django_outbox_message"))
            assert "outbox_msg_topic_idx" in made
            # MariaDB/MySQL would copy the table to add a check: AddCheckNotValid leaves it out there
            assert ("outbox_msg_priority_check" in made) == (connection.vendor == "postgresql")
    finally:
        producer.stopping.set()
        producer.join(timeout=30)
        outputs = []
        for worker in workers:
            worker.send_signal(15)
            outputs.append(worker.wait(timeout=60))
        if migrated:
            with override_settings(MIGRATION_MODULES={APP: SAFE}):
                call_command("migrate", APP, schema.package_latest(), verbosity=0)
    assert not producer.failures, producer.failures[:5]
    assert len(producer.sent) >= 100
    delivered = set(Message.objects.filter(topic="probe.during", status="delivered").values_list("id", flat=True))
    assert delivered == set(producer.sent)
    assert Message.objects.filter(topic="probe.history").count() == FINISHED
    for code, out in outputs:
        assert code == 0 and "Traceback" not in out and "error" not in out.lower(), out[-3000:]
