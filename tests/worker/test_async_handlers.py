"""``async def`` handlers, and handlers returning an awaitable, are awaited.

In the worker (its delivery threads, with and without the handler timeout, and a real worker process)
and in ``relay_all()``, where an async handler's ORM calls must run on the caller's connection and so
see the caller's transaction. Their exceptions are failed attempts, and ``HANDLER_TIMEOUT_SECONDS``
cancels them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Generator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections
from django.test import override_settings

from django_outbox import PermanentDeliveryError, outbox
from django_outbox.models import Attempt, Message
from django_outbox.testing import relay_all
from django_outbox.worker import Relay, RelayConfig
from testproject.shop.models import Order
from tests.probe.models import Delivery
from tests.support.waiting import wait_for

transactional = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def slow_retries(settings: Any) -> None:
    """Retries 15 to 30 s later: a run until empty never sees the retry of what failed in it."""
    settings.OUTBOX = {**settings.OUTBOX, "BACKOFF_BASE_SECONDS": 30, "BACKOFF_MAX_SECONDS": 30}


def run_until_empty(**overrides: Any) -> Relay:
    """A real worker (its delivery and keeper threads) until nothing is due now."""
    relay = Relay(RelayConfig.from_settings(until_empty=True, poll_interval=0.05, notify=False, **overrides))
    relay.run()
    assert not relay.crashed
    return relay


async def record_delivery(message: Message) -> None:
    """What a real async consumer does: awaits I/O, then writes through the async ORM."""
    await asyncio.sleep(0)
    await Delivery.objects.acreate(
        message_id=message.id, message_uuid=message.uuid, topic=message.topic, attempt=message.attempts, pid=0
    )


class Ready:
    """An awaitable that is not a coroutine (as a library's future-like object may be)."""

    def __init__(self, message: Message) -> None:
        self.message = message

    def __await__(self) -> Generator[Any, None, None]:
        return record_delivery(self.message).__await__()


def returns_coroutine(message: Message) -> Awaitable[None]:
    return record_delivery(message)


def returns_awaitable(message: Message) -> Awaitable[None]:
    return Ready(message)


def delivered_once(message: Message) -> None:
    message.refresh_from_db()
    assert message.status == Message.Status.DELIVERED, message.last_error
    assert list(message.attempt_log.values_list("outcome", flat=True)) == ["delivered"]
    assert Delivery.objects.filter(message_id=message.pk).count() == 1


# --- the worker's delivery threads -------------------------------------------------------------------


@transactional
@pytest.mark.parametrize("func", [record_delivery, returns_coroutine, returns_awaitable])
def test_the_worker_awaits_an_async_handler_and_its_orm_writes_land(handler, func):
    handler("async.ok", func)
    messages = [outbox.send("async.ok", {"n": n}) for n in range(3)]
    relay = run_until_empty()
    assert relay.stats.delivered == 3
    for message in messages:
        delivered_once(message)


@transactional
@pytest.mark.parametrize("timeout", [None, 5.0], ids=["no-timeout", "on-the-timeout-helper"])
def test_an_async_handlers_exception_is_a_failed_attempt(handler, timeout):
    async def fails(message: Message) -> None:
        await asyncio.sleep(0)
        if message.payload.get("permanent"):
            raise PermanentDeliveryError("async: the address does not exist")
        raise ConnectionError("async: destination down")

    handler("async.fail", fails)
    retried = outbox.send("async.fail", {})
    dead = outbox.send("async.fail", {"permanent": True})
    run_until_empty(handler_timeout=timeout)
    retried.refresh_from_db()
    dead.refresh_from_db()
    assert retried.status == Message.Status.PENDING
    assert "ConnectionError: async: destination down" in retried.last_error
    assert retried.attempt_log.get().outcome == Attempt.Outcome.FAILED
    assert dead.status == Message.Status.DEAD
    assert "async: the address does not exist" in dead.last_error


@transactional
def test_handler_timeout_cancels_a_hung_async_handler(handler):
    cancelled: list[int] = []

    async def hangs(message: Message) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(message.id)
            raise

    handler("async.hang", hangs)
    handler("async.ok", record_delivery)
    hung = outbox.send("async.hang", {}, max_attempts=1)
    fine = outbox.send("async.ok", {})
    started = time.monotonic()
    run_until_empty(handler_timeout=0.5)
    assert time.monotonic() - started < 20
    hung.refresh_from_db()
    assert hung.status == Message.Status.DEAD
    attempt = hung.attempt_log.get()
    assert "timed out after 0.5 s" in attempt.error
    assert attempt.finished_at is not None and attempt.started_at is not None
    assert (attempt.finished_at - attempt.started_at).total_seconds() < 10
    # the coroutine itself was cancelled: nothing is left running for 60 s (nor holds the process at exit)
    wait_for(lambda: cancelled == [hung.pk], timeout=10)
    delivered_once(fine)


@transactional
def test_a_real_worker_process_awaits_async_handlers(worker_process):
    ok = [outbox.send("asyncprobe.created", {"n": n}) for n in range(3)]
    failing = outbox.send("asyncprobe.created", {"always_fail": True}, max_attempts=1)
    hung = outbox.send("asyncprobe.created", {"sleep": 60}, max_attempts=1)
    started = time.monotonic()
    code, output = worker_process("--until-empty", "--handler-timeout", "2").wait(timeout=50)
    assert code == 0, output
    assert time.monotonic() - started < 45, "a cancelled async handler must not hold the worker at exit"
    for message in ok:
        delivered_once(message)
    assert {d.pid for d in Delivery.objects.all()} != {0}
    failing.refresh_from_db()
    assert failing.status == Message.Status.DEAD
    assert "async probe: failure requested" in failing.last_error
    hung.refresh_from_db()
    assert hung.status == Message.Status.DEAD
    assert "timed out after 2 s" in hung.last_error
    assert "never awaited" not in output


# --- relay_all(): the caller's thread, connection and transaction ------------------------------------


@pytest.mark.django_db
def test_relay_all_awaits_an_async_handler_inside_the_callers_transaction(handler):
    """The test's transaction is open and uncommitted: an async handler's ORM calls must run on this
    connection to see the order, and its write must be visible here afterwards."""
    seen: list[tuple[str, bool]] = []

    async def ship(message: Message) -> None:
        order = await Order.objects.aget(pk=message.payload["order"])
        in_atomic = await sync_to_async(lambda: connection.in_atomic_block)()
        seen.append((order.item, in_atomic))
        await record_delivery(message)

    handler("async.ship", ship)
    order = Order.objects.create(customer_email="ann@example.com", item="mug")
    message = outbox.send("async.ship", {"order": order.pk})
    stats = relay_all()
    assert stats.delivered == 1
    assert seen == [("mug", True)]
    delivered_once(message)


@pytest.mark.django_db
def test_relay_all_records_an_async_failure_and_bounds_a_hung_handler(settings, handler):
    cancelled: list[int] = []

    async def fails(message: Message) -> None:
        raise ValueError("async: bad payload")

    async def hangs(message: Message) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(message.id)
            raise

    handler("async.fail", fails)
    handler("async.hang", hangs)
    failed = outbox.send("async.fail", {})
    hung = outbox.send("async.hang", {})
    started = time.monotonic()
    with override_settings(OUTBOX={**settings.OUTBOX, "HANDLER_TIMEOUT_SECONDS": 0.5}):
        stats = relay_all()
    assert time.monotonic() - started < 20
    assert stats.failed == 2
    failed.refresh_from_db()
    assert "ValueError: async: bad payload" in failed.last_error
    hung.refresh_from_db()
    assert "timed out after 0.5 s" in hung.last_error
    assert cancelled == [hung.pk]


@transactional
def test_relay_all_from_a_thread_of_a_running_event_loop(handler):
    """``await sync_to_async(relay_all)()`` in async code: the handler runs on that running loop."""
    loops: list[object] = []

    async def on_the_loop(message: Message) -> None:
        loops.append(asyncio.get_running_loop())
        await record_delivery(message)

    handler("async.loop", on_the_loop)
    message = outbox.send("async.loop", {})

    async def main() -> object:
        try:
            await sync_to_async(relay_all)()
        finally:
            await sync_to_async(connections.close_all)()  # that thread's connection, not the test's
        return asyncio.get_running_loop()

    outer = asyncio.run(main())
    assert loops == [outer]
    delivered_once(message)
