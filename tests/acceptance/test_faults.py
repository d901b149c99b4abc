"""Faults with real processes: killed producers, poison messages, hung handlers and the handler timeout."""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import threading

import pytest
from django.db import transaction
from django.test import override_settings

from django_outbox import outbox
from django_outbox.models import Attempt, Message
from django_outbox.worker import Relay, RelayConfig
from testproject.shop.models import Order
from tests.probe.models import Delivery
from tests.support import ROOT
from tests.support.brokers import running_relay
from tests.support.processes import worker_env
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

PRODUCER = """
import sys, time, django
django.setup()
from django.db import transaction
from django_outbox import outbox
from testproject.shop.models import Order
with transaction.atomic():
    Order.objects.create(customer_email="killed@example.com", item="mug")
    outbox.send("probe.created", {"n": 1}, idempotency_key="killed-producer")
    print("sent, not committed", flush=True)
    time.sleep(120)
"""


def test_producer_killed_mid_transaction_leaves_no_message(worker_process):
    producer = subprocess.Popen(
        [sys.executable, "-c", PRODUCER], cwd=ROOT, env=worker_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert producer.stdout is not None
        assert producer.stdout.readline().strip() == "sent, not committed"
        assert not Message.objects.filter(idempotency_key="killed-producer").exists()  # not committed yet
    finally:
        producer.send_signal(signal.SIGKILL)
        producer.communicate(timeout=10)
    assert producer.returncode == -signal.SIGKILL
    assert not Message.objects.exists()
    assert not Order.objects.exists()
    code, output = worker_process("--until-empty").wait(timeout=60)
    assert code == 0, output
    assert not Delivery.objects.exists()
    # the dead transaction left no lock behind: the same idempotency key is free and sends at once
    again = outbox.send("probe.created", {"n": 2}, idempotency_key="killed-producer")
    assert Message.objects.get().pk == again.pk


def test_rolled_back_producer_leaves_nothing_for_a_running_worker(worker_process):
    worker = worker_process("--poll-interval", "0.1")
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox.send("probe.created", {"rolled": "back"})
        Order.objects.create(customer_email="a@example.com", item="mug")
        raise RuntimeError("the view failed after send()")
    committed = outbox.send("probe.created", {"rolled": "no"})
    wait_for(lambda: Delivery.objects.filter(message_id=committed.pk).exists(), timeout=60)
    worker.stop()
    assert list(Message.objects.values_list("payload", flat=True)) == [{"rolled": "no"}]
    assert Delivery.objects.count() == 1
    assert not Order.objects.exists()


def _others(count: int) -> list[Message]:
    with transaction.atomic():
        return [
            # Other keys than the poison's and the hung message's: a dead head blocks its own key by design
            # (OUTBOX["ORDERING"] = "block", tested in tests/db/test_ordering.py), never anyone else's.
            outbox.send(f"probe.other{n % 3}", {"n": n}, key=f"other-key-{n % 7}", idempotency_key=f"other-{n}")
            for n in range(count)
        ]


def test_poison_and_hung_messages_end_dead_without_blocking_other_topics_or_keys(worker_process):
    poison = outbox.send("probe.poison", {"always_fail": True}, key="key-1", max_attempts=3)
    hung = outbox.send("probe.hang", {"sleep": 60}, key="key-2", max_attempts=2)
    # Two workers with a lease shorter than the timeout: the hung call outlives its lease (renewed meanwhile,
    # every third of it) and is bounded by the timeout alone. A lease of a few seconds, not one: a renewal
    # a busy machine delays by two thirds of a second must not let the other worker reap a healthy call.
    workers = [
        worker_process("--handler-timeout", "5", "--lease", "3", "--poll-interval", "0.1", "--batch-size", "20")
        for _ in range(2)
    ]
    wait_for(lambda: Message.objects.filter(pk=hung.pk, status="processing").exists(), timeout=60)
    others = _others(200)
    wait_for(lambda: Message.objects.filter(pk__in=[poison.pk, hung.pk], status="dead").count() == 2, timeout=90)
    wait_for(lambda: Message.objects.filter(status="delivered").count() == 200, timeout=60)
    for worker in workers:
        assert worker.proc.poll() is None, "a poison message must not take its worker down"

    hung_attempts = list(Attempt.objects.filter(message=hung).order_by("number"))
    assert [(a.number, a.outcome) for a in hung_attempts] == [(1, "failed"), (2, "failed")]
    assert all("delivery timed out after 5 s" in a.error for a in hung_attempts)
    assert all(4.5 < (a.finished_at - a.started_at).total_seconds() < 30 for a in hung_attempts)
    assert "timed out" in Message.objects.get(pk=hung.pk).last_error
    poison_attempts = Attempt.objects.filter(message=poison).order_by("number")
    assert [(a.number, a.outcome) for a in poison_attempts] == [(1, "failed"), (2, "failed"), (3, "failed")]
    assert "probe: failure requested" in Message.objects.get(pk=poison.pk).last_error

    # every other message (other topics and keys) was delivered once,
    # and all of them before the hung message's last attempt gave up
    per_message = collections.Counter(Delivery.objects.values_list("message_id", flat=True))
    assert {m.pk for m in others} == set(per_message)
    assert max(per_message.values()) == 1
    last_delivery = max(Delivery.objects.values_list("delivered_at", flat=True))
    assert last_delivery < hung_attempts[-1].finished_at


def test_timed_out_call_is_abandoned_and_its_thread_finishes_later(handler):
    """In one process: the abandoned helper thread completes after the attempt was recorded as failed."""
    release = threading.Event()
    finished: list[int] = []

    def hang(message: Message) -> None:
        release.wait(30)
        finished.append(message.attempts)

    handler("faults.hang", hang)
    handler("faults.ok", lambda message: None)
    hung = outbox.send("faults.hang", {}, max_attempts=2)
    fine = [outbox.send("faults.ok", {"n": n}) for n in range(5)]
    with override_settings(OUTBOX={"HANDLER_TIMEOUT_SECONDS": 0.5, "BACKOFF_BASE_SECONDS": 0.01}):
        with running_relay() as relay:
            assert relay.config.handler_timeout == 0.5
            wait_for(lambda: Message.objects.get(pk=hung.pk).status == "dead", timeout=10)
            wait_for(lambda: Message.objects.filter(status="delivered").count() == 5, timeout=10)
    assert set(Message.objects.filter(pk__in=[m.pk for m in fine]).values_list("status", flat=True)) == {"delivered"}
    assert finished == []  # both attempts are still hanging in abandoned threads
    release.set()
    wait_for(lambda: sorted(finished) == [1, 2], timeout=10)
    errors = list(Attempt.objects.filter(message=hung).values_list("error", flat=True))
    assert len(errors) == 2
    assert all("delivery timed out after 0.5 s" in e and "may still complete later" in e for e in errors)


def test_without_a_timeout_deliveries_run_in_the_delivery_thread(handler):
    threads: list[str] = []
    handler("faults.where", lambda message: threads.append(threading.current_thread().name))
    outbox.send("faults.where", {})
    relay = Relay(RelayConfig.from_settings(until_empty=True, poll_interval=0.05, notify=False))
    assert relay.config.handler_timeout is None
    relay.run()
    assert len(threads) == 1 and threads[0].startswith("outbox-delivery-")  # a delivery thread, not a helper
