"""``outbox.send()`` and ``@outbox.handler``: what application code calls."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from django.conf import settings as django_settings
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from .conf import get_settings
from .exceptions import PayloadTooLargeError
from .limits import IDEMPOTENCY_KEY_MAX_LENGTH, KEY_MAX_LENGTH, TOPIC_MAX_LENGTH
from .routing import Handler, registry, resolve_transport

if TYPE_CHECKING:
    from .models import Message

H = TypeVar("H", bound=Handler)

#: ``max_attempts`` and ``attempts`` are 32-bit integer columns on PostgreSQL.
MAX_ATTEMPTS_LIMIT = 2**31 - 1
#: One encoder for every call: ``json.dumps(cls=...)`` would build a new one each time. It keeps no state
#: between calls, so threads share it safely. ASCII output makes the text's length its size in bytes.
_ENCODER = DjangoJSONEncoder(allow_nan=False, separators=(",", ":"))
#: The ``\u0000`` escape json.dumps writes for NUL, not the text "\\u0000" (whose backslash it doubles).
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


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
    return value


def _encode(what: str, value: object) -> str:
    try:
        encoded = _ENCODER.encode(value)
    except TypeError as exc:
        raise TypeError(
            f"outbox.send(): {what} must be JSON-serialisable: {exc}. "
            "Pass plain data (dict, list, str, int, ...) or convert the object first."
        ) from exc
    except ValueError as exc:
        raise TypeError(
            f"outbox.send(): {what} must be JSON-serialisable: {exc} (NaN and infinity are not JSON)."
        ) from exc
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


def _available_at(delay: object, available_at: object, now: dt.datetime) -> dt.datetime:
    if delay is not None and available_at is not None:
        raise ValueError("outbox.send(): pass delay or available_at, not both.")
    if delay is not None:
        if isinstance(delay, dt.timedelta):
            seconds = delay.total_seconds()
        elif isinstance(delay, int | float) and not isinstance(delay, bool):
            seconds = float(delay)
        else:
            raise TypeError(
                f"outbox.send(): delay must be a timedelta or a number of seconds, not {type(delay).__name__}."
            )
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"outbox.send(): delay must be a finite, non-negative number of seconds, got {delay!r}.")
        try:
            return now + dt.timedelta(seconds=seconds)
        except OverflowError as exc:
            raise ValueError(f"outbox.send(): delay {delay!r} reaches past the year 9999.") from exc
    if available_at is not None:
        if not isinstance(available_at, dt.datetime):
            raise TypeError(f"outbox.send(): available_at must be a datetime, not {type(available_at).__name__}.")
        if timezone.is_naive(available_at):
            raise ValueError(
                "outbox.send(): available_at must be timezone-aware (use django.utils.timezone.now() + timedelta(...))."
            )
        return available_at
    return now


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
        caller's transaction untouched. A repeated ``idempotency_key`` returns the stored message.
        """
        conf = get_settings()
        topic = _check_name("topic", topic, TOPIC_MAX_LENGTH, optional=False)  # type: ignore[assignment]
        key = _check_name("key", key, KEY_MAX_LENGTH, optional=True)
        idempotency_key = _check_name("idempotency_key", idempotency_key, IDEMPOTENCY_KEY_MAX_LENGTH, optional=True)
        if headers is not None and (
            not isinstance(headers, Mapping)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
        ):
            raise TypeError("outbox.send(): headers must be a dict of str to str.")
        if max_attempts is None:
            max_attempts = conf.MAX_ATTEMPTS
        elif (
            isinstance(max_attempts, bool)
            or not isinstance(max_attempts, int)
            or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT
        ):
            raise ValueError(f"outbox.send(): max_attempts must be a positive integer, got {max_attempts!r}.")
        alias = conf.DATABASE if using is None else using
        if alias not in django_settings.DATABASES:
            raise ValueError(f"outbox.send(): using={alias!r} is not a database in settings.DATABASES.")
        payload_json = _encode("payload", payload)
        if len(payload_json) > conf.MAX_PAYLOAD_BYTES:
            raise PayloadTooLargeError(
                f"outbox.send(): the payload of {topic!r} is {len(payload_json)} bytes as JSON; "
                f"OUTBOX['MAX_PAYLOAD_BYTES'] is {conf.MAX_PAYLOAD_BYTES}. Store large data elsewhere and "
                "send a reference to it."
            )
        now = timezone.now()
        when = _available_at(delay, available_at, now)
        # Without an explicit time, PostgreSQL schedules on its own clock: now plus the delay (store.insert).
        delay_seconds = None if available_at is not None else (when - now).total_seconds()
        resolve_transport(topic)
        from . import store  # imported here: the package must be importable before apps are ready

        message, _ = store.insert(
            alias,
            store.NewMessage(
                uuid=uuid.uuid4(),
                topic=topic,
                key=key,
                payload_json=payload_json,
                headers_json=_encode("headers", dict(headers)) if headers else "{}",
                idempotency_key=idempotency_key,
                max_attempts=max_attempts,
                available_at=when,
                created_at=now,
                delay_seconds=delay_seconds,
            ),
            # PostgreSQL folds the NOTIFYs of one transaction into one, and drops them on rollback.
            notify=conf.NOTIFY_CHANNEL if conf.NOTIFY else None,
        )
        return message

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
