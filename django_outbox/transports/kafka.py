"""Apache Kafka through confluent-kafka (librdkafka): an idempotent producer with ``acks=all``.

A claimed batch is produced in one go; librdkafka sends it in as few requests as it can and reports
each record on its own. A message counts as delivered only on its own delivery report without error,
so a failed report (a record too large, an unknown topic, a timeout) fails that message alone.

The producer is idempotent: librdkafka's own retries inside one producer session never write a record
twice and keep the order of one partition. What it cannot dedupe is the outbox's retry of a batch
whose reports were lost (a broker that died after writing): consumers dedupe on ``Outbox-Message-Id``.

One producer per transport instance, so per worker thread; the producer's callbacks run only inside
``deliver_batch()`` (in ``flush()`` and ``poll()``), in that thread, so nothing here needs a lock.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ..exceptions import MissingExtraError, PermanentDeliveryError, TransientDeliveryError
from ..options import BAD_TEMPLATE, Rule, shown
from . import cloudevents
from .broker import (
    BAD_URL,
    CONTENT_TYPE,
    MAX_NETWORK_TIMEOUT,
    BrokerTransport,
    encode_payload,
    option,
    render,
    text_headers,
)

try:
    import confluent_kafka
    from confluent_kafka import KafkaError, KafkaException
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise MissingExtraError(
        package="confluent-kafka", extra="kafka", feature="django_outbox.transports.kafka.KafkaTransport"
    ) from exc

if TYPE_CHECKING:
    from ..models import Message

#: A ``PRODUCER_CONFIG`` key the transport sets itself, or a value that would break its guarantees.
OWNED_CONFIG = "django_outbox.E055"
#: A ``PRODUCER_CONFIG`` that librdkafka refuses (an unknown property, a bad value, a missing CA file).
BAD_CONFIG = "django_outbox.E056"

#: librdkafka refuses a connection setup timeout under a second.
MIN_CONNECT_TIMEOUT = 1.0
#: What Kafka takes as a topic name: at most 249 of these characters, not "." or "..".
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
#: ``host:port`` or ``[v6]:port``, optionally behind a listener's protocol, as librdkafka reads a bootstrap server.
_SERVER = re.compile(
    r"^(?:(?:PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL)://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$"
)
#: Seconds over DELIVERY_TIMEOUT the batch waits for reports librdkafka owes (its timer runs a bit late).
REPORT_GRACE_SECONDS = 2.0

#: Property names that hold a secret: their values never appear in a message or a log line.
_SECRET_WORDS = ("password", "secret", "pem", "jaas", "token", "credential")

#: What the transport sets, with why a user may not; a value in ``_ALLOWED`` may be repeated harmlessly.
_OWNED: dict[str, str] = {
    "bootstrap.servers": "use OPTIONS['BOOTSTRAP_SERVERS']",
    "metadata.broker.list": "use OPTIONS['BOOTSTRAP_SERVERS']",
    "enable.idempotence": "the transport's producer is always idempotent",
    "acks": "the transport always waits for all in-sync replicas (acks=all)",
    "request.required.acks": "the transport always waits for all in-sync replicas (acks=all)",
    "message.timeout.ms": "use OPTIONS['DELIVERY_TIMEOUT']",
    "delivery.timeout.ms": "use OPTIONS['DELIVERY_TIMEOUT']",
    "socket.connection.setup.timeout.ms": "use OPTIONS['CONNECT_TIMEOUT']",
    "transactional.id": "the outbox is the transaction; a transactional producer is not supported",
    "enable.gapless.guarantee": "it turns a single failed record into a fatal error for every later one",
    "retries": "librdkafka's retries are what makes a lost request safe to resend in order",
    "message.send.max.retries": "librdkafka's retries are what makes a lost request safe to resend in order",
    "on_delivery": "the transport reads each message's own delivery report",
    "delivery.report.only.error": "the transport reads each message's own delivery report",
    "error_cb": "the transport watches the producer's errors",
    "logger": "the transport logs to the 'django_outbox.kafka' logger",
}
_ALLOWED: dict[str, tuple[object, ...]] = {
    "enable.idempotence": (True, "true"),
    "acks": ("all", -1, "-1"),
    "request.required.acks": ("all", -1, "-1"),
}

logger = logging.getLogger("django_outbox.kafka")


def _is_secret(key: str) -> bool:
    return any(word in key.lower() for word in _SECRET_WORDS)


def _scrub(text: str, config: Mapping[str, Any]) -> str:
    """``text`` without the values of secret properties (librdkafka may quote a value it refuses)."""
    for key, value in config.items():
        if _is_secret(str(key)) and isinstance(value, str) and len(value) >= 3:
            text = text.replace(value, "***")
    return text


def _servers(value: str | tuple[str, ...]) -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return [item.strip() for item in items]


def _servers_refused(value: str | tuple[str, ...]) -> str | None:
    for server in _servers(value):
        match = _SERVER.match(server)
        if match is None or not 1 <= int(match.group(2)) <= 65535:
            return f"= {shown(value)} has {shown(server)}, which is not host:port (a port from 1 to 65535)."
    return None


def _topic_refused(template: str) -> str | None:
    name = template.replace("{topic}", "topic")
    if _TOPIC_NAME.fullmatch(name) and name not in (".", ".."):
        return None
    return (
        f"= {shown(template)} is not a Kafka topic name: up to 249 letters, digits, '.', '_' and '-' "
        "(with {topic} filled in)."
    )


def _config_shape_refused(config: object) -> str | None:
    if not isinstance(config, Mapping):
        return f"must be a dict of librdkafka properties, not {type(config).__name__}."
    for key, value in config.items():
        if not isinstance(key, str) or not key:
            return f"has the key {shown(key)}; librdkafka property names are non-empty strings."
        if (isinstance(value, float) and value != value) or value in (float("inf"), float("-inf")):
            return f"has {key!r} = {value}, which is not a finite number."
        if not isinstance(value, str | int | float | bool):
            shown_value = "***" if _is_secret(key) else shown(value)
            return f"[{key!r}] = {shown_value} is not a string, a number or True/False."
    return None


def _config_owned(config: Mapping[str, Any]) -> str | None:
    for key, value in config.items():
        why = _OWNED.get(key)
        if why is not None and value not in _ALLOWED.get(key, ()):
            return f"sets {key!r} = {shown(value)}, which the transport owns: {why}."
    return None


def _client_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as librdkafka takes it: every value a string (its own form), True/False as true/false."""
    return {key: (str(value).lower() if isinstance(value, bool) else str(value)) for key, value in config.items()}


def _config_refused(config: Mapping[str, Any]) -> str | None:
    """Whether librdkafka builds a producer from ``config`` (no broker named, so none is contacted)."""
    try:
        producer = confluent_kafka.Producer({**_client_config(config), "logger": _QUIET})
    except KafkaException as exc:
        return f"is refused by librdkafka: {_scrub(_error_text(exc), config)}"
    except (TypeError, ValueError) as exc:
        return f"is refused by librdkafka: {_scrub(str(exc), config)}"
    del producer
    return None


class _Quiet(logging.Logger):
    """The logger of the producer a check builds: it has no broker to talk to, and no need to say so."""

    def __init__(self) -> None:
        super().__init__("django_outbox.kafka.check", level=logging.CRITICAL + 1)


_QUIET = _Quiet()


def _error_text(exc: BaseException) -> str:
    error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    return error.str() if error is not None else str(exc)


@dataclasses.dataclass(frozen=True, kw_only=True)
class KafkaOptions:
    bootstrap_servers: str | tuple[str, ...] = option(
        kind=(str, list),
        items=str,
        nonempty=True,
        nonempty_items=True,
        rules=(Rule(BAD_URL, _servers_refused, "Example: 'kafka-1:9092,kafka-2:9092' or ['kafka-1:9092']."),),
    )
    topic: str = option(
        "{topic}",
        kind=str,
        template=True,
        rules=(Rule(BAD_TEMPLATE, _topic_refused, "Example: 'outbox.{topic}'."),),
    )
    producer_config: Mapping[str, Any] = option(
        kind=object,
        default_factory=dict,
        expected="a dict of librdkafka properties",
        rules=(
            Rule(BAD_CONFIG, _config_shape_refused, "Example: {'security.protocol': 'SASL_SSL', 'linger.ms': 5}."),
            Rule(OWNED_CONFIG, _config_owned, "Remove the key; the transport sets it (see docs/transports/kafka.md)."),
            Rule(BAD_CONFIG, _config_refused, "Fix the property as librdkafka's CONFIGURATION.md describes it."),
        ),
    )
    #: Seconds a record may take, from produce to its delivery report (librdkafka's message.timeout.ms).
    delivery_timeout: float = option(30.0, kind=float, minimum=0.1, maximum=MAX_NETWORK_TIMEOUT)
    #: Seconds to open a connection to a broker, and to read the cluster's metadata on a fresh producer.
    connect_timeout: float = option(5.0, kind=float, minimum=MIN_CONNECT_TIMEOUT, maximum=MAX_NETWORK_TIMEOUT)
    #: "payload" (the record below), or a CloudEvent per the Kafka binding (binary: ``ce_`` headers; structured).
    format: str = option(cloudevents.PAYLOAD, kind=str, choices=cloudevents.BROKER_FORMATS)


#: Errors no retry can cure: the record itself is refused.
_PERMANENT = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError._INVALID_ARG,
    }
)

#: Answers that mean the broker no longer knows this producer's idempotent session, or that the session
#: cannot be trusted to move on: a record that timed out in the producer's own queue (``_MSG_TIMED_OUT``)
#: after a broker restarted empty left its partition waiting on a sequence the broker never stored, and
#: every later record of that partition (a key's, in order) timed out behind it until the producer was
#: replaced.
_SESSION_BROKEN = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError.PRODUCER_FENCED,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError.UNKNOWN_PRODUCER_ID,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.INVALID_PRODUCER_ID_MAPPING,
    }
)

_WAITING: Any = object()


class KafkaTransport(BrokerTransport):
    options_class: ClassVar[type] = KafkaOptions

    def __init__(self, *, name: str, options: Mapping[str, Any]) -> None:
        super().__init__(name=name, options=options)
        self.settings: KafkaOptions
        self._producer: confluent_kafka.Producer | None = None
        self._verified = False  # the cluster answered this producer's metadata request
        self._fatal: KafkaError | None = None
        self._doubtful = False  # the idempotent session was fenced or lost its sequence: start a new one

    # --- delivery --------------------------------------------------------------------------------

    def deliver_batch(self, messages: Sequence[Message]) -> list[BaseException | None]:
        try:
            producer = self._ready_producer([render(self.settings.topic, m) for m in messages[:1]])
        except TransientDeliveryError as exc:
            return [exc] * len(messages)
        settings = self.settings
        results: list[Any] = [_WAITING] * len(messages)
        deadline = time.monotonic() + settings.delivery_timeout + REPORT_GRACE_SECONDS
        for index, message in enumerate(messages):
            topic = render(settings.topic, message)
            results[index] = self._produce(producer, index, message, topic, results, deadline)
        while _WAITING in results and self._fatal is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            producer.flush(min(remaining, 1.0))
        if _WAITING in results:
            # Reports librdkafka still owes: purge them so none arrives in a later batch's flush.
            reason = (
                f"fatal producer error: {self._fatal.str()}"
                if self._fatal is not None
                else f"no delivery report within {settings.delivery_timeout:g} s (OPTIONS['DELIVERY_TIMEOUT'])"
            )
            producer.purge()
            producer.flush(0)
            for index, value in enumerate(results):
                if value is _WAITING:
                    results[index] = TransientDeliveryError(f"Kafka did not confirm the message: {reason}")
            self._verified = False
            self._doubtful = True  # purged records leave gaps in the session's sequence: start a new one
        if self._fatal is not None or self._doubtful:
            self._discard()  # the next batch starts a new idempotent session, with a producer id of its own
        return list(results)

    def _produce(
        self,
        producer: confluent_kafka.Producer,
        index: int,
        message: Message,
        topic: str,
        results: list[Any],
        deadline: float,
    ) -> Any:
        if not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
            return PermanentDeliveryError(
                f"{topic!r} (OPTIONS['TOPIC'] for topic {message.topic!r}) is not a Kafka topic name: use up to "
                "249 letters, digits, '.', '_' and '-'"
            )
        text = text_headers(message)
        value = encode_payload(message)
        if self.settings.format == cloudevents.CLOUDEVENTS:
            text.update(cloudevents.binary_headers(message, "ce_"))
            text["content-type"] = CONTENT_TYPE
        elif self.settings.format == cloudevents.CLOUDEVENTS_STRUCTURED:
            text["content-type"] = cloudevents.STRUCTURED_CONTENT_TYPE
            value = cloudevents.structured(message)
        headers: list[tuple[str, str | bytes | None]] = [(n, v.encode()) for n, v in text.items()]
        key = message.key.encode() if message.key is not None else None

        def report(err: KafkaError | None, record: Any) -> None:
            results[index] = self._outcome(err, record, topic)

        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=headers, on_delivery=report)
            except BufferError:
                # librdkafka's queue is full (queue.buffering.max.*): serve reports, then try again
                if time.monotonic() >= deadline:
                    return TransientDeliveryError("the Kafka producer's queue stayed full; nothing was sent")
                producer.poll(0.05)
                continue
            except KafkaException as exc:
                return self._explain(exc.args[0], topic)
            return _WAITING

    def _outcome(self, err: KafkaError | None, record: Any, topic: str) -> BaseException | None:
        """What one delivery report means for its message: None (delivered) or the attempt's error."""
        if err is not None:
            return self._explain(err, topic)
        offset = record.offset()
        if offset is None or offset < 0:
            # A success without an offset: librdkafka took a "duplicate sequence" answer as proof the record
            # was written before. A broker that lost its producer state (seen when one restarts empty)
            # answers so for records it never stored, so the outbox retries: at worst a duplicate, which
            # the failed attempt explains, never a loss. The session is suspect: the next batch starts anew.
            self._doubtful = True
            return TransientDeliveryError(
                f"Kafka acknowledged the record for topic {topic!r} without an offset (a duplicate-sequence "
                "answer), which does not prove it is stored; it will be produced again"
            )
        return None

    def _explain(self, err: KafkaError, topic: str) -> BaseException:
        code = err.code()
        text = err.str()
        if err.fatal():
            self._fatal = err
        if code in _SESSION_BROKEN:
            self._doubtful = True
        if code in _PERMANENT:
            hint = ""
            if code == KafkaError.MSG_SIZE_TOO_LARGE:
                hint = (
                    " (the record is larger than the producer's message.max.bytes or the topic's max.message.bytes;"
                    " raise both, or send less)"
                )
            return PermanentDeliveryError(f"Kafka refused the record for topic {topic!r}: {text}{hint}")
        if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            return TransientDeliveryError(
                f"Kafka has no topic {topic!r} ({text}): create it (kafka-topics --create --topic {topic}), or let "
                "the brokers create topics (auto.create.topics.enable)"
            )
        return TransientDeliveryError(f"Kafka did not take the record for topic {topic!r}: {text}")

    # --- the producer ----------------------------------------------------------------------------

    def _ready_producer(self, topics: list[str]) -> confluent_kafka.Producer:
        """The producer, built on first use; a fresh one (or one that failed) first reads the cluster's
        metadata, so an unreachable cluster fails the batch in CONNECT_TIMEOUT rather than DELIVERY_TIMEOUT."""
        if self._producer is None:
            self._producer = confluent_kafka.Producer(self._config())
            self._verified, self._fatal, self._doubtful = False, None, False
        producer = self._producer
        if not self._verified:
            try:
                topic = topics[0] if topics and _TOPIC_NAME.fullmatch(topics[0]) else None
                producer.list_topics(topic=topic, timeout=self.settings.connect_timeout)
            except KafkaException as exc:
                servers = ",".join(_servers(self.settings.bootstrap_servers))
                raise TransientDeliveryError(
                    f"cannot reach Kafka at {servers} within {self.settings.connect_timeout:g} s "
                    f"(OPTIONS['CONNECT_TIMEOUT']): {_error_text(exc)}"
                ) from exc
            self._verified = True
        return producer

    def _config(self) -> dict[str, Any]:
        settings = self.settings
        return {
            **_client_config(settings.producer_config),
            "bootstrap.servers": ",".join(_servers(settings.bootstrap_servers)),
            "enable.idempotence": "true",
            "acks": "all",
            "message.timeout.ms": str(round(settings.delivery_timeout * 1000)),
            "socket.connection.setup.timeout.ms": str(round(settings.connect_timeout * 1000)),
            "error_cb": self._on_error,
            "logger": logger,
        }

    def _on_error(self, err: KafkaError) -> None:
        """Errors of the producer as a whole; a fatal one (the idempotent session is broken) ends it."""
        if err.fatal():
            self._fatal = err

    def _discard(self) -> None:
        producer, self._producer, self._verified = self._producer, None, False
        if producer is not None:
            producer.purge()
            producer.flush(0)

    def close(self) -> None:
        # Every batch waited for its reports (or purged them), so nothing is left to flush.
        self._discard()


__all__ = ["KafkaTransport"]
