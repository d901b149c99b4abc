"""Wake-ups: one NOTIFY per committed producing transaction, and workers that act on it at once."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from psycopg import pq

from django_outbox import outbox, store
from django_outbox.models import Message
from django_outbox.worker import Relay, RelayConfig
from tests.support.database import connect_raw, needs_session_listen, neighbour_transaction
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("postgres")]


@pytest.fixture
def listen():
    """A separate connection LISTENing on the outbox channel; returns a function that drains notifications."""
    conn = connect_raw(direct=True, autocommit=True)  # a LISTEN needs a session of its own
    conn.execute("LISTEN django_outbox")

    def received(wait: float = 0.5) -> int:
        return sum(1 for _ in conn.notifies(timeout=wait))

    yield received
    conn.close()


def test_one_notification_per_committed_transaction(listen):
    with transaction.atomic():
        for n in range(5):
            outbox.send("probe.created", {"n": n})
        assert listen(0.3) == 0  # nothing before the commit
    assert listen() == 1


def test_notification_rides_on_the_insert_no_extra_statement(listen):
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        outbox.send("probe.created", {"n": 1})
        outbox.send("probe.created", {"n": 2})
    statements = [q["sql"] for q in queries.captured_queries if "django_outbox_message" in q["sql"]]
    assert len(statements) == 2
    assert all("pg_notify" in sql for sql in statements)  # PostgreSQL folds them into one at commit
    # and no NOTIFY of its own after the commit (on_commit callbacks run inside the captured block)
    assert not any("pg_notify" in q["sql"] and "INSERT" not in q["sql"] for q in queries.captured_queries)
    assert listen() == 1


def test_no_notification_after_rollback(listen):
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox.send("probe.created", {})
        raise RuntimeError
    assert listen() == 0


def test_savepoint_rollback_then_send_again_still_notifies_once(listen):
    with transaction.atomic():
        try:
            with transaction.atomic():
                outbox.send("probe.created", {"n": 1})
                raise ValueError
        except ValueError:
            pass
        outbox.send("probe.created", {"n": 2})
    assert listen() == 1


def test_each_autocommit_send_notifies(listen):
    outbox.send("probe.created", {})
    outbox.send("probe.created", {})
    assert listen() == 2


def test_idempotent_repeat_does_not_notify_again(listen):
    outbox.send("probe.created", {}, idempotency_key="once")
    assert listen() == 1
    outbox.send("probe.created", {}, idempotency_key="once")
    assert listen() == 0


def test_notify_can_be_switched_off(listen):
    with override_settings(OUTBOX={"NOTIFY": False}):
        outbox.send("probe.created", {})
    assert listen() == 0


def _start_idle_worker(poll_interval: float, **overrides: object) -> tuple[Relay, threading.Thread]:
    relay = Relay(RelayConfig.from_settings(poll_interval=poll_interval, **overrides))
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    wait_for(lambda: relay.listener is not None, timeout=10)  # run() makes it, in the worker's thread
    assert relay.listener is not None
    wait_for(relay.listener.connected.is_set, timeout=10)
    time.sleep(0.3)  # let the delivery threads go idle
    return relay, thread


@needs_session_listen
def test_idle_worker_wakes_on_commit_not_on_poll(handler):
    delivered = threading.Event()
    handler("t.wake", lambda m: delivered.set())
    relay, thread = _start_idle_worker(poll_interval=60)
    try:
        with transaction.atomic():
            outbox.send("t.wake", {})
        # the poll interval is a minute: only the NOTIFY can explain a delivery within seconds
        assert delivered.wait(10)
    finally:
        relay.stop()
        thread.join(20)


@needs_session_listen
def test_listening_worker_goes_idle_after_a_short_batch_without_an_empty_claim(handler, monkeypatch):
    delivered = threading.Event()
    handler("t.wake", lambda m: delivered.set())
    claims: list[int] = []
    claim = store.claim
    monkeypatch.setattr(store, "claim", lambda *a, **k: claims.append(len(batch := claim(*a, **k))) or batch)
    # two delivery threads: one NOTIFY wakes one of them, so the other makes no empty claim either
    relay, thread = _start_idle_worker(poll_interval=60, concurrency=2)
    try:
        claims.clear()
        outbox.send("t.wake", {})
        assert delivered.wait(10)
        wait_for(lambda: Message.objects.get().status == "delivered")
        time.sleep(0.5)
        assert claims == [1]  # the wake-up's claim, and no empty one after it
    finally:
        relay.stop()
        thread.join(20)


@needs_session_listen
def test_one_notify_wakes_one_thread_and_its_full_batch_wakes_the_other(handler):
    threads: set[str] = set()

    def slow(message: Message) -> None:
        threads.add(threading.current_thread().name)
        time.sleep(0.002)

    handler("t.wake", slow)
    relay, thread = _start_idle_worker(poll_interval=60, concurrency=2, batch_size=20)
    try:
        with transaction.atomic():  # one transaction: one NOTIFY
            for n in range(200):
                outbox.send("t.wake", {"n": n})
        wait_for(lambda: not Message.objects.exclude(status="delivered").exists(), timeout=30)
        # With a minute's poll and one NOTIFY, the second thread can only have been woken by the first,
        # whose claim came back full.
        assert threads == {"outbox-delivery-0", "outbox-delivery-1"}
    finally:
        relay.stop()
        thread.join(20)


@needs_session_listen
def test_a_keyed_message_is_delivered_while_another_database_of_the_server_holds_a_transaction_open(handler):
    """Per-key order must not wait for unrelated transactions: a neighbour database's open write
    transaction (a batch job, a session left idle in transaction) once held every keyed message of the
    outbox back until it ended, since the commit-order fence waited for every xid of the cluster."""
    delivered = threading.Event()
    handler("t.keyed", lambda m: delivered.set())
    relay, thread = _start_idle_worker(poll_interval=60)
    try:
        with neighbour_transaction() as neighbour:
            outbox.send("t.keyed", {}, key="order-1")
            # with a minute's poll, only the NOTIFY's claim explains this, and it did not wait for the neighbour
            assert delivered.wait(10), "the keyed message waited for another database's transaction"
            assert neighbour.info.transaction_status == pq.TransactionStatus.INTRANS, "still open"
    finally:
        relay.stop()
        thread.join(20)


@needs_session_listen
def test_listening_worker_claims_again_at_once_after_a_keyed_batch(handler):
    """Recording the head of a key makes its next message claimable, and no NOTIFY says so."""
    seen: list[int] = []
    handler("t.wake", lambda m: seen.append(m.payload["n"]))
    relay, thread = _start_idle_worker(poll_interval=60)
    try:
        with transaction.atomic():
            for n in range(3):
                outbox.send("t.wake", {"n": n}, key="one-key")
        # one message of the key per claim; with a minute's poll, only claiming at once explains this
        wait_for(lambda: len(seen) == 3, timeout=15)
        assert seen == [0, 1, 2]
    finally:
        relay.stop()
        thread.join(20)


@needs_session_listen
def test_listener_reconnects_after_its_connection_is_killed(handler):
    delivered = threading.Event()
    handler("t.wake", lambda m: delivered.set())
    relay, thread = _start_idle_worker(poll_interval=60)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%%' "
                "AND datname = current_database()"
            )
            assert cursor.fetchone() is not None
        assert relay.listener is not None
        wait_for(lambda: not relay.listener.connected.is_set(), timeout=10)
        wait_for(relay.listener.connected.is_set, timeout=15)
        time.sleep(0.3)
        outbox.send("t.wake", {})
        assert delivered.wait(10)
        wait_for(lambda: Message.objects.get().status == "delivered")
    finally:
        relay.stop()
        thread.join(20)


def test_a_cancel_notifies_so_the_key_it_unblocks_moves_on_at_once(listen):
    head = outbox.send("probe.created", {"n": 1}, key="K")
    Message.objects.filter(pk=head.pk).update(status=Message.Status.DEAD)
    listen()  # the sends' own notifications
    store.cancel("default", [head.pk], reason="operator")
    assert listen() == 1
    store.cancel("default", [head.pk], reason="again")  # nothing changed: nothing to announce
    assert listen() == 0


@needs_session_listen
@needs_session_listen
def test_a_worker_of_another_topic_delivers_the_message_a_cancel_unblocked_without_polling(handler):
    delivered = threading.Event()
    handler("t.first", lambda m: None)
    handler("t.second", lambda m: delivered.set())
    head = outbox.send("t.first", {"n": 1}, key="K")
    Message.objects.filter(pk=head.pk).update(status=Message.Status.DEAD)
    outbox.send("t.second", {"n": 2}, key="K")  # held behind the dead head (ORDERING "block")
    relay, thread = _start_idle_worker(poll_interval=60, topics=("t.second",))
    try:
        assert not delivered.wait(1)
        store.cancel("default", [head.pk], reason="operator")
        assert delivered.wait(10), "only a wake-up explains a delivery within seconds, with a minute's poll"
    finally:
        relay.stop()
        thread.join(20)


@needs_session_listen
def test_a_key_that_spans_topics_hands_off_to_the_worker_of_the_next_topic_at_once(handler):
    """Workers split by --topics: recording the head of a key wakes the worker serving its next message."""
    delivered = threading.Event()
    handler("t.first", lambda m: None)
    handler("t.second", lambda m: delivered.set())
    second_worker, second_thread = _start_idle_worker(poll_interval=60, topics=("t.second",))
    first_worker, first_thread = _start_idle_worker(poll_interval=60, topics=("t.first",))
    try:
        with transaction.atomic():
            outbox.send("t.first", {"n": 1}, key="K")
            outbox.send("t.second", {"n": 2}, key="K")  # held behind the first until it is recorded
        assert delivered.wait(10), "only a wake-up explains a delivery within seconds, with a minute's poll"
    finally:
        for relay, thread in ((first_worker, first_thread), (second_worker, second_thread)):
            relay.stop()
            thread.join(20)


@needs_session_listen
def test_every_notification_rings_also_several_read_in_one_go():
    """The listener reads its socket through libpq directly: the notifications one commit sends arrive
    together and each one rings (a ring wakes one delivery thread), and the next is heard as well."""
    from django_outbox.conf import get_settings
    from django_outbox.worker.listener import Listener

    rings: list[float] = []
    listener = Listener("default", lambda: rings.append(time.monotonic()), lambda: False)
    listener.start()
    try:
        wait_for(listener.connected.is_set, timeout=10)
        wait_for(lambda: len(rings) >= 1, timeout=5)  # one ring on connecting: what was sent meanwhile
        time.sleep(0.2)
        before = len(rings)
        channel = get_settings().NOTIFY_CHANNEL
        with connect_raw(direct=True, autocommit=False) as sender:
            for payload in ("a", "b", "c"):  # distinct payloads: PostgreSQL folds only identical ones
                sender.execute("SELECT pg_notify(%s, %s)", [channel, payload])
            sender.commit()
            wait_for(lambda: len(rings) == before + 3, timeout=5)
            sender.execute("SELECT pg_notify(%s, 'd')", [channel])
            sender.commit()
            wait_for(lambda: len(rings) == before + 4, timeout=5)
        time.sleep(0.2)
        assert len(rings) == before + 4
    finally:
        listener.stop()
        listener.join(5)
    assert not listener.is_alive()
