"""Typed view of ``settings.OUTBOX``.

Read lazily and cached until Django's ``setting_changed`` fires, so ``override_settings`` works in
tests and nothing is read at import time. Each key is declared once, as a field of ``OutboxSettings``
(see ``options.py``); validation collects every problem with a stable check id: ``manage.py check``
reports them all, while code paths that need the settings raise on the first.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .exceptions import OutboxImproperlyConfigured
from .options import Problem, Rule, declared, option, shown, validate

#: The implicit transport that calls ``@outbox.handler`` functions in the worker process.
HANDLER_TRANSPORT = "handler"
#: Topics of Django tasks (``django_outbox.tasks``): queue ``q`` is topic ``tasks.q``.
TASKS_TOPIC_PREFIX = "tasks."
HANDLER_BACKEND = "django_outbox.transports.handler.HandlerTransport"
#: Emails written by ``django_outbox.mail.EmailBackend`` use this topic, always served by the built-in
#: email transport (see routing.resolve_transport), so no ROUTES entry is needed for them.
EMAIL_TOPIC = "django_outbox.email"
EMAIL_TRANSPORT = "django_outbox.email"
EMAIL_TRANSPORT_BACKEND = "django_outbox.mail.transport.EmailTransport"


#: RFC 3986: what a URI reference is made of (a percent sign only as ``%XX``).
_URI_REFERENCE = re.compile(r"(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})+")
_SOURCE_HINT = "Example: 'https://shop.example.com/orders' or '/shop'."
#: A CloudEvents ``source`` goes with every message; longer than this is a mistake.
MAX_SOURCE_BYTES = 2048


def _source_refused(source: str) -> str | None:
    """Why ``source`` is not a URI reference (RFC 3986), which the CloudEvents ``source`` attribute must be."""
    if _URI_REFERENCE.fullmatch(source) is None:
        return (
            f"= {shown(source)} is not a URI reference: letters, digits and - . _ ~ : / ? # [ ] @ ! $ & ' ( ) * + , ; ="
            " only, anything else (a space, a non-ASCII letter, a lone %) percent-encoded."
        )
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class TransportConfig:
    name: str
    backend: str
    options: Mapping[str, Any]


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

# The check ids of the settings (docs/checks.md); each is declared here once and used by name.
NOT_A_DICT = "django_outbox.E001"
UNKNOWN_KEY = "django_outbox.E002"
#: A value of the wrong type or out of range, unless its option names an id of its own.
BAD_VALUE = "django_outbox.E003"
NO_SUCH_DATABASE = "django_outbox.E004"
BAD_CHANNEL = "django_outbox.E006"
NO_SUCH_LISTEN_DATABASE = "django_outbox.E008"
BAD_TRANSPORT_ENTRY = "django_outbox.E010"
#: A transport's BACKEND cannot be imported or is no BaseTransport (checks.py; ``send()`` refuses its topics).
BAD_BACKEND = "django_outbox.E011"
#: A transport needs an optional package that is not installed (checks.py).
MISSING_EXTRA = "django_outbox.E012"
BAD_ROUTES = "django_outbox.E020"
UNKNOWN_ROUTE_TRANSPORT = "django_outbox.E021"
BAD_INBOX_RETENTION = "django_outbox.E060"
BAD_IDEMPOTENCY_KEY_TTL = "django_outbox.E061"
BAD_ORDERING = "django_outbox.E070"
BAD_RETENTION = "django_outbox.E071"
BAD_RETENTION_MODE = "django_outbox.E072"
BAD_ARCHIVE_AFTER = "django_outbox.E073"
BAD_HOUSEKEEPING_INTERVAL = "django_outbox.E074"
BAD_HANDLER_TIMEOUT = "django_outbox.E090"
#: ``METRICS_TOPIC_LABELS`` is neither None nor a list of topic patterns (observability).
BAD_METRICS_TOPIC_LABELS = "django_outbox.E100"
#: A health threshold is not a finite number of seconds above 0 and at most a day.
BAD_HEALTH_THRESHOLD = "django_outbox.E101"
#: ``HEALTH_TOKEN`` is not a string, or is too short to resist guessing.
BAD_HEALTH_TOKEN = "django_outbox.E102"
#: The shortest bearer token the health and metrics views accept: 128 bits of hex.
HEALTH_TOKEN_MIN_LENGTH = 32
BAD_CLOUDEVENTS_SOURCE = "django_outbox.E091"
#: ``outbox_worker`` started with ``OUTBOX["EAGER"]`` on: settings meant for tests (management/commands).
EAGER_WORKER = "django_outbox.W003"

ORDERING_CHOICES = ("block", "skip_dead")
RETENTION_MODES = ("archive", "delete")
_DURATION_HINT = "Example: datetime.timedelta(days=7). Remove the key to use the default."


def _database_refused(alias: str) -> str | None:
    if alias in django_settings.DATABASES:
        return None
    return f"names {shown(alias)}, which is not in DATABASES (aliases: {', '.join(django_settings.DATABASES)})."


def _listen_database_refused(alias: str) -> str | None:
    if alias in django_settings.DATABASES:
        return None
    return f"must name an alias of DATABASES, not {shown(alias)} (aliases: {', '.join(django_settings.DATABASES)})."


def _channel_refused(channel: str) -> str | None:
    refused = channel_problem(channel)
    return f"= {shown(channel)} cannot be a PostgreSQL channel: {refused}." if refused else None


def _base_url_refused(url: str) -> str | None:
    if not url or _is_base_url(url):
        return None
    return f"must be '' or an http(s) scheme and host, not {shown(url)}."


def _health_token_refused(token: object) -> str | None:
    if token == "" or (
        isinstance(token, str) and len(token) >= HEALTH_TOKEN_MIN_LENGTH and token.isprintable() and " " not in token
    ):
        return None
    return (
        f"must be '' or a string of at least {HEALTH_TOKEN_MIN_LENGTH} printable characters without spaces"
        " (the value is not shown: it is a secret)."
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class OutboxSettings:
    """Every key of ``settings.OUTBOX``, each declared once: its type, bounds, default and check id."""

    MAX_ATTEMPTS: int = option(10, kind=int, minimum=1, maximum=MAX_INT32)
    BACKOFF_BASE_SECONDS: float = option(2.0, kind=float, minimum=0, maximum=MAX_DURATION_SECONDS)
    BACKOFF_MAX_SECONDS: float = option(3600.0, kind=float, minimum=0, maximum=MAX_DURATION_SECONDS)
    #: Longest wait a destination's ``Retry-After`` is honoured for; None: ``BACKOFF_MAX_SECONDS``. Capped,
    #: so infinity (no cap) is refused: a hostile receiver could park a message forever.
    RETRY_AFTER_MAX_SECONDS: float | None = option(
        None,
        kind=(float, type(None)),
        minimum=0,
        maximum=sys.float_info.max,
        expected="a finite number of seconds >= 0 or None",
        hint="Example: 3600. None (the default) caps a receiver's Retry-After at BACKOFF_MAX_SECONDS.",
    )
    LEASE_SECONDS: float = option(60.0, kind=float, minimum=1, maximum=MAX_WAIT_SECONDS)
    POLL_INTERVAL_SECONDS: float = option(5.0, kind=float, minimum=0.01, maximum=MAX_WAIT_SECONDS)
    BATCH_SIZE: int = option(100, kind=int, minimum=1, maximum=MAX_BATCH_SIZE)
    #: Most messages of one key a claim takes (consecutive, due, delivered in order); the batch bounds it too.
    KEY_BATCH_SIZE: int = option(100, kind=int, minimum=1, maximum=MAX_BATCH_SIZE)
    #: Delivery threads per worker; None: 2 on PostgreSQL and MariaDB/MySQL, 1 on SQLite (see ``default_concurrency``).
    CONCURRENCY: int | None = option(None, kind=(int, type(None)), minimum=1, maximum=MAX_CONCURRENCY)
    GRACE_PERIOD_SECONDS: float = option(30.0, kind=float, minimum=0, maximum=MAX_WAIT_SECONDS)
    MAX_PAYLOAD_BYTES: int = option(1_000_000, kind=int, minimum=1, maximum=MAX_PAYLOAD_LIMIT)
    DATABASE: str = option(
        "default",
        kind=str,
        nonempty=True,
        rules=(Rule(NO_SUCH_DATABASE, _database_refused, "Name an alias of DATABASES."),),
    )
    #: The DATABASES alias the workers' listener LISTENs on; None: DATABASE. Behind a pooler in
    #: transaction pooling, name an alias that reaches the same server directly (docs/deploying.md).
    LISTEN_DATABASE: str | None = option(
        None,
        kind=(str, type(None)),
        id=NO_SUCH_LISTEN_DATABASE,
        expected="an alias of DATABASES or None",
        hint="Add an alias that reaches the outbox's PostgreSQL server directly (not through a pooler in "
        "transaction pooling), or remove the key.",
        rules=(
            Rule(
                NO_SUCH_LISTEN_DATABASE,
                _listen_database_refused,
                "Add an alias that reaches the outbox's PostgreSQL server directly (not through a pooler in "
                "transaction pooling), or remove the key.",
            ),
        ),
    )
    NOTIFY: bool = option(True, kind=bool)
    NOTIFY_CHANNEL: str = option(
        "django_outbox",
        kind=str,
        rules=(
            Rule(
                BAD_CHANNEL,
                _channel_refused,
                f"Use a short name such as 'django_outbox' (at most {MAX_CHANNEL_BYTES} bytes in UTF-8, no NUL).",
            ),
        ),
    )
    #: PostgreSQL workers prepare the claim and the record (docs/settings.md); off behind old PgBouncers.
    PREPARED_STATEMENTS: bool = option(True, kind=bool)
    #: Topic pattern to transport name; read by ``_parse_routes`` (E020, E021) once TRANSPORTS is known.
    ROUTES: Mapping[str, str] = option(kind=object, default_factory=dict)
    #: Name to ``{"BACKEND": ..., "OPTIONS": {...}}``; read by ``_parse_transports`` (E010).
    TRANSPORTS: Mapping[str, TransportConfig] = option(kind=object, default_factory=dict)
    EMAIL_BACKEND: str = option("django.core.mail.backends.smtp.EmailBackend", kind=str, nonempty=True)
    EMAIL_MAILER: str = option("", kind=str)
    EMAIL_VIEW_BASE_URL: str = option(
        "",
        kind=str,
        rules=(Rule(BAD_VALUE, _base_url_refused, "Example: 'https://shop.example.com'."),),
    )
    EMAIL_VIEW_MAX_AGE_SECONDS: float = option(30 * 24 * 3600.0, kind=float, minimum=1, maximum=MAX_DURATION_SECONDS)
    #: How long inbox receipts are kept: the window in which a redelivered message is recognised.
    INBOX_RETENTION: dt.timedelta = option(
        dt.timedelta(days=7),
        kind=dt.timedelta,
        duration=True,
        minimum=0,
        maximum=MAX_DURATION_SECONDS,
        id=BAD_INBOX_RETENTION,
        hint=_DURATION_HINT,
    )
    #: How long a stored ``Idempotency-Key`` response is replayed (Stripe keeps keys for 24 hours).
    IDEMPOTENCY_KEY_TTL: dt.timedelta = option(
        dt.timedelta(hours=24),
        kind=dt.timedelta,
        duration=True,
        minimum=0,
        maximum=MAX_DURATION_SECONDS,
        id=BAD_IDEMPOTENCY_KEY_TTL,
        hint=_DURATION_HINT,
    )
    #: Longest a delivery call (a handler, or one call to a transport) may run; None: no limit.
    HANDLER_TIMEOUT_SECONDS: float | None = option(
        None,
        kind=(float, type(None)),
        minimum=0.01,
        maximum=MAX_WAIT_SECONDS,
        id=BAD_HANDLER_TIMEOUT,
        hint="Example: 30. Use None (the default) for no limit.",
    )
    #: "block": a dead message holds back the later messages of its key until it is retried or cancelled;
    #: "skip_dead": the key moves on past it.
    ORDERING: str = option("block", kind=str, choices=ORDERING_CHOICES, id=BAD_ORDERING)
    #: How long delivered and cancelled messages are kept for audit before housekeeping removes them.
    RETENTION: dt.timedelta = option(
        dt.timedelta(days=7),
        kind=dt.timedelta,
        duration=True,
        minimum=0,
        maximum=MAX_DURATION_SECONDS,
        id=BAD_RETENTION,
        hint=_DURATION_HINT,
    )
    #: "archive": finished messages move to the archive tables after ARCHIVE_AFTER and stay there until
    #: RETENTION; "delete": they stay in the message table until RETENTION and are then deleted.
    RETENTION_MODE: str = option("archive", kind=str, choices=RETENTION_MODES, id=BAD_RETENTION_MODE)
    #: How long a finished message stays in the message table before it is archived; repeated
    #: idempotency keys are recognised only while the first message is there.
    ARCHIVE_AFTER: dt.timedelta = option(
        dt.timedelta(hours=1),
        kind=dt.timedelta,
        duration=True,
        minimum=0,
        maximum=MAX_DURATION_SECONDS,
        id=BAD_ARCHIVE_AFTER,
        hint=_DURATION_HINT,
    )
    #: How often one worker runs housekeeping; 0 leaves it to ``manage.py outbox_housekeeping`` (cron).
    HOUSEKEEPING_INTERVAL_SECONDS: float = option(
        60.0,
        kind=float,
        minimum=0,
        maximum=MAX_WAIT_SECONDS,
        id=BAD_HOUSEKEEPING_INTERVAL,
        hint="Use 0 to run housekeeping only from cron (manage.py outbox_housekeeping).",
    )
    #: Tests only: each transaction that sent messages delivers them right after it commits, in its own
    #: process and thread, through the worker's code (``django_outbox.testing.eager``; docs/testing.md).
    EAGER: bool = option(False, kind=bool)
    #: Topic patterns (as in ROUTES) whose payloads the admin shows only with the content permission;
    #: emails are content-protected whatever this says.
    SENSITIVE_TOPICS: tuple[str, ...] = option(
        (),
        kind=(list, tuple),
        items=str,
        nonempty_items=True,
        expected="a list of non-empty topic patterns",
        hint='Example: ["payments.*", "users.password_changed"]. Remove the key to protect emails only.',
    )
    #: The ``topic`` label values of the worker's metrics: each pattern is one value, any other topic
    #: counts as "other"; None (the default): every topic is its own value (few topics only).
    METRICS_TOPIC_LABELS: tuple[str, ...] | None = option(
        None,
        kind=(list, tuple, type(None)),
        items=str,
        nonempty_items=True,
        id=BAD_METRICS_TOPIC_LABELS,
        expected="None or a list of non-empty topic patterns",
        hint='Example: ["orders.*", "emails.*"]; other topics are counted as "other".',
    )
    #: The health view answers "lagging" (503) past this lag, "stalled" past HEALTH_STALLED_SECONDS.
    HEALTH_LAG_SECONDS: float = option(
        60.0, kind=float, minimum=0, above=True, maximum=MAX_WAIT_SECONDS, id=BAD_HEALTH_THRESHOLD
    )
    HEALTH_STALLED_SECONDS: float = option(
        600.0, kind=float, minimum=0, above=True, maximum=MAX_WAIT_SECONDS, id=BAD_HEALTH_THRESHOLD
    )
    #: A bearer token that opens the health and metrics views to probes and scrapers; "" (the
    #: default): staff sessions only.
    HEALTH_TOKEN: str = option(
        "",
        kind=object,  # any type reaches the rule, whose message never shows the value: it is a secret
        id=BAD_HEALTH_TOKEN,
        rules=(
            Rule(
                BAD_HEALTH_TOKEN,
                _health_token_refused,
                "Make one with: python -c 'import secrets; print(secrets.token_hex(32))'",
            ),
        ),
    )
    #: The CloudEvents ``source`` attribute of every message sent with a FORMAT of "cloudevents*".
    CLOUDEVENTS_SOURCE: str = option(
        "/django-outbox",
        kind=str,
        nonempty=True,
        max_bytes=MAX_SOURCE_BYTES,
        id=BAD_CLOUDEVENTS_SOURCE,
        hint="Example: 'https://shop.example.com/orders' or '/shop'.",
        rules=(
            Rule(BAD_CLOUDEVENTS_SOURCE, _source_refused, "Example: 'https://shop.example.com/orders' or '/shop'."),
        ),
    )


def bounded(name: str, value: object) -> int | float:
    """``value`` for ``OUTBOX[name]`` if ``check`` would accept it there; ``ValueError`` saying why otherwise.

    For the worker's command-line overrides, which must not get past the bounds the settings have.
    """
    (declaration,) = (o for o in declared(OutboxSettings) if o.name == name)
    parsed, problem = declaration.parse(value, "OUTBOX", BAD_VALUE)
    if problem is not None or parsed is None:
        raise ValueError(problem.msg if problem else f"OUTBOX[{name!r}] needs a number here")
    result: int | float = parsed
    return result


def _parse(raw: object) -> tuple[OutboxSettings, list[Problem]]:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        return OutboxSettings(), [
            Problem(
                NOT_A_DICT,
                f"OUTBOX must be a dict, not {type(raw).__name__}.",
                'Write OUTBOX = {"MAX_ATTEMPTS": 10, ...} in your settings.',
            )
        ]
    values, problems = validate(
        declared(OutboxSettings), raw, where="OUTBOX", unknown_id=UNKNOWN_KEY, invalid_id=BAD_VALUE, noun="key"
    )
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
                BAD_VALUE,
                "OUTBOX['BACKOFF_MAX_SECONDS'] is smaller than OUTBOX['BACKOFF_BASE_SECONDS'].",
                "The cap must be at least the first delay.",
            )
        )
    return parsed, problems


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

    Probed against the server (tests/unit/test_check_bounds.py): any character is fine, quotes, spaces and
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
                BAD_TRANSPORT_ENTRY,
                "OUTBOX['TRANSPORTS'] must be a dict of name to config.",
                'Example: {"hooks": {"BACKEND": "dotted.path.Transport", "OPTIONS": {}}}',
            )
        ]
    problems = []
    for name, config in raw.items():
        if not isinstance(config, Mapping) or not isinstance(config.get("BACKEND"), str):
            problems.append(
                Problem(
                    BAD_TRANSPORT_ENTRY,
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
                    BAD_TRANSPORT_ENTRY,
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
                BAD_ROUTES,
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
                    BAD_ROUTES,
                    f"OUTBOX['ROUTES'] entry {shown(pattern)}: {shown(name)} is not a pattern and a name.",
                    "Both must be non-empty strings.",
                )
            )
        elif name not in transports:
            problems.append(
                Problem(
                    UNKNOWN_ROUTE_TRANSPORT,
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
