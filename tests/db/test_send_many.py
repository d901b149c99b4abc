"""``outbox.send_many()``: many messages in one ``INSERT``, with ``send()``'s validation,
idempotency, per-key order, key locks and one ``NOTIFY`` per transaction."""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import random
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_outbox import (
    IdempotencyConflictError,
    PayloadTooLargeError,
    UnknownTopicError,
    outbox,
    store,
)
from django_outbox.models import Message
from django_outbox.retention import housekeeping
from django_outbox.testing import relay_all
from testproject.shop.models import Order
from tests.support.database import connect_raw, connect_raw_mysql
from tests.support.threads import in_thread
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

Register = Callable[[str, Callable[..., object]], None]


def inserts(queries: CaptureQueriesContext) -> list[str]:
    return [
        q["sql"] for q in queries.captured_queries if "INSERT INTO" in q["sql"] and "django_outbox_message" in q["sql"]
    ]


def test_one_insert_writes_every_message_in_order_and_returns_them_as_stored():
    items = [{"topic": "probe.created", "payload": {"n": n}, "key": f"k{n % 3}"} for n in range(100)]
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        Order.objects.create(customer_email="a@example.com", item="mug")
        sent = outbox.send_many(items)
    assert len(inserts(queries)) == 1
    assert [m.payload for m in sent] == [{"n": n} for n in range(100)]
    assert [m.id for m in sent] == sorted(m.id for m in sent), "ids in the batch's order"
    stored = {m.id: m for m in Message.objects.all()}
    assert len(stored) == 100
    for message in sent:
        row = stored[message.id]
        for field in ("uuid", "topic", "key", "payload", "headers", "status", "attempts", "max_attempts"):
            assert getattr(message, field) == getattr(row, field), field
        assert message.created_at == row.created_at and message.available_at == row.available_at


def test_ids_follow_the_batch_when_the_idempotency_keys_sort_otherwise():
    items = [{"topic": "probe.created", "payload": n, "key": "k", "idempotency_key": f"i{9 - n}"} for n in range(10)]
    sent = outbox.send_many(items)
    assert [m.payload for m in sent] == list(range(10))
    assert [m.id for m in sent] == sorted(m.id for m in sent)
    assert list(Message.objects.order_by("id").values_list("payload", flat=True)) == list(range(10))


def test_each_item_takes_sends_arguments():
    at = timezone.now() + dt.timedelta(hours=2)
    sent = outbox.send_many(
        [
            {"topic": "probe.created", "payload": [1, 2.5, None], "headers": {"x-a": "b"}, "max_attempts": 2},
            {"topic": "probe.created", "payload": "text", "delay": 3600, "idempotency_key": "i-1"},
            {"topic": "probe.created", "payload": 7, "available_at": at, "key": "K"},
            {"topic": "probe.created", "payload": {}, "delay": dt.timedelta(0)},
        ]
    )
    rows = [Message.objects.get(pk=m.pk) for m in sent]
    assert rows[0].payload == [1, 2.5, None] and rows[0].headers == {"x-a": "b"} and rows[0].max_attempts == 2
    assert rows[1].idempotency_key == "i-1"
    delay = (rows[1].available_at - rows[1].created_at).total_seconds()
    assert delay == pytest.approx(3600, abs=0.01)
    assert rows[2].available_at == at and rows[2].key == "K"
    assert rows[3].available_at == rows[3].created_at
    assert [m.available_at for m in sent] == [r.available_at for r in rows]


def test_an_empty_batch_writes_nothing_and_asks_nothing():
    with CaptureQueriesContext(connection) as queries:
        assert outbox.send_many([]) == []
    assert queries.captured_queries == []


def test_any_iterable_of_dicts_is_taken():
    sent = outbox.send_many({"topic": "probe.created", "payload": n} for n in range(3))
    assert [m.payload for m in sent] == [0, 1, 2]


# --- validation: every item before anything is written -------------------------------------------------

BAD_ITEMS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"topic": "probe.created", "payload": math.nan}, TypeError, "NaN"),
    ({"topic": "probe.created", "payload": {}, "key": 5}, TypeError, "key must be a string"),
    ({"topic": "", "payload": {}}, ValueError, "topic must be a non-empty string"),
    ({"topic": "probe.created", "payload": {}, "max_attempts": 0}, ValueError, "max_attempts"),
    ({"topic": "probe.created", "payload": {}, "delay": -1}, ValueError, "delay"),
    ({"topic": "probe.created", "payload": {}, "delay": 1, "available_at": timezone.now()}, ValueError, "not both"),
    ({"topic": "probe.created", "payload": {}, "headers": {"a b": "c"}}, ValueError, "header name"),
    ({"topic": "probe.created", "payload": "x" * 2_000_000}, PayloadTooLargeError, "MAX_PAYLOAD_BYTES"),
    ({"topic": "nobody.serves.this", "payload": {}}, UnknownTopicError, "nobody.serves.this"),
    ({"topic": "probe.created", "payload": {}, "kee": "typo"}, TypeError, "unknown argument(s) ['kee']"),
    ({"topic": "probe.created", "payload": {}, "using": "other"}, TypeError, "argument of send_many() itself"),
    ({"topic": "probe.created"}, TypeError, "lacks payload"),
    ({"payload": {}}, TypeError, "lacks topic"),
]


@pytest.mark.parametrize(("bad", "error", "says"), BAD_ITEMS, ids=[s for _, _, s in BAD_ITEMS])
def test_a_bad_57th_item_writes_nothing_and_names_itself(bad, error, says):
    items: list[Any] = [{"topic": "probe.created", "payload": {"n": n}, "key": "K"} for n in range(100)]
    items[56] = bad
    with transaction.atomic():
        Order.objects.create(customer_email="a@example.com", item="before")
        with pytest.raises(error) as raised:
            outbox.send_many(items)
        Order.objects.create(customer_email="a@example.com", item="after")  # the transaction goes on
    assert str(raised.value).startswith("outbox.send_many(): item 56"), str(raised.value)
    assert says in str(raised.value)
    assert Message.objects.count() == 0
    assert Order.objects.count() == 2


def test_the_same_error_class_as_send_would_raise():
    for bad, _, _ in BAD_ITEMS:
        if set(bad) - {"topic", "payload", "key", "headers", "delay", "available_at", "max_attempts"} or len(bad) < 2:
            continue  # send_many()'s own checks of the item's shape
        with pytest.raises(Exception) as by_send:
            outbox.send(**bad)
        with pytest.raises(Exception) as by_send_many:
            outbox.send_many([bad])
        assert type(by_send_many.value) is type(by_send.value)
        assert by_send_many.value.__cause__ is not None


@pytest.mark.parametrize("batch", [{"topic": "probe.created", "payload": {}}, "probe.created", None, 5])
def test_a_batch_that_is_not_a_list_of_dicts_is_refused(batch):
    with pytest.raises(TypeError, match=r"outbox.send_many\(\)"):
        outbox.send_many(batch)


def test_a_non_dict_item_is_refused_by_number():
    with pytest.raises(TypeError, match=r"item 1 must be a dict"):
        outbox.send_many([{"topic": "probe.created", "payload": 1}, ("probe.created", 2)])
    assert Message.objects.count() == 0


def test_an_unknown_database_is_refused():
    with pytest.raises(ValueError, match="using='nope'"):
        outbox.send_many([{"topic": "probe.created", "payload": 1}], using="nope")


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_using_writes_the_batch_on_that_database():
    sent = outbox.send_many([{"topic": "probe.created", "payload": n} for n in range(3)], using="other")
    assert Message.objects.using("other").count() == 3 and Message.objects.count() == 0
    assert all(m._state.db == "other" for m in sent)


# --- idempotency -----------------------------------------------------------------------------------


def test_a_stored_key_returns_the_stored_message_and_the_rest_is_written():
    first = outbox.send("probe.created", {"n": 1}, idempotency_key="once")
    sent = outbox.send_many(
        [
            {"topic": "probe.created", "payload": {"n": 0}},
            {"topic": "probe.created", "payload": {"n": 1.0}, "idempotency_key": "once"},  # 1 and 1.0: one number
            {"topic": "probe.created", "payload": {"n": 2}, "idempotency_key": "twice"},
        ]
    )
    assert sent[1].pk == first.pk and sent[1].uuid == first.uuid
    assert Message.objects.count() == 3
    assert Message.objects.get(idempotency_key="twice").pk == sent[2].pk


def test_a_stored_key_with_other_content_raises_and_writes_nothing_of_the_batch():
    first = outbox.send("probe.created", {"n": 1}, idempotency_key="once")
    with transaction.atomic():
        with pytest.raises(IdempotencyConflictError) as raised:
            outbox.send_many(
                [
                    {"topic": "probe.created", "payload": {"n": 0}, "key": "K"},
                    {"topic": "probe.created", "payload": {"n": 2}, "idempotency_key": "once"},
                ]
            )
        Order.objects.create(customer_email="a@example.com", item="after")  # the transaction goes on
    assert raised.value.existing is not None and raised.value.existing.pk == first.pk
    assert list(Message.objects.values_list("pk", flat=True)) == [first.pk]
    assert Order.objects.count() == 1


def test_in_autocommit_a_conflict_leaves_nothing_committed():
    outbox.send("probe.created", {"n": 1}, idempotency_key="once")
    with pytest.raises(IdempotencyConflictError):
        outbox.send_many(
            [
                {"topic": "probe.created", "payload": {"n": 0}},
                {"topic": "probe.created", "payload": {"n": 2}, "idempotency_key": "once"},
            ]
        )
    assert Message.objects.count() == 1


def test_a_key_repeated_within_the_batch_with_the_same_content_is_written_once():
    sent = outbox.send_many(
        [
            {"topic": "probe.created", "payload": {"n": 1}, "idempotency_key": "once"},
            {"topic": "probe.created", "payload": {"n": 2}},
            {"topic": "probe.created", "payload": {"n": 1}, "idempotency_key": "once"},
        ]
    )
    assert sent[0] is sent[2]
    assert Message.objects.count() == 2


def test_a_key_repeated_within_the_batch_with_other_content_raises_before_writing():
    with pytest.raises(IdempotencyConflictError, match="item 2 repeats the idempotency_key 'once' of item 0") as raised:
        outbox.send_many(
            [
                {"topic": "probe.created", "payload": {"n": 1}, "idempotency_key": "once"},
                {"topic": "probe.created", "payload": {"n": 2}},
                {"topic": "probe.created", "payload": {"n": 1}, "idempotency_key": "once", "key": "other"},
            ]
        )
    assert raised.value.existing is None
    assert Message.objects.count() == 0


def test_a_repeated_batch_returns_the_first_batchs_messages():
    items = [{"topic": "probe.created", "payload": {"n": n}, "idempotency_key": f"i-{n}"} for n in range(20)]
    first = outbox.send_many(items)
    again = outbox.send_many(items)
    assert [m.pk for m in again] == [m.pk for m in first]
    assert Message.objects.count() == 20


# --- delivery, order, notifications ----------------------------------------------------------------------


def test_a_keys_messages_are_delivered_in_the_batchs_order(handler: Register):
    seen: list[tuple[str | None, int]] = []
    handler("batch.*", lambda m: seen.append((m.key, m.payload)))
    outbox.send_many([{"topic": "batch.x", "payload": n, "key": ["A", "B"][n % 2]} for n in range(10)])
    wait_for(lambda: relay_all() or len(seen) == 10, timeout=30)
    assert [n for k, n in seen if k == "A"] == [0, 2, 4, 6, 8]
    assert [n for k, n in seen if k == "B"] == [1, 3, 5, 7, 9]


def test_eager_delivers_the_batch_at_commit(handler: Register, settings: Any):
    seen: list[int] = []
    handler("batch.*", lambda m: seen.append(m.payload))
    with override_settings(OUTBOX={**settings.OUTBOX, "EAGER": True}):
        with transaction.atomic():
            outbox.send_many([{"topic": "batch.x", "payload": n, "key": "K"} for n in range(3)])
            assert seen == []
        assert seen == [0, 1, 2]


def test_a_batch_of_ten_thousand_is_written():
    sent = outbox.send_many([{"topic": "probe.created", "payload": {"n": n}} for n in range(10_000)])
    assert len({m.id for m in sent}) == 10_000 == Message.objects.count()


@pytest.fixture
def listen(postgres: None) -> Iterator[Callable[[float], int]]:
    conn = connect_raw(direct=True, autocommit=True)
    conn.execute("LISTEN django_outbox")

    def received(wait: float = 0.5) -> int:
        return sum(1 for _ in conn.notifies(timeout=wait))

    yield received
    conn.close()


def test_one_notification_per_transaction(listen: Callable[[float], int]):
    outbox.send_many([{"topic": "probe.created", "payload": n} for n in range(100)])
    assert listen(0.5) == 1
    with transaction.atomic():
        outbox.send_many([{"topic": "probe.created", "payload": n} for n in range(10)])
        outbox.send("probe.created", {})
        outbox.send_many([{"topic": "probe.created", "payload": n} for n in range(10)])
        assert listen(0.3) == 0
    assert listen(0.5) == 1
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox.send_many([{"topic": "probe.created", "payload": 1}])
        raise RuntimeError
    assert listen(0.5) == 0
    items = [{"topic": "probe.created", "payload": n, "idempotency_key": f"i{n}"} for n in range(3)]
    outbox.send_many(items)
    assert listen(0.5) == 1
    outbox.send_many(items)  # nothing new: nothing to announce
    assert listen(0.5) == 0


# --- SQLite: chunks under the bound-variable limit -----------------------------------------------------


@pytest.fixture
def small_sqlite_limit() -> Iterator[None]:
    """The connection's real limit on bound variables, lowered so a batch of 7 needs 4 statements."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's limit on bound variables")
    connection.ensure_connection()
    raw = connection.connection
    before = raw.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 20)  # 2 rows of 9 values
    yield
    raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, before)


def test_sqlite_writes_a_batch_over_the_variable_limit_in_chunks(small_sqlite_limit: None):
    with CaptureQueriesContext(connection) as queries:
        sent = outbox.send_many([{"topic": "probe.created", "payload": n, "key": "K"} for n in range(7)])
    assert len(inserts(queries)) == 4
    assert [m.payload for m in sent] == list(range(7))
    assert list(Message.objects.order_by("id").values_list("payload", flat=True)) == list(range(7))


def test_sqlite_chunks_are_one_transaction_in_autocommit(small_sqlite_limit: None):
    outbox.send("probe.created", {"n": 1}, idempotency_key="once")
    items: list[dict[str, Any]] = [{"topic": "probe.created", "payload": n} for n in range(6)]
    items.append({"topic": "probe.created", "payload": {"n": 2}, "idempotency_key": "once"})  # the 4th chunk
    with pytest.raises(IdempotencyConflictError):
        outbox.send_many(items)
    assert Message.objects.count() == 1, "the first three chunks were taken back"


# --- PostgreSQL: a batch larger than one document --------------------------------------------------------


@pytest.fixture
def small_pg_document(postgres: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The size one statement's document may reach, lowered from 64 MiB so a batch of 7 needs several."""
    from django_outbox.store import producing

    monkeypatch.setattr(producing, "_PG_DOCUMENT_BYTES", 2 * (512 + 300))


def test_postgres_writes_a_batch_larger_than_one_document_in_several_statements(small_pg_document: None):
    items = [{"topic": "probe.created", "payload": {"n": n, "pad": "x" * 200}, "key": "K"} for n in range(7)]
    with CaptureQueriesContext(connection) as queries:
        sent = outbox.send_many(items)
    assert len(inserts(queries)) == 4
    assert [m.payload["n"] for m in sent] == list(range(7))
    stored = Message.objects.order_by("id")
    assert [m.payload["n"] for m in stored] == list(range(7)), "ids in the batch's order across statements"
    assert [m.uuid for m in stored] == [m.uuid for m in sent]


def test_postgres_statements_of_one_batch_are_one_transaction_in_autocommit(small_pg_document: None):
    outbox.send("probe.created", {"n": 1}, idempotency_key="once")
    items: list[dict[str, Any]] = [{"topic": "probe.created", "payload": {"n": n, "pad": "x" * 200}} for n in range(6)]
    items.append({"topic": "probe.created", "payload": {"n": 2}, "idempotency_key": "once"})  # the last statement
    with pytest.raises(IdempotencyConflictError):
        outbox.send_many(items)
    assert Message.objects.count() == 1, "the earlier statements were taken back"


def test_json_null_and_scalar_payloads_are_stored_as_json(postgres: None):
    payloads: list[Any] = [None, "text", 3, 2.5, True, [], {}, [None], {"a": None}]
    sent = outbox.send_many([{"topic": "probe.created", "payload": p} for p in payloads])
    assert [m.payload for m in sent] == payloads
    with connection.cursor() as cursor:
        cursor.execute("SELECT jsonb_typeof(payload) FROM django_outbox_message ORDER BY id")
        kinds = [row[0] for row in cursor.fetchall()]
    assert kinds == ["null", "string", "number", "number", "boolean", "array", "object", "array", "object"]


# --- PostgreSQL: the keys' locks ---------------------------------------------------------------------------


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_the_keys_are_locked_before_any_row_takes_its_id(postgres: None, idempotent: bool):
    # with idempotency keys the ids are drawn first, in the batch's order, and the rows written in the
    # order of their idempotency keys: the locks must still come before the first id
    extra = lambda n: {"idempotency_key": f"i{-n}"} if idempotent else {}  # noqa: E731
    with CaptureQueriesContext(connection) as queries:
        outbox.send_many([{"topic": "probe.created", "payload": n, "key": f"k{n}", **extra(n)} for n in range(3)])
    (insert,) = inserts(queries)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (VERBOSE, COSTS OFF) " + insert)
        lines = [row[0] for row in cursor.fetchall()]
    projects_id = next(line for line in lines if "nextval(" in line)
    takes_locks = next(line for line in lines if "pg_advisory_xact_lock(" in line)
    depth = lambda line: len(line) - len(line.lstrip())  # noqa: E731
    assert lines.index(takes_locks) > lines.index(projects_id) and depth(takes_locks) > depth(projects_id), lines


def test_a_batch_locks_each_key_once_and_keeps_them_to_commit(postgres: None):
    with transaction.atomic():
        outbox.send_many([{"topic": "probe.created", "payload": n, "key": f"k{n % 4}"} for n in range(40)])
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FILTER (WHERE classid = %s::int8::oid AND mode = 'ExclusiveLock'),"
                " count(*) FILTER (WHERE classid = %s::int8::oid AND objid = 0 AND mode = 'ShareLock')"
                " FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted",
                [store.KEY_LOCK_CLASS, store.BATCH_LOCK_CLASS],
            )
            assert cursor.fetchone() == (4, 1), "a lock per key, and the one every keyed producer shares"
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
        assert cursor.fetchone() == (0,)


def _lock_numbers(*keys: str) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT hashtext(k) FROM unnest(%s::text[]) AS k", [list(keys)])
        return [row[0] for row in cursor.fetchall()]


def test_keys_are_locked_in_the_order_of_their_lock_not_of_the_list(postgres: None):
    """A batch [Y, X] whose X is held elsewhere waits for X without holding Y: it takes X's lock first,
    as every batch does, so two batches with overlapping keys cannot each hold what the other waits for."""
    first, second = sorted(["alpha", "beta", "gamma", "delta"], key=lambda k: _lock_numbers(k)[0])[:2]
    held, release = threading.Event(), threading.Event()

    def hold_first() -> None:
        with transaction.atomic():
            outbox.send("probe.created", {}, key=first)
            held.set()
            release.wait(30)

    holder = in_thread(hold_first)
    try:
        assert held.wait(10)
        batch_done, other_done = threading.Event(), threading.Event()

        def send_batch() -> None:
            items = [
                {"topic": "probe.created", "payload": 1, "key": second},
                {"topic": "probe.created", "payload": 2, "key": first},
            ]
            outbox.send_many(items)
            batch_done.set()

        def send_other() -> None:
            outbox.send("probe.created", {}, key=second)
            other_done.set()

        batch = in_thread(send_batch)
        wait_for(lambda: _waiting_sessions() == 1, timeout=10)
        other = in_thread(send_other)
        assert other_done.wait(10), "the batch held the later key while it waited for the earlier one"
        other.join(10)
        assert not batch_done.is_set()
    finally:
        release.set()
        holder.join(20)
    assert batch_done.wait(10)
    batch.join(10)


def _waiting_sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return int(cursor.fetchone()[0])


def test_batches_with_overlapping_keys_in_any_order_never_deadlock(server_database: None):
    keys = [f"key-{n}" for n in range(12)]
    errors: list[BaseException] = []

    def produce(seed: int) -> None:
        shuffled = random.Random(seed)
        try:
            for _ in range(15):
                picked = shuffled.sample(keys, 8)
                with transaction.atomic():
                    outbox.send_many([{"topic": "probe.created", "payload": 0, "key": k} for k in picked])
        except DatabaseError as exc:  # a deadlock PostgreSQL broke (after deadlock_timeout)
            errors.append(exc)

    threads = [in_thread(functools.partial(produce, seed)) for seed in range(4)]
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert Message.objects.count() == 4 * 15 * 8


def _blocked(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT cardinality(pg_blocking_pids(%s)) > 0", [pid])
        return bool(cursor.fetchone()[0])


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def test_batches_with_overlapping_idempotency_keys_in_opposite_orders_never_deadlock(postgres: None):
    """Batch A = [i1, gate-a, i2], batch B = [i2, gate-b, i1]. A third transaction holds both gates
    (uncommitted rows with those idempotency keys), so A has written i1 and B i2 when each stops at its
    gate. Released, A would wait for B's i2 and B for A's i1: a deadlock PostgreSQL breaks by failing
    one. Each batch must take its idempotency keys in one fixed order before it writes any row."""
    gates_held, release = threading.Event(), threading.Event()

    def hold_gates() -> None:
        with transaction.atomic():
            outbox.send("probe.created", {}, idempotency_key="gate-a")
            outbox.send("probe.created", {}, idempotency_key="gate-b")
            gates_held.set()
            release.wait(30)
            transaction.set_rollback(True)

    def item(idempotency_key: str) -> dict[str, Any]:
        return {"topic": "probe.created", "payload": {"for": idempotency_key}, "idempotency_key": idempotency_key}

    pids: dict[str, int] = {}
    sent: dict[str, list[Message]] = {}
    errors: list[BaseException] = []

    def batch(name: str, keys: list[str]) -> None:
        pids[name] = _backend_pid()
        try:
            with transaction.atomic():
                sent[name] = outbox.send_many([item(k) for k in keys])
        except DatabaseError as exc:
            errors.append(exc)

    holder = in_thread(hold_gates)
    try:
        assert gates_held.wait(10)
        a = in_thread(functools.partial(batch, "a", ["i1", "gate-a", "i2"]))
        b = in_thread(functools.partial(batch, "b", ["i2", "gate-b", "i1"]))
        wait_for(lambda: len(pids) == 2 and _blocked(pids["a"]) and _blocked(pids["b"]), timeout=20)
    finally:
        release.set()
        holder.join(20)
    a.join(30)
    b.join(30)
    assert not a.is_alive() and not b.is_alive()
    assert errors == []
    assert [m.idempotency_key for m in sent["a"]] == ["i1", "gate-a", "i2"]
    assert {m.idempotency_key: m.id for m in sent["a"]}["i1"] == {m.idempotency_key: m.id for m in sent["b"]}["i1"]
    assert Message.objects.count() == 4


def test_a_holder_archived_mid_batch_does_not_reorder_its_key(postgres: None, settings: Any):
    """[m1 (key k, idempotency key held by a delivered message H), m2 (key k)]: the INSERT skips m1 (H holds
    its key) and, here, waits for another transaction's uncommitted row before it writes m2. Housekeeping
    archives H meanwhile, so when the batch looks H up it is gone and m1 must be written after all. m1
    must still come before m2 in the key's order (a lower id), as the batch lists them. (The rows are
    written in the order of their idempotency keys: m1's, "a-held", is looked at before m2's waits.)"""
    settings.OUTBOX = {**settings.OUTBOX, "RETENTION_MODE": "archive", "ARCHIVE_AFTER": dt.timedelta(seconds=1)}
    holder = outbox.send("probe.created", {"n": 1}, key="k", idempotency_key="a-held")
    Message.objects.filter(pk=holder.pk).update(status="delivered", delivered_at=timezone.now())
    gate_held, release = threading.Event(), threading.Event()

    def hold_gate() -> None:
        with transaction.atomic():
            outbox.send("probe.created", {}, idempotency_key="z-gate")
            gate_held.set()
            release.wait(30)
            transaction.set_rollback(True)

    pid: list[int] = []
    sent: list[Message] = []

    def send_batch() -> None:
        pid.append(_backend_pid())
        sent.extend(
            outbox.send_many(
                [
                    {"topic": "probe.created", "payload": {"n": 1}, "key": "k", "idempotency_key": "a-held"},
                    {"topic": "probe.created", "payload": {"n": 2}, "key": "k", "idempotency_key": "z-gate"},
                ]
            )
        )

    gate = in_thread(hold_gate)
    try:
        assert gate_held.wait(10)
        batch = in_thread(send_batch)
        wait_for(lambda: bool(pid) and _blocked(pid[0]), timeout=20)  # m1 skipped, m2 waiting for the gate
        report = housekeeping.run("default", now=timezone.now() + dt.timedelta(minutes=1))
        assert report.archived == 1 and not Message.objects.filter(pk=holder.pk).exists()
    finally:
        release.set()
        gate.join(20)
    batch.join(30)
    assert not batch.is_alive()
    first, second = sent
    assert first.id != holder.id, "H was archived: m1 is a message of its own"
    assert first.id < second.id, "m1 took a later id than m2 of the same key"
    assert list(Message.objects.filter(key="k").order_by("id").values_list("payload", flat=True)) == [
        {"n": 1},
        {"n": 2},
    ]


@override_settings(USE_TZ=False)
def test_without_time_zones_naive_times_are_taken_as_by_send():
    later = timezone.now() + dt.timedelta(hours=1)
    assert timezone.is_naive(later)
    sent = outbox.send_many(
        [
            {"topic": "probe.created", "payload": 1, "available_at": later},
            {"topic": "probe.created", "payload": 2, "delay": 60},
            {"topic": "probe.created", "payload": 3},
        ]
    )
    rows = [Message.objects.get(pk=m.pk) for m in sent]
    assert rows[0].available_at == later == sent[0].available_at
    assert all(timezone.is_naive(m.available_at) for m in sent)
    assert [m.available_at for m in sent] == [r.available_at for r in rows]
    assert [m.created_at for m in sent] == [r.created_at for r in rows]


@pytest.mark.parametrize("in_transaction", [False, True])
def test_returned_messages_equal_the_stored_rows_field_by_field(in_transaction):
    items = [
        {"topic": "probe.created", "payload": {"n": 1, "f": 1e20}, "key": "K", "headers": {"h": "v"}},
        {"topic": "probe.created", "payload": None, "idempotency_key": "i", "delay": 5, "max_attempts": 3},
    ]
    if in_transaction:
        with transaction.atomic():
            sent = outbox.send_many(items)
    else:
        sent = outbox.send_many(items)
    names = [f.attname for f in Message._meta.concrete_fields]
    for message in sent:
        row = Message.objects.get(pk=message.pk)
        assert {n: getattr(message, n) for n in names} == {n: getattr(row, n) for n in names}


def _locks_of_this_backend_held_elsewhere_ok() -> None:
    """Another session's ordinary transaction, as the application's own queries run meanwhile."""
    other = connect_raw(direct=True)
    try:
        with other.transaction():
            other.execute("SELECT count(*) FROM django_outbox_message WHERE id < 0").fetchone()
            other.execute("SELECT pg_advisory_xact_lock(1, 1)")  # a lock of its own needs a slot too
    finally:
        other.close()


def test_a_keyed_batch_of_100000_distinct_keys_does_not_fill_the_servers_lock_table(postgres, handler: Register):
    """One advisory lock per key filled PostgreSQL's shared lock table ("out of shared memory"), and while
    the batch's transaction held them another session's ordinary query failed the same way. A batch of
    many keys takes one lock that excludes every keyed producer instead; the order per key holds."""
    handler("bulk.*", lambda m: None)
    items = [{"topic": "bulk.t", "payload": {"n": n}, "key": f"k-{n}"} for n in range(100_000)]
    with transaction.atomic():
        sent = outbox.send_many(items)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
            (held,) = cursor.fetchone()
        assert held <= 2, f"{held} advisory locks held by one batch"
        _locks_of_this_backend_held_elsewhere_ok()
    assert len(sent) == 100_000
    assert Message.objects.filter(topic="bulk.t").count() == 100_000


def test_a_keyed_send_waits_while_a_batch_of_many_keys_is_open(postgres, handler: Register):
    """The batch's one lock stands for every key it holds: a keyed send() of any key, even one the batch
    lacks, waits for the batch's transaction, so no key's ids commit out of order."""
    from django_outbox.store import producing

    handler("bulk.*", lambda m: None)
    items = [{"topic": "bulk.t", "payload": {"n": n}, "key": f"k-{n}"} for n in range(producing.MANY_KEYS + 1)]
    opened, release = threading.Event(), threading.Event()

    def batch() -> None:
        with transaction.atomic():
            outbox.send_many(items)
            opened.set()
            release.wait(30)

    thread = in_thread(batch)
    sent = threading.Event()
    try:
        assert opened.wait(30)

        def send_one() -> None:
            outbox.send("bulk.t", {"n": -1}, key="k-0")
            sent.set()

        other = in_thread(send_one)
        assert not sent.wait(1), "a keyed send() of a key in the open batch went through"
    finally:
        release.set()
        thread.join(30)
    assert sent.wait(30)
    other.join(30)
    ids = list(Message.objects.filter(key="k-0").order_by("id").values_list("payload", flat=True))
    assert ids == [{"n": 0}, {"n": -1}]


def insert_committed_elsewhere(cursor: Any, *, n: int, idempotency_key: str) -> None:
    """Another producer's message, written by hand on its own MariaDB connection (its commit is the caller's)."""
    cursor.execute(
        "INSERT INTO django_outbox_message (uuid, topic, `key`, payload, headers, idempotency_key, status,"
        " attempts, max_attempts, available_at, created_at, last_error) VALUES (%s, 'probe.created',"
        " NULL, %s, '{}', %s, 'pending', 0, 5, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), '')",
        [uuid.uuid4().hex, json.dumps({"n": n}), idempotency_key],
    )


@pytest.mark.parametrize("many", [False, True], ids=["send", "send_many"])
def test_a_holder_committed_after_the_transactions_snapshot_is_found(mysql: None, many: bool):
    """Under REPEATABLE READ (MariaDB's own default, which a project gets with ``"isolation_level":
    "repeatable read"``) a transaction reads its first snapshot to its end: a message another producer
    committed with the same idempotency key after that snapshot refuses the row, and a plain ``SELECT``
    for its holder, in the same snapshot, finds nothing. The lookup reads the latest committed row instead
    (a locking read), so the call returns the stored message rather than failing."""
    other = connect_raw_mysql()
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    try:
        with transaction.atomic():
            Order.objects.create(customer_email="a@example.com", item="mug")
            assert Message.objects.count() == 0  # the transaction's snapshot, taken before the other commits
            cursor = other.cursor()
            insert_committed_elsewhere(cursor, n=1, idempotency_key="idem-1")
            other.commit()
            item: dict[str, Any] = {"topic": "probe.created", "payload": {"n": 1}, "idempotency_key": "idem-1"}
            if many:
                sent = outbox.send_many([item, {"topic": "probe.created", "payload": {"n": 2}}])
                assert [m.payload for m in sent] == [{"n": 1}, {"n": 2}]
                message = sent[0]
            else:
                message = outbox.send(**item)
        stored = Message.objects.get(idempotency_key="idem-1")
        assert message.id == stored.id
        assert Message.objects.count() == (2 if many else 1)
    finally:
        other.close()
        connection.close()  # the next test's connection gets the configured isolation again


# --- MariaDB: a batch in as few statements as fit the server's packet -------------------------------------


@pytest.fixture
def small_mariadb_statement(mysql: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The text one statement may carry, lowered from 4 MiB so a batch of 7 needs several."""
    from django_outbox.store import mysql as mariadb

    monkeypatch.setattr(mariadb, "BATCH_BYTES", 2 * (2 * 200 + 300))
    monkeypatch.setattr(mariadb, "_SMALL_BATCH_BYTES", 0)


def test_mariadb_writes_a_batch_in_one_statement_and_its_keys_locks_in_one():
    """Row by row, 10,000 items took 3.4 s on MariaDB against 0.34 s on PostgreSQL."""
    if connection.vendor != "mysql" or not connection.features.can_return_columns_from_insert:
        pytest.skip("MariaDB's INSERT ... RETURNING")
    items = [{"topic": "probe.created", "payload": {"n": n}, "key": f"k{n % 7}"} for n in range(500)]
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        sent = outbox.send_many(items)
    assert len(inserts(queries)) == 1
    assert len([q for q in queries.captured_queries if "django_outbox_key_lock" in q["sql"]]) == 1
    assert [m.payload for m in sent] == [{"n": n} for n in range(500)]


def test_mariadb_writes_a_batch_larger_than_one_statement_in_several(small_mariadb_statement: None):
    items = [{"topic": "probe.created", "payload": {"n": n, "pad": "x" * 200}, "key": "K"} for n in range(7)]
    with CaptureQueriesContext(connection) as queries:
        sent = outbox.send_many(items)
    assert len(inserts(queries)) == 4
    assert [m.payload["n"] for m in sent] == list(range(7))
    stored = Message.objects.order_by("id")
    assert [m.payload["n"] for m in stored] == list(range(7)), "ids in the batch's order across statements"
    assert [m.uuid for m in stored] == [m.uuid for m in sent]
    assert [m.id for m in stored] == [m.id for m in sent]


def test_mariadb_a_key_taken_by_another_producer_mid_batch_takes_the_batch_back(small_mariadb_statement: None):
    """Another producer commits an idempotency key of the batch, with other content, after the batch looked
    for its holders and before the statement that carries it: the statement fails on the unique index,
    the batch looks again (as last committed), finds the conflict and raises, and nothing of the batch
    stays, the statements before that one included (autocommit)."""
    other = connect_raw_mysql()
    items: list[dict[str, Any]] = [{"topic": "probe.created", "payload": {"n": n, "pad": "x" * 200}} for n in range(6)]
    items.append({"topic": "probe.created", "payload": {"n": 2}, "idempotency_key": "late"})  # the last statement
    raced: list[str] = []

    def commit_elsewhere_before_the_last_insert(execute, sql, params, many, context):
        if "INSERT INTO django_outbox_message" in sql and "late" in params and not raced:
            raced.append(sql)
            cursor = other.cursor()
            insert_committed_elsewhere(cursor, n=9, idempotency_key="late")
            other.commit()
        return execute(sql, params, many, context)

    try:
        with connection.execute_wrapper(commit_elsewhere_before_the_last_insert):
            with pytest.raises(IdempotencyConflictError):
                outbox.send_many(items)
    finally:
        other.close()
    assert raced, "the interleaving was forced"
    assert list(Message.objects.values_list("payload", flat=True)) == [{"n": 9}], "the batch was taken back"


def test_mariadb_a_key_taken_mid_batch_with_the_same_content_returns_its_holder(small_mariadb_statement: None):
    other = connect_raw_mysql()
    items: list[dict[str, Any]] = [{"topic": "probe.created", "payload": {"n": n, "pad": "x" * 200}} for n in range(6)]
    items.append({"topic": "probe.created", "payload": {"n": 2}, "idempotency_key": "late"})
    raced: list[int] = []

    def commit_elsewhere_before_the_last_insert(execute, sql, params, many, context):
        if "INSERT INTO django_outbox_message" in sql and "late" in params and not raced:
            cursor = other.cursor()
            insert_committed_elsewhere(cursor, n=2, idempotency_key="late")
            raced.append(cursor.lastrowid)
            other.commit()
        return execute(sql, params, many, context)

    try:
        with connection.execute_wrapper(commit_elsewhere_before_the_last_insert):
            sent = outbox.send_many(items)
    finally:
        other.close()
    assert raced, "the interleaving was forced"
    assert sent[-1].id == raced[0]
    assert [m.payload["n"] for m in sent[:-1]] == list(range(6))
    assert Message.objects.count() == 7
    assert [m.id for m in sent[:-1]] == sorted(m.id for m in sent[:-1])


def test_more_items_than_the_cap_are_refused_before_the_rest_is_read():
    """One call holds its batch in memory until it is written: past ``SEND_MANY_MAX_ITEMS`` it raises,
    writes nothing, and reads no further item of an endless iterable."""
    from django_outbox.limits import SEND_MANY_MAX_ITEMS

    read = 0

    def endless() -> Iterator[dict[str, Any]]:
        nonlocal read
        while True:
            read += 1
            yield {"topic": "probe.created", "payload": read}

    with pytest.raises(ValueError, match=r"more than 100,000 items in one call; nothing was written"):
        outbox.send_many(endless())
    assert read == SEND_MANY_MAX_ITEMS + 1
    assert Message.objects.count() == 0


def test_a_batch_takes_a_bounded_amount_of_memory_per_item(server_database: None):
    """Python's allocations at the peak of a batch stay under 4 KB an item (about 2 KB measured, half of it
    the returned messages), so the cap bounds a call's memory; 20,000 items here (tracemalloc slows every
    allocation), and 100,000 in one call in
    ``test_a_keyed_batch_of_100000_distinct_keys_does_not_fill_the_servers_lock_table``."""
    import tracemalloc

    count = 20_000
    items = [{"topic": "probe.created", "payload": {"n": n}} for n in range(count)]
    tracemalloc.start()
    try:
        with transaction.atomic():
            sent = outbox.send_many(items)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(sent) == count == Message.objects.count()
    assert [m.payload["n"] for m in sent[:3]] == [0, 1, 2] and sent[-1].payload == {"n": count - 1}
    assert peak < 4_000 * count, f"{peak / count:.0f} bytes an item at the peak"


@pytest.fixture
def without_insert_returning(mysql: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """MySQL's ``INSERT`` returns no columns: MariaDB's server, with Django told it cannot either."""
    monkeypatch.setattr(connection.features, "can_return_columns_from_insert", False)


def test_without_insert_returning_a_batch_is_written_row_by_row_in_its_order(without_insert_returning: None):
    first = outbox.send("probe.created", {"n": 1}, idempotency_key="once")
    items = [{"topic": "probe.created", "payload": {"n": n}, "key": f"k{n % 3}"} for n in range(5)]
    items.append({"topic": "probe.created", "payload": {"n": 1}, "idempotency_key": "once"})
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        sent = outbox.send_many(items)
    assert len(inserts(queries)) == 5, "one INSERT per new item; the stored key's message is read, not written"
    assert sent[-1].pk == first.pk, "a stored idempotency key returns the stored message"
    stored = Message.objects.exclude(pk=first.pk).order_by("id")
    assert [m.payload for m in stored] == [{"n": n} for n in range(5)]
    assert [m.pk for m in stored] == [m.pk for m in sent[:-1]]


def test_without_insert_returning_a_conflicting_key_takes_the_whole_batch_back(without_insert_returning: None):
    outbox.send("probe.created", {"n": 1}, idempotency_key="once")
    with transaction.atomic():
        with pytest.raises(IdempotencyConflictError):
            outbox.send_many(
                [
                    {"topic": "probe.created", "payload": {"n": 0}, "key": "K"},
                    {"topic": "probe.created", "payload": {"n": 2}, "idempotency_key": "once"},
                ]
            )
        Order.objects.create(customer_email="a@example.com", item="after")  # the transaction goes on
    assert Message.objects.count() == 1
    assert Order.objects.count() == 1
