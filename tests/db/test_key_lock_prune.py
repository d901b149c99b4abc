"""MariaDB/MySQL: housekeeping prunes ``django_outbox_key_lock``, raced against real producers.

A keyed ``send()`` there locks its key's row (inserting it the first time), so without pruning the table
keeps one row per key ever sent. Housekeeping deletes the rows of keys with no open message (pending,
processing, dead). It must never wait for a producer, never make a producer wait for more than its few
statements, and never let two producers of one key overlap (per-key commit order, docs/ordering.md).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction

from django_outbox import outbox
from django_outbox.models import Message
from django_outbox.retention import housekeeping
from django_outbox.store import mysql as store_mysql
from django_outbox.testing import relay_all
from tests.support.threads import in_thread, key_lock_waiters
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_archive")]


@pytest.fixture(autouse=True)
def _no_lock_rows(mysql) -> None:
    """The table has no model, so the test database's flush between tests leaves its rows: start empty."""
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {store_mysql.KEY_LOCK}")


def _lock_rows() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT `key` FROM {store_mysql.KEY_LOCK}")
        return {row[0] for row in cursor.fetchall()}


def test_housekeeping_prunes_the_rows_of_keys_with_no_open_message(mysql, handler):
    handler("prune.*", lambda message: None)
    outbox.send("prune.done", {}, key="delivered🔑")
    relay_all()
    outbox.send("prune.x", {}, key="pending", delay=3600)  # stays pending through the relay below
    dead = outbox.send("prune.x", {}, key="dead")
    Message.objects.filter(pk=dead.pk).update(status=Message.Status.DEAD)
    cancelled = outbox.send("prune.x", {}, key="cancelled")
    Message.objects.filter(pk=cancelled.pk).update(status=Message.Status.CANCELLED)
    assert _lock_rows() == {"delivered🔑", "pending", "dead", "cancelled"}
    report = housekeeping.run("default")
    assert report.key_locks_pruned == 2 and "pruned 2 key lock rows" in str(report)
    assert _lock_rows() == {"pending", "dead"}
    # The key is used again: its row comes back, and goes once the key is idle again.
    outbox.send("prune.done", {}, key="delivered🔑")
    assert "delivered🔑" in _lock_rows()
    relay_all()
    assert housekeeping.run("default").key_locks_pruned == 1
    assert _lock_rows() == {"pending", "dead"}


def test_pruning_walks_the_table_in_batches_and_stops_at_the_time_budget(mysql, handler):
    handler("prune.*", lambda message: None)
    outbox.send_many([{"topic": "prune.x", "payload": n, "key": f"k{n:02}"} for n in range(25)])
    relay_all()
    report = housekeeping.run("default", batch_size=10)
    assert report.key_locks_pruned == 25 and report.finished and _lock_rows() == set()
    outbox.send_many([{"topic": "prune.x", "payload": n, "key": f"k{n:02}"} for n in range(25)])
    relay_all()
    report = housekeeping.run("default", batch_size=10, time_budget=0)
    assert report.key_locks_pruned == 10 and not report.finished, "one batch, then the budget is spent"
    assert len(_lock_rows()) == 15


def test_a_row_an_open_producer_holds_is_skipped_not_waited_for(mysql, handler):
    """The key's earlier messages are delivered, so its row is a candidate; a producer holding it in an
    open transaction has an invisible message. Housekeeping skips the row (it does not wait), and once
    the producer commits, the key has an open message and its row is kept."""
    handler("prune.*", lambda message: None)
    outbox.send("prune.x", {"n": 0}, key="H")
    relay_all()
    errors: list[BaseException] = []
    sent, release = threading.Event(), threading.Event()

    def producer() -> None:
        with transaction.atomic():
            outbox.send("prune.x", {"n": 1}, key="H")
            sent.set()
            assert release.wait(60)

    thread = in_thread(producer, errors)
    try:
        assert sent.wait(60)
        started = time.monotonic()
        report = housekeeping.run("default")
        assert time.monotonic() - started < 10, "housekeeping waited for the producer's transaction"
        assert report.key_locks_pruned == 0 and _lock_rows() == {"H"}
        assert thread.is_alive() and not errors
    finally:
        release.set()
        thread.join(60)
    assert errors == []
    assert housekeeping.run("default").key_locks_pruned == 0, "the key has a pending message now"
    assert _lock_rows() == {"H"}
    relay_all()
    assert housekeeping.run("default").key_locks_pruned == 1 and _lock_rows() == set()


def test_a_producer_meeting_the_prune_waits_for_it_then_serialises_as_before(mysql, handler, monkeypatch):
    """Housekeeping is stopped while it holds the idle key's row, just before deleting it. A producer of
    the key waits (a few statements' worth in real life), then writes the row afresh once the delete is
    committed; a second producer of the key, while the first's transaction is open, still waits for it:
    deleting the row did not break the producers' queue."""
    handler("prune.*", lambda message: None)
    outbox.send("prune.x", {"n": 0}, key="H")
    relay_all()
    errors: list[BaseException] = []
    holding, release_prune = threading.Event(), threading.Event()
    real_delete = store_mysql._delete_key_locks

    def held_delete(conn: Any, cursor: Any, keys: list[str]) -> int:
        holding.set()
        assert release_prune.wait(60)
        return int(real_delete(conn, cursor, keys))

    monkeypatch.setattr(store_mysql, "_delete_key_locks", held_delete)
    reports: list[housekeeping.Report] = []
    pruner = in_thread(lambda: reports.append(housekeeping.run("default")), errors)
    first_sent, release_first, second_sent = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with transaction.atomic():
            outbox.send("prune.x", {"n": 1}, key="H")
            first_sent.set()
            assert release_first.wait(60)

    def second() -> None:
        with transaction.atomic():
            outbox.send("prune.x", {"n": 2}, key="H")
        second_sent.set()

    try:
        assert holding.wait(60)
        producer_one = in_thread(first, errors)
        wait_for(lambda: errors or key_lock_waiters() >= 1, timeout=60)
        assert not first_sent.is_set(), "the producer went past a row housekeeping holds"
        release_prune.set()
        pruner.join(60)
        assert reports and reports[0].key_locks_pruned == 1
        assert first_sent.wait(60)
        producer_two = in_thread(second, errors)
        wait_for(lambda: errors or key_lock_waiters() >= 1, timeout=60)
        assert not second_sent.is_set(), "a second producer of the key did not wait for the first"
    finally:
        release_prune.set()
        release_first.set()
    producer_one.join(60)
    producer_two.join(60)
    assert errors == [] and second_sent.is_set()
    assert _lock_rows() == {"H"}
    ones, twos = (Message.objects.get(key="H", payload__n=n) for n in (1, 2))
    assert ones.id < twos.id, "ids in commit order"


def test_producers_relay_and_housekeeping_at_once(mysql, handler):
    """Producers of a few keys (each holding its transaction a moment after sending), a relay delivering
    all along (so keys keep going idle) and housekeeping pruning in a loop, all on their own connections.
    No producer fails (no deadlock, no lock-wait timeout), two producers of a key are never both past
    send() with their transactions open, every message is written once and delivered in id order per key,
    and housekeeping pruned rows while the producers ran."""
    delivered: list[tuple[str, int]] = []
    handler("prune.*", lambda message: delivered.append((message.key, message.id)))
    keys = ["a", "b", "c"]
    producers, per_producer = 4, 15
    inside: dict[str, int] = dict.fromkeys(keys, 0)
    overlaps: list[str] = []
    guard = threading.Lock()
    errors: list[BaseException] = []
    stop = threading.Event()
    pruned = [0]

    def produce(p: int) -> None:
        for i in range(per_producer):
            key = keys[(p + i) % len(keys)]
            with transaction.atomic():
                outbox.send("prune.x", {"p": p, "i": i}, key=key)
                with guard:
                    inside[key] += 1
                    if inside[key] > 1:
                        overlaps.append(key)
                time.sleep(0.002 * ((p + i) % 3))
                with guard:
                    inside[key] -= 1

    def prune() -> None:
        while not stop.is_set():
            pruned[0] += housekeeping.run("default", batch_size=2).key_locks_pruned

    def relay() -> None:
        while not stop.is_set():
            relay_all()

    background = [in_thread(prune, errors), in_thread(relay, errors)]
    threads = [in_thread(lambda p=p: produce(p), errors) for p in range(producers)]
    for thread in threads:
        thread.join(180)
    wait_for(lambda: errors or len(delivered) >= producers * per_producer, timeout=120)
    stop.set()
    for thread in background:
        thread.join(60)
    assert errors == [], errors
    assert overlaps == [], f"two producers of a key were inside their transactions at once: {overlaps}"
    assert Message.objects.count() == producers * per_producer
    assert len(delivered) == producers * per_producer == len(set(delivered))
    for key in keys:
        ids = [message_id for k, message_id in delivered if k == key]
        assert ids == sorted(ids), f"key {key} delivered out of id order"
    assert pruned[0] > 0, "housekeeping never found an idle key to prune while the producers ran"
