"""A repeated ``idempotency_key``: the same content returns the stored message, other content is refused.

"The same content" is the topic, the key and the payload (as JSON values: key order and 1 against 1.0
do not matter, ``true`` against ``1`` does). Headers, ``delay``, ``available_at`` and ``max_attempts``
are not compared: a retried task recomputes its schedule, and tracing adds a new ``traceparent`` header
to every call. Either way nothing is written and the caller's transaction goes on.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from django.db import connection, transaction

import django_outbox
from django_outbox import IdempotencyConflictError, OutboxError, outbox
from django_outbox.models import Message
from testproject.shop.models import Order

pytestmark = pytest.mark.django_db(transaction=True)

FIRST: dict[str, Any] = {"topic": "probe.created", "payload": {"order": 1, "total": 9.5, "lines": [1, 2]}, "key": "k"}


def first_then(second: dict[str, Any], *, same_transaction: bool) -> tuple[Message, Message | None, Exception | None]:
    """Send FIRST and then ``second`` with the same idempotency key; the transactions go on after both."""
    args = {**FIRST, "idempotency_key": "order-1"}
    result: Message | None = None
    error: Exception | None = None
    with transaction.atomic():
        first = outbox.send(**args)
        if same_transaction:
            try:
                result = outbox.send(**{**args, **second})
            except IdempotencyConflictError as exc:
                error = exc
            Order.objects.create(customer_email="a@example.com", item="same transaction")
    if not same_transaction:
        with transaction.atomic():
            try:
                result = outbox.send(**{**args, **second})
            except IdempotencyConflictError as exc:
                error = exc
            Order.objects.create(customer_email="a@example.com", item="second transaction")
    assert Order.objects.count() == 1  # the caller's transaction went on and committed
    assert Message.objects.count() == 1
    return first, result, error


@pytest.mark.parametrize("same_transaction", [True, False], ids=["one transaction", "two transactions"])
@pytest.mark.parametrize(
    "second",
    [
        {},
        {"payload": {"lines": [1, 2], "total": 9.5, "order": 1}},  # another key order: the same JSON object
        {"payload": {"order": 1.0, "total": 9.5, "lines": [1, 2]}},  # 1.0 and 1 are one JSON number
        {"headers": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
        {"delay": dt.timedelta(minutes=5)},
        {"max_attempts": 2},
    ],
    ids=["identical", "key order", "int and float", "headers", "delay", "max_attempts"],
)
def test_the_same_content_returns_the_stored_message(second, same_transaction):
    first, again, error = first_then(second, same_transaction=same_transaction)
    assert error is None
    assert again is not None and again.pk == first.pk and again.uuid == first.uuid
    assert again.payload == FIRST["payload"] and again.headers == {}


@pytest.mark.parametrize("same_transaction", [True, False], ids=["one transaction", "two transactions"])
@pytest.mark.parametrize(
    "second",
    [
        {"topic": "probe.updated"},
        {"key": "other"},
        {"key": None},
        {"payload": {"order": 2, "total": 9.5, "lines": [1, 2]}},
        {"payload": {"order": True, "total": 9.5, "lines": [1, 2]}},  # true is not 1 in JSON
        {"payload": {"order": 1, "total": 9.5, "lines": [2, 1]}},
        {"payload": {"order": 1, "total": 9.5, "lines": [1, 2], "extra": None}},
        {"payload": [1, 2]},
    ],
    ids=["topic", "key", "no key", "value", "bool for int", "list order", "extra field", "another type"],
)
def test_other_content_raises_a_conflict_and_writes_nothing(second, same_transaction):
    first, again, error = first_then(second, same_transaction=same_transaction)
    assert again is None
    assert isinstance(error, IdempotencyConflictError) and isinstance(error, OutboxError)
    assert error.existing.pk == first.pk
    assert "'order-1'" in str(error) and str(first.uuid) in str(error)
    stored = Message.objects.get()
    assert (stored.topic, stored.key, stored.payload) == (FIRST["topic"], FIRST["key"], FIRST["payload"])


def test_the_conflict_error_is_exported_and_documented():
    assert "IdempotencyConflictError" in django_outbox.__all__
    assert issubclass(django_outbox.IdempotencyConflictError, django_outbox.OutboxError)


def test_a_conflict_rolls_back_nothing_of_the_callers_savepoint():
    with transaction.atomic():
        outbox.send("probe.created", {"n": 1}, idempotency_key="k1")
        with transaction.atomic():
            Order.objects.create(customer_email="a@example.com", item="inner")
            with pytest.raises(IdempotencyConflictError):
                outbox.send("probe.created", {"n": 2}, idempotency_key="k1")
            outbox.send("probe.created", {"n": 3}, idempotency_key="k2")
    assert sorted(Message.objects.values_list("idempotency_key", flat=True)) == ["k1", "k2"]
    assert Order.objects.count() == 1


def test_a_conflict_with_a_concurrent_uncommitted_send_is_seen_once_it_commits(postgres):
    """PostgreSQL: the second INSERT waits for the first transaction's row, then compares with it."""
    sent, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def first() -> None:
        try:
            with transaction.atomic():
                outbox.send("probe.created", {"n": 1}, idempotency_key="race")
                sent.set()
                release.wait(10)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            sent.set()
        finally:
            connection.close()

    thread = threading.Thread(target=first)
    thread.start()
    assert sent.wait(10)
    threading.Timer(0.3, release.set).start()  # commits while the send below waits on its row
    try:
        with transaction.atomic():
            with pytest.raises(IdempotencyConflictError):
                outbox.send("probe.created", {"n": 2}, idempotency_key="race")
            Order.objects.create(customer_email="a@example.com", item="after the conflict")
    finally:
        release.set()
        thread.join(10)
    assert errors == []
    assert list(Message.objects.values_list("payload", flat=True)) == [{"n": 1}]
    assert Order.objects.count() == 1


def test_the_checks_cost_no_query(django_assert_num_queries):
    """One statement per send, as before; a repeat reads the stored row once, a conflict too."""
    with django_assert_num_queries(1):
        outbox.send("probe.created", {"n": 1}, idempotency_key="q")
    with django_assert_num_queries(2):
        outbox.send("probe.created", {"n": 1}, idempotency_key="q")
    with django_assert_num_queries(2), pytest.raises(IdempotencyConflictError):
        outbox.send("probe.created", {"n": 2}, idempotency_key="q")
    # MariaDB/MySQL: a keyed message first locks its key's row (per-key commit order, store/mysql.py), in
    # autocommit inside a transaction of its own (BEGIN, lock, insert, COMMIT: tests/db/test_mysql.py)
    with django_assert_num_queries(4 if connection.vendor == "mysql" else 1):
        outbox.send("probe.created", {"n": 1}, key="k", headers={"h": "v"}, delay=5)


def _delete_elsewhere(message_id: int) -> None:
    """Remove a message on a connection of its own, as housekeeping's archiving does, and commit."""
    if connection.vendor == "postgresql":
        from tests.support.database import connect_raw

        with connect_raw(autocommit=True) as other:
            other.execute("DELETE FROM django_outbox_message WHERE id = %s", [message_id])
    elif connection.vendor == "mysql":
        from tests.support.database import connect_raw_mysql

        other = connect_raw_mysql()
        other.cursor().execute("DELETE FROM django_outbox_message WHERE id = %s", [message_id])
        other.commit()
        other.close()
    else:
        import sqlite3

        other = sqlite3.connect(connection.settings_dict["NAME"], timeout=10)
        with other:
            other.execute("DELETE FROM django_outbox_message WHERE id = ?", [message_id])
        other.close()


@pytest.mark.parametrize("in_transaction", [False, True])
def test_a_send_racing_the_archiving_of_its_keys_first_message_writes_the_new_one(in_transaction):
    """The first message leaves the table between the conflicting INSERT and the look-up of the stored one."""
    if in_transaction and connection.vendor != "postgresql":
        pytest.skip("SQLite's write lock, taken by the INSERT, keeps any other writer out until the commit")
    first = outbox.send("orders.created", {"n": 1}, idempotency_key="race-1")
    Message.objects.filter(pk=first.pk).update(status=Message.Status.DELIVERED)
    raced: list[str] = []

    def archive_first_in_between(execute, sql, params, many, context):
        if ("WHERE idempotency_key = " in sql or "WHERE idempotency_key IN (" in sql) and not raced:
            raced.append(sql)
            _delete_elsewhere(first.pk)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(archive_first_in_between):
        if in_transaction:
            with transaction.atomic():
                second = outbox.send("orders.created", {"n": 1}, idempotency_key="race-1")
                Order.objects.create(customer_email="a@example.com", item="racing")  # the transaction is usable
        else:
            second = outbox.send("orders.created", {"n": 1}, idempotency_key="race-1")
    assert raced, "the interleaving was forced"
    assert second.pk != first.pk
    assert list(Message.objects.values_list("pk", flat=True)) == [second.pk]


def test_idempotency_keys_and_message_keys_that_differ_only_in_case_or_accents_are_different():
    """Keys are opaque strings, compared byte for byte on every database. MariaDB's default collation
    (utf8mb4_general_ci) called "Ab3x" and "ab3X" equal: the second message, with the same content, was
    taken for a repeat and never written."""
    first = outbox.send("probe.created", {"n": 1}, idempotency_key="Ab3x", key="Order-É")
    second = outbox.send("probe.created", {"n": 1}, idempotency_key="ab3X", key="order-e")
    third = outbox.send("probe.created", {"n": 1}, idempotency_key="Ab3X")
    assert len({first.pk, second.pk, third.pk}) == 3
    assert Message.objects.filter(idempotency_key__in=["Ab3x", "ab3X", "Ab3X"]).count() == 3
    assert Message.objects.filter(key="Order-É").count() == 1 and Message.objects.filter(key="order-e").count() == 1
    batch = outbox.send_many(
        [
            {"topic": "probe.created", "payload": {"n": 2}, "idempotency_key": "Zz"},
            {"topic": "probe.created", "payload": {"n": 2}, "idempotency_key": "zZ"},
        ]
    )
    assert batch[0].pk != batch[1].pk
