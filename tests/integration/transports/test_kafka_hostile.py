"""The Kafka transport against a Kafka-protocol broker (Tansu, on loopback) that misbehaves, and records
Kafka refuses: a broker whose answers come late, an outbox topic that is no Kafka topic name, headers
that make a record too large, header names and values outside ASCII.

Each runs through the worker, so each failure is a recorded attempt with its reason.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterator

import pytest
from django.db import transaction

from django_outbox import outbox
from django_outbox.models import Attempt, Message
from django_outbox.transports.kafka import REPORT_GRACE_SECONDS
from tests.integration.transports.test_kafka import BACKEND, create_topic, options, read_topic
from tests.support.brokers import (
    count_status,
    failed_attempts,
    outbox_settings,
    relay_until_empty,
    running_relay,
    send_many,
    unique_prefix,
)
from tests.support.proxy import FlakyProxy
from tests.support.servers import free_port
from tests.support.tansu import Tansu, running_tansu
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.database_independent, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def tansu() -> Iterator[Tansu]:
    with running_tansu() as broker:
        yield broker


# --- a broker whose answers come late ---------------------------------------------------------------------


@pytest.fixture
def late_broker() -> Iterator[tuple[Tansu, FlakyProxy]]:
    """A broker reached only through a proxy, which can hold the broker's answers (``hold_answers()``)."""
    port = free_port()
    proxy = FlakyProxy("127.0.0.1", port)
    broker = Tansu(port, advertised=proxy.port)
    try:
        yield broker, proxy
    finally:
        broker.stop()
        proxy.close()


def test_a_broker_that_answers_late_fails_the_attempts_in_time_and_loses_nothing(late_broker):
    """The broker stores the records but its answers come after DELIVERY_TIMEOUT: each attempt fails once
    that has passed (plus the grace), with the reason, and the worker goes on; once the answers flow again
    the retries deliver every message. The broker then holds some records twice, each of a message with a
    failed attempt to explain it (the consumer dedupes them), and none is lost."""
    broker, proxy = late_broker
    prefix = unique_prefix()
    topic = f"{prefix}.orders"
    bootstrap = f"127.0.0.1:{proxy.port}"
    create_topic(broker, topic, 1)
    delivery_timeout = 2.0
    settings = {"BOOTSTRAP_SERVERS": bootstrap, "DELIVERY_TIMEOUT": delivery_timeout, "CONNECT_TIMEOUT": 1.0}
    with outbox_settings("kafka", BACKEND, settings, f"{prefix}.*"), running_relay(concurrency=1, batch_size=20):
        first = send_many(topic, 1)
        wait_for(lambda: count_status(Message.Status.DELIVERED) == 1, timeout=30)  # the producer is ready
        proxy.hold_answers()
        late = send_many(topic, 20, start=1)
        wait_for(lambda: failed_attempts() >= 20, timeout=30)
        proxy.release_answers()
        wait_for(lambda: count_status(Message.Status.DELIVERED) == 21, timeout=60)
    assert count_status(Message.Status.DEAD) == 0
    failed = list(Attempt.objects.filter(outcome=Attempt.Outcome.FAILED))
    bound = dt.timedelta(seconds=delivery_timeout + REPORT_GRACE_SECONDS + 1.5)
    for attempt in failed:
        assert attempt.finished_at is not None and attempt.finished_at - attempt.started_at <= bound, (
            f"an attempt took {attempt.finished_at - attempt.started_at} with DELIVERY_TIMEOUT {delivery_timeout} s"
        )
        # a batch handed to the ready producer waited for answers in vain; a later batch, with the answers
        # still held, could not even read the cluster's metadata with the fresh producer session a timed-out
        # record starts (the first attempt of a message claimed after the first batch, on a loaded machine)
        reasons = ("Message timed out", "no delivery report within", f"cannot reach Kafka at {bootstrap}")
        assert any(reason in attempt.error for reason in reasons), attempt.error
    late_first = [a for a in failed if "Message timed out" in a.error or "no delivery report within" in a.error]
    assert any(a.number == 1 for a in late_first), "no first attempt waited for the late answers"
    retried = {str(a.message.uuid) for a in failed}
    # A claim takes a key's run and hands it to the producer in one batch: each of the run is attempted
    # (and, before the run's records were all written, some were released with no attempt row, so their
    # second copy had nothing in the audit to explain it)
    assert retried and retried <= {str(m.uuid) for m in late}
    seen = Counter(r.message_id for _, r in read_topic(broker, topic, at_least=21))
    assert set(seen) == {str(m.uuid) for m in first + late}, "a message is missing from the topic"
    twice = {message_id for message_id, n in seen.items() if n > 1}
    assert twice <= retried, "a record is in the topic twice with no failed attempt to explain it"


# --- records Kafka refuses ----------------------------------------------------------------------------------


def test_an_outbox_topic_that_is_no_kafka_topic_name_is_dead_at_once_and_fails_alone(tansu):
    """TOPIC = "{topic}" with an outbox topic outside Kafka's alphabet (non-ASCII, a space): no retry can
    make it a name, so the message is dead at its first attempt, and the rest of the batch is delivered."""
    prefix = unique_prefix()
    good = f"{prefix}.orders"
    create_topic(tansu, good, 1)
    with outbox_settings("kafka", BACKEND, options(tansu), f"{prefix}.*"):
        with transaction.atomic():
            before = outbox.send(good, {"n": 1}, key="k")
            accented = outbox.send(f"{prefix}.commandes.créées", {"n": 2}, key="k2")
            spaced = outbox.send(f"{prefix}.two words", {"n": 3}, key="k3")
            after = outbox.send(good, {"n": 4}, key="k")
        relay_until_empty()
    for bad in (accented, spaced):
        bad.refresh_from_db()
        assert (bad.status, bad.attempts) == (Message.Status.DEAD, 1)
        assert f"{bad.topic!r}" in bad.last_error and "is not a Kafka topic name" in bad.last_error
    for message in (before, after):
        message.refresh_from_db()
        assert message.status == Message.Status.DELIVERED
    assert sorted(r.message_id for _, r in read_topic(tansu, good, at_least=2)) == sorted(
        [str(before.uuid), str(after.uuid)]
    )


def test_headers_that_make_the_record_too_large_are_dead_at_once_and_fail_alone(tansu):
    """A small payload with a large header: the record (headers included) is over the producer's
    message.max.bytes, so it is refused as too large, with the hint, and the others are delivered."""
    prefix = unique_prefix()
    topic = f"{prefix}.big"
    create_topic(tansu, topic, 1)
    settings = options(tansu, PRODUCER_CONFIG={"message.max.bytes": 20_000})
    with outbox_settings("kafka", BACKEND, settings, f"{prefix}.*"):
        with transaction.atomic():
            small = outbox.send(topic, {"n": 1}, key="k")
            big = outbox.send(topic, {"n": 2}, key="other", headers={"X-Blob": "h" * 50_000})
            after = outbox.send(topic, {"n": 3}, key="k")
        relay_until_empty()
    big.refresh_from_db()
    assert (big.status, big.attempts) == (Message.Status.DEAD, 1)
    assert "Message size too large" in big.last_error and "message.max.bytes" in big.last_error
    for message in (small, after):
        message.refresh_from_db()
        assert message.status == Message.Status.DELIVERED
    assert len(read_topic(tansu, topic, at_least=2)) == 2


def test_header_names_and_values_outside_ascii_arrive_as_utf8(tansu):
    """Kafka headers are bytes: a header name and value in any script, and a key of emoji, arrive as the
    UTF-8 of what was sent, byte for byte."""
    prefix = unique_prefix()
    topic = f"{prefix}.intl"
    create_topic(tansu, topic, 1)
    headers = {"Ключ-Арендатора": "значение ✓", "X-Émoji": "📦🚚", "X-Json": '{"a": [1, "é"]}'}
    with outbox_settings("kafka", BACKEND, options(tansu), f"{prefix}.*"):
        with transaction.atomic():
            message = outbox.send(topic, {"name": "Zürich"}, key="🔑-clé", headers=headers)
        relay_until_empty()
    message.refresh_from_db()
    assert message.status == Message.Status.DELIVERED, message.last_error
    ((_, received),) = read_topic(tansu, topic, at_least=1)
    assert received.key == "🔑-clé"
    assert {name: received.headers[name] for name in headers} == headers
    assert received.payload == {"name": "Zürich"}


def test_a_sasl_password_the_broker_refuses_appears_in_no_error_and_no_log_line(tansu, caplog):
    """SASL towards a broker that offers none: every attempt fails with "cannot reach Kafka", and the
    password is in neither the message's last error, its attempt rows, nor anything librdkafka logged."""
    import logging

    prefix = unique_prefix()
    password = "s3cr3t-Passw0rd-do-not-leak"
    config = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "outbox",
        "sasl.password": password,
    }
    caplog.set_level(logging.DEBUG, logger="django_outbox")
    with outbox_settings("kafka", BACKEND, options(tansu, PRODUCER_CONFIG=config, CONNECT_TIMEOUT=1.0), f"{prefix}.*"):
        (message,) = send_many(f"{prefix}.orders", 1)
        relay_until_empty()
    message.refresh_from_db()
    assert message.status == Message.Status.PENDING
    assert f"cannot reach Kafka at {tansu.bootstrap}" in message.last_error
    texts = [message.last_error, *Attempt.objects.filter(message=message).values_list("error", flat=True)]
    texts += [record.getMessage() for record in caplog.records]
    assert not [text for text in texts if password in text]
