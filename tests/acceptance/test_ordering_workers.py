"""Per-key order under load: real worker processes, many keys, random failures and retries."""

from __future__ import annotations

import collections

import pytest
from django.db import connection

from django_outbox.models import Attempt, Message
from tests.probe.models import Delivery
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def send_keyed(keys: int, per_key: int, fail_rate: float) -> None:
    """Interleaved as a busy application would send them: message n of every key, then n + 1."""
    Message.objects.bulk_create(
        [
            Message(
                topic="probe.ordered",
                key=f"order-{k}",
                payload={"seq": n, "fail_rate": fail_rate},
                # ~10% failures: 30 attempts make a dead message (which would block its key) impossible
                # in practice, so "nothing lost" is about the relay, not about luck.
                max_attempts=30,
            )
            for n in range(per_key)
            for k in range(keys)
        ],
        batch_size=1000,
    )


def assert_delivered_in_send_order(keys: int, per_key: int) -> None:
    assert Message.objects.exclude(status="delivered").count() == 0, "every message is delivered, none dead"
    seq_of = {m.id: m.payload["seq"] for m in Message.objects.only("id", "payload")}
    per_key_log: dict[str, list[int]] = collections.defaultdict(list)
    for message_id, key in Delivery.objects.order_by("id").values_list("message_id", "key"):
        per_key_log[key].append(seq_of[message_id])
    assert len(per_key_log) == keys
    out_of_order = {key: log for key, log in per_key_log.items() if log != list(range(per_key))}
    assert out_of_order == {}, f"{len(out_of_order)} keys not delivered exactly once in send order"
    assert Attempt.objects.filter(outcome="failed").count() > keys * per_key * 0.05, "failures were exercised"


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "keys", "vendor"), [(4, 200, "postgresql"), (2, 200, "sqlite")])
def test_every_key_is_delivered_in_send_order_by_many_workers(worker_process, workers, keys, vendor):
    if connection.vendor != vendor:
        pytest.skip(f"the {vendor} run of this test")
    per_key = 25
    send_keyed(keys, per_key, fail_rate=0.1)
    # Not --until-empty: a worker that finds every head waiting for its retry would leave early.
    started = [worker_process("--batch-size", "100", "--poll-interval", "0.2") for _ in range(workers)]
    wait_for(lambda: Delivery.objects.count() >= keys * per_key, timeout=400, interval=0.5)
    wait_for(lambda: not Message.objects.exclude(status="delivered").exists(), timeout=30)
    for worker in started:
        worker.stop()
    assert_delivered_in_send_order(keys, per_key)
    assert len(set(Delivery.objects.values_list("pid", flat=True))) == workers, "every worker took a share"
