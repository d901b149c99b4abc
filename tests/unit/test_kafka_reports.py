"""How the Kafka transport reads one delivery report, on the report objects confluent-kafka itself builds.

No broker is needed: a report is a ``confluent_kafka.Message`` (with the offset the broker answered, or
none) and a ``KafkaError`` or None, and both can be made as librdkafka hands them over. The case that
matters most is a success without an offset: a broker restarted without its producer state answers
"duplicate sequence" for records it never stored, which librdkafka reports as delivered.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, Message

from django_outbox.exceptions import PermanentDeliveryError, TransientDeliveryError
from django_outbox.transports.kafka import KafkaTransport

#: librdkafka's RD_KAFKA_OFFSET_INVALID, the offset of a record acknowledged as a duplicate.
OFFSET_INVALID = -1001


@pytest.fixture
def transport() -> Iterator[KafkaTransport]:
    transport = KafkaTransport(name="kafka", options={"BOOTSTRAP_SERVERS": "127.0.0.1:9"})
    try:
        yield transport
    finally:
        transport.close()


def record(offset: int | None = None) -> Message:
    """A report's record; without an offset, as librdkafka hands over one acknowledged as a duplicate."""
    if offset is None:
        return Message(topic="orders", partition=0, key=b"order-1", value=b"{}")
    return Message(topic="orders", partition=0, key=b"order-1", value=b"{}", offset=offset)


@pytest.mark.parametrize(
    "report", [record(), record(offset=OFFSET_INVALID)], ids=["no offset", "RD_KAFKA_OFFSET_INVALID"]
)
def test_a_success_without_an_offset_is_a_failed_attempt_and_ends_the_producer_session(transport, report):
    assert report.offset() is None  # what confluent-kafka hands over for both

    outcome = transport._outcome(None, report, "orders")

    assert isinstance(outcome, TransientDeliveryError)  # retried: at worst a duplicate, never a loss
    assert "without an offset" in str(outcome) and "'orders'" in str(outcome)
    assert transport._doubtful  # the next batch starts a new idempotent session


@pytest.mark.parametrize("offset", [0, 41])
def test_a_success_with_an_offset_is_delivered(transport, offset):
    assert transport._outcome(None, record(offset=offset), "orders") is None
    assert not transport._doubtful


def test_an_error_report_fails_the_message_whatever_its_offset(transport):
    too_large = transport._outcome(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), record(offset=7), "orders")
    assert isinstance(too_large, PermanentDeliveryError) and "larger than" in str(too_large)

    assert not transport._doubtful
    timed_out = transport._outcome(KafkaError(KafkaError._MSG_TIMED_OUT), record(offset=7), "orders")
    assert isinstance(timed_out, TransientDeliveryError)
    # A record that timed out in the producer's queue may leave its partition's sequence waiting on the
    # broker for good (seen after a broker restarted empty): the next batch starts a new session.
    assert transport._doubtful


def test_a_fenced_session_fails_the_message_and_ends_the_session(transport):
    fenced = transport._outcome(KafkaError(KafkaError.UNKNOWN_PRODUCER_ID), record(), "orders")
    assert isinstance(fenced, TransientDeliveryError)
    assert transport._doubtful
