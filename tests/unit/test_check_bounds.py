"""``manage.py check`` refuses every value that would break at run time, and never raises itself.

Each case here passed the checks before and then failed later: in ``send()`` inside the caller's
transaction, in the worker at the first failure or claim, or in ``check`` itself with a traceback.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from typing import Any

import pytest
from django.core import checks
from django.core.checks import CheckMessage
from django.test import override_settings

from django_outbox.conf import get_settings
from django_outbox.models import Message
from django_outbox.transports.base import BaseTransport
from django_outbox.worker import RelayConfig, backoff_seconds
from tests.support.checks import ACCEPTED_CHANNELS, NATS_STREAMS, NATS_SUBJECTS, REFUSED_CHANNELS, outbox_ids

NAN = float("nan")
INF = float("inf")
SECRET = "whsec_" + "A" * 32
WEBHOOK = "django_outbox.transports.webhook.WebhookTransport"
AMQP = "django_outbox.transports.amqp.AMQPTransport"
REDIS = "django_outbox.transports.redis.RedisStreamsTransport"
NATS = "django_outbox.transports.nats.NATSTransport"
EMAIL = "django_outbox.mail.transport.EmailTransport"


# --- NOTIFY_CHANNEL ----------------------------------------------------------------------------------


@pytest.mark.parametrize("channel", REFUSED_CHANNELS)
def test_a_channel_postgres_refuses_is_reported_by_check(channel):
    assert outbox_ids(NOTIFY_CHANNEL=channel) == ["django_outbox.E006"]


@pytest.mark.parametrize("channel", ACCEPTED_CHANNELS)
def test_a_channel_postgres_takes_passes_check(channel):
    assert outbox_ids(NOTIFY_CHANNEL=channel) == []


def test_a_channel_that_is_not_a_string_stays_a_type_error():
    assert outbox_ids(NOTIFY_CHANNEL=7) == ["django_outbox.E003"]


# --- numeric settings ----------------------------------------------------------------------------------

#: Each numeric key and the id its bad values get (E003 unless the key has had its own id).
NUMERIC_KEYS = {
    "MAX_ATTEMPTS": "django_outbox.E003",
    "BACKOFF_BASE_SECONDS": "django_outbox.E003",
    "BACKOFF_MAX_SECONDS": "django_outbox.E003",
    "LEASE_SECONDS": "django_outbox.E003",
    "POLL_INTERVAL_SECONDS": "django_outbox.E003",
    "BATCH_SIZE": "django_outbox.E003",
    "CONCURRENCY": "django_outbox.E003",
    "GRACE_PERIOD_SECONDS": "django_outbox.E003",
    "MAX_PAYLOAD_BYTES": "django_outbox.E003",
    "EMAIL_VIEW_MAX_AGE_SECONDS": "django_outbox.E003",
    "HANDLER_TIMEOUT_SECONDS": "django_outbox.E090",
    "HOUSEKEEPING_INTERVAL_SECONDS": "django_outbox.E074",
    "INBOX_RETENTION": "django_outbox.E060",
    "IDEMPOTENCY_KEY_TTL": "django_outbox.E061",
    "RETENTION": "django_outbox.E071",
    "ARCHIVE_AFTER": "django_outbox.E073",
}
BAD_NUMBERS = [NAN, -NAN, INF, -INF, -1, -0.5, 2**63, 1e308, 10**400]


@pytest.mark.parametrize("key", sorted(NUMERIC_KEYS))
@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
def test_nan_infinity_negative_and_huge_numbers_are_reported(key, value):
    """BACKOFF_MAX_SECONDS = nan crashed the worker at the first failure, LEASE_SECONDS = inf at the first
    claim, POLL_INTERVAL_SECONDS = nan stopped retries: all passed check."""
    if key == "BACKOFF_BASE_SECONDS":  # the cap must not be below the base; keep that rule out of the way
        assert outbox_ids(BACKOFF_BASE_SECONDS=value, BACKOFF_MAX_SECONDS=1e6) == [NUMERIC_KEYS[key]]
    else:
        assert outbox_ids(**{key: value}) == [NUMERIC_KEYS[key]]


@pytest.mark.parametrize(
    "key", ["INBOX_RETENTION", "IDEMPOTENCY_KEY_TTL", "RETENTION", "ARCHIVE_AFTER", "LEASE_SECONDS"]
)
@pytest.mark.parametrize("value", [dt.timedelta.max, -dt.timedelta(days=1), dt.timedelta(0), 1e-300, 10**10], ids=repr)
def test_durations_out_of_range_are_reported(key, value):
    assert outbox_ids(**{key: value}) == [NUMERIC_KEYS[key]]


def test_the_bounds_are_in_the_message_and_hint():
    with override_settings(OUTBOX={"BACKOFF_MAX_SECONDS": INF, "LEASE_SECONDS": 10**6}):
        backoff, lease = (m for m in checks.run_checks() if m.id == "django_outbox.E003")
    assert "BACKOFF_MAX_SECONDS" in backoff.msg and "inf" in backoff.msg
    assert "from 0 to 315360000" in backoff.msg  # ten years
    assert "LEASE_SECONDS" in lease.msg and "from 1 to 86400" in lease.msg  # a day
    assert backoff.hint and lease.hint


def test_a_huge_value_makes_a_short_message():
    """repr(10**5000) raises ValueError (Python's 4300-digit limit); a 10 MB string must not be echoed."""
    with override_settings(OUTBOX={"MAX_ATTEMPTS": 10**5000, "NOTIFY_CHANNEL": "x" * 10_000_000}):
        found = [m for m in checks.run_checks() if m.id and m.id.startswith("django_outbox.")]
    assert sorted(m.id for m in found) == ["django_outbox.E003", "django_outbox.E006"]
    assert all(len(m.msg) < 400 for m in found)


@pytest.mark.parametrize("attempts", [1025, 1026, 5000, 2**31 - 1])
def test_many_attempts_pass_check_without_a_traceback(attempts):
    """MAX_ATTEMPTS = 1026 made check itself die with OverflowError in the inbox retention check.

    So many attempts retry for longer than the default inbox retention (7 days): that warning is right."""
    assert outbox_ids(MAX_ATTEMPTS=attempts) == ["django_outbox.W060"]


def test_the_inbox_warning_still_sees_long_retry_spans():
    found = outbox_ids(MAX_ATTEMPTS=2**31 - 1, INBOX_RETENTION=dt.timedelta(days=7))
    assert found == ["django_outbox.W060"]


@pytest.mark.parametrize("attempts", [2**31, 2**63])
def test_more_attempts_than_the_column_holds_are_reported(attempts):
    assert outbox_ids(MAX_ATTEMPTS=attempts) == ["django_outbox.E003"]


def test_largest_accepted_values_build_a_relay_with_finite_backoff():
    top = {
        "MAX_ATTEMPTS": 2**31 - 1,
        "BACKOFF_BASE_SECONDS": 315_360_000,
        "BACKOFF_MAX_SECONDS": 315_360_000,
        "LEASE_SECONDS": 86_400,
        "POLL_INTERVAL_SECONDS": 86_400,
        "GRACE_PERIOD_SECONDS": 86_400,
        "HANDLER_TIMEOUT_SECONDS": 86_400,
        "BATCH_SIZE": 10_000,
        "CONCURRENCY": 256,
    }
    assert outbox_ids(**top) == ["django_outbox.W060"]
    with override_settings(OUTBOX=top):
        conf = get_settings()
        RelayConfig.from_settings()
        for attempt in (1, 2, 1024, 1025, 1026, 2**31 - 1):
            delay = backoff_seconds(attempt, base=conf.BACKOFF_BASE_SECONDS, cap=conf.BACKOFF_MAX_SECONDS)
            assert math.isfinite(delay) and 0 <= delay <= conf.BACKOFF_MAX_SECONDS


# --- transport options ---------------------------------------------------------------------------------

BASE_OPTIONS: dict[str, dict[str, Any]] = {
    WEBHOOK: {"URL": "https://hooks.example.com/in", "SECRET": SECRET},
    AMQP: {"URL": "amqp://guest:guest@127.0.0.1:5672/%2F", "EXCHANGE": "outbox"},
    REDIS: {"URL": "redis://127.0.0.1:6379/0"},
    NATS: {"SERVERS": "nats://127.0.0.1:4222"},
}
#: Each numeric option and the id its bad values get.
NUMERIC_OPTIONS = [
    (WEBHOOK, "TIMEOUT", "django_outbox.E045"),
    (AMQP, "CONFIRM_TIMEOUT", "django_outbox.E051"),
    (AMQP, "CONNECT_TIMEOUT", "django_outbox.E051"),
    (AMQP, "HEARTBEAT", "django_outbox.E051"),
    (REDIS, "MAXLEN", "django_outbox.E051"),
    (REDIS, "SOCKET_TIMEOUT", "django_outbox.E051"),
    (NATS, "DUPLICATE_WINDOW", "django_outbox.E051"),
    (NATS, "ACK_TIMEOUT", "django_outbox.E051"),
    (NATS, "CONNECT_TIMEOUT", "django_outbox.E051"),
]


def transport_ids(backend: str, options: Mapping[str, Any]) -> list[str]:
    return outbox_ids(TRANSPORTS={"t": {"BACKEND": backend, "OPTIONS": dict(options)}})


@pytest.mark.parametrize(("backend", "key", "expected"), NUMERIC_OPTIONS, ids=lambda v: str(v).rsplit(".", 1)[-1])
@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
def test_bad_numbers_in_transport_options_are_reported(backend, key, expected, value):
    """A webhook TIMEOUT = nan made every delivery fail until the message was dead."""
    assert transport_ids(backend, {**BASE_OPTIONS[backend], key: value}) == [expected]


def test_the_email_transport_reports_options_it_does_not_take():
    assert transport_ids(EMAIL, {"TIMEOUT": NAN}) == ["django_outbox.E041"]
    assert transport_ids(EMAIL, {}) == []


@pytest.mark.parametrize(
    ("backend", "options", "expected"),
    [
        (WEBHOOK, {"URL": "http://[::1", "SECRET": SECRET}, "django_outbox.E042"),  # urlsplit raises ValueError
        (WEBHOOK, {"URL": "https://example.com:99999/", "SECRET": SECRET}, "django_outbox.E042"),
        (WEBHOOK, {"URL": "https://exa mple.com/", "SECRET": SECRET}, "django_outbox.E042"),
        (WEBHOOK, {"URL": "https://example.com/\x00", "SECRET": SECRET}, "django_outbox.E042"),
        (WEBHOOK, {"RESOLVER": "tests\x00.x"}, "django_outbox.E044"),
        (WEBHOOK, {"RESOLVER": ["a.b"]}, "django_outbox.E044"),
        (WEBHOOK, {"URL": "https://hooks.example.com/in", "SECRET": SECRET, "ALLOWED_HOSTS": ["\x00"]}, None),
        (AMQP, {**BASE_OPTIONS[AMQP], "ROUTING_KEY": "{topic:>99999999999}"}, "django_outbox.E052"),
        (AMQP, {**BASE_OPTIONS[AMQP], "ROUTING_KEY": "{topic!r}"}, "django_outbox.E052"),
        (AMQP, {**BASE_OPTIONS[AMQP], "EXCHANGE": "x" * 256}, "django_outbox.E051"),
        (AMQP, {**BASE_OPTIONS[AMQP], "HEARTBEAT": 65536}, "django_outbox.E051"),
    ],
)
def test_other_option_values_that_fail_later_are_reported(backend, options, expected):
    assert transport_ids(backend, options) == ([expected] if expected else [])


def test_a_webhook_resolver_given_as_a_function_passes_check():
    """The transport takes a callable RESOLVER; check called import_string() on it and raised."""
    assert transport_ids(WEBHOOK, {"RESOLVER": _resolver}) == []


def _resolver(message: Message) -> tuple[str, str]:
    return ("https://hooks.example.com/in", SECRET)


# --- no check raises -------------------------------------------------------------------------------------


class ExplodingTransport(BaseTransport):
    """A third-party transport whose own check has a bug."""

    @classmethod
    def check(cls, name: str, options: Mapping[str, Any]) -> list[CheckMessage]:
        raise ZeroDivisionError("the check divided by zero")


def test_a_check_that_raises_becomes_an_error_naming_it():
    with override_settings(
        OUTBOX={
            "TRANSPORTS": {
                "boom": {"BACKEND": "tests.unit.test_check_bounds.ExplodingTransport"},
                "hooks": {"BACKEND": WEBHOOK, "OPTIONS": {"URL": "nope", "SECRET": SECRET}},
            }
        }
    ):
        found = [m for m in checks.run_checks() if m.id and m.id.startswith("django_outbox.")]
    (failed,) = [m for m in found if m.id == "django_outbox.E007"]
    assert "ExplodingTransport" in failed.msg and "ZeroDivisionError" in failed.msg and "divided by zero" in failed.msg
    assert failed.obj == "OUTBOX['TRANSPORTS']['boom']"
    assert failed.hint
    # the other transports are still checked
    assert "django_outbox.E042" in {m.id for m in found}


def test_every_outbox_check_is_guarded():
    """Each check the app registers reports its own failure instead of raising out of run_checks()."""
    from django.core.checks.registry import registry

    ours = [c for c in registry.get_checks() if c.__module__.startswith("django_outbox")]
    assert ours
    for check in ours:
        assert getattr(check, "outbox_guarded", False), check


def test_a_guarded_check_that_raises_reports_e007_and_the_rest_still_run():
    from django.core.checks.registry import registry

    from django_outbox.checks import register_check

    @register_check("outbox-test-only")
    def broken(app_configs: object = None, **kwargs: object) -> list[CheckMessage]:
        raise OverflowError("int too large to convert to float")

    try:
        found = checks.run_checks(tags=["outbox-test-only"])
    finally:
        registry.registered_checks.discard(broken)
    (failed,) = found
    assert failed.id == "django_outbox.E007"
    assert "broken" in failed.msg and "OverflowError: int too large to convert to float" in failed.msg


@pytest.mark.parametrize(
    "args",
    [
        ("--lease", "inf"),
        ("--lease", "nan"),
        ("--poll-interval", "nan"),
        ("--poll-interval", "1e308"),
        ("--handler-timeout", "inf"),
        ("--batch-size", str(2**63)),
        ("--concurrency", "100000"),
    ],
)
def test_the_worker_command_applies_the_same_bounds(args):
    """The command-line overrides of the settings bypassed check: ``--lease inf`` failed at the first claim."""
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match=r"must be .* from .* to "):
        call_command("outbox_worker", "--until-empty", *args)


@pytest.mark.parametrize("attempts", [1, 2, 3, 7, 12, 40])
@pytest.mark.parametrize(("base", "cap"), [(0, 0), (0, 5), (2, 0), (2, 3600), (0.5, 7), (3, 3), (1e-3, 1e6)])
def test_the_retry_span_equals_the_sum_it_replaces(attempts, base, cap):
    from django_outbox.inbox.checks import retry_span

    naive = sum(min(cap, base * 2 ** (n - 1)) for n in range(1, attempts))
    assert retry_span(attempts, base, cap) == pytest.approx(naive)


def test_a_numeric_broker_option_must_declare_both_bounds():
    """So the next option added cannot forget the upper bound (or NaN) again."""
    from django_outbox.transports.broker import option

    with pytest.raises(TypeError, match="minimum and a maximum"):
        option(1.0, kind=float, minimum=0.1)
    with pytest.raises(TypeError, match="minimum and a maximum"):
        option(None, kind=(int, type(None)))
    option(1.0, kind=float, minimum=0.1, maximum=10)


@pytest.mark.parametrize(("stream", "works"), NATS_STREAMS)
def test_nats_stream_names_the_server_refuses_are_reported(stream, works):
    options = {**BASE_OPTIONS[NATS], "STREAM": stream}
    assert transport_ids(NATS, options) == ([] if works else ["django_outbox.E051"])


@pytest.mark.parametrize(("subject", "works"), NATS_SUBJECTS)
def test_nats_subjects_the_server_refuses_are_reported(subject, works):
    options = {**BASE_OPTIONS[NATS], "SUBJECT": subject}
    assert transport_ids(NATS, options) == ([] if works else ["django_outbox.E052"])
