"""Per-key FIFO: one message per key in flight, in id order; insert order versus commit order; scheduling."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_outbox import PermanentDeliveryError, outbox, store
from django_outbox.models import Message
from django_outbox.testing import relay_all
from testproject.shop.models import Order
from tests.support.database import needs_session_listen
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def log(handler):
    """Record (key, n) of every message the ``ord.*`` handler is given, failing where the payload says."""
    seen: list[tuple[str | None, int]] = []

    def record(message: Message) -> None:
        seen.append((message.key, message.payload["n"]))
        if message.payload.get("permanent"):
            raise PermanentDeliveryError("refused for good")
        if message.attempts <= message.payload.get("fail_until", 0):
            raise ConnectionError("destination down")

    handler("ord.*", record)
    return seen


def relay_until(condition, timeout: float = 60) -> None:
    """Relay until ``condition()`` holds. On PostgreSQL a keyed message waits for every transaction of the
    cluster that was open when a claim first saw it, so another session (even in another database) can
    delay it for a moment: keyed delivery is checked as "eventually, and in order", never as "at once"."""

    def relayed():
        relay_all()
        return condition()

    wait_for(relayed, timeout=timeout, interval=0.02)


def keyed(log, key):
    return [n for k, n in log if k == key]


def claim(limit: int = 100) -> list[Message]:
    return store.claim("default", worker="test-worker", limit=limit, lease_seconds=60)


def test_a_claim_takes_only_the_head_of_each_key_and_every_keyless_message(log):
    a1 = outbox.send("ord.x", {"n": 1}, key="A")
    outbox.send("ord.x", {"n": 2}, key="A")
    b1 = outbox.send("ord.x", {"n": 1}, key="B")
    free = [outbox.send("ord.x", {"n": n}) for n in range(3)]
    claimed: list[Message] = []
    wait_for(lambda: claimed.extend(claim()) or len(claimed) >= 5, timeout=20)
    assert sorted(m.id for m in claimed) == sorted([a1.id, b1.id, *(m.id for m in free)])
    assert claim() == [], "the second message of A waits while A's head is processing"


def test_a_failing_head_holds_its_key_back_until_it_is_delivered(log):
    outbox.send("ord.x", {"n": 1, "fail_until": 2}, key="A")
    outbox.send("ord.x", {"n": 2}, key="A")
    outbox.send("ord.x", {"n": 9})
    relay_until(lambda: keyed(log, "A") == [1])
    assert keyed(log, None) == [9]
    Message.objects.filter(status="pending").update(available_at=timezone.now())  # skip the backoff
    relay_until(lambda: keyed(log, "A") == [1, 1])
    Message.objects.filter(status="pending").update(available_at=timezone.now())
    relay_until(lambda: keyed(log, "A") == [1, 1, 1, 2])


def test_a_dead_head_blocks_its_key_until_cancelled(log):
    head = outbox.send("ord.x", {"n": 1, "permanent": True}, key="A")
    outbox.send("ord.x", {"n": 2}, key="A")
    outbox.send("ord.x", {"n": 1}, key="B")
    relay_until(lambda: sorted(log) == [("A", 1), ("B", 1)])
    relay_all()
    assert sorted(log) == [("A", 1), ("B", 1)]
    assert Message.objects.get(pk=head.pk).status == "dead"
    store.cancel("default", [head.pk], reason="operator gave up")
    relay_until(lambda: log[-1] == ("A", 2))


def test_a_retried_dead_head_is_delivered_before_the_rest_of_its_key(log):
    head = outbox.send("ord.x", {"n": 1, "permanent": True}, key="A")
    outbox.send("ord.x", {"n": 2}, key="A")
    relay_until(lambda: log == [("A", 1)])
    relay_all()
    assert log == [("A", 1)]
    Message.objects.filter(pk=head.pk).update(payload={"n": 1})  # the destination was fixed
    store.retry("default", [head.pk])
    relay_until(lambda: len(log) == 3)
    assert log == [("A", 1), ("A", 1), ("A", 2)]


@override_settings(OUTBOX={"ORDERING": "skip_dead", "MAX_ATTEMPTS": 5, "BACKOFF_BASE_SECONDS": 0.05})
def test_skip_dead_lets_the_key_move_on(log):
    outbox.send("ord.x", {"n": 1, "permanent": True}, key="A")
    outbox.send("ord.x", {"n": 2}, key="A")
    relay_until(lambda: len(log) == 2)
    assert log == [("A", 1), ("A", 2)]


def test_cancelled_messages_never_block(log):
    first = outbox.send("ord.x", {"n": 1}, key="A")
    store.cancel("default", [first.pk], reason="not needed")
    outbox.send("ord.x", {"n": 2}, key="A")
    relay_until(lambda: log == [("A", 2)])


def test_a_scheduled_head_holds_back_later_messages_of_its_key_but_nothing_else(log):
    outbox.send("ord.x", {"n": 1}, key="A", delay=dt.timedelta(hours=1))
    outbox.send("ord.x", {"n": 2}, key="A")
    outbox.send("ord.x", {"n": 1}, key="B")
    relay_until(lambda: log == [("B", 1)])
    relay_all()
    assert log == [("B", 1)]


def test_next_due_ignores_messages_held_behind_their_key(log):
    """An idle worker sleeps until something can become due, instead of spinning on held messages."""
    soon = timezone.now() + dt.timedelta(seconds=30)
    outbox.send("ord.x", {"n": 1}, key="A", available_at=soon)
    outbox.send("ord.x", {"n": 2}, key="A")  # due now, but held behind A:1
    due_in = store.next_due("default")  # seconds, on the database's clock
    assert due_in is not None and abs(due_in - (soon - store.database_now("default")).total_seconds()) < 0.05


# --- insert order is not commit order (PostgreSQL) ---------------------------------------------


def _hold_open(send_first: threading.Event, inserted: threading.Event, release: threading.Event) -> threading.Thread:
    """In another connection: send ord.x n=1 on key K, then keep the transaction open until released."""

    def run() -> None:
        try:
            send_first.wait(10)
            with transaction.atomic():
                outbox.send("ord.x", {"n": 1}, key="K")
                inserted.set()
                release.wait(20)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _first_insert_commits_last(log, *, second_has_older_xid: bool) -> None:
    send_first, inserted, release = threading.Event(), threading.Event(), threading.Event()
    thread = _hold_open(send_first, inserted, release)
    try:
        with transaction.atomic():
            if second_has_older_xid:
                # This transaction takes its transaction id (by a business write) before the other one,
                # yet inserts its message after it: a rule on the inserting transaction's own id would fail.
                Order.objects.create(customer_email="a@example.com", item="mug")
            send_first.set()
            assert inserted.wait(10)
            second = outbox.send("ord.x", {"n": 2}, key="K")
            outbox.send("ord.x", {"n": 0})
        relay_until(lambda: log == [(None, 0)])
        time.sleep(0.2)
        relay_all()
        assert log == [(None, 0)], "only the keyless message may go while K's lower id is uncommitted"
        assert Message.objects.get(pk=second.pk).status == "pending"
    finally:
        release.set()
        thread.join(20)
    relay_until(lambda: len(log) == 3)
    assert log == [(None, 0), ("K", 1), ("K", 2)]
    first = Message.objects.get(key="K", payload__n=1)
    assert first.id < second.id, "the message inserted first has the lower id but committed last"


def test_a_key_waits_for_a_lower_id_whose_transaction_is_still_open(postgres, log):
    _first_insert_commits_last(log, second_has_older_xid=False)


def test_a_key_waits_even_when_the_later_insert_has_the_older_transaction(postgres, log):
    _first_insert_commits_last(log, second_has_older_xid=True)


def test_a_rolled_back_lower_id_does_not_block_its_key(postgres, log):
    inserted, release = threading.Event(), threading.Event()

    def run() -> None:
        try:
            with transaction.atomic():
                outbox.send("ord.x", {"n": 1}, key="K")
                inserted.set()
                release.wait(20)
                transaction.set_rollback(True)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    assert inserted.wait(10)
    outbox.send("ord.x", {"n": 2}, key="K")
    relay_all()
    time.sleep(0.2)
    relay_all()
    assert log == []
    release.set()
    thread.join(20)
    relay_until(lambda: log == [("K", 2)])


def test_send_takes_the_transaction_id_before_the_row_id(postgres, log):
    """The fence's premise: in send()'s INSERT, the row id is projected over the row that took the xid."""
    with CaptureQueriesContext(connection) as queries:
        outbox.send("ord.x", {"n": 1}, key="K")
    (insert,) = [q["sql"] for q in queries.captured_queries if "INSERT INTO django_outbox_message" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (VERBOSE, COSTS OFF) " + insert)
        lines = [row[0] for row in cursor.fetchall()]
    projects_id = next(line for line in lines if "nextval(" in line)
    takes_xid = next(line for line in lines if "Output: pg_current_xact_id()" in line)
    depth = lambda line: len(line) - len(line.lstrip())  # noqa: E731
    assert lines.index(takes_xid) > lines.index(projects_id) and depth(takes_xid) > depth(projects_id), lines


# --- scheduling --------------------------------------------------------------------------------


@needs_session_listen
def test_a_sleeping_worker_wakes_for_the_next_due_message_not_the_poll(worker_process):
    due_in = 1.5
    message = outbox.send("probe.scheduled", {"n": 1}, delay=due_in)
    worker = worker_process("--poll-interval", "30")
    # the handler's row appears before the outcome is recorded: wait for the recorded outcome (the
    # generous timeout covers a worker process that starts slowly on a loaded machine; the assertion
    # below is what the test is about)
    wait_for(lambda: Message.objects.filter(pk=message.pk, status="delivered").exists(), timeout=due_in + 60)
    message.refresh_from_db()
    assert message.delivered_at >= message.available_at
    assert (message.delivered_at - message.available_at).total_seconds() < 10, "well before the 30 s poll"
    if connection.vendor == "postgresql":
        # An idle worker told of a new message by NOTIFY goes back to sleep until that message is due.
        time.sleep(0.5)
        later = outbox.send("probe.scheduled", {"n": 2}, delay=due_in)
        wait_for(lambda: Message.objects.filter(pk=later.pk, status="delivered").exists(), timeout=due_in + 60)
        later.refresh_from_db()
        assert later.delivered_at >= later.available_at
        assert (later.delivered_at - later.available_at).total_seconds() < 10
    worker.stop()
