"""Shared by the broker tests: sending a keyed batch, running the real relay, a TCP proxy that can fail."""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.test import override_settings

from django_outbox import outbox
from django_outbox.models import Attempt, Message
from django_outbox.worker import Relay, RelayConfig

from .proxy import FlakyProxy as FlakyProxy  # re-exported: the broker tests import it from here
from .waiting import wait_for

KEYS = ("k0", "k1", "k2", "k3", "k4")


def unique_prefix() -> str:
    """A topic prefix of its own per test, so nothing left in a broker by an earlier run interferes."""
    return f"t{secrets.token_hex(4)}"


def send_many(topic: str, count: int, *, start: int = 0) -> list[Message]:
    """``count`` messages over a few keys, each with a user header and an idempotency key."""
    with transaction.atomic():
        return [
            outbox.send(
                topic,
                {"n": n, "key": KEYS[n % len(KEYS)], "price": "9.99", "tags": ["a", "b"]},
                key=KEYS[n % len(KEYS)],
                idempotency_key=f"{topic}:{n}",
                headers={"trace": f"trace-{n}", "tenant": "7"},
            )
            for n in range(start, start + count)
        ]


def relay_until_empty(**overrides: Any) -> Relay:
    """The worker's loop, threads and all, until nothing is due now (``outbox_worker --until-empty``)."""
    relay = Relay(RelayConfig.from_settings(until_empty=True, poll_interval=0.05, notify=False, **overrides))
    relay.run()
    return relay


@contextlib.contextmanager
def running_relay(**overrides: Any) -> Iterator[Relay]:
    """A worker that keeps running (and polling) in a background thread until the block ends."""
    relay = Relay(RelayConfig.from_settings(poll_interval=0.05, notify=False, grace_period=5, **overrides))
    thread = threading.Thread(target=relay.run, name="test-relay", daemon=True)
    thread.start()
    try:
        yield relay
    finally:
        relay.stop()
        thread.join(timeout=30)
        assert not thread.is_alive(), "the relay did not stop"


def outbox_settings(name: str, backend: str, options: dict[str, Any], pattern: str, **outbox: Any) -> override_settings:
    """One broker transport serving ``pattern``, quick retries; ``outbox`` overrides other settings."""
    return override_settings(
        OUTBOX={
            "MAX_ATTEMPTS": 100,
            "BACKOFF_BASE_SECONDS": 0.05,
            "BACKOFF_MAX_SECONDS": 0.3,
            "POLL_INTERVAL_SECONDS": 0.05,
            "TRANSPORTS": {name: {"BACKEND": backend, "OPTIONS": options}},
            "ROUTES": {pattern: name},
            **outbox,
        }
    )


def count_status(status: str) -> int:
    return Message.objects.filter(status=status).count()


def failed_attempts() -> int:
    return Attempt.objects.filter(outcome=Attempt.Outcome.FAILED).count()


def relay_through_outage(
    proxy: FlakyProxy, name: str, backend: str, options: dict[str, Any], prefix: str
) -> list[Message]:
    """Relay 50 messages, cut the broker off (through ``proxy``) while 50 more are sent, then restore it.

    The same scenario for every broker: attempts fail while it is down, the worker reconnects, every
    message ends delivered and none dead. Returns what was sent, for the test to read back its own way.
    """
    with outbox_settings(name, backend, options, f"{prefix}.*"), running_relay():
        sent = send_many(f"{prefix}.orders", 50)
        wait_for(lambda: count_status(Message.Status.DELIVERED) == 50, timeout=20)
        proxy.down()
        sent += send_many(f"{prefix}.orders", 50, start=50)
        wait_for(lambda: failed_attempts() >= 3, timeout=20)
        proxy.up()
        wait_for(lambda: count_status(Message.Status.DELIVERED) == 100, timeout=30)
    assert count_status(Message.Status.DEAD) == 0
    return sent


@dataclass(frozen=True, kw_only=True)
class Received:
    """One message as a consumer read it from the broker, with that broker's own client."""

    message_id: str
    payload: dict[str, Any]
    key: str | None
    idempotency_key: str | None
    headers: dict[str, Any]


def assert_all_received(
    sent: Sequence[Message], received: Sequence[Received], *, once: bool = True, in_order: bool = True
) -> None:
    """Every sent message arrived with its id, key, idempotency key, user headers and payload.

    ``once``: and none twice. ``in_order``: and, per key, in the order sent (the relay keeps that order
    while no attempt fails; retries with jittered backoff may reorder).
    """
    by_id = {str(m.uuid): m for m in sent}
    received_ids = [r.message_id for r in received]
    missing = set(by_id) - set(received_ids)
    assert not missing, f"{len(missing)} of {len(sent)} messages never arrived, e.g. {sorted(missing)[:3]}"
    strangers = set(received_ids) - set(by_id)
    assert not strangers, f"unexpected messages arrived: {sorted(strangers)[:3]}"
    for r in received:
        m = by_id[r.message_id]
        assert r.payload == m.payload
        assert r.key == m.key
        assert r.idempotency_key == m.idempotency_key
        assert r.headers["trace"] == m.headers["trace"]
        assert r.headers["tenant"] == "7"
    if once:
        assert len(received_ids) == len(set(received_ids)), "a message arrived twice"
    if in_order:
        order: dict[str | None, list[int]] = defaultdict(list)
        for r in received:
            order[r.key].append(r.payload["n"])
        for key, numbers in order.items():
            assert numbers == sorted(numbers), f"messages of key {key!r} arrived out of order"
