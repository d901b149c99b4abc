"""``send()`` under property-based testing: whatever it is given, it writes one deliverable message or
raises a clear error and writes nothing, and the caller's transaction goes on either way.

Each example runs ``send()`` inside ``transaction.atomic()``, writes a business row in the same
transaction afterwards, commits, and checks the counts; a message that was written is then relayed by
the worker loop (``relay_all``) to a test handler, which must receive exactly the JSON value that was
sent. Examples clean up after themselves (the test database is shared by all of them).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import string
import uuid
import zoneinfo
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from hypothesis import example, given, settings
from hypothesis import strategies as st

from django_outbox import OutboxError, outbox
from django_outbox.models import Attempt, Message
from django_outbox.testing import relay_all
from testproject.shop.models import Order

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "prop.sent"
ALLOWED = (OutboxError, TypeError, ValueError)


@pytest.fixture
def received(handler: Callable[[str, Callable[..., object]], None]) -> Iterator[list[Message]]:
    """What the handler of ``prop.*`` was called with, in order."""
    seen: list[Message] = []
    handler("prop.*", seen.append)
    yield seen


# --- strategies ---------------------------------------------------------------------------------------

#: Every code point, lone surrogates and NUL included (hypothesis leaves surrogates out by default), with
#: the characters that databases, JSON and header protocols treat specially drawn more often.
ANY_CHAR = st.characters(exclude_categories=()) | st.sampled_from(["\x00", "\ud800", "\udfff", "\r", "\n", " ", ":"])
ANY_TEXT = st.text(ANY_CHAR, max_size=30)
EDGE_INTS = st.sampled_from([0, -1, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, -(2**63) - 1, 2**64, -(2**64), 10**300])
TIMEZONES = st.one_of(
    st.just(dt.UTC),
    st.timedeltas(min_value=-dt.timedelta(hours=23, minutes=59), max_value=dt.timedelta(hours=23, minutes=59)).map(
        dt.timezone
    ),
    st.timezones(),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    EDGE_INTS,
    st.floats(),  # NaN and infinities included
    st.sampled_from([1e16, 1e308, -1e308, 5e-324, -0.0, 1.5e300, 2.0**63]),
    ANY_TEXT,
    st.text(max_size=10),
    st.decimals(),
    st.datetimes(timezones=st.none() | TIMEZONES),
    st.dates(),
    st.times(),
    st.timedeltas(),
    st.uuids(),
)
DICT_KEYS = st.one_of(ANY_TEXT, st.integers(), st.floats(), st.booleans(), st.none())
PAYLOADS = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(DICT_KEYS, children, max_size=4),
        st.tuples(children, children),
    ),
    max_leaves=12,
)


def nested(depth: int, kind: str) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


NAMES = st.one_of(
    st.none(),
    ANY_TEXT,
    st.text(string.ascii_letters + ".-_:", min_size=1, max_size=20),
    st.text(min_size=190, max_size=210),
    st.integers(),
    st.binary(max_size=5),
)
HEADERS = st.one_of(
    st.none(),
    st.dictionaries(ANY_TEXT, ANY_TEXT, max_size=3),
    st.dictionaries(st.text(string.ascii_letters, min_size=1, max_size=8), st.text(max_size=8), max_size=3),
    st.dictionaries(st.one_of(st.integers(), st.none(), ANY_TEXT), st.one_of(st.integers(), ANY_TEXT), max_size=2),
    st.just({"big": "v" * 2_000_000}),
    st.lists(st.text(max_size=3), max_size=2),
    st.text(max_size=3),
)
DELAYS = st.one_of(
    st.none(),
    st.floats(),
    st.integers(),
    EDGE_INTS,
    st.sampled_from([10**400, -(10**400), 2**1024]),
    st.timedeltas(),
    st.sampled_from([dt.timedelta.max, dt.timedelta.min, dt.timedelta(0), dt.timedelta(microseconds=1)]),
    st.booleans(),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.text(max_size=3),
)
EXTREMES = [dt.datetime.min, dt.datetime.max, dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30)]
AVAILABLE_AT = st.one_of(
    st.none(),
    st.datetimes(),  # naive
    st.datetimes(timezones=TIMEZONES),
    st.builds(lambda d, tz: d.replace(tzinfo=tz), st.sampled_from(EXTREMES), TIMEZONES),
    st.dates(),
    st.text(max_size=3),
)
MAX_ATTEMPTS = st.one_of(
    st.none(),
    st.integers(-3, 20),
    st.sampled_from([0, -1, 2**31 - 1, 2**31, 2**63, -(2**31), True, False, 1.0, 3.5, "3"]),
)


# --- checks -------------------------------------------------------------------------------------------


def same_json(a: Any, b: Any) -> bool:
    """JSON value equality: booleans are not numbers, and a float stays a float (iterative: payloads nest deep)."""
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, dict):
            if x.keys() != y.keys():
                return False
            pending.extend((x[k], y[k]) for k in x)
        elif isinstance(x, list):
            if len(x) != len(y):
                return False
            pending.extend(zip(x, y, strict=True))
        elif x != y:
            return False
    return True


def stored_payload(pk: int) -> Any:
    """The payload column decoded by nothing but ``json.loads``: what the database really holds."""
    with connection.cursor() as cursor:
        cast = "payload::text" if connection.vendor == "postgresql" else "payload"
        cursor.execute(f"SELECT {cast} FROM django_outbox_message WHERE id = %s", [pk])
        (text,) = cursor.fetchone()
    return json.loads(text)


def as_json(value: Any) -> Any:
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def send_and_check(received: list[Message], *args: Any, **kwargs: Any) -> Message | None:
    """One send in a transaction that goes on afterwards; returns the message if one was written."""
    before = Message.objects.count()
    sent: Message | None = None
    with transaction.atomic():
        try:
            sent = outbox.send(*args, **kwargs)
        except ALLOWED:
            pass
        Order.objects.create(customer_email="a@example.com", item="after send")  # the transaction goes on
    try:
        assert Order.objects.filter(item="after send").count() == 1
        assert Message.objects.count() == before + (sent is not None)
        if sent is None:
            return None
        Message.objects.filter(pk=sent.pk).update(available_at=dt.datetime.now(dt.UTC))  # due now, however delayed
        received.clear()
        relay_all(topics=["prop.*"])
        stored = Message.objects.get(pk=sent.pk)
        assert stored.status == Message.Status.DELIVERED, stored.last_error
        assert [m.pk for m in received] == [sent.pk]
        delivered = received[0].payload
        assert same_json(delivered, stored_payload(sent.pk))
        assert same_json(delivered, sent.payload)  # what send() returned
        assert same_json(delivered, as_json(args[1] if len(args) > 1 else kwargs["payload"]))
        return sent
    finally:
        for model in (Attempt, Message, Order):  # without loading rows: a refused payload may not decode
            model.objects.all()._raw_delete(connection.alias)


# --- properties ---------------------------------------------------------------------------------------


@given(payload=PAYLOADS)
@example(payload={"big": 2**64, "small": -(2**63) - 1})
@example(payload=1e16)  # PostgreSQL's jsonb gave it back as the int 10000000000000000
@example(payload=[1e308, -1.5e300, 2.0**63])  # ... and 1e308 as an int that is not even equal to it
@example(payload={"text": "e+1 1e+16 \\"})  # numbers in exponent form inside strings stay as they are
def test_any_payload_is_delivered_as_sent_or_refused(received, payload):
    send_and_check(received, TOPIC, payload)


@given(depth=st.integers(0, 5000), kind=st.sampled_from(["list", "dict"]))
@example(depth=5000, kind="list")  # RecursionError out of send()
@example(depth=950, kind="dict")  # stored, then a RecursionError in every claim that read it
@example(depth=100, kind="list")  # the deepest allowed
def test_deeply_nested_payloads_are_delivered_or_refused(received, depth, kind):
    send_and_check(received, TOPIC, nested(depth, kind))


@given(char=st.sampled_from(["x", "\u00e9", "\U0001f600", "\\", '"']), length=st.integers(10_000, 400_000))
def test_long_strings_are_delivered_or_refused(received, char, length):
    send_and_check(received, TOPIC, {"text": char * length})  # past MAX_PAYLOAD_BYTES once escaped: refused


@given(
    suffix=NAMES,
    key=NAMES,
    idempotency_key=NAMES,
    headers=HEADERS,
)
@example(suffix="a", key="k\x00", idempotency_key=None, headers=None)  # DataError on PostgreSQL
@example(suffix="a\x00", key=None, idempotency_key="i\x00", headers=None)
@example(suffix="a", key="\ud800", idempotency_key=None, headers=None)  # UnicodeEncodeError from the driver
@example(suffix="a", key=None, idempotency_key=None, headers={"X-A": "v\r\nNats-Msg-Id: x"})  # header injection
@example(suffix="a", key=None, idempotency_key=None, headers={"big": "v" * 2_000_000})  # over MAX_PAYLOAD_BYTES
def test_any_names_and_headers_are_stored_or_refused(received, suffix, key, idempotency_key, headers):
    topic = f"prop.{suffix}" if isinstance(suffix, str) else suffix
    sent = send_and_check(received, topic, {"n": 1}, key=key, idempotency_key=idempotency_key, headers=headers)
    if sent is not None:
        assert (sent.topic, sent.key, sent.idempotency_key) == (topic, key, idempotency_key)
        assert sent.headers == (headers or {})


@given(delay=DELAYS, available_at=AVAILABLE_AT, max_attempts=MAX_ATTEMPTS)
@example(delay=10**400, available_at=None, max_attempts=None)  # OverflowError out of float()
@example(delay=-(10**400), available_at=None, max_attempts=None)
@example(
    delay=None, available_at=dt.datetime(2000, 1, 1, tzinfo=dt.timezone(-dt.timedelta(hours=23))), max_attempts=None
)
@example(  # PostgreSQL cannot parse an offset with microseconds
    delay=None,
    available_at=dt.datetime(2000, 1, 1, tzinfo=dt.timezone(dt.timedelta(microseconds=1))),
    max_attempts=None,
)
@example(  # year 10000 in UTC: OverflowError on SQLite; on PostgreSQL stored, then unreadable by psycopg
    delay=None, available_at=dt.datetime.max.replace(tzinfo=dt.timezone(-dt.timedelta(hours=5))), max_attempts=None
)
@example(delay=None, available_at=dt.datetime.min.replace(tzinfo=dt.timezone(dt.timedelta(hours=5))), max_attempts=None)
@example(delay=dt.timedelta.max, available_at=None, max_attempts=2**31 - 1)
@example(  # an hour a DST change repeats: == of aware times in two zones is False there (PEP 495)
    delay=None,
    available_at=dt.datetime(1983, 9, 25, 2, 0, tzinfo=zoneinfo.ZoneInfo("Europe/Ljubljana")),
    max_attempts=None,
)
def test_any_schedule_and_attempts_are_stored_or_refused(received, delay, available_at, max_attempts):
    sent = send_and_check(received, TOPIC, {"n": 1}, delay=delay, available_at=available_at, max_attempts=max_attempts)
    if sent is not None:
        assert delay is None or available_at is None
        if isinstance(available_at, dt.datetime):
            # the same instant (the first of a repeated hour, as astimezone() reads it)
            assert sent.available_at == available_at.astimezone(dt.UTC)
        if max_attempts is not None:
            assert sent.max_attempts == max_attempts and isinstance(max_attempts, int)
        if isinstance(delay, int | float) and not isinstance(delay, bool):
            assert math.isfinite(delay) and delay >= 0


@settings(max_examples=3)  # each example starts a worker process: a few, of twenty payloads each
@given(payloads=st.lists(PAYLOADS, min_size=20, max_size=20))
def test_a_worker_process_delivers_every_accepted_payload_as_sent(worker_process, tmp_path, payloads):
    echo = tmp_path / f"echo-{uuid.uuid4().hex}.jsonl"
    sent: dict[int, Any] = {}
    try:
        with transaction.atomic():
            for payload in payloads:
                try:
                    sent[outbox.send("echo.sent", payload).pk] = payload
                except ALLOWED:
                    pass
        code, output = worker_process("--until-empty", "--topics", "echo.*", env={"OUTBOX_TEST_ECHO": str(echo)}).wait()
        assert code == 0, output
        lines = echo.read_text(encoding="utf-8").splitlines() if sent else []
        received = {line["id"]: line["payload"] for line in map(json.loads, lines)}
        assert received.keys() == sent.keys() and len(lines) == len(sent)
        for pk, payload in sent.items():
            assert same_json(received[pk], stored_payload(pk))
            assert same_json(received[pk], as_json(payload))
    finally:
        for model in (Attempt, Message):
            model.objects.all()._raw_delete(connection.alias)
