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


#: Longest duration any setting may give: ten (365-day) years. Far beyond any sane retention or backoff, and
#: still a ``timedelta``, a PostgreSQL ``interval`` and an offset from now that every supported database
#: stores as a timestamp (so no value that passes ``check`` can overflow a date at run time).
MAX_DURATION_SECONDS = 10 * 365 * 24 * 3600
#: Longest a worker waits for one thing (a lease, a poll, a delivery call, a stopping delivery): one day.
MAX_WAIT_SECONDS = 24 * 3600
#: Counts stored in an integer column (``Message.max_attempts``) are at most PostgreSQL's ``integer``.
MAX_INT32 = 2**31 - 1
#: The claim's ids travel as one parameter each when a batch is handed back (``store.release``); this
#: keeps a batch well inside PostgreSQL's 65,535 and SQLite's 32,766 parameters per statement.
MAX_BATCH_SIZE = 10_000
#: Delivery threads per worker: each holds a database connection.
MAX_CONCURRENCY = 256
#: Largest payload limit: 64 MiB, inside PostgreSQL's jsonb limit (256 MiB) and common packet limits.
MAX_PAYLOAD_LIMIT = 64 * 1024 * 1024
#: PostgreSQL truncates identifiers (and refuses longer channel names) at NAMEDATALEN - 1 bytes.
MAX_CHANNEL_BYTES = 63


@dataclass(frozen=True, kw_only=True, slots=True)
class Number:
    """The allowed range of one numeric setting; a value outside it is a ``Problem`` with ``id``.

    Finite values only: NaN compares false with everything, so a plain ``value < minimum`` let it
    through. Adding a numeric setting is one row in ``_NUMBERS``.
    """

    kind: type  # int or float (a float setting also takes an int)
    minimum: float
    maximum: float
    id: str = "django_outbox.E003"
    #: None is a value of its own (no limit, or the default), not an error.
    optional: bool = False
    hint: str = "Fix the value or remove the key to use the default."

    def parse(self, name: str, value: object) -> tuple[int | float | None, Problem | None]:
        if value is None and self.optional:
            return None, None
        if isinstance(value, int | float) and not isinstance(value, bool):
            ok_type = isinstance(value, int) or (self.kind is float and math.isfinite(value))
            if ok_type and self.minimum <= value <= self.maximum:  # an int of any size compares exactly
                return self.kind(value), None
        what = "an integer" if self.kind is int else "a number"
        none = " or None" if self.optional else ""
        return None, Problem(
            self.id,
            f"OUTBOX[{name!r}] must be {what} from {_g(self.minimum)} to {_g(self.maximum)}{none}, not {shown(value)}.",
            self.hint,
        )


def shown(value: object, limit: int = 100) -> str:
    """``repr(value)`` cut to ``limit`` characters, for check messages about values of any size or kind.

    A setting may hold a 10 MB string or an integer too long for ``repr()`` (Python refuses more than
    4300 digits); a check message must still be short, and building it must not raise.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = _SHORT_REPR.repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = 100


def _g(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else repr(bound)


_NUMBERS: dict[str, Number] = {
    "MAX_ATTEMPTS": Number(kind=int, minimum=1, maximum=MAX_INT32),
    "BACKOFF_BASE_SECONDS": Number(kind=float, minimum=0, maximum=MAX_DURATION_SECONDS),
    "BACKOFF_MAX_SECONDS": Number(kind=float, minimum=0, maximum=MAX_DURATION_SECONDS),
    "LEASE_SECONDS": Number(kind=float, minimum=1, maximum=MAX_WAIT_SECONDS),
    "POLL_INTERVAL_SECONDS": Number(kind=float, minimum=0.01, maximum=MAX_WAIT_SECONDS),
    "BATCH_SIZE": Number(kind=int, minimum=1, maximum=MAX_BATCH_SIZE),
    "CONCURRENCY": Number(kind=int, minimum=1, maximum=MAX_CONCURRENCY, optional=True),
    "GRACE_PERIOD_SECONDS": Number(kind=float, minimum=0, maximum=MAX_WAIT_SECONDS),
    "MAX_PAYLOAD_BYTES": Number(kind=int, minimum=1, maximum=MAX_PAYLOAD_LIMIT),
    "EMAIL_VIEW_MAX_AGE_SECONDS": Number(kind=float, minimum=1, maximum=MAX_DURATION_SECONDS),
    "HANDLER_TIMEOUT_SECONDS": Number(
        kind=float,
        minimum=0.01,
        maximum=MAX_WAIT_SECONDS,
        id="django_outbox.E090",
        optional=True,
        hint="Example: 30. Use None (the default) for no limit.",
    ),
    "HOUSEKEEPING_INTERVAL_SECONDS": Number(
        kind=float,
        minimum=0,
        maximum=MAX_WAIT_SECONDS,
        id="django_outbox.E074",
        hint="Use 0 to run housekeeping only from cron (manage.py outbox_housekeeping).",
    ),
}


def bounded(name: str, value: object) -> int | float:
    """``value`` for ``OUTBOX[name]`` if ``check`` would accept it there; ``ValueError`` saying why otherwise.

    For the worker's command-line overrides, which must not get past the bounds the settings have.
    """
    parsed, problem = _NUMBERS[name].parse(name, value)
    if problem is not None or parsed is None:
        raise ValueError(problem.msg if problem else f"OUTBOX[{name!r}] needs a number here")
    return parsed


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
                f"OUTBOX has an unknown key {shown(name)}.",
                f"Known keys: {', '.join(sorted(_KNOWN))}.",
            )
        )
    for name, number in _NUMBERS.items():
        if name in raw:
            value, problem = number.parse(name, raw[name])
            if problem is None:
                values[name] = value
            else:
                problems.append(problem)
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
    if "NOTIFY_CHANNEL" in raw and isinstance(raw["NOTIFY_CHANNEL"], str):  # not a string: E003 below
        refused = channel_problem(raw["NOTIFY_CHANNEL"])
        if refused:
            problems.append(
                Problem(
                    "django_outbox.E006",
                    f"OUTBOX['NOTIFY_CHANNEL'] = {shown(raw['NOTIFY_CHANNEL'])} cannot be a PostgreSQL channel: "
                    f"{refused}.",
                    f"Use a short name such as 'django_outbox' (at most {MAX_CHANNEL_BYTES} bytes in UTF-8, no NUL).",
                )
            )
        else:
            values["NOTIFY_CHANNEL"] = raw["NOTIFY_CHANNEL"]
    for name in ("DATABASE", "NOTIFY_CHANNEL", "EMAIL_BACKEND"):
        if name in raw and not (name == "NOTIFY_CHANNEL" and isinstance(raw[name], str)):
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
    base_url = values.get("EMAIL_VIEW_BASE_URL")
    if base_url and not _is_base_url(base_url):
        del values["EMAIL_VIEW_BASE_URL"]
        problems.append(
            Problem(
                "django_outbox.E003",
                f"OUTBOX['EMAIL_VIEW_BASE_URL'] must be '' or an http(s) scheme and host, not {shown(base_url)}.",
                "Example: 'https://shop.example.com'.",
            )
        )
    if "DATABASE" in values and values["DATABASE"] not in django_settings.DATABASES:
        problems.append(
            Problem(
                "django_outbox.E004",
                f"OUTBOX['DATABASE'] names {shown(values['DATABASE'])}, which is not in DATABASES.",
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
                        f"OUTBOX[{name!r}] must be a timedelta or number of seconds, more than 0 and at most "
                        f"{MAX_DURATION_SECONDS} (ten years), not {shown(raw[name])}.",
                        "Example: datetime.timedelta(days=7). Remove the key to use the default.",
                    )
                )
            else:
                values[name] = duration

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
    """ORDERING and RETENTION_MODE (E070, E072); the durations and the interval are checked with the rest."""
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
                        f"OUTBOX[{name!r}] must be one of {', '.join(map(repr, choices))}, not {shown(raw[name])}.",
                        "Fix the value or remove the key to use the default.",
                    )
                )
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
    """A duration of at least a microsecond and at most ten years, from a timedelta or seconds; else None."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not (isinstance(value, int) or math.isfinite(value)) or not 0 < value <= MAX_DURATION_SECONDS:
            return None
        value = dt.timedelta(seconds=value)
    if isinstance(value, dt.timedelta) and dt.timedelta(0) < value <= dt.timedelta(seconds=MAX_DURATION_SECONDS):
        return value
    return None


def _is_base_url(url: str) -> bool:
    """Whether ``url`` can go in front of a link's path: http(s), a host, nothing a browser would misread."""
    from urllib.parse import urlsplit

    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError on a port out of range)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and not (parts.query or parts.fragment)


def channel_problem(channel: str) -> str | None:
    """Why PostgreSQL refuses ``channel`` in ``LISTEN`` and ``pg_notify()``, or None if it takes it.

    Probed against the server (tests/test_check_bounds.py): any character is fine, quotes, spaces and
    newlines included (LISTEN quotes the identifier), except NUL; the name must not be empty and must fit
    in 63 bytes of UTF-8, or pg_notify() raises "channel name too long" inside the sender's transaction.
    """
    if not channel:
        return "it is empty"
    if "\x00" in channel:
        return "it contains a NUL character"
    try:
        size = len(channel.encode("utf-8"))
    except UnicodeEncodeError:
        return "it is not valid Unicode (a lone surrogate)"
    if size > MAX_CHANNEL_BYTES:
        return f"it is {size} bytes in UTF-8, longer than PostgreSQL's {MAX_CHANNEL_BYTES}"
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
                    f"OUTBOX['TRANSPORTS'][{shown(name)}] must be a dict with a 'BACKEND' dotted path.",
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
                    f"OUTBOX['TRANSPORTS'][{shown(name)}] takes only 'BACKEND' and an 'OPTIONS' dict.",
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
                    f"OUTBOX['ROUTES'] entry {shown(pattern)}: {shown(name)} is not a pattern and a name.",
                    "Both must be non-empty strings.",
                )
            )
        elif name not in transports:
            problems.append(
                Problem(
                    "django_outbox.E021",
                    f"OUTBOX['ROUTES'][{shown(pattern)}] names transport {shown(name)}, which is not in "
                    "OUTBOX['TRANSPORTS'].",
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
