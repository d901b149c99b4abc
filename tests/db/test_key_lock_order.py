"""Two producers taking the same keys in opposite orders, on real concurrent connections (PostgreSQL and
MariaDB: SQLite serialises its writers, so nothing can interleave there).

A keyed ``send()`` locks its key until the producer's transaction ends (docs/ordering.md). ``send_many()``
locks a batch's keys in one fixed order, so two batches never wait on each other in a cycle. Separate
``send()`` calls lock in the order the caller makes them: two transactions that send the same keys in
opposite orders deadlock, and the server aborts one of them whole (PostgreSQL after ``deadlock_timeout``,
MariaDB at once, error 1213). What must hold either way: nothing is lost, nothing is half-written, and the
aborted transaction, run again, goes through.
"""

from __future__ import annotations

import threading

import pytest
from django.db import DatabaseError, transaction

from django_outbox import outbox
from django_outbox.models import Message
from tests.support.threads import in_thread, key_lock_waiters
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = [f"acct-{n}🔑" for n in range(6)]


def _payloads(producer: str) -> list[int]:
    return sorted(m.payload["n"] for m in Message.objects.filter(topic=f"probe.{producer}"))


def test_batches_of_the_same_keys_in_opposite_orders_queue_rather_than_deadlock(server_database):
    """The first batch holds its transaction open; the second, its keys reversed, waits for it at its
    first lock (the smallest key, which the first batch holds) instead of taking the largest key and then
    waiting in a cycle. Released, both commit whole."""
    errors: list[BaseException] = []
    first_sent, release = threading.Event(), threading.Event()

    def first() -> None:
        with transaction.atomic():
            outbox.send_many([{"topic": "probe.a", "payload": {"n": n}, "key": k} for n, k in enumerate(KEYS)])
            first_sent.set()
            assert release.wait(60)

    def second() -> None:
        with transaction.atomic():
            items = [{"topic": "probe.b", "payload": {"n": n}, "key": k} for n, k in enumerate(KEYS)]
            outbox.send_many(items[::-1])

    one = in_thread(first, errors)
    try:
        assert first_sent.wait(60)
        two = in_thread(second, errors)
        wait_for(lambda: errors or key_lock_waiters() >= 1, timeout=60)
        assert not errors, errors
        assert Message.objects.count() == 0, "nothing is visible before the batches commit"
    finally:
        release.set()
        one.join(60)
    two.join(60)
    assert errors == []
    assert _payloads("a") == _payloads("b") == list(range(len(KEYS)))
    for key in KEYS:  # per key, the first batch's message took the lower id: its commit came first
        assert [m.topic for m in Message.objects.filter(key=key).order_by("id")] == ["probe.a", "probe.b"]


def test_concurrent_batches_of_overlapping_keys_in_every_order_never_deadlock(server_database):
    """Four producers, each sending batches of the same keys in its own order, many rounds at once."""
    errors: list[BaseException] = []
    rounds, producers = 12, 4
    start = threading.Barrier(producers)

    def produce(p: int) -> None:
        start.wait(60)
        for r in range(rounds):
            order = KEYS[p % len(KEYS) :] + KEYS[: p % len(KEYS)]
            if (p + r) % 2:
                order = order[::-1]
            with transaction.atomic():
                outbox.send_many([{"topic": f"probe.p{p}", "payload": {"n": r}, "key": k} for k in order])

    threads = [in_thread(lambda p=p: produce(p), errors) for p in range(producers)]
    for thread in threads:
        thread.join(180)
    assert errors == [], "a batch failed (a deadlock between batches means the keys were not locked in order)"
    assert Message.objects.count() == rounds * producers * len(KEYS)


def _is_deadlock(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, DatabaseError) and "deadlock" in text


def test_two_transactions_sending_the_same_keys_in_opposite_orders_one_is_aborted_whole(server_database):
    """A sends K1 then K2, B sends K2 then K1, each holding its first key when it asks for the second:
    a real deadlock. The server aborts one transaction with a deadlock error (a ``DatabaseError``); its
    first message is gone with it (nothing half-written), the other commits both, and the aborted one,
    run again as the error asks, commits both of its own: nothing lost."""
    k1, k2 = KEYS[0], KEYS[1]
    holding = {"a": threading.Event(), "b": threading.Event()}
    failures: dict[str, BaseException] = {}
    errors: list[BaseException] = []

    def producer(name: str, first_key: str, second_key: str, other: str) -> None:
        for attempt in range(2):
            try:
                with transaction.atomic():
                    outbox.send(f"probe.{name}", {"n": 1}, key=first_key)
                    if attempt == 0:
                        holding[name].set()
                        assert holding[other].wait(60)
                    outbox.send(f"probe.{name}", {"n": 2}, key=second_key)
                return
            except DatabaseError as exc:
                if attempt or not _is_deadlock(exc):
                    raise
                failures[name] = exc
                holding[name].set()  # a retry of its own: the other producer waits for nothing more

    threads = [
        in_thread(lambda: producer("a", k1, k2, "b"), errors),
        in_thread(lambda: producer("b", k2, k1, "a"), errors),
    ]
    for thread in threads:
        thread.join(120)
    assert errors == [], errors
    assert len(failures) == 1, f"exactly one transaction is the deadlock's victim: {failures}"
    (victim,) = failures
    assert _is_deadlock(failures[victim])
    assert _payloads("a") == _payloads("b") == [1, 2]
    # The victim's rows are those of its retry: per key, the survivor's message came first.
    survivor = "b" if victim == "a" else "a"
    for key in (k1, k2):
        assert [m.topic for m in Message.objects.filter(key=key).order_by("id")] == [
            f"probe.{survivor}",
            f"probe.{victim}",
        ]


def test_a_deadlock_victim_leaves_its_other_writes_out_too(server_database):
    """The abort takes the victim's whole transaction back, not only its last statement: a business row
    written before the sends is gone with its messages (MariaDB rolls a deadlock victim back whole, unlike
    a lock-wait timeout, which undoes only the statement)."""
    from testproject.shop.models import Order

    k1, k2 = KEYS[2], KEYS[3]
    holding = {"a": threading.Event(), "b": threading.Event()}
    outcome: dict[str, str] = {}
    errors: list[BaseException] = []

    def producer(name: str, first_key: str, second_key: str, other: str) -> None:
        try:
            with transaction.atomic():
                Order.objects.create(customer_email=f"{name}@example.com", item="mug")
                outbox.send(f"probe.{name}", {"n": 1}, key=first_key)
                holding[name].set()
                assert holding[other].wait(60)
                outbox.send(f"probe.{name}", {"n": 2}, key=second_key)
            outcome[name] = "committed"
        except DatabaseError as exc:
            if not _is_deadlock(exc):
                raise
            outcome[name] = "aborted"

    threads = [
        in_thread(lambda: producer("a", k1, k2, "b"), errors),
        in_thread(lambda: producer("b", k2, k1, "a"), errors),
    ]
    for thread in threads:
        thread.join(120)
    assert errors == [], errors
    assert sorted(outcome.values()) == ["aborted", "committed"], outcome
    for name, result in outcome.items():
        kept = result == "committed"
        assert _payloads(name) == ([1, 2] if kept else [])
        assert Order.objects.filter(customer_email=f"{name}@example.com").exists() is kept
