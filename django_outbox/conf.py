"""Typed view of ``settings.OUTBOX``.

Read lazily and cached until Django's ``setting_changed`` fires, so ``override_settings`` works in
tests and nothing is read at import time. Validation collects every problem with a stable check id;
``manage.py check`` reports them all, while code paths that need the settings raise on the first.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .exceptions import OutboxImproperlyConfigured

#: The implicit transport that calls ``@outbox.handler`` functions in the worker process.
HANDLER_TRANSPORT = "handler"
HANDLER_BACKEND = "django_outbox.transports.handler.HandlerTransport"
#: Emails written by ``django_outbox.mail.EmailBackend`` use this topic, always served by the built-in
#: email transport (see routing.resolve_transport), so no ROUTES entry is needed for them.
EMAIL_TOPIC = "django_outbox.email"
EMAIL_TRANSPORT = "django_outbox.email"
EMAIL_TRANSPORT_BACKEND = "django_outbox.mail.transport.EmailTransport"


@dataclass(frozen=True, kw_only=True, slots=True)
class TransportConfig:
    name: str
    backend: str
    options: Mapping[str, Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class OutboxSettings:
    MAX_ATTEMPTS: int = 10
    BACKOFF_BASE_SECONDS: float = 2.0
    BACKOFF_MAX_SECONDS: float = 3600.0
    #: Longest wait a destination's ``Retry-After`` is honoured for; None: ``BACKOFF_MAX_SECONDS``.
    RETRY_AFTER_MAX_SECONDS: float | None = None
    LEASE_SECONDS: float = 60.0
    POLL_INTERVAL_SECONDS: float = 5.0
    BATCH_SIZE: int = 100
    #: Delivery threads per worker; None: 2 on PostgreSQL, 1 on SQLite (see ``default_concurrency``).
    CONCURRENCY: int | None = None
    GRACE_PERIOD_SECONDS: float = 30.0
    MAX_PAYLOAD_BYTES: int = 1_000_000
    DATABASE: str = "default"
    #: The DATABASES alias the workers' listener LISTENs on; None: DATABASE. Behind a pooler in
    #: transaction pooling, name an alias that reaches the same server directly (docs/deploying.md).
    LISTEN_DATABASE: str | None = None
    NOTIFY: bool = True
    NOTIFY_CHANNEL: str = "django_outbox"
    #: PostgreSQL workers prepare the claim and the record (docs/settings.md); off behind old PgBouncers.
    PREPARED_STATEMENTS: bool = True
    ROUTES: Mapping[str, str] = field(default_factory=dict)
    TRANSPORTS: Mapping[str, TransportConfig] = field(default_factory=dict)
    EMAIL_BACKEND: str = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_MAILER: str = ""
    EMAIL_VIEW_BASE_URL: str = ""
    EMAIL_VIEW_MAX_AGE_SECONDS: float = 30 * 24 * 3600.0
    #: How long inbox receipts are kept: the window in which a redelivered message is recognised.
    INBOX_RETENTION: dt.timedelta = dt.timedelta(days=7)
    #: How long a stored ``Idempotency-Key`` response is replayed (Stripe keeps keys for 24 hours).
    IDEMPOTENCY_KEY_TTL: dt.timedelta = dt.timedelta(hours=24)
    #: Longest a delivery call (a handler, or one call to a transport) may run; None: no limit.
    HANDLER_TIMEOUT_SECONDS: float | None = None
    #: "block": a dead message holds back the later messages of its key until it is retried or cancelled;
    #: "skip_dead": the key moves on past it.
    ORDERING: str = "block"
    #: How long delivered and cancelled messages are kept for audit before housekeeping removes them.
    RETENTION: dt.timedelta = dt.timedelta(days=7)
    #: "archive": finished messages move to the archive tables after ARCHIVE_AFTER and stay there until
    #: RETENTION; "delete": they stay in the message table until RETENTION and are then deleted.
    RETENTION_MODE: str = "archive"
    #: How long a finished message stays in the message table before it is archived; repeated
    #: idempotency keys are recognised only while the first message is there.
    ARCHIVE_AFTER: dt.timedelta = dt.timedelta(hours=1)
    #: How often one worker runs housekeeping; 0 leaves it to ``manage.py outbox_housekeeping`` (cron).
    HOUSEKEEPING_INTERVAL_SECONDS: float = 60.0
    #: Topic patterns (as in ROUTES) whose payloads the admin shows only with the content permission;
    #: emails are content-protected whatever this says.
    SENSITIVE_TOPICS: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with ``settings.OUTBOX``; ``id`` is the system check id."""

    id: str
    msg: str
    hint: str


_NUMBERS: dict[str, tuple[type, float]] = {
    # name: (type, smallest allowed value)
    "MAX_ATTEMPTS": (int, 1),
    "BACKOFF_BASE_SECONDS": (float, 0),
    "BACKOFF_MAX_SECONDS": (float, 0),
    "LEASE_SECONDS": (float, 1),
    "POLL_INTERVAL_SECONDS": (float, 0.01),
    "BATCH_SIZE": (int, 1),
    "CONCURRENCY": (int, 1),
    "GRACE_PERIOD_SECONDS": (float, 0),
    "MAX_PAYLOAD_BYTES": (int, 1),
    "EMAIL_VIEW_MAX_AGE_SECONDS": (float, 1),
}
_KNOWN = set(OutboxSettings.__dataclass_fields__)
#: Settings given as a timedelta or a number of seconds, with the check id of a bad value.
_DURATIONS = (
    ("INBOX_RETENTION", "django_outbox.E060"),
    ("IDEMPOTENCY_KEY_TTL", "django_outbox.E061"),
    ("RETENTION", "django_outbox.E071"),
    ("ARCHIVE_AFTER", "django_outbox.E073"),
)


def _parse(raw: object) -> tuple[OutboxSettings, list[Problem]]:
    problems: list[Problem] = []
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        return OutboxSettings(), [
            Problem(
                "django_outbox.E001",
                f"OUTBOX must be a dict, not {type(raw).__name__}.",
                'Write OUTBOX = {"MAX_ATTEMPTS": 10, ...} in your settings.',
            )
        ]
    values: dict[str, Any] = {}
    for name in sorted(set(raw) - _KNOWN, key=str):
        problems.append(
            Problem(
                "django_outbox.E002",
                f"OUTBOX has an unknown key {name!r}.",
                f"Known keys: {', '.join(sorted(_KNOWN))}.",
            )
        )
    for name, (kind, minimum) in _NUMBERS.items():
        if name not in raw:
            continue
        value = raw[name]
        ok_type = isinstance(value, int) if kind is int else isinstance(value, int | float)
        if isinstance(value, bool) or not ok_type or value < minimum:
            problems.append(
                Problem(
                    "django_outbox.E003",
                    f"OUTBOX[{name!r}] must be {'an integer' if kind is int else 'a number'} "
                    f">= {minimum}, not {value!r}.",
                    "Fix the value or remove the key to use the default.",
                )
            )
        else:
            values[name] = kind(value)
    for name in ("NOTIFY", "PREPARED_STATEMENTS"):
        if name in raw:
            if isinstance(raw[name], bool):
                values[name] = raw[name]
            else:
                problems.append(
                    Problem(
                        "django_outbox.E003",
                        f"OUTBOX[{name!r}] must be True or False.",
                        "Fix the value or remove the key to use the default.",
                    )
                )
    for name in ("DATABASE", "NOTIFY_CHANNEL", "EMAIL_BACKEND"):
        if name in raw:
            if isinstance(raw[name], str) and raw[name]:
                values[name] = raw[name]
            else:
                problems.append(
                    Problem(
                        "django_outbox.E003",
                        f"OUTBOX[{name!r}] must be a non-empty string.",
                        "Fix the value or remove the key to use the default.",
                    )
                )
    for name in ("EMAIL_MAILER", "EMAIL_VIEW_BASE_URL"):  # optional strings: empty means unset
        if name in raw:
            if isinstance(raw[name], str):
                values[name] = raw[name]
            else:
                problems.append(
                    Problem(
                        "django_outbox.E003",
                        f"OUTBOX[{name!r}] must be a string.",
                        "Fix the value or remove the key to use the default.",
                    )
                )
    if "SENSITIVE_TOPICS" in raw:
        patterns = raw["SENSITIVE_TOPICS"]
        if isinstance(patterns, list | tuple) and all(isinstance(p, str) and p for p in patterns):
            values["SENSITIVE_TOPICS"] = tuple(patterns)
        else:
            problems.append(
                Problem(
                    "django_outbox.E003",
                    "OUTBOX['SENSITIVE_TOPICS'] must be a list of non-empty topic patterns, "
                    f"not {reprlib.repr(patterns)}.",
                    'Example: ["payments.*", "users.password_changed"]. Remove the key to protect emails only.',
                )
            )
    if raw.get("LISTEN_DATABASE") is not None:
        listen = raw["LISTEN_DATABASE"]
        if isinstance(listen, str) and listen in django_settings.DATABASES:
            values["LISTEN_DATABASE"] = listen
        else:
            problems.append(
                Problem(
                    "django_outbox.E008",
                    f"OUTBOX['LISTEN_DATABASE'] must name an alias of DATABASES, not {listen!r}.",
                    "Add an alias that reaches the outbox's PostgreSQL server directly (not through a pooler in "
                    f"transaction pooling), or remove the key. Aliases: {', '.join(django_settings.DATABASES)}.",
                )
            )
    if "DATABASE" in values and values["DATABASE"] not in django_settings.DATABASES:
        problems.append(
            Problem(
                "django_outbox.E004",
                f"OUTBOX['DATABASE'] names {values['DATABASE']!r}, which is not in DATABASES.",
                f"Use one of: {', '.join(django_settings.DATABASES)}.",
            )
        )

    for name, check_id in _DURATIONS:
        if name in raw:
            duration = _duration(raw[name])
            if duration is None:
                problems.append(
                    Problem(
                        check_id,
                        f"OUTBOX[{name!r}] must be a positive timedelta or number of seconds, not {raw[name]!r}.",
                        "Example: datetime.timedelta(days=7). Remove the key to use the default.",
                    )
                )
            else:
                values[name] = duration

    if raw.get("HANDLER_TIMEOUT_SECONDS") is not None:
        timeout = raw["HANDLER_TIMEOUT_SECONDS"]
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < float("inf"):
            problems.append(
                Problem(
                    "django_outbox.E090",
                    f"OUTBOX['HANDLER_TIMEOUT_SECONDS'] must be a positive number of seconds or None, not {timeout!r}.",
                    "Example: 30. Use None (the default) for no limit.",
                )
            )
        else:
            values["HANDLER_TIMEOUT_SECONDS"] = float(timeout)
    problems += _parse_retention(raw, values)
    problems += _parse_retry_after_max(raw, values)

    transports, transport_problems = _parse_transports(raw.get("TRANSPORTS", {}))
    problems += transport_problems
    values["TRANSPORTS"] = transports
    routes, route_problems = _parse_routes(raw.get("ROUTES", {}), transports)
    problems += route_problems
    values["ROUTES"] = routes
    parsed = OutboxSettings(**values)
    if parsed.BACKOFF_MAX_SECONDS < parsed.BACKOFF_BASE_SECONDS:
        problems.append(
            Problem(
                "django_outbox.E003",
                "OUTBOX['BACKOFF_MAX_SECONDS'] is smaller than OUTBOX['BACKOFF_BASE_SECONDS'].",
                "The cap must be at least the first delay.",
            )
        )
    return parsed, problems


ORDERING_CHOICES = ("block", "skip_dead")
RETENTION_MODES = ("archive", "delete")


def _parse_retention(raw: Mapping[str, Any], values: dict[str, Any]) -> list[Problem]:
    """ORDERING, RETENTION, RETENTION_MODE, ARCHIVE_AFTER, HOUSEKEEPING_INTERVAL_SECONDS (E070-E074)."""
    problems = []
    for name, choices, check_id in (
        ("ORDERING", ORDERING_CHOICES, "django_outbox.E070"),
        ("RETENTION_MODE", RETENTION_MODES, "django_outbox.E072"),
    ):
        if name in raw:
            if raw[name] in choices:
                values[name] = raw[name]
            else:
                problems.append(
                    Problem(
                        check_id,
                        f"OUTBOX[{name!r}] must be one of {', '.join(map(repr, choices))}, not {raw[name]!r}.",
                        "Fix the value or remove the key to use the default.",
                    )
                )
    if "HOUSEKEEPING_INTERVAL_SECONDS" in raw:
        value = raw["HOUSEKEEPING_INTERVAL_SECONDS"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 10**9:
            problems.append(
                Problem(
                    "django_outbox.E074",
                    f"OUTBOX['HOUSEKEEPING_INTERVAL_SECONDS'] must be a number >= 0, not {value!r}.",
                    "Use 0 to run housekeeping only from cron (manage.py outbox_housekeeping).",
                )
            )
        else:
            values["HOUSEKEEPING_INTERVAL_SECONDS"] = float(value)
    return problems


def _parse_retry_after_max(raw: Mapping[str, Any], values: dict[str, Any]) -> list[Problem]:
    """RETRY_AFTER_MAX_SECONDS: None, or a finite number >= 0 (E003). A receiver's ``Retry-After`` is
    capped there, so infinity (no cap) is refused: a hostile receiver could park a message forever."""
    value = raw.get("RETRY_AFTER_MAX_SECONDS")
    if value is None:
        return []
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int beyond a float's range
            number = None
    if number is None or not math.isfinite(number) or number < 0:
        try:
            shown = repr(value)[:100]
        except Exception:  # an int of more digits than str() converts, an object whose repr raises
            shown = f"this {type(value).__name__}"
        return [
            Problem(
                "django_outbox.E003",
                f"OUTBOX['RETRY_AFTER_MAX_SECONDS'] must be a finite number of seconds >= 0 or None, not {shown}.",
                "Example: 3600. None (the default) caps a receiver's Retry-After at BACKOFF_MAX_SECONDS.",
            )
        ]
    values["RETRY_AFTER_MAX_SECONDS"] = number
    return []


def _duration(value: object) -> dt.timedelta | None:
    """A positive duration from a timedelta or a number of seconds; None if it is neither."""
    if isinstance(value, dt.timedelta):
        return value if value > dt.timedelta(0) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        try:
            return dt.timedelta(seconds=value)
        except (OverflowError, ValueError):  # infinity, NaN, or beyond timedelta's range
            return None
    return None


def _parse_transports(raw: object) -> tuple[dict[str, TransportConfig], list[Problem]]:
    transports = {
        HANDLER_TRANSPORT: TransportConfig(name=HANDLER_TRANSPORT, backend=HANDLER_BACKEND, options={}),
        EMAIL_TRANSPORT: TransportConfig(name=EMAIL_TRANSPORT, backend=EMAIL_TRANSPORT_BACKEND, options={}),
    }
    if not isinstance(raw, Mapping):
        return transports, [
            Problem(
                "django_outbox.E010",
                "OUTBOX['TRANSPORTS'] must be a dict of name to config.",
                'Example: {"hooks": {"BACKEND": "dotted.path.Transport", "OPTIONS": {}}}',
            )
        ]
    problems = []
    for name, config in raw.items():
        if not isinstance(config, Mapping) or not isinstance(config.get("BACKEND"), str):
            problems.append(
                Problem(
                    "django_outbox.E010",
                    f"OUTBOX['TRANSPORTS'][{name!r}] must be a dict with a 'BACKEND' dotted path.",
                    'Example: {"BACKEND": "django_outbox.transports.webhook.WebhookTransport"}',
                )
            )
            continue
        extra = set(config) - {"BACKEND", "OPTIONS"}
        options = config.get("OPTIONS", {})
        if extra or not isinstance(options, Mapping):
            problems.append(
                Problem(
                    "django_outbox.E010",
                    f"OUTBOX['TRANSPORTS'][{name!r}] takes only 'BACKEND' and an 'OPTIONS' dict.",
                    "Move transport settings under 'OPTIONS'.",
                )
            )
            continue
        transports[str(name)] = TransportConfig(name=str(name), backend=config["BACKEND"], options=dict(options))
    return transports, problems


def _parse_routes(raw: object, transports: Mapping[str, TransportConfig]) -> tuple[dict[str, str], list[Problem]]:
    if not isinstance(raw, Mapping):
        return {}, [
            Problem(
                "django_outbox.E020",
                "OUTBOX['ROUTES'] must be a dict of topic pattern to transport.",
                'Example: {"orders.*": "webhooks"}',
            )
        ]
    routes: dict[str, str] = {}
    problems = []
    for pattern, name in raw.items():
        if not isinstance(pattern, str) or not pattern or not isinstance(name, str):
            problems.append(
                Problem(
                    "django_outbox.E020",
                    f"OUTBOX['ROUTES'] entry {pattern!r}: {name!r} is not a pattern and a name.",
                    "Both must be non-empty strings.",
                )
            )
        elif name not in transports:
            problems.append(
                Problem(
                    "django_outbox.E021",
                    f"OUTBOX['ROUTES'][{pattern!r}] names transport {name!r}, which is not in OUTBOX['TRANSPORTS'].",
                    f"Known transports: {', '.join(sorted(transports))}.",
                )
            )
        else:
            routes[pattern] = name
    return routes, problems


@functools.cache
def _load() -> tuple[OutboxSettings, tuple[Problem, ...]]:
    parsed, problems = _parse(getattr(django_settings, "OUTBOX", None))
    return parsed, tuple(problems)


def problems() -> tuple[Problem, ...]:
    return _load()[1]


def get_settings() -> OutboxSettings:
    parsed, found = _load()
    if found:
        first = found[0]
        raise OutboxImproperlyConfigured(f"{first.msg} {first.hint} ({first.id}; run 'manage.py check')")
    return parsed


@receiver(setting_changed)
def _clear_cache(*, setting: str, **kwargs: object) -> None:
    if setting in ("OUTBOX", "DATABASES"):
        _load.cache_clear()
