"""Property: every value of every ``OUTBOX`` key and transport option is reported by ``check`` or works.

"Works" means what the code that reads the value does with it: ``get_settings()`` returns, a relay
configuration builds and its backoff stays finite for any attempt number, the transport can be built,
and (for a few examples, on the test database) a message is sent and delivered. ``run_checks()`` never
raises, and never reports ``django_outbox.E007`` (one of our own checks failing to run) either.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest
from django.core import checks
from django.core.checks import CheckMessage
from django.db import transaction
from django.test import override_settings
from hypothesis import event, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from django_outbox import outbox
from django_outbox.conf import OutboxSettings, get_settings
from django_outbox.models import Message
from django_outbox.transports.broker import BrokerTransport
from django_outbox.transports.registry import transport_class
from django_outbox.worker import Relay, RelayConfig, backoff_seconds
from tests.support.checks import ACCEPTED_CHANNELS, REFUSED_CHANNELS, outbox_ids, server_takes_channel

SECRET = "whsec_" + "A" * 32
WEBHOOK = "django_outbox.transports.webhook.WebhookTransport"
AMQP = "django_outbox.transports.amqp.AMQPTransport"
REDIS = "django_outbox.transports.redis.RedisStreamsTransport"
NATS = "django_outbox.transports.nats.NATSTransport"
EMAIL = "django_outbox.mail.transport.EmailTransport"
TOPIC = "prop.roundtrip"
ATTEMPTS = (1, 2, 3, 1023, 1024, 1025, 1026, 5000, 2**31 - 1)

# --- values of every kind --------------------------------------------------------------------------------

INTS = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 1025, 1026, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63), 10**400]),
)
FLOATS = st.one_of(
    st.floats(),
    st.floats(min_value=0, max_value=1e9),
    st.sampled_from([math.nan, -math.nan, math.inf, -math.inf, -0.0, 0.0, 1e308, 5e-324, 1e-300, 0.01, 86400.0]),
)
TEXTS = st.one_of(
    st.text(max_size=80),
    st.sampled_from(["", "\x00", "a\x00b", "\ud800", "\u65e5\u672c\u8a9e", "a" * 63, "a" * 64, "\u00e9" * 32]),
    st.just("x" * 100_000),
)
DELTAS = st.one_of(
    st.timedeltas(),
    st.sampled_from([dt.timedelta.max, dt.timedelta.min, -dt.timedelta(days=1), dt.timedelta(0), dt.timedelta(days=7)]),
)
SCALARS = st.one_of(st.none(), st.booleans(), INTS, FLOATS, TEXTS, DELTAS)
ANYTHING = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)

#: Values a user might plausibly write for some keys, so that accepted settings are exercised too.
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "DATABASE": st.sampled_from(["default", "other", ""]),
    "ORDERING": st.sampled_from(["block", "skip_dead", "BLOCK"]),
    "RETENTION_MODE": st.sampled_from(["archive", "delete", "keep"]),
    "EMAIL_BACKEND": st.sampled_from(
        ["django.core.mail.backends.locmem.EmailBackend", "django_outbox.mail.EmailBackend", ".x", "no.such.Backend"]
    ),
    "EMAIL_VIEW_BASE_URL": st.sampled_from(["", "https://shop.example.com", "shop.example.com", "http://h:99999"]),
    "ROUTES": st.dictionaries(TEXTS, st.sampled_from(["handler", "nowhere", "t"]) | ANYTHING, max_size=3),
    "TRANSPORTS": st.dictionaries(
        st.sampled_from(["t", "handler"]) | TEXTS,
        st.fixed_dictionaries({"BACKEND": st.sampled_from([WEBHOOK, EMAIL, ".x", "no.such.T"]) | TEXTS}),
        max_size=2,
    ),
}
#: Every documented key, read from the settings dataclass, so a key added there is fed values here too.
FIELDS = OutboxSettings.__dataclass_fields__
KEYS = sorted(FIELDS)


def typical(key: str) -> st.SearchStrategy[Any]:
    """Values of the kind the key's default has, mostly near or inside a sane range, some just outside."""
    if key in PLAUSIBLE:
        return PLAUSIBLE[key]
    field = FIELDS.get(key)
    default = field.default if field is not None else None
    sane = st.integers(min_value=0, max_value=100_000) | st.floats(min_value=0, max_value=100_000)
    numbers = st.one_of(
        sane, sane, st.integers(min_value=-1, max_value=2**32), st.floats(min_value=-1, max_value=1e9), INTS, FLOATS
    )
    if isinstance(default, bool):
        return st.booleans()
    if isinstance(default, int | float):
        return numbers
    if isinstance(default, dt.timedelta):
        return st.timedeltas(min_value=-dt.timedelta(days=1), max_value=dt.timedelta(days=5000)) | numbers | DELTAS
    if isinstance(default, str):
        return TEXTS
    if default is None:  # optional numbers (CONCURRENCY, HANDLER_TIMEOUT_SECONDS) and whatever comes next
        return st.none() | numbers
    return st.lists(TEXTS, max_size=3) | st.dictionaries(TEXTS, TEXTS, max_size=2)  # collections


def value_for(key: str) -> st.SearchStrategy[Any]:
    return st.one_of(typical(key), typical(key), typical(key), ANYTHING)


def outbox_dicts(keys: list[str], max_keys: int = 4) -> st.SearchStrategy[dict[Any, Any]]:
    """A few keys at a time: with every key present, one bad value would hide whether the rest work."""
    few = st.lists(st.sampled_from(keys), max_size=max_keys, unique=True).flatmap(
        lambda chosen: st.fixed_dictionaries({key: value_for(key) for key in chosen})
    )
    junk = st.dictionaries(st.sampled_from([*keys, "MAX_ATEMPTS"]) | TEXTS, ANYTHING, max_size=3)
    return st.one_of(few, few, few, junk)


@contextmanager
def checked(outbox_setting: object) -> Iterator[list[CheckMessage]]:
    """Run ``manage.py check``'s checks under ``OUTBOX = outbox_setting``; yields our error-level messages."""
    with override_settings(OUTBOX=outbox_setting):
        found = [m for m in checks.run_checks() if m.id and m.id.startswith("django_outbox.")]
        assert "django_outbox.E007" not in {m.id for m in found}, [m.msg for m in found]
        yield [m for m in found if m.is_serious()]


def assert_settings_work() -> OutboxSettings:
    conf = get_settings()
    relay_config = RelayConfig.from_settings()
    assert relay_config.batch_size == conf.BATCH_SIZE
    for attempt in (*ATTEMPTS, conf.MAX_ATTEMPTS):
        delay = backoff_seconds(attempt, base=conf.BACKOFF_BASE_SECONDS, cap=conf.BACKOFF_MAX_SECONDS)
        assert math.isfinite(delay) and 0 <= delay <= conf.BACKOFF_MAX_SECONDS
        dt.timedelta(seconds=delay)  # what the record adds to now(); would raise past timedelta's range
    for duration in (conf.INBOX_RETENTION, conf.IDEMPOTENCY_KEY_TTL, conf.RETENTION, conf.ARCHIVE_AFTER):
        dt.datetime.now(dt.UTC) + duration
        dt.datetime.now(dt.UTC) - duration
    return conf


@pytest.mark.django_db(databases=["default", "other"])  # Django 6 asks each server for its version
@given(outbox_setting=outbox_dicts(KEYS))
def test_every_outbox_value_is_reported_or_works(outbox_setting):
    with checked(outbox_setting) as errors:
        event("reported" if errors else "accepted")
        if not errors:
            assert_settings_work()


#: Settings the round trip uses: the ones send() and the drain read.
CORE = [
    "MAX_ATTEMPTS",
    "BACKOFF_BASE_SECONDS",
    "BACKOFF_MAX_SECONDS",
    "LEASE_SECONDS",
    "POLL_INTERVAL_SECONDS",
    "BATCH_SIZE",
    "CONCURRENCY",
    "GRACE_PERIOD_SECONDS",
    "MAX_PAYLOAD_BYTES",
    "NOTIFY",
    "NOTIFY_CHANNEL",
    "PREPARED_STATEMENTS",
    "HANDLER_TIMEOUT_SECONDS",
    "ORDERING",
]


@pytest.mark.django_db(databases=["default", "other"])  # Django 6 asks each server for its version
@hypothesis_settings(max_examples=max(10, hypothesis_settings().max_examples // 4))
@given(outbox_setting=outbox_dicts(CORE, max_keys=6))
def test_accepted_core_settings_send_and_deliver(outbox_setting, handler):
    """The expensive half: accepted settings send a message in a transaction and a drain delivers it."""
    seen: list[object] = []
    handler(TOPIC, lambda message: seen.append(message.payload))
    with checked(outbox_setting) as errors:
        event("reported" if errors else "accepted")
        if errors:
            return
        assert_settings_work()
        try:
            message = outbox.send(TOPIC, 1)  # 1 byte of JSON: within any accepted MAX_PAYLOAD_BYTES
            Relay(RelayConfig.from_settings(notify=False)).drain()
            message.refresh_from_db()
            assert message.status == Message.Status.DELIVERED, message.last_error
            assert seen == [1]
        finally:
            Message.objects.all().delete()  # the examples share the test's transaction


# --- transport options -------------------------------------------------------------------------------------

URLS = {
    WEBHOOK: st.sampled_from(
        ["https://hooks.example.com/in", "http://127.0.0.1:1/x", "http://[::1", "https://h:99999/", "ftp://h/", "x"]
    ),
    AMQP: st.sampled_from(["amqp://guest:guest@127.0.0.1:5672/%2F", "amqps://h/", "amqp://h:99999/", "http://h/"]),
    REDIS: st.sampled_from(["redis://127.0.0.1:6379/0", "rediss://h", "unix:///tmp/r.sock", "redis://h:99999"]),
    NATS: st.sampled_from(["nats://127.0.0.1:4222", "tls://h:4222", "nats://h:99999", "nats://"]),
}
TEMPLATES = st.sampled_from(["{topic}", "outbox.{topic}", "{topic!r}", "{topic:>9999999}", "{other}", "{", "x"])


def option_values(backend: str) -> dict[str, st.SearchStrategy[Any]]:
    """Every option of ``backend``, each with plausible values and anything at all."""
    if backend == WEBHOOK:
        names: dict[str, st.SearchStrategy[Any]] = {
            "URL": URLS[WEBHOOK],
            "SECRET": st.sampled_from([SECRET, "whsec_short", "nope"]),
            "TIMEOUT": FLOATS | INTS,
            "ALLOWED_HOSTS": st.lists(TEXTS, max_size=3),
            "RESOLVER": st.sampled_from(["tests.db.test_check_properties.resolve", ".x", "os.sep", resolve]),
        }
    elif backend == EMAIL:
        names = {"TIMEOUT": FLOATS, "HOST": TEXTS}
    else:
        import dataclasses

        cls = transport_class(backend)
        assert issubclass(cls, BrokerTransport)
        names = {}
        for f in dataclasses.fields(cls.options_class):
            key = f.name.upper()
            if key in ("URL", "SERVERS"):
                names[key] = URLS[backend] | st.lists(URLS[backend], max_size=2)
            elif f.metadata["template"]:
                names[key] = TEMPLATES
            elif f.metadata["choices"]:
                names[key] = st.sampled_from(f.metadata["choices"])
            elif f.metadata["kind"] in (int, float) or f.metadata["minimum"] is not None:
                names[key] = FLOATS | INTS | st.none()
            else:
                names[key] = st.booleans() | TEXTS | st.lists(TEXTS, max_size=2)
    return names


def resolve(message: Message) -> tuple[str, str]:
    return ("https://hooks.example.com/in", SECRET)


#: A working configuration of each transport, which the property then changes a few options of.
BASE_OPTIONS: dict[str, dict[str, Any]] = {
    WEBHOOK: {"URL": "https://hooks.example.com/in", "SECRET": SECRET},
    AMQP: {"URL": "amqp://guest:guest@127.0.0.1:5672/%2F", "EXCHANGE": "outbox"},
    REDIS: {"URL": "redis://127.0.0.1:6379/0"},
    NATS: {"SERVERS": "nats://127.0.0.1:4222"},
    EMAIL: {},
}


def transport_options(backend: str) -> st.SearchStrategy[dict[Any, Any]]:
    values = option_values(backend)
    changes = st.lists(st.sampled_from(sorted(values)), max_size=3, unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({key: st.one_of(values[key], values[key], ANYTHING) for key in keys})
    )
    mutated = changes.map(lambda changed: {**BASE_OPTIONS[backend], **changed})
    dropped = st.sampled_from(sorted(BASE_OPTIONS[backend]) or [""]).map(
        lambda key: {k: v for k, v in BASE_OPTIONS[backend].items() if k != key}
    )
    junk = st.dictionaries(st.sampled_from([*values, "url", "BOGUS"]) | TEXTS, ANYTHING, max_size=3)
    return st.one_of(mutated, mutated, mutated, dropped, junk)


TRANSPORT_OPTIONS = st.sampled_from([WEBHOOK, AMQP, REDIS, NATS, EMAIL]).flatmap(
    lambda backend: st.tuples(st.just(backend), transport_options(backend))
)


@pytest.mark.django_db(databases=["default", "other"])  # Django 6 asks each server for its version
@given(case=TRANSPORT_OPTIONS)
def test_every_transport_option_is_reported_or_builds(case):
    backend, options = case
    setting = {"TRANSPORTS": {"t": {"BACKEND": backend, "OPTIONS": options}}, "ROUTES": {"prop.*": "t"}}
    with checked(setting) as errors:
        event(f"{backend.rsplit('.', 1)[-1]} {'reported' if errors else 'accepted'}")
        if errors:
            return
        build(backend, options)


def build(backend: str, options: Mapping[str, Any]) -> None:
    """Build the transport as a worker thread does, and the client it would connect with (no network)."""
    transport: Any = transport_class(backend)(name="t", options=options)
    try:
        if backend == WEBHOOK:
            transport.client  # noqa: B018  (httpx validates the timeout and pool here)
        elif backend == REDIS:
            transport.client  # noqa: B018  (redis-py parses the URL and the socket options here)
        elif backend == AMQP:
            import pika

            pika.URLParameters(transport.settings.url)  # what _connect() builds first
    finally:
        transport.close()


# --- NOTIFY_CHANNEL against the real server ---------------------------------------------------------------

CHANNELS = st.one_of(
    st.text(max_size=70),
    st.text(st.characters(codec="utf-8"), min_size=28, max_size=40),  # multi-byte characters near 63 bytes
    st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010, exclude_categories=()), max_size=3),  # surrogates
    st.sampled_from(["", "\x00", "a" * 63, "a" * 64, "\u00e9" * 31 + "a", "\u00e9" * 32]),
)


@pytest.mark.django_db(databases=["default", "other"])  # Django 6 asks each server for its version
@hypothesis_settings(max_examples=max(10, hypothesis_settings().max_examples // 2))
@given(channel=CHANNELS)
def test_check_accepts_exactly_the_channels_postgres_takes(postgres, channel):
    with checked({"NOTIFY_CHANNEL": channel}) as errors:
        assert (not errors) == server_takes_channel(channel), [e.msg for e in errors]


# --- the checks' verdicts on NOTIFY_CHANNEL against the real server (from the unit layer's tables) ---


@pytest.mark.django_db(databases=["default", "other"])  # Django 6 asks each server for its version
@pytest.mark.parametrize("channel", REFUSED_CHANNELS + ACCEPTED_CHANNELS)
def test_check_agrees_with_the_real_server_about_each_channel(postgres, channel):
    assert server_takes_channel(channel) == (outbox_ids(NOTIFY_CHANNEL=channel) == [])


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_the_longest_channel_check_passes_works_for_send(postgres, handler):
    """63 bytes: check passes and send() commits (64 made every send() raise DataError in its transaction)."""
    channel = "\u00e9" * 31 + "a"
    with override_settings(OUTBOX={"NOTIFY_CHANNEL": channel}):
        assert outbox_ids(NOTIFY_CHANNEL=channel) == []
        with transaction.atomic():
            outbox.send("probe.created", {"n": 1})
    assert Message.objects.filter(topic="probe.created").count() == 1
