"""The Kafka transport against a real Kafka-protocol broker (Tansu, started by the tests on a free loopback
port); the consumer is plain confluent-kafka."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from django_outbox.models import Attempt, Message
from django_outbox.transports.kafka import KafkaTransport
from tests.support.brokers import (
    Received,
    assert_all_received,
    count_status,
    failed_attempts,
    outbox_settings,
    relay_until_empty,
    running_relay,
    send_many,
    unique_prefix,
)
from tests.support.tansu import Tansu, running_tansu
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.database_independent, pytest.mark.django_db(transaction=True)]

BACKEND = "django_outbox.transports.kafka.KafkaTransport"
PARTITIONS = 3


@pytest.fixture
def tansu() -> Iterator[Tansu]:
    with running_tansu() as broker:
        yield broker


def create_topic(broker: Tansu, topic: str, partitions: int = PARTITIONS, *, exist_ok: bool = False) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        try:
            future.result(10)
        except KafkaException as exc:
            if not (exist_ok and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise


def options(broker: Tansu, **more: Any) -> dict[str, Any]:
    return {"BOOTSTRAP_SERVERS": broker.bootstrap, "DELIVERY_TIMEOUT": 5.0, "CONNECT_TIMEOUT": 2.0, **more}


def _text(value: str | bytes | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


def read_topic(broker: Tansu, topic: str, *, at_least: int, timeout: float = 20) -> list[tuple[int, Received]]:
    """Every record of ``topic`` from the start of each partition: (partition, what the consumer saw).

    It reads until ``at_least`` records came and every partition is read up to its end (its high
    watermark, asked once that many came): a pause of the consumer's fetches on a busy machine is not
    the end of the topic.
    """
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": unique_prefix(), "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, -2) for p in partitions])  # -2: from the beginning
    out: list[tuple[int, Received]] = []
    next_offset = dict.fromkeys(partitions, 0)
    ends: dict[int, int] | None = None
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            batch = consumer.consume(500, timeout=0.5)
            for record in batch:
                assert record.error() is None, record.error()
                next_offset[record.partition() or 0] = (record.offset() or 0) + 1
                pairs: list[tuple[str, bytes]] = list(record.headers() or [])  # type: ignore[arg-type]
                headers = {name: _text(value) for name, value in pairs}
                assert topic.endswith(headers["Outbox-Topic"])  # TOPIC may put a prefix before it
                key = record.key()
                assert _text(key) == headers.get("Outbox-Key", "")
                out.append(
                    (
                        record.partition() or 0,
                        Received(
                            message_id=headers["Outbox-Message-Id"],
                            payload=json.loads(_text(record.value())),
                            key=_text(key) if key is not None else None,
                            idempotency_key=headers.get("Idempotency-Key"),
                            headers=headers,
                        ),
                    )
                )
            if len(out) >= at_least and ends is None:
                ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
            if ends is not None and all(next_offset[p] >= end for p, end in ends.items()):
                break
    finally:
        consumer.close()
    assert len(out) >= at_least, f"read {len(out)} of the {at_least} records expected of {topic} in {timeout:g} s"
    return out


def test_worker_relays_1000_messages_with_headers_payload_key_partition_and_order(tansu):
    prefix = unique_prefix()
    topic = f"{prefix}.orders"
    create_topic(tansu, topic)
    with outbox_settings("kafka", BACKEND, options(tansu), f"{prefix}.*"):
        sent = send_many(topic, 1000)
        relay = relay_until_empty(concurrency=4, batch_size=50)
    assert relay.stats.delivered == 1000
    assert count_status(Message.Status.DELIVERED) == 1000
    records = read_topic(tansu, topic, at_least=1000)
    # the whole header list, in its order: the message's own headers, then the outbox's
    first = next(r for _, r in records if r.message_id == str(sent[0].uuid))
    own = ["Outbox-Message-Id", "Outbox-Topic", "Outbox-Key", "Idempotency-Key"]
    assert list(first.headers) == ["trace", "tenant", *own]
    assert_all_received(sent, [r for _, r in records])
    partitions: dict[str | None, set[int]] = defaultdict(set)
    for partition, received in records:
        partitions[received.key].add(partition)
    assert all(len(p) == 1 for p in partitions.values()), f"a key spread over partitions: {dict(partitions)}"
    assert len(set().union(*partitions.values())) > 1, "every key in one partition: the test shows nothing"


def test_a_message_without_key_or_idempotency_key_has_neither_header(tansu):
    from django.db import transaction

    from django_outbox import outbox

    prefix = unique_prefix()
    topic = f"{prefix}.bare"
    create_topic(tansu, topic, 1)
    with outbox_settings("kafka", BACKEND, options(tansu), f"{prefix}.*"):
        with transaction.atomic():
            message = outbox.send(topic, ["a", 1, None])
        relay_until_empty()
    ((_, received),) = read_topic(tansu, topic, at_least=1)
    assert received.key is None and received.payload == ["a", 1, None]
    assert received.headers == {"Outbox-Message-Id": str(message.uuid), "Outbox-Topic": topic}


def test_the_topic_template_names_the_kafka_topic(tansu):
    prefix = unique_prefix()
    create_topic(tansu, f"events.{prefix}.orders", 1)
    with outbox_settings("kafka", BACKEND, options(tansu, TOPIC="events.{topic}"), f"{prefix}.*"):
        sent = send_many(f"{prefix}.orders", 5)
        relay_until_empty()
    assert_all_received(sent, [r for _, r in read_topic(tansu, f"events.{prefix}.orders", at_least=5)])


def test_an_unknown_topic_is_a_clear_failed_attempt_and_the_message_waits(tansu):
    prefix = unique_prefix()
    config = {"allow.auto.create.topics": False, "topic.metadata.propagation.max.ms": 500}
    with outbox_settings("kafka", BACKEND, options(tansu, PRODUCER_CONFIG=config), f"{prefix}.*"):
        (message,) = send_many(f"{prefix}.missing", 1)
        relay_until_empty()
        message.refresh_from_db()
        assert message.status == Message.Status.PENDING
        assert f"Kafka has no topic '{prefix}.missing'" in message.last_error
        assert "create it" in message.last_error
        # created meanwhile: the next attempt delivers it
        create_topic(tansu, f"{prefix}.missing", 1)
        Message.objects.filter(pk=message.pk).update(available_at=message.created_at)
        relay_until_empty()
    message.refresh_from_db()
    assert message.status == Message.Status.DELIVERED
    assert [r.message_id for _, r in read_topic(tansu, f"{prefix}.missing", at_least=1)] == [str(message.uuid)]


def test_a_record_over_the_size_limit_is_dead_at_once_and_fails_alone(tansu):
    """Tansu itself takes records of any size; the limit a producer obeys is its message.max.bytes, which
    matches the brokers' (1 MB by default on both): over it, the record is refused, and no retry helps."""
    from django.db import transaction

    from django_outbox import outbox

    prefix = unique_prefix()
    topic = f"{prefix}.big"
    create_topic(tansu, topic, 1)
    settings = options(tansu, PRODUCER_CONFIG={"message.max.bytes": 20_000})
    with outbox_settings("kafka", BACKEND, settings, f"{prefix}.*"):
        with transaction.atomic():
            small = outbox.send(topic, {"n": 1}, key="k")
            big = outbox.send(topic, {"blob": "x" * 50_000}, key="other")
            after = outbox.send(topic, {"n": 2}, key="k2")
        relay_until_empty()
    big.refresh_from_db()
    assert big.status == Message.Status.DEAD
    assert big.attempts == 1
    assert "Message size too large" in big.last_error and "message.max.bytes" in big.last_error
    (attempt,) = big.attempt_log.all()
    assert attempt.outcome == Attempt.Outcome.FAILED and "message.max.bytes" in attempt.error
    for message in (small, after):
        message.refresh_from_db()
        assert message.status == Message.Status.DELIVERED
    assert sorted(r.message_id for _, r in read_topic(tansu, topic, at_least=2)) == sorted(
        [str(small.uuid), str(after.uuid)]
    )


def test_a_broker_killed_mid_run_and_restarted_loses_nothing_the_outbox_holds(tansu):
    """The messages wait, retry and arrive; none is dead; a record twice only where an attempt failed.

    The restarted broker has forgotten every producer's idempotent session: it fences some, and answers
    others' records with "duplicate sequence" without storing them. librdkafka reports those as delivered
    without an offset; the transport retries them (half the runs lost a message before it did).

    Tansu keeps records in memory, so what it held before the kill is gone with it (a broker's durability,
    not the outbox's): the read-back covers what the outbox delivered to the restarted broker.
    """
    prefix = unique_prefix()
    topic = f"{prefix}.orders"
    create_topic(tansu, topic)
    settings = options(tansu, DELIVERY_TIMEOUT=2.0, CONNECT_TIMEOUT=1.0)
    with outbox_settings("kafka", BACKEND, settings, f"{prefix}.*"), running_relay(concurrency=3, batch_size=20):
        first = send_many(topic, 300)
        wait_for(lambda: count_status(Message.Status.DELIVERED) >= 1, timeout=60)
        tansu.kill()
        later = send_many(topic, 50, start=300)
        wait_for(lambda: failed_attempts() >= 3, timeout=30)
        tansu.start()
        create_topic(tansu, topic, exist_ok=True)  # the relay's retries may have had it created first
        wait_for(lambda: count_status(Message.Status.DELIVERED) == 350, timeout=60)
    assert count_status(Message.Status.DEAD) == 0
    retried = set(
        Attempt.objects.filter(outcome=Attempt.Outcome.FAILED).values_list("message__uuid", flat=True).distinct()
    )
    assert retried, "no attempt failed: the broker was not down while messages were due"
    records = [r for _, r in read_topic(tansu, topic, at_least=len(later))]
    seen = Counter(r.message_id for r in records)
    by_id = {str(m.uuid): m for m in first + later}
    must_arrive = {str(m.uuid) for m in later} | {str(u) for u in retried}
    missing = must_arrive - set(seen)
    assert not missing, f"{len(missing)} messages delivered after the restart are not in the broker"
    twice = {i for i, n in seen.items() if n > 1}
    assert twice <= {str(u) for u in retried}, "a record arrived twice with no failed attempt to explain it"
    for r in records:
        assert r.payload == by_id[r.message_id].payload


def test_security_options_reach_the_client(tansu):
    """TLS towards a plaintext listener: the handshake fails, so the option was passed through."""
    prefix = unique_prefix()
    settings = options(tansu, PRODUCER_CONFIG={"security.protocol": "SSL"}, CONNECT_TIMEOUT=1.0)
    with outbox_settings("kafka", BACKEND, settings, f"{prefix}.*"):
        (message,) = send_many(f"{prefix}.orders", 1)
        relay_until_empty()
    message.refresh_from_db()
    assert message.status == Message.Status.PENDING
    assert f"cannot reach Kafka at {tansu.bootstrap}" in message.last_error


def test_an_unreachable_cluster_fails_the_batch_within_the_connect_timeout():
    from tests.support.servers import free_port

    prefix = unique_prefix()
    port = free_port()
    settings = {"BOOTSTRAP_SERVERS": f"127.0.0.1:{port}", "CONNECT_TIMEOUT": 1.0, "DELIVERY_TIMEOUT": 30.0}
    with outbox_settings("kafka", BACKEND, settings, f"{prefix}.*"):
        sent = send_many(f"{prefix}.orders", 3)
        transport = KafkaTransport(name="kafka", options=settings)
        try:
            started = time.monotonic()
            results = transport.deliver_batch(sent)
            took = time.monotonic() - started
        finally:
            transport.close()
    assert all(r is not None and f"cannot reach Kafka at 127.0.0.1:{port}" in str(r) for r in results)
    assert took < 10, f"took {took:.1f} s; CONNECT_TIMEOUT is 1 s and DELIVERY_TIMEOUT 30 s"


def test_the_producer_is_idempotent_with_acks_all_whatever_the_config_says(tansu):
    transport = KafkaTransport(name="kafka", options=options(tansu, PRODUCER_CONFIG={"linger.ms": 5}))
    config = transport._config()
    transport.close()
    assert config["enable.idempotence"] == "true" and config["acks"] == "all"
    assert config["linger.ms"] == "5"
    assert config["message.timeout.ms"] == "5000"


def test_deliver_batch_reports_each_message_alone(tansu):
    """One batch, three topics: the good records are delivered, the one a check could not foresee fails."""
    prefix = unique_prefix()
    create_topic(tansu, f"{prefix}.a", 1)
    config = {"allow.auto.create.topics": False, "topic.metadata.propagation.max.ms": 500}
    settings = options(tansu, PRODUCER_CONFIG=config)
    with outbox_settings("kafka", BACKEND, settings, f"{prefix}.*"):
        a1 = send_many(f"{prefix}.a", 1)[0]
        b = send_many(f"{prefix}.b", 1)[0]
        a2 = send_many(f"{prefix}.a", 1, start=1)[0]
        transport = KafkaTransport(name="kafka", options=settings)
        try:
            results = transport.deliver_batch([a1, b, a2])
        finally:
            transport.close()
    assert results[0] is None and results[2] is None
    assert results[1] is not None and f"Kafka has no topic '{prefix}.b'" in str(results[1])
