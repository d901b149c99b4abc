"""The Kafka transport's options as ``manage.py check`` sees them; librdkafka builds a producer, no broker is needed."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from django_outbox.checks import check_settings
from django_outbox.exceptions import OutboxImproperlyConfigured
from django_outbox.transports.kafka import KafkaTransport

KAFKA = "django_outbox.transports.kafka.KafkaTransport"
SERVERS = "kafka-1:9092,kafka-2:9092"


def problems(options: dict[str, Any]) -> list[tuple[str, str]]:
    with override_settings(OUTBOX={"TRANSPORTS": {"kafka": {"BACKEND": KAFKA, "OPTIONS": options}}}):
        return [(c.id or "", c.msg) for c in check_settings()]


def ids(options: dict[str, Any]) -> list[str]:
    return [i for i, _ in problems(options)]


@pytest.mark.parametrize(
    "options",
    [
        {"BOOTSTRAP_SERVERS": SERVERS},
        {"BOOTSTRAP_SERVERS": ["127.0.0.1:9092", "[::1]:9093", "SASL_SSL://kafka.example.com:9094"]},
        {"BOOTSTRAP_SERVERS": SERVERS, "TOPIC": "events.{topic}", "DELIVERY_TIMEOUT": 60, "CONNECT_TIMEOUT": 1},
        {"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {"linger.ms": 5, "compression.type": "lz4"}},
        # what a transport that owns a key would set anyway is harmless
        {"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {"enable.idempotence": True, "acks": "all"}},
        {"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {"acks": -1}},
        # SASL over TLS, as a managed cluster asks for it
        {
            "BOOTSTRAP_SERVERS": SERVERS,
            "PRODUCER_CONFIG": {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": "outbox",
                "sasl.password": "s3cret-pass",
                "ssl.endpoint.identification.algorithm": "https",
            },
        },
        {
            "BOOTSTRAP_SERVERS": SERVERS,
            "PRODUCER_CONFIG": {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "u",
                "sasl.password": "p",
            },
        },
    ],
)
def test_valid_options_pass_the_checks(options):
    assert problems(options) == []


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, "django_outbox.E013"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFG": {}}, "django_outbox.E050"),
        ({"BOOTSTRAP_SERVERS": ""}, "django_outbox.E051"),
        ({"BOOTSTRAP_SERVERS": []}, "django_outbox.E051"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "DELIVERY_TIMEOUT": float("nan")}, "django_outbox.E051"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "DELIVERY_TIMEOUT": 10**30}, "django_outbox.E051"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "CONNECT_TIMEOUT": 0.5}, "django_outbox.E051"),  # librdkafka: 1 s at least
        ({"BOOTSTRAP_SERVERS": "kafka-1"}, "django_outbox.E053"),
        ({"BOOTSTRAP_SERVERS": "kafka-1:99999"}, "django_outbox.E053"),
        ({"BOOTSTRAP_SERVERS": "kafka://kafka-1:9092"}, "django_outbox.E053"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "TOPIC": "{key}"}, "django_outbox.E052"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "TOPIC": "events/{topic}"}, "django_outbox.E052"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "TOPIC": "x" * 250}, "django_outbox.E052"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {"enable.idempotence": False}}, "django_outbox.E055"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {"acks": 1}}, "django_outbox.E055"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {"request.required.acks": "0"}}, "django_outbox.E055"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {"bootstrap.servers": "x:1"}}, "django_outbox.E055"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {"message.timeout.ms": 1000}}, "django_outbox.E055"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {"transactional.id": "t"}}, "django_outbox.E055"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {"retries": 0}}, "django_outbox.E055"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": "linger.ms=5"}, "django_outbox.E056"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {5: "x"}}, "django_outbox.E056"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {"linger.ms": float("inf")}}, "django_outbox.E056"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {"linger.ms": [5]}}, "django_outbox.E056"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {"no.such.property": 1}}, "django_outbox.E056"),
        ({"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {"linger.ms": "soon"}}, "django_outbox.E056"),
        (
            {
                "BOOTSTRAP_SERVERS": SERVERS,
                "PRODUCER_CONFIG": {"security.protocol": "SASL_SSL", "sasl.mechanism": "ROT13"},
            },
            "django_outbox.E056",
        ),
        (
            {
                "BOOTSTRAP_SERVERS": SERVERS,
                "PRODUCER_CONFIG": {"security.protocol": "SSL", "ssl.ca.location": "/no/ca"},
            },
            "django_outbox.E056",
        ),
        # what librdkafka refuses together: a linger longer than the delivery timeout it sets
        ({"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {"linger.ms": 3_000_000}}, "django_outbox.E056"),
    ],
)
def test_bad_options_are_reported_with_stable_ids(options, expected):
    assert ids(options) == [expected]


def test_a_refused_config_names_the_property_and_never_the_password():
    found = problems(
        {
            "BOOTSTRAP_SERVERS": SERVERS,
            "PRODUCER_CONFIG": {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "ROT13",
                "sasl.password": "hunter2-secret",
                "sasl.username": "u",
            },
        }
    )
    ((check_id, msg),) = found
    assert check_id == "django_outbox.E056"
    assert "ROT13" in msg
    assert "hunter2-secret" not in msg


def test_a_password_of_the_wrong_type_is_not_shown():
    ((_, msg),) = problems({"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {"sasl.password": ["hunter2-secret"]}})
    assert "hunter2-secret" not in msg and "'sasl.password'" in msg


def test_a_worker_refuses_what_check_refuses():
    with pytest.raises(OutboxImproperlyConfigured, match="E055"):
        KafkaTransport(name="kafka", options={"BOOTSTRAP_SERVERS": SERVERS, "PRODUCER_CONFIG": {"acks": 0}})


def test_the_transport_config_keeps_the_users_properties_and_its_own_guarantees():
    transport = KafkaTransport(
        name="kafka",
        options={
            "BOOTSTRAP_SERVERS": ["a:9092", "b:9092"],
            "DELIVERY_TIMEOUT": 12.5,
            "CONNECT_TIMEOUT": 3,
            "PRODUCER_CONFIG": {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "u",
                "sasl.password": "p",
                "enable.idempotence": True,
            },
        },
    )
    config = transport._config()
    transport.close()
    assert config["bootstrap.servers"] == "a:9092,b:9092"
    assert config["security.protocol"] == "SASL_SSL" and config["sasl.mechanism"] == "PLAIN"
    assert config["enable.idempotence"] == "true" and config["acks"] == "all"
    assert config["message.timeout.ms"] == "12500"
    assert config["socket.connection.setup.timeout.ms"] == "3000"
