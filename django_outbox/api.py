"""``outbox.send()`` and ``@outbox.handler``: what application code calls."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from .conf import get_settings
from .exceptions import IdempotencyConflictError, OutboxError, PayloadTooLargeError
from .limits import (
    IDEMPOTENCY_KEY_MAX_LENGTH,
    KEY_MAX_LENGTH,
    PAYLOAD_MAX_DEPTH,
    SEND_MANY_MAX_ITEMS,
    TOPIC_MAX_LENGTH,
)
from .observability.propagation import trace_headers
from .routing import Handler, registry, sending_transport

if TYPE_CHECKING:
    from .models import Message
    from .store import producing as store_types

H = TypeVar("H", bound=Handler)

#: ``max_attempts`` and ``attempts`` are 32-bit integer columns on PostgreSQL.
MAX_ATTEMPTS_LIMIT = 2**31 - 1
#: One encoder for every call: ``json.dumps(cls=...)`` would build a new one each time. It keeps no state
#: between calls, so threads share it safely. ASCII output makes the text's length its size in bytes.
_ENCODER = DjangoJSONEncoder(allow_nan=False, separators=(",", ":"))
#: The ``\u0000`` escape json.dumps writes for NUL, not the text "\\u0000" (whose backslash it doubles).
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
#: A JSON string (skipped), or a number in exponent form with a positive exponent: Python writes floats
#: from 1e16 up that way, and PostgreSQL's jsonb, which keeps numbers as exact decimals, gives them back
#: without the exponent and without a fraction (1e+16 becomes 10000000000000000), so they came back as
#: ints, and 1e308 as an int that is not equal to the float sent.
#: (Strings as the "unrolled loop" ``"[^"\\]*(?:\\.[^"\\]*)*"``: one alternative per character was
#: 25 times slower, seconds for a payload of some megabytes.)
_STRING_OR_BIG_FLOAT = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|(-?\d+(?:\.\d+)?e\+\d+)')
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKET = re.compile(r"[\[\]{}]")
#: The latest and earliest ``available_at``: a day inside ``datetime``'s range, so the time can be shown
#: in any time zone (the admin) and a worker's arithmetic on it cannot leave the range.
LATEST_AVAILABLE_AT = dt.datetime.max.replace(tzinfo=dt.UTC) - dt.timedelta(days=1)
EARLIEST_AVAILABLE_AT = dt.datetime.min.replace(tzinfo=dt.UTC) + dt.timedelta(days=1)
#: A header name: printable, without spaces or a colon (HTTP, AMQP and NATS headers all carry that).
_HEADER_NAME = re.compile(r"[^\x00-\x20\x7f:]+")
#: What no header value may hold: a line break would inject headers on text protocols (NATS), NUL is
#: unstorable.
_HEADER_VALUE_BREAK = re.compile(r"[\r\n\x00]")


def new_uuid() -> uuid.UUID:
    """A message's uuid: version 7 (RFC 9562), the time in milliseconds then 74 random bits.

    Unique as a random one is (74 random bits per millisecond), but it sorts by time, so each new
    message's entry lands at the right edge of the uuid's unique index, beside the previous one. A
    random (version 4) uuid wrote into a random leaf of that index: on a table of 200,000 messages,
    whose index no longer fits in the pages written since the last checkpoint, nearly every ``send()``
    wrote a full-page image of its leaf into the WAL (6 KB per one-row commit against 0.7 KB),
    and a batch of 100 touched 100 leaves (docs/performance.md).
    """
    rand = int.from_bytes(os.urandom(10), "big")
    value = (time.time_ns() // 1_000_000 & _MS_MASK) << 80 | (rand >> 62 & 0xFFF) << 64 | rand & _RAND_B_MASK
    # What uuid.UUID(int=...) makes, without the checks of an argument that is in range by construction.
    made = _new_object(uuid.UUID)
    _set_slot(made, "int", value | _VERSION_7_BITS)
    _set_slot(made, "is_safe", _SAFE_UNKNOWN)
    return made


_MS_MASK = (1 << 48) - 1
_RAND_B_MASK = (1 << 62) - 1
#: The version nibble (7) and the RFC 9562 variant bits (0b10).
_VERSION_7_BITS = 0x7 << 76 | 0b10 << 62
_new_object = object.__new__
_set_slot = object.__setattr__  # a UUID refuses attribute assignment; its own __init__ goes this way
_SAFE_UNKNOWN = uuid.SafeUUID.unknown


def _check_name(what: str, value: object, max_length: int, *, optional: bool) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise TypeError(
            f"outbox.send(): {what} must be a string{' or None' if optional else ''}, not {type(value).__name__}."
        )
    if not value or value != value.strip():
        raise ValueError(f"outbox.send(): {what} must be a non-empty string without surrounding spaces, got {value!r}.")
    if len(value) > max_length:
        raise ValueError(f"outbox.send(): {what} is {len(value)} characters long; the limit is {max_length}.")
    if "\x00" in value:  # PostgreSQL refuses it in text (a DataError, not the caller's mistake made clear)
        raise ValueError(f"outbox.send(): {what} contains a NUL character (\\x00), which databases cannot store.")
    if "\n" in value or "\r" in value:
        # Every transport carries it as a header value (Outbox-Topic, Outbox-Key, Idempotency-Key, ce-subject):
        # NATS's client turns a line break there into a space, so the consumer would read another value.
        raise ValueError(
            f"outbox.send(): {what} contains a line break, which the transports' headers cannot carry as it is "
            f"(NATS turns it into a space). Remove it or encode the value first, got {value!r}."
        )
    if not value.isascii():  # ASCII text cannot hold a surrogate: the common case skips the encode
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"outbox.send(): {what} contains a lone UTF-16 surrogate ({exc.object[exc.start : exc.end]!r}), "
                "which is not valid Unicode. Fix how the text was decoded."
            ) from exc
    return value


def _check_headers(headers: object) -> str:
    """The headers as JSON; names and values must be text that every header-carrying transport can carry."""
    if headers is None:
        return "{}"
    if not isinstance(headers, Mapping):
        raise TypeError(f"outbox.send(): headers must be a dict of str to str, not {type(headers).__name__}.")
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(
                f"outbox.send(): headers must be a dict of str to str; {name!r}: {value!r} is "
                f"{type(name).__name__} to {type(value).__name__}."
            )
        if _HEADER_NAME.fullmatch(name) is None:
            raise ValueError(
                f"outbox.send(): header name {name!r} must be non-empty, without spaces, control characters or ':'."
            )
        if _HEADER_VALUE_BREAK.search(value) is not None:
            raise ValueError(
                f"outbox.send(): the value of header {name!r} contains a line break or NUL, which would let it "
                "inject headers into text protocols. Encode the value first."
            )
    return _encode("headers", dict(headers)) if headers else "{}"


class _Encoders(threading.local):
    """The C function ``JSONEncoder.encode()`` builds on every call, built once per thread and kept while
    it succeeds: its table of the containers being encoded (the circular-reference check) is empty after
    a success, but may not be after an error."""

    encode: Callable[[object, int], Any] | None = None

    def make(self) -> Callable[[object, int], Any]:
        if c_make_encoder is None:  # pragma: no cover - CPython without its _json module
            return lambda value, _level: _ENCODER.encode(value)
        self.encode = c_make_encoder(
            {},
            _ENCODER.default,
            encode_basestring_ascii,
            None,
            _ENCODER.key_separator,
            _ENCODER.item_separator,
            _ENCODER.sort_keys,
            _ENCODER.skipkeys,
            _ENCODER.allow_nan,
        )
        return self.encode


_encoders = _Encoders()


def _encode(what: str, value: object) -> str:
    encode = _encoders.encode or _encoders.make()
    try:
        try:
            chunks = encode(value, 0)
        except BaseException:
            # whatever raised (a default() or a str() of the caller's too): the table may hold containers
            _encoders.encode = None
            raise
    except TypeError as exc:
        raise TypeError(
            f"outbox.send(): {what} must be JSON-serialisable: {exc}. "
            "Pass plain data (dict, list, str, int, ...) or convert the object first."
        ) from exc
    except RecursionError as exc:
        raise ValueError(
            f"outbox.send(): {what} is nested too deeply to encode; the limit is {PAYLOAD_MAX_DEPTH} levels."
        ) from exc
    except ValueError as exc:
        hint = " (NaN and infinity are not JSON)" if "float" in str(exc) else ""
        raise TypeError(f"outbox.send(): {what} must be JSON-serialisable: {exc}{hint}.") from exc
    encoded: str = chunks if isinstance(chunks, str) else "".join(chunks)
    if "\\u0000" in encoded and _NUL.search(encoded):
        raise ValueError(
            f"outbox.send(): {what} contains a NUL character (\\u0000), which databases "
            "cannot store in JSON. Remove it or encode the data (e.g. base64)."
        )
    if "\\ud" in encoded:  # a UTF-16 surrogate escape: fine in a pair (emoji), refused alone by PostgreSQL
        try:
            json.dumps(value, cls=DjangoJSONEncoder, ensure_ascii=False).encode()
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"outbox.send(): {what} contains a lone UTF-16 surrogate ({exc.object[exc.start : exc.end]!r}), "
                "which is not valid Unicode and which PostgreSQL refuses in JSON. Fix how the text was decoded."
            ) from exc
    return encoded


def _portable(encoded: str) -> str:
    """The payload's JSON as every database and worker can give it back: bounded nesting, floats in full.

    Run once the text is known to fit ``MAX_PAYLOAD_BYTES``, which bounds its work; the common payload
    pays for three substring scans.
    """
    # A payload with fewer brackets than the limit cannot nest deeper than it.
    if encoded.count("[") + encoded.count("{") > PAYLOAD_MAX_DEPTH:
        depth = _depth(encoded)
        if depth > PAYLOAD_MAX_DEPTH:
            raise ValueError(
                f"outbox.send(): payload nests lists and objects {depth} levels deep; the limit is "
                f"{PAYLOAD_MAX_DEPTH}, so that every worker and consumer can decode it."
            )
    if "e+" in encoded and "e+" in _STRING.sub("", encoded):  # a big float, not just text that looks like one
        encoded = _STRING_OR_BIG_FLOAT.sub(_positional, encoded)
    return encoded


def _depth(encoded: str) -> int:
    depth = deepest = 0
    for bracket in _BRACKET.findall(_STRING.sub("", encoded)):
        if bracket in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _positional(match: re.Match[str]) -> str:
    """A big float written out in full with a fraction, so that every database gives back a float."""
    number = match.group(1)
    if number is None:  # a string
        return match.group(0)
    return f"{decimal.Decimal(number):f}.0"


def _same_json(a: object, b: object) -> bool:
    """JSON value equality: numbers by value (1 and 1.0 are one JSON number), booleans apart from them.

    Iterative, since payloads may nest up to ``PAYLOAD_MAX_DEPTH`` levels.
    """
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        x_number = isinstance(x, int | float) and not isinstance(x, bool)
        y_number = isinstance(y, int | float) and not isinstance(y, bool)
        if x_number or y_number:
            if not (x_number and y_number and x == y):
                return False
        elif type(x) is not type(y):
            return False
        elif isinstance(x, dict) and isinstance(y, dict):
            if x.keys() != y.keys():
                return False
            pending.extend((x[k], y[k]) for k in x)
        elif isinstance(x, list) and isinstance(y, list):
            if len(x) != len(y):
                return False
            pending.extend(zip(x, y, strict=True))
        elif x != y:
            return False
    return True


def _in_range(when: dt.datetime) -> bool:
    """Inside the years 1 to 9999 with a day to spare; naive times (``USE_TZ = False``) compared as such."""
    if timezone.is_naive(when):
        return EARLIEST_AVAILABLE_AT.replace(tzinfo=None) <= when <= LATEST_AVAILABLE_AT.replace(tzinfo=None)
    return EARLIEST_AVAILABLE_AT <= when <= LATEST_AVAILABLE_AT


def _available_at(delay: object, available_at: object, now: dt.datetime) -> dt.datetime:
    if delay is not None and available_at is not None:
        raise ValueError("outbox.send(): pass delay or available_at, not both.")
    if delay is not None:
        if isinstance(delay, dt.timedelta):
            seconds = delay.total_seconds()
        elif isinstance(delay, int | float) and not isinstance(delay, bool):
            try:
                seconds = float(delay)
            except OverflowError:  # an int beyond any float (10**400): no timedelta either
                seconds = -math.inf if delay < 0 else math.inf
                if seconds > 0:
                    raise ValueError(f"outbox.send(): delay {delay!r} reaches past the year 9999.") from None
        else:
            raise TypeError(
                f"outbox.send(): delay must be a timedelta or a number of seconds, not {type(delay).__name__}."
            )
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"outbox.send(): delay must be a finite, non-negative number of seconds, got {delay!r}.")
        try:
            when = now + dt.timedelta(seconds=seconds)
        except OverflowError as exc:
            raise ValueError(f"outbox.send(): delay {delay!r} reaches past the year 9999.") from exc
        if not _in_range(when):
            raise ValueError(f"outbox.send(): delay {delay!r} reaches past the year 9999.")
        return when
    if available_at is not None:
        if not isinstance(available_at, dt.datetime):
            raise TypeError(f"outbox.send(): available_at must be a datetime, not {type(available_at).__name__}.")
        if not django_settings.USE_TZ:  # naive times in TIME_ZONE, as Django's own fields take them
            try:
                local = timezone.make_naive(available_at) if timezone.is_aware(available_at) else available_at
            except OverflowError:
                local = None
            if local is None or not _in_range(local):
                raise ValueError(
                    f"outbox.send(): available_at {available_at.isoformat()} is outside the years 1 to 9999 "
                    "(with a day to spare for time zones)."
                )
            return local
        if timezone.is_naive(available_at):
            raise ValueError(
                "outbox.send(): available_at must be timezone-aware (use django.utils.timezone.now() + timedelta(...))."
            )
        try:
            # In UTC: PostgreSQL refuses offsets beyond 15:59 and offsets with seconds that Python allows.
            utc = available_at.astimezone(dt.UTC)
        except OverflowError:  # e.g. datetime.max at UTC-5: past the year 9999 in UTC
            utc = None
        if utc is None or not EARLIEST_AVAILABLE_AT <= utc <= LATEST_AVAILABLE_AT:
            raise ValueError(
                f"outbox.send(): available_at {available_at.isoformat()} is outside the years 1 to 9999 (UTC, "
                "with a day to spare for time zones)."
            )
        return utc
    return now


#: What each item of ``send_many()`` may hold: ``send()``'s arguments but ``using``, which is the call's.
SEND_ARGUMENTS = frozenset(
    {"topic", "payload", "key", "idempotency_key", "headers", "delay", "available_at", "max_attempts"}
)


def _prepare(
    conf: Any,
    topic: object,
    payload: Any,
    *,
    key: object = None,
    idempotency_key: object = None,
    headers: object = None,
    delay: object = None,
    available_at: object = None,
    max_attempts: object = None,
    now: dt.datetime | None = None,
) -> store_types.NewMessage:
    """One message validated and encoded, ready to be written; raises on the first bad argument.

    ``now``: the time the message counts as sent (``send_many()`` reads the clock once for the batch).
    """
    store = _store or _import_store()

    topic = _check_name("topic", topic, TOPIC_MAX_LENGTH, optional=False)
    key = _check_name("key", key, KEY_MAX_LENGTH, optional=True)
    idempotency_key = _check_name("idempotency_key", idempotency_key, IDEMPOTENCY_KEY_MAX_LENGTH, optional=True)
    if trace_headers is not None:  # opentelemetry-api installed
        headers = trace_headers(headers)
    headers_json = _check_headers(headers)
    attempts: int
    if max_attempts is None:
        attempts = conf.MAX_ATTEMPTS
    elif (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT
    ):
        raise ValueError(f"outbox.send(): max_attempts must be a positive integer, got {max_attempts!r}.")
    else:
        attempts = max_attempts
    payload_json = _encode("payload", payload)
    if len(payload_json) <= conf.MAX_PAYLOAD_BYTES:  # else refused below, without the work of _portable()
        payload_json = _portable(payload_json)
    if len(payload_json) > conf.MAX_PAYLOAD_BYTES:
        raise PayloadTooLargeError(
            f"outbox.send(): the payload of {topic!r} is {len(payload_json)} bytes as JSON; "
            f"OUTBOX['MAX_PAYLOAD_BYTES'] is {conf.MAX_PAYLOAD_BYTES}. Store large data elsewhere and "
            "send a reference to it."
        )
    # No headers are stored as {}: not the caller's bytes, so not counted (the limit may be as low as 1).
    if headers_json != "{}" and len(headers_json) > conf.MAX_PAYLOAD_BYTES - len(payload_json):
        raise PayloadTooLargeError(
            f"outbox.send(): the headers of {topic!r} are {len(headers_json)} bytes as JSON, which with "
            f"the payload's {len(payload_json)} is over OUTBOX['MAX_PAYLOAD_BYTES'] ({conf.MAX_PAYLOAD_BYTES})."
        )
    now = timezone.now() if now is None else now
    when = _available_at(delay, available_at, now)
    # Without an explicit time, PostgreSQL schedules on its own clock: now plus the delay (store.insert).
    delay_seconds = None if available_at is not None else (when - now).total_seconds()
    assert topic is not None  # _check_name() returns a string for a required name
    sending_transport(topic)
    new: store_types.NewMessage = store.NewMessage(
        uuid=new_uuid(),
        topic=topic,
        key=key,
        payload_json=payload_json,
        headers_json=headers_json,
        idempotency_key=idempotency_key,
        max_attempts=attempts,
        available_at=when,
        created_at=now,
        delay_seconds=delay_seconds,
    )
    return new


#: ``django_outbox.store``, imported at the first send: it imports the models, and this module must be
#: importable before the apps are ready. Kept here, since a function-level import statement runs the
#: import system's own Python on every call.
_store: Any = None


def _import_store() -> Any:
    global _store
    from . import store

    _store = store
    return store


def _alias(conf: Any, using: object, caller: str) -> str:
    alias = conf.DATABASE if using is None else using
    if not isinstance(alias, str) or alias not in django_settings.DATABASES:
        raise ValueError(f"outbox.{caller}(): using={alias!r} is not a database in settings.DATABASES.")
    return alias


def _same_content(message: Message, new: store_types.NewMessage) -> bool:
    """What makes a repeated idempotency key a repeat and not a conflict: the same topic, key and payload."""
    return (
        message.topic == new.topic
        and message.key == new.key
        and _same_json(message.payload, json.loads(new.payload_json))
    )


def _same_batch_content(first: store_types.NewMessage, later: store_types.NewMessage) -> bool:
    return (
        first.topic == later.topic
        and first.key == later.key
        and _same_json(json.loads(first.payload_json), json.loads(later.payload_json))
    )


def _conflict(caller: str, new: store_types.NewMessage, existing: Message) -> IdempotencyConflictError:
    return IdempotencyConflictError(
        f"outbox.{caller}(): idempotency_key {new.idempotency_key!r} already belongs to message {existing.uuid} "
        f"(topic {existing.topic!r}, key {existing.key!r}) with other content; nothing was written. "
        "A repeated key must come with the same topic, key and payload: derive the key from "
        "everything that makes the message unique.",
        existing=existing,
    )


def _item_error(exc: Exception, index: int) -> Exception:
    """``exc`` raised for item ``index`` of ``send_many()``, saying so: the same class, the same text
    after the item's number, chained to the original."""
    text = str(exc).removeprefix("outbox.send(): ")
    try:
        error = type(exc)(f"outbox.send_many(): item {index}: {text}")
    except TypeError:  # an error class with arguments of its own: keep it, and add the item's number
        exc.add_note(f"outbox.send_many(): item {index}")
        return exc
    error.__cause__ = exc
    return error


class Outbox:
    """The public face of the outbox; ``django_outbox.outbox`` is the instance to use."""

    def send(
        self,
        topic: str,
        payload: Any,
        *,
        key: str | None = None,
        idempotency_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        delay: dt.timedelta | float | None = None,
        available_at: dt.datetime | None = None,
        max_attempts: int | None = None,
        using: str | None = None,
    ) -> Message:
        """Write a message in the current transaction of ``using``; it is relayed only once that commits.

        Everything is validated before the row is written, so a bad argument raises here and leaves the
        caller's transaction untouched. A repeated ``idempotency_key`` returns the stored message if the
        topic, key and payload are the same, and raises ``IdempotencyConflictError`` otherwise (docs/api.md).
        """
        conf = get_settings()
        new = _prepare(
            conf,
            topic,
            payload,
            key=key,
            idempotency_key=idempotency_key,
            headers=headers,
            delay=delay,
            available_at=available_at,
            max_attempts=max_attempts,
        )
        # OUTBOX["DATABASE"] is checked with the settings (get_settings() raises while it names no alias).
        alias = conf.DATABASE if using is None else _alias(conf, using, "send")
        store = _store or _import_store()

        # PostgreSQL folds the NOTIFYs of one transaction into one, and drops them on rollback.
        written: tuple[Message, bool] = store.insert(alias, new, notify=conf.NOTIFY_CHANNEL if conf.NOTIFY else None)
        message, created = written
        if not created and not _same_content(message, new):
            raise _conflict("send", new, message)
        if created and conf.EAGER:  # tests only: delivered in this process once the transaction commits
            from .testing.eager import deliver_at_commit

            deliver_at_commit(alias, [message.id])
        return message

    def send_many(self, messages: Iterable[Mapping[str, Any]], *, using: str | None = None) -> list[Message]:
        """Write many messages in the current transaction of ``using`` with one ``INSERT``; one
        ``Message`` per item, in order.

        Each item is a dict of ``send()``'s keyword arguments (``topic`` and ``payload`` required). Every
        item is validated before anything is written: a bad one raises, naming its index, and writes
        nothing. Idempotency as with ``send()`` called for each item in turn: a key already stored
        returns the stored message (or raises ``IdempotencyConflictError`` for other content, and then
        nothing of the batch is written); a key repeated within the batch with the same content is
        written once and returned at each of its places, with other content it raises (``existing``
        is None then). Keys are locked in one fixed order (docs/ordering.md), so two ``send_many()``
        calls with overlapping keys cannot deadlock each other.
        """
        conf = get_settings()
        refused = TypeError(
            "outbox.send_many(): pass a list of dicts, one per message, not "
            f"{type(messages).__name__}; for one message, call send()."
        )
        if isinstance(messages, Mapping | str | bytes):
            raise refused
        try:
            items = iter(messages)
        except TypeError:
            raise refused from None
        news: list[store_types.NewMessage] = []
        now = timezone.now()
        for index, item in enumerate(items):
            if index == SEND_MANY_MAX_ITEMS:
                raise ValueError(
                    f"outbox.send_many(): more than {SEND_MANY_MAX_ITEMS:,} items in one call; nothing was "
                    "written. Split the batch into several send_many() calls in the same transaction: it "
                    "stays atomic."
                )
            if not isinstance(item, Mapping):
                raise TypeError(
                    f"outbox.send_many(): item {index} must be a dict of send()'s arguments, not {type(item).__name__}."
                )
            unknown = set(item) - SEND_ARGUMENTS
            if unknown:
                where = " (it is an argument of send_many() itself)" if unknown == {"using"} else ""
                raise TypeError(
                    f"outbox.send_many(): item {index} has unknown argument(s) {sorted(map(str, unknown))}{where}; "
                    f"each item takes {', '.join(sorted(SEND_ARGUMENTS))}."
                )
            missing = {"topic", "payload"} - set(item)
            if missing:
                raise TypeError(f"outbox.send_many(): item {index} lacks {', '.join(sorted(missing))}.")
            try:
                news.append(_prepare(conf, **item, now=now))
            except (TypeError, ValueError, OutboxError) as exc:
                raise _item_error(exc, index) from exc
        alias = _alias(conf, using, "send_many")
        # A key repeated within the batch: the first place writes, the later ones repeat it.
        first_of: dict[str, int] = {}
        same_as: list[int] = []
        for index, new in enumerate(news):
            holder = first_of.setdefault(new.idempotency_key, index) if new.idempotency_key is not None else index
            if holder != index and not _same_batch_content(news[holder], new):
                raise IdempotencyConflictError(
                    f"outbox.send_many(): item {index} repeats the idempotency_key {new.idempotency_key!r} of "
                    f"item {holder} with other content; nothing was written. A repeated key must come "
                    "with the same topic, key and payload.",
                    existing=None,
                )
            same_as.append(holder)
        if not news:
            return []
        store = _store or _import_store()

        # The items that write, and each one's place among them by its index (ints hash faster than uuids).
        unique: list[store_types.NewMessage] = []
        place_of: dict[int, int] = {}
        for index, new in enumerate(news):
            if same_as[index] == index:
                place_of[index] = len(unique)
                unique.append(new)
        written = store.insert_many(
            alias,
            unique,
            notify=conf.NOTIFY_CHANNEL if conf.NOTIFY else None,
            check=lambda message, new: None if _same_content(message, new) else _conflict("send_many", new, message),
        )
        created = [message.id for message, was_created in written if was_created]
        if created and conf.EAGER:  # tests only, as in send()
            from .testing.eager import deliver_at_commit

            deliver_at_commit(alias, created)
        return [written[place_of[holder]][0] for holder in same_as]

    async def asend(
        self,
        topic: str,
        payload: Any,
        *,
        key: str | None = None,
        idempotency_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        delay: dt.timedelta | float | None = None,
        available_at: dt.datetime | None = None,
        max_attempts: int | None = None,
        using: str | None = None,
    ) -> Message:
        """``send()`` for ``async def`` code: the same arguments, validation and result.

        It runs ``send()`` through ``sync_to_async`` (thread-sensitive), so it writes on the connection
        Django's async ORM uses, and joins the transaction open there: none in a plain async view, so the
        message is committed at once on its own; the caller's ``atomic()`` when called, through
        ``async_to_sync``, from sync code that holds one (docs/async.md).
        """
        return await sync_to_async(self.send, thread_sensitive=True)(
            topic,
            payload,
            key=key,
            idempotency_key=idempotency_key,
            headers=headers,
            delay=delay,
            available_at=available_at,
            max_attempts=max_attempts,
            using=using,
        )

    async def asend_many(self, messages: Iterable[Mapping[str, Any]], *, using: str | None = None) -> list[Message]:
        """``send_many()`` for ``async def`` code, on the same terms as ``asend()``."""
        return await sync_to_async(self.send_many, thread_sensitive=True)(messages, using=using)

    def handler(self, pattern: str) -> Callable[[H], H]:
        """Register a function that the worker calls with each ``Message`` of a matching topic.

        Put handlers in ``<app>/outbox.py``: those modules are imported when Django starts, so web
        processes know the topic is served (``send()`` checks) and workers can deliver it.
        """

        def decorator(func: H) -> H:
            registry.register(pattern, func)
            return func

        return decorator


outbox = Outbox()
