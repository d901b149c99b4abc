"""Per-key FIFO: one message per key in flight, in id order; insert order versus commit order; scheduling."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from psycopg import pq

from django_outbox import PermanentDeliveryError, outbox, store
from django_outbox.models import Message
from django_outbox.testing import relay_all
from testproject.shop.models import Order
from tests.support.database import needs_session_listen, neighbour_transaction
from tests.support.threads import in_thread
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
    """Relay until ``condition()`` holds (a failed attempt's backoff, another thread's commit)."""

    def relayed():
        relay_all()
        return condition()

    wait_for(relayed, timeout=timeout, interval=0.02)


def keyed(log, key):
    return [n for k, n in log if k == key]


def claim(limit: int = 100) -> list[Message]:
    return store.claim("default", worker="test-worker", limit=limit, lease_seconds=60)


def test_a_claim_takes_each_keys_consecutive_messages_and_every_keyless_message(log):
    a1 = outbox.send("ord.x", {"n": 1}, key="A")
    a2 = outbox.send("ord.x", {"n": 2}, key="A")
    b1 = outbox.send("ord.x", {"n": 1}, key="B")
    free = [outbox.send("ord.x", {"n": n}) for n in range(3)]
    a3 = outbox.send("ord.x", {"n": 3}, key="A")
    claimed: list[Message] = []
    wait_for(lambda: claimed.extend(claim()) or len(claimed) >= 7, timeout=20)
    assert [m.id for m in claimed] == sorted([a1.id, a2.id, a3.id, b1.id, *(m.id for m in free)])
    assert {m.status for m in Message.objects.all()} == {"processing"}
    a4 = outbox.send("ord.x", {"n": 4}, key="A")
    assert claim() == [], "A's fourth message waits while the ones before it are processing"
    store.release("default", worker="test-worker", message_ids=[a1.id, a2.id, a3.id])
    assert [m.id for m in claim()] == [a1.id, a2.id, a3.id, a4.id]


@override_settings(OUTBOX={"KEY_BATCH_SIZE": 2, "MAX_ATTEMPTS": 5})
def test_key_batch_size_caps_a_keys_run_in_one_claim(log):
    sent = [outbox.send("ord.x", {"n": n}, key="A") for n in range(5)]
    other = outbox.send("ord.x", {"n": 0}, key="B")
    assert [m.id for m in claim()] == [sent[0].id, sent[1].id, other.id]
    assert claim() == []


def test_a_run_stops_at_a_scheduled_or_processing_message_of_its_key(log):
    a1 = outbox.send("ord.x", {"n": 1}, key="A")
    outbox.send("ord.x", {"n": 2}, key="A", delay=dt.timedelta(hours=1))
    outbox.send("ord.x", {"n": 3}, key="A")
    assert [m.id for m in claim()] == [a1.id]


def test_the_first_failure_in_a_keys_run_sends_the_rest_back_unchanged(log, settings):
    """A key's run is delivered in id order; the failed message is retried with its backoff, the ones
    after it go back to pending as if never claimed: no attempt counted, no attempt row."""
    settings.OUTBOX = {**settings.OUTBOX, "BACKOFF_BASE_SECONDS": 60, "BACKOFF_MAX_SECONDS": 60}
    a1 = outbox.send("ord.x", {"n": 1}, key="A")
    a2 = outbox.send("ord.x", {"n": 2, "fail_until": 1}, key="A")
    rest = [outbox.send("ord.x", {"n": n}, key="A") for n in (3, 4)]
    b1 = outbox.send("ord.x", {"n": 1}, key="B")
    relay_all()
    assert keyed(log, "A") == [1, 2] and keyed(log, "B") == [1]
    assert Message.objects.get(pk=a1.pk).status == "delivered"
    failed = Message.objects.get(pk=a2.pk)
    assert (failed.status, failed.attempts, failed.attempt_log.count()) == ("pending", 1, 1)
    assert failed.available_at > timezone.now() + dt.timedelta(seconds=30)
    for later in rest:
        row = Message.objects.get(pk=later.pk)
        assert (row.status, row.attempts, row.locked_by, row.attempt_log.count()) == ("pending", 0, None, 0)
    assert Message.objects.get(pk=b1.pk).status == "delivered"
    Message.objects.filter(pk=a2.pk).update(available_at=timezone.now())
    relay_until(lambda: keyed(log, "A") == [1, 2, 2, 3, 4])


def test_a_failing_head_holds_its_key_back_until_it_is_delivered(log, settings):
    # The test moves the retry forward itself: a backoff of the suite's default 0.05 s could run out while
    # relay_all() is still relaying, on a busy machine, and deliver the head again before the first check.
    settings.OUTBOX = {**settings.OUTBOX, "BACKOFF_BASE_SECONDS": 60, "BACKOFF_MAX_SECONDS": 60}
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
#
# Ids are taken at insert, rows appear at commit. send() with a key takes a transaction-scoped advisory
# lock on the key before the row takes its id, so a second sender of the key waits for the first to end:
# a key's ids are taken and committed in the same order, and a worker never sees a later id of a key
# while an earlier one is still invisible.


def _waiting_for_the_key(key: str) -> bool:
    """Whether a session of this database is queued for the advisory lock of ``key`` (any pooler)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objsubid = 2"
            " AND classid = %s::int8::oid AND objid = (hashtext(%s)::int8 & 4294967295)::oid"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            [store.KEY_LOCK_CLASS, key],
        )
        return cursor.fetchone() is not None


def _hold_open(inserted: threading.Event, release: threading.Event, *, roll_back: bool = False) -> threading.Thread:
    """In another connection: send ord.x n=1 on key K, then keep the transaction open until released."""

    def run() -> None:
        with transaction.atomic():
            outbox.send("ord.x", {"n": 1}, key="K")
            inserted.set()
            release.wait(30)
            transaction.set_rollback(roll_back)

    return in_thread(run)


@pytest.mark.parametrize("second_has_older_xid", [False, True], ids=["plain", "second-has-older-xid"])
def test_a_second_sender_of_a_key_waits_until_the_first_commits(postgres, log, second_has_older_xid):
    """The first insert of K commits last unless the second waits: it waits, then takes the higher id."""
    inserted, release, second_sent = threading.Event(), threading.Event(), threading.Event()
    first = _hold_open(inserted, release)
    sent: list[Message] = []

    def second_sender() -> None:
        with transaction.atomic():
            if second_has_older_xid:
                # This transaction takes its transaction id (by a business write) before the other one,
                # yet inserts its message after it: a rule on the inserting transaction's own id would fail.
                Order.objects.create(customer_email="a@example.com", item="mug")
            sent.append(outbox.send("ord.x", {"n": 2}, key="K"))
            second_sent.set()
            outbox.send("ord.x", {"n": 0})

    try:
        assert inserted.wait(10)
        second = in_thread(second_sender)
        wait_for(lambda: _waiting_for_the_key("K"), timeout=10)
        assert not second_sent.is_set(), "the second send() of K returned while the first's transaction is open"
        relay_all()
        assert log == [], "nothing is committed yet"
    finally:
        release.set()
        first.join(20)
    second.join(20)
    assert second_sent.is_set() and not second.is_alive()
    relay_until(lambda: len(log) == 3)
    assert keyed(log, "K") == [1, 2]
    assert Message.objects.get(key="K", payload__n=1).id < sent[0].id, "ids in commit order"


def test_a_rolled_back_first_sender_lets_the_second_go(postgres, log):
    inserted, release, second_sent = threading.Event(), threading.Event(), threading.Event()
    first = _hold_open(inserted, release, roll_back=True)
    try:
        assert inserted.wait(10)
        second = in_thread(lambda: (outbox.send("ord.x", {"n": 2}, key="K"), second_sent.set()))
        wait_for(lambda: _waiting_for_the_key("K"), timeout=10)
        assert not second_sent.is_set()
    finally:
        release.set()
        first.join(20)
    assert second_sent.wait(10)
    second.join(20)
    relay_until(lambda: log == [("K", 2)])


def test_senders_of_other_keys_and_without_a_key_do_not_wait(postgres, log):
    inserted, release, others_sent = threading.Event(), threading.Event(), threading.Event()
    first = _hold_open(inserted, release)
    try:
        assert inserted.wait(10)

        def others() -> None:
            with transaction.atomic():
                outbox.send("ord.x", {"n": 1}, key="L")
                outbox.send("ord.x", {"n": 9})
            others_sent.set()

        in_thread(others).join(20)
        assert others_sent.is_set(), "another key's or a keyless send() waited for K's open transaction"
        relay_until(lambda: set(log) == {(None, 9), ("L", 1)})
    finally:
        release.set()
        first.join(20)
    relay_until(lambda: len(log) == 3)


def test_a_keyed_message_is_claimed_while_another_database_holds_a_transaction_open(postgres, log):
    """The old commit-order fence waited for every transaction of the cluster; the key's lock waits for
    none but the key's own senders."""
    with neighbour_transaction() as neighbour:
        outbox.send("ord.x", {"n": 1}, key="K")
        relay_all()
        assert log == [("K", 1)], "the keyed message waited for another database's transaction"
        assert neighbour.info.transaction_status == pq.TransactionStatus.INTRANS


def test_concurrent_senders_of_one_key_are_delivered_in_commit_order_while_a_relay_claims(postgres, log):
    """Producers of one key that commit in every interleaving, each holding its transaction open for a
    moment after the insert, while the relay claims all along: the key's messages arrive in id order,
    each once. Without the lock a claim saw a later id committed before an earlier one."""
    producers, per_producer = 4, 8
    errors: list[BaseException] = []

    def produce(p: int) -> None:
        try:
            for i in range(per_producer):
                with transaction.atomic():
                    outbox.send("ord.x", {"n": p * 100 + i}, key="K")
                    time.sleep(0.001 * ((p + i) % 4))  # commits land in another order than inserts would
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [in_thread(lambda p=p: produce(p)) for p in range(producers)]
    while any(t.is_alive() for t in threads):
        relay_all()
    for thread in threads:
        thread.join(20)
    assert errors == []
    relay_until(lambda: len(log) == producers * per_producer)
    ids_in_delivery_order = [Message.objects.get(key="K", payload__n=n).id for n in keyed(log, "K")]
    assert ids_in_delivery_order == sorted(ids_in_delivery_order), "delivered out of id order"
    assert len(set(ids_in_delivery_order)) == producers * per_producer


def test_an_autocommit_send_takes_the_key_lock_in_its_own_statement(postgres, log):
    """In autocommit the lock and the insert share the statement's transaction: nothing stays held."""
    with CaptureQueriesContext(connection) as queries:
        outbox.send("ord.x", {"n": 1}, key="K")
    assert [q["sql"] for q in queries.captured_queries if "pg_advisory" in q["sql"]] != []
    assert len(queries.captured_queries) == 1, queries.captured_queries
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
        assert cursor.fetchone() == (0,)
    with transaction.atomic():
        outbox.send("ord.x", {"n": 2}, key="K")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FILTER (WHERE classid = %s::int8::oid AND mode = 'ExclusiveLock'),"
                " count(*) FILTER (WHERE classid = %s::int8::oid AND objid = 0 AND mode = 'ShareLock')"
                " FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted",
                [store.KEY_LOCK_CLASS, store.BATCH_LOCK_CLASS],
            )
            assert cursor.fetchone() == (1, 1), "the key's lock and the shared one, held until the transaction ends"


def test_send_takes_the_key_lock_before_the_row_id(postgres, log):
    """The order's premise: in send()'s INSERT, the row id is projected over the row that took the lock."""
    with CaptureQueriesContext(connection) as queries:
        outbox.send("ord.x", {"n": 1}, key="K")
    (insert,) = [q["sql"] for q in queries.captured_queries if "INSERT INTO django_outbox_message" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (VERBOSE, COSTS OFF) " + insert)
        lines = [row[0] for row in cursor.fetchall()]
    projects_id = next(line for line in lines if "nextval(" in line)
    takes_lock = next(line for line in lines if "Output: " in line and "pg_advisory_xact_lock(" in line)
    depth = lambda line: len(line) - len(line.lstrip())  # noqa: E731
    assert lines.index(takes_lock) > lines.index(projects_id) and depth(takes_lock) > depth(projects_id), lines


def test_a_keyless_send_takes_no_lock(postgres, log):
    with CaptureQueriesContext(connection) as queries:
        outbox.send("ord.x", {"n": 1})
    assert not any("pg_advisory" in q["sql"] for q in queries.captured_queries)


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


@pytest.mark.parametrize("limit", [7, 30], ids=["few-per-key", "runs"])
def test_concurrent_claims_never_split_a_keys_run(server_database, log, limit):
    """Two workers claiming at the same moment: a key's messages go to one of them, a run from the key's
    head, never a head to one and the messages after it to the other (SKIP LOCKED skips rows one by one,
    so the claim keeps a key's messages only as far as it locked every one before them). On MariaDB a
    batch of 7 over three keys takes their heads only, one of 30 their runs (``store.mysql.claim_runs``)."""
    for round_ in range(20):
        Message.objects.all().delete()
        sent = [outbox.send("ord.x", {"n": n}, key=f"K{n % 3}") for n in range(30)]
        by_key = {k: [m.id for m in sent if m.key == k] for k in ("K0", "K1", "K2")}
        barrier = threading.Barrier(2)
        results: dict[str, list[Message]] = {}
        errors: list[BaseException] = []

        def claimer(name: str, barrier: threading.Barrier = barrier, results: dict = results) -> None:
            barrier.wait(5)
            results[name] = store.claim("default", worker=name, limit=limit, lease_seconds=60)

        threads = [in_thread(lambda name=name: claimer(name), errors) for name in ("w1", "w2")]
        for thread in threads:
            thread.join(10)
        assert not errors, errors
        holders: dict[str, set[str]] = {}
        for name, claimed in results.items():
            for key, ids in by_key.items():
                mine = [m.id for m in claimed if m.key == key]
                if mine:
                    assert mine == ids[: len(mine)], f"round {round_}: {name} holds {mine} of {key} {ids}"
                    holders.setdefault(key, set()).add(name)
        assert all(len(names) == 1 for names in holders.values()), f"round {round_}: {holders}"
