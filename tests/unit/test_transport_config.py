"""Broker transport configuration: routes, system checks with stable ids, extras that name themselves."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from django_outbox.checks import check_settings
from django_outbox.exceptions import MissingExtraError, OutboxImproperlyConfigured
from django_outbox.routing import resolve_transport
from django_outbox.transports.amqp import AMQPTransport
from django_outbox.transports.broker import redact
from django_outbox.transports.kafka import KafkaTransport
from django_outbox.transports.nats import NATSTransport
from django_outbox.transports.redis import RedisStreamsTransport

AMQP = "django_outbox.transports.amqp.AMQPTransport"
REDIS = "django_outbox.transports.redis.RedisStreamsTransport"
NATS = "django_outbox.transports.nats.NATSTransport"
KAFKA = "django_outbox.transports.kafka.KafkaTransport"


def ids_for(backend: str, options: dict[str, Any]) -> list[str]:
    with override_settings(OUTBOX={"TRANSPORTS": {"broker": {"BACKEND": backend, "OPTIONS": options}}}):
        return [c.id for c in check_settings() if c.id is not None]


def test_first_matching_route_wins():
    transports = {
        "rabbit": {"BACKEND": AMQP, "OPTIONS": {"URL": "amqp://localhost", "EXCHANGE": "x"}},
        "streams": {"BACKEND": REDIS, "OPTIONS": {"URL": "redis://localhost"}},
    }
    routes = {"orders.refunded": "streams", "orders.*": "rabbit", "*": "streams"}
    with override_settings(OUTBOX={"TRANSPORTS": transports, "ROUTES": routes}):
        assert resolve_transport("orders.refunded") == "streams"
        assert resolve_transport("orders.created") == "rabbit"
        assert resolve_transport("users.created") == "streams"
        assert check_settings() == []


@pytest.mark.parametrize(
    ("backend", "options"),
    [
        (AMQP, {"URL": "amqp://guest:guest@localhost:5672/%2F", "EXCHANGE": "events"}),
        (AMQP, {"URL": "amqps://h/vh", "EXCHANGE": "", "ROUTING_KEY": "app.{topic}", "HEARTBEAT": 30}),
        (REDIS, {"URL": "redis://localhost:6379/0", "STREAM": "app:{topic}", "MAXLEN": 10_000}),
        (NATS, {"SERVERS": ["nats://a:4222", "nats://b:4222"], "SUBJECT": "app.{topic}"}),
        (NATS, {"SERVERS": "nats://a", "STREAM": "OUT", "CREATE_STREAM": True, "STREAM_SUBJECTS": ["app.>"]}),
    ],
)
def test_valid_options_pass_the_checks(backend, options):
    assert ids_for(backend, options) == []


@pytest.mark.parametrize(
    ("backend", "options", "expected"),
    [
        (AMQP, {"EXCHANGE": "events"}, "django_outbox.E013"),
        (REDIS, {}, "django_outbox.E013"),
        (NATS, {}, "django_outbox.E013"),
        (AMQP, {"URL": "amqp://h", "EXCHANGE": "x", "EXCHNAGE_TYPE": "topic"}, "django_outbox.E050"),
        (REDIS, {"URL": "redis://h", "MAX_LEN": 5}, "django_outbox.E050"),
        (AMQP, {"URL": "amqp://h", "EXCHANGE": "x", "CONFIRM_TIMEOUT": "10"}, "django_outbox.E051"),
        (AMQP, {"URL": "amqp://h", "EXCHANGE": "x", "EXCHANGE_TYPE": "fan"}, "django_outbox.E051"),
        (AMQP, {"URL": "amqp://h", "EXCHANGE": "x", "MANDATORY": 1}, "django_outbox.E051"),
        (REDIS, {"URL": "redis://h", "MAXLEN": 0}, "django_outbox.E051"),
        (NATS, {"SERVERS": []}, "django_outbox.E051"),
        (NATS, {"SERVERS": "nats://h", "STREAM_SUBJECTS": ["ok", ""]}, "django_outbox.E051"),
        (AMQP, {"URL": "amqp://h", "EXCHANGE": "x", "ROUTING_KEY": "{topic}.{key}"}, "django_outbox.E052"),
        (REDIS, {"URL": "redis://h", "STREAM": "outbox:{topic"}, "django_outbox.E052"),
        (NATS, {"SERVERS": "nats://h", "SUBJECT": "{subject}"}, "django_outbox.E052"),
        (AMQP, {"URL": "http://h", "EXCHANGE": "x"}, "django_outbox.E053"),
        (REDIS, {"URL": "localhost:6379"}, "django_outbox.E053"),
        (NATS, {"SERVERS": ["nats://a", "redis://b"]}, "django_outbox.E053"),
        (AMQP, {"URL": "amqp://h", "EXCHANGE": "", "DECLARE_EXCHANGE": True}, "django_outbox.E054"),
        (NATS, {"SERVERS": "nats://h", "CREATE_STREAM": True, "STREAM": "S"}, "django_outbox.E054"),
    ],
)
def test_bad_options_are_reported_with_stable_ids(backend, options, expected):
    assert ids_for(backend, options) == [expected]


def test_check_messages_say_what_to_fix():
    with override_settings(
        OUTBOX={"TRANSPORTS": {"broker": {"BACKEND": REDIS, "OPTIONS": {"URL": "redis://h", "MAXLEN": -1}}}}
    ):
        (error,) = check_settings()
    assert (
        error.msg == "OUTBOX['TRANSPORTS']['broker']['OPTIONS']['MAXLEN'] must be an integer or None from 1 to "
        "9223372036854775807, not -1."
    )
    assert error.hint == "Fix the value, or remove the option to use its default."


def test_unknown_backend_is_reported_before_anything_runs():
    found = ids_for("django_outbox.transports.pulsar.PulsarTransport", {})
    assert found == ["django_outbox.E011"]


def test_bad_options_also_stop_a_transport_from_being_built():
    with pytest.raises(OutboxImproperlyConfigured, match=r"'STREAM'.*only \{topic\} is available.*E052"):
        RedisStreamsTransport(name="streams", options={"URL": "redis://h", "STREAM": "{key}"})
    with pytest.raises(OutboxImproperlyConfigured, match="E013"):
        AMQPTransport(name="rabbit", options={"URL": "amqp://h"})


def test_passwords_are_kept_out_of_messages():
    assert redact("amqp://guest:s3cret@host:5672/%2F") == "amqp://guest:***@host:5672/%2F"
    assert redact("redis://host:6379/0") == "redis://host:6379/0"
    with override_settings(
        OUTBOX={"TRANSPORTS": {"b": {"BACKEND": AMQP, "OPTIONS": {"URL": "http://u:s3cret@h", "EXCHANGE": ""}}}}
    ):
        (error,) = check_settings()
    assert "s3cret" not in error.msg


@pytest.mark.parametrize(
    ("module", "package", "extra", "backend"),
    [
        ("django_outbox.transports.amqp", "pika", "amqp", AMQP),
        ("django_outbox.transports.redis", "redis", "redis", REDIS),
        ("django_outbox.transports.nats", "nats", "nats", NATS),
        ("django_outbox.transports.kafka", "confluent_kafka", "kafka", KAFKA),
    ],
)
def test_a_missing_extra_names_itself(monkeypatch, module, package, extra, backend):
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)  # what Python does for a package that is not installed
    monkeypatch.delitem(sys.modules, module)
    with pytest.raises(MissingExtraError) as raised:
        importlib.import_module(module)
    assert raised.value.extra == extra
    assert f"pip install 'django-transactional-outbox[{extra}]'" in str(raised.value)

    with override_settings(OUTBOX={"TRANSPORTS": {"broker": {"BACKEND": backend, "OPTIONS": {}}}}):
        errors = [e for e in run_checks() if e.id and e.id.startswith("django_outbox.")]
    assert [e.id for e in errors] == ["django_outbox.E012"]
    assert f"[{extra}]" in errors[0].msg


def test_transports_batch():
    assert AMQPTransport.supports_batch()
    assert RedisStreamsTransport.supports_batch()
    assert NATSTransport.supports_batch()
    assert KafkaTransport.supports_batch()
