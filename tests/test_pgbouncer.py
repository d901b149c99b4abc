"""Behind PgBouncer: the default worker settings through a pooler in transaction and session pooling."""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator

import pytest
from django.db import connection

from django_outbox import outbox
from django_outbox.models import Message

from . import pgbouncer
from .conftest import IN_CI, WorkerProcess
from .probe.models import Delivery

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("postgres")]


@pytest.fixture(params=["transaction", "session"])
def bouncer(request) -> Iterator[pgbouncer.PgBouncer]:
    if not pgbouncer.available():
        if IN_CI:
            pytest.fail("pgbouncer is not installed (apt-get install pgbouncer); under CI=true that is a failure")
        pytest.skip("pgbouncer is not installed")
    # Fewer server connections than clients in transaction pooling, as in production: clients share them.
    pooler = pgbouncer.PgBouncer(request.param, pool_size=3 if request.param == "transaction" else 30)
    yield pooler
    pooler.stop()


def through(pooler: pgbouncer.PgBouncer) -> dict[str, str]:
    return {
        "DATABASE_URL": pooler.url(connection.settings_dict["NAME"]),
        "OUTBOX_LOG_LEVEL": "WARNING",
        "DEBUG": "false",
    }


def test_default_workers_deliver_every_message_once_through_the_pooler(bouncer):
    total = 2000
    for n in range(total):
        outbox.send("probe.pooled", {"n": n})
    started = time.monotonic()
    workers = [WorkerProcess("--until-empty", env=through(bouncer)) for _ in range(2)]
    outputs = []
    for worker in workers:
        code, out = worker.wait(timeout=120)
        outputs.append(out)
        assert code == 0, out
    elapsed = time.monotonic() - started
    log = "\n".join(outputs)
    assert "unavailable" not in log and "could not record" not in log, log
    if bouncer.mode == "transaction":  # the workers found out, and said so once each
        assert 1 <= log.count("prepared statements do not survive") <= len(workers), log
    else:
        assert "prepared statements do not survive" not in log, "session pooling keeps them"
    per_message = collections.Counter(Delivery.objects.values_list("message_id", flat=True))
    assert len(per_message) == total and set(per_message.values()) == {1}, "every message exactly once"
    assert Message.objects.filter(status="delivered", attempts=1).count() == total
    assert elapsed < 20, f"{total} messages took {elapsed:.0f}s through the pooler"
