"""RabbitMQ (AMQP 0-9-1) with publisher confirms: a message counts as delivered once the broker acks it.

pika's blocking channel waits for one confirm per publish, a round trip (and, for persistent messages,
a disk sync) each. So this transport drives pika's asynchronous connection on its own private I/O loop:
it publishes a whole claimed batch, then runs the loop until every confirm (or a nack, a return, a
timeout, a closed connection) is in. The loop only runs inside ``deliver_batch()``, in the worker
thread that owns the transport, so nothing here needs a lock.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ..exceptions import MissingExtraError, TransientDeliveryError
from ..options import Problem
from . import cloudevents
from .broker import (
    CONTENT_TYPE,
    MAX_NETWORK_TIMEOUT,
    BrokerTransport,
    combination_error,
    encode_payload,
    option,
    redact,
    render,
    text_headers,
    url_rules,
)

try:
    import pika
    import pika.channel
    import pika.frame
    import pika.spec
    from pika.exchange_type import ExchangeType
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise MissingExtraError(
        package="pika", extra="amqp", feature="django_outbox.transports.amqp.AMQPTransport"
    ) from exc

if TYPE_CHECKING:
    from ..models import Message


#: Exchange names travel as AMQP short strings: at most 255 bytes.
AMQP_SHORTSTR_BYTES = 255


@dataclasses.dataclass(frozen=True, kw_only=True)
class AMQPOptions:
    url: str = option(kind=str, rules=url_rules(("amqp", "amqps"), pika.URLParameters))
    exchange: str = option(kind=str, max_bytes=AMQP_SHORTSTR_BYTES)
    routing_key: str = option("{topic}", kind=str, template=True)
    declare_exchange: bool = option(False, kind=bool)
    exchange_type: str = option("topic", kind=str, choices=("direct", "topic", "fanout", "headers"))
    mandatory: bool = option(True, kind=bool)
    confirm_timeout: float = option(10.0, kind=float, minimum=0.1, maximum=MAX_NETWORK_TIMEOUT)
    connect_timeout: float = option(5.0, kind=float, minimum=0.1, maximum=MAX_NETWORK_TIMEOUT)
    #: Seconds; AMQP sends it as a 16-bit number, 0 turns heartbeats off.
    heartbeat: int | None = option(None, kind=(int, type(None)), minimum=0, maximum=65535)
    #: "payload" (the properties below), or a CloudEvent per the RabbitMQ binding (binary or structured).
    format: str = option(cloudevents.PAYLOAD, kind=str, choices=cloudevents.BROKER_FORMATS)


_WAITING = object()


class AMQPTransport(BrokerTransport):
    options_class: ClassVar[type] = AMQPOptions

    def __init__(self, *, name: str, options: Mapping[str, Any]) -> None:
        super().__init__(name=name, options=options)
        self.settings: AMQPOptions
        self._connection: pika.SelectConnection | None = None
        self._channel: pika.channel.Channel | None = None
        self._ready = False
        self._failure: BaseException | None = None  # why the connection or channel is unusable
        self._running = False
        self._stop_when: Callable[[], bool] | None = None
        self._running_loop: Any = None  # the I/O loop _run_until is running, for callbacks to stop
        self._last_tag = 0
        self._pending: dict[int, tuple[int, str]] = {}  # delivery tag -> (index in batch, message id)
        self._returned: dict[str, str] = {}  # message id -> why the broker returned it
        self._results: list[Any] = []

    @classmethod
    def check_combination(cls, name: str, options: Mapping[str, Any]) -> list[Problem]:
        found: list[Problem] = []
        if options.get("DECLARE_EXCHANGE") and options["EXCHANGE"] == "":
            found.append(
                combination_error(
                    name,
                    "DECLARE_EXCHANGE is set but EXCHANGE is '' (the default exchange, which cannot be declared).",
                    "Name the exchange to declare, or remove DECLARE_EXCHANGE.",
                )
            )
        return found

    # --- delivery --------------------------------------------------------------------------------

    def deliver_batch(self, messages: Sequence[Message]) -> list[BaseException | None]:
        try:
            self._ensure_open()
        except TransientDeliveryError as exc:
            return [exc] * len(messages)
        assert self._channel is not None
        settings = self.settings
        self._results = [_WAITING] * len(messages)
        for index, message in enumerate(messages):
            try:
                self._channel.basic_publish(
                    exchange=settings.exchange,
                    routing_key=render(settings.routing_key, message),
                    body=self._body(message),
                    properties=self._properties(message),
                    mandatory=settings.mandatory,
                )
            except Exception as exc:
                self._failure = self._failure or exc
                break
            self._last_tag += 1
            self._pending[self._last_tag] = (index, str(message.uuid))
        self._run_until(lambda: not self._pending or self._failure is not None, settings.confirm_timeout)
        results: list[BaseException | None] = []
        for value in self._results:
            if value is _WAITING:
                reason = self._failure or TimeoutError(f"no confirm within {settings.confirm_timeout}s")
                value = TransientDeliveryError(f"RabbitMQ did not confirm the message: {self._describe(reason)}")
                value.__cause__ = reason
            results.append(value)
        if self._pending or self._failure is not None:
            self._discard()  # unconfirmed publishes leave the channel's delivery tags in doubt
        self._pending.clear()
        self._returned.clear()
        self._results = []
        return results

    def _body(self, message: Message) -> bytes:
        if self.settings.format == cloudevents.CLOUDEVENTS_STRUCTURED:
            return cloudevents.structured(message)
        return encode_payload(message)

    def _properties(self, message: Message) -> pika.BasicProperties:
        """AMQP properties; in CloudEvents binary mode the attributes also travel as ``ce-`` headers
        (the RabbitMQ binding), ``datacontenttype`` as ``content_type``."""
        body_format = self.settings.format
        headers: dict[str, Any] = text_headers(message)
        if body_format == cloudevents.CLOUDEVENTS:
            headers.update(cloudevents.binary_headers(message, "ce-"))
        created = message.created_at or dt.datetime.now(dt.UTC)
        return pika.BasicProperties(
            content_type=cloudevents.STRUCTURED_CONTENT_TYPE
            if body_format == cloudevents.CLOUDEVENTS_STRUCTURED
            else CONTENT_TYPE,
            delivery_mode=pika.spec.PERSISTENT_DELIVERY_MODE,
            message_id=str(message.uuid),
            timestamp=int(created.timestamp()),
            type=message.topic,
            headers=headers,
        )

    def close(self) -> None:
        self._discard()

    # --- connection ------------------------------------------------------------------------------

    def _ensure_open(self) -> None:
        if self._connection is not None and self._ready and self._failure is None:
            # Let the loop read what arrived while idle (a close from a restarting broker, heartbeats).
            self._run_until(lambda: False, 0)
            if self._failure is None and self._connection.is_open and self._channel and self._channel.is_open:
                return
        self._discard()
        self._connect()

    def _connect(self) -> None:
        settings = self.settings
        params = pika.URLParameters(settings.url)
        params.connection_attempts = 1
        params.socket_timeout = settings.connect_timeout
        params.stack_timeout = settings.connect_timeout
        params.blocked_connection_timeout = settings.confirm_timeout
        if settings.heartbeat is not None:
            params.heartbeat = settings.heartbeat
        self._ready, self._failure, self._last_tag = False, None, 0
        self._connection = pika.SelectConnection(
            params,
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_closed,
        )
        self._run_until(lambda: self._ready or self._failure is not None, settings.connect_timeout)
        if not self._ready:
            reason = self._failure or TimeoutError(f"not ready within {settings.connect_timeout}s")
            self._discard()
            raise TransientDeliveryError(
                f"cannot open a channel to RabbitMQ at {redact(settings.url)}: {self._describe(reason)}"
            ) from reason

    def _discard(self) -> None:
        """Forget the connection, closing it (and its socket) if it is not closed yet."""
        connection = self._connection
        self._channel, self._ready = None, False
        if connection is None:
            return
        try:
            if not (connection.is_closed or connection.is_closing):
                connection.close()
            self._run_until(lambda: connection.is_closed, 2.0)
        except Exception:
            pass
        finally:
            self._connection = None
        if not connection.is_closed:
            transport = getattr(connection, "_transport", None)
            if transport is not None:  # the broker never answered the close; drop the socket
                transport.abort()
                # pika closes the socket in a later callback of the loop: run it, or the socket leaks
                self._run_until(lambda: connection.is_closed, 0.5, connection=connection)
        connection.ioloop.close()

    def _run_until(
        self, done: Callable[[], bool], timeout: float, *, connection: pika.SelectConnection | None = None
    ) -> None:
        """Run the connection's I/O loop until ``done()`` or ``timeout`` seconds (0: one pass)."""
        connection = connection or self._connection
        if connection is None or done():
            return
        ioloop = connection.ioloop
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            timer = ioloop.call_later(max(remaining, 0), ioloop.stop)
            self._stop_when, self._running, self._running_loop = done, True, ioloop
            try:
                ioloop.start()
            finally:
                self._stop_when, self._running, self._running_loop = None, False, None
                ioloop.remove_timeout(timer)
            if done() or time.monotonic() >= deadline:
                return

    def _wake(self) -> None:
        if self._running and self._stop_when is not None and self._stop_when() and self._running_loop is not None:
            self._running_loop.stop()

    @staticmethod
    def _describe(exc: BaseException) -> str:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

    # --- pika callbacks ----------------------------------------------------------------------------

    def _on_open(self, connection: pika.connection.Connection) -> None:
        connection.channel(on_open_callback=self._on_channel_open)

    def _on_open_error(self, connection: pika.connection.Connection, error: BaseException | str) -> None:
        self._failure = error if isinstance(error, BaseException) else ConnectionError(str(error))
        self._wake()

    def _on_closed(self, connection: pika.connection.Connection, reason: BaseException) -> None:
        self._failure = self._failure or reason
        self._wake()

    def _on_channel_open(self, channel: pika.channel.Channel) -> None:
        self._channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_confirm_mode)

    def _on_confirm_mode(self, frame: pika.frame.Method[Any]) -> None:
        settings = self.settings
        if settings.declare_exchange:
            assert self._channel is not None
            self._channel.exchange_declare(
                exchange=settings.exchange,
                exchange_type=ExchangeType(settings.exchange_type),
                durable=True,
                callback=self._on_ready,
            )
        else:
            self._on_ready(frame)

    def _on_ready(self, frame: pika.frame.Method[Any]) -> None:
        self._ready = True
        self._wake()

    def _on_channel_closed(self, channel: pika.channel.Channel, reason: BaseException) -> None:
        # e.g. 404 when the exchange does not exist: the channel is gone, so is the batch
        self._failure = self._failure or reason
        connection = self._connection
        if connection is not None and connection.is_open:
            connection.close()
        self._wake()

    def _on_return(
        self,
        channel: pika.channel.Channel,
        method: pika.spec.Basic.Return,
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        # RabbitMQ sends the return before the ack of the same message.
        self._returned[str(properties.message_id)] = (
            f"RabbitMQ returned the message as unroutable ({method.reply_code} {method.reply_text}): "
            f"no queue is bound to exchange {method.exchange!r} for routing key {method.routing_key!r}"
        )

    def _on_confirm(self, frame: pika.frame.Method[Any]) -> None:
        method = frame.method
        tag = method.delivery_tag
        tags = sorted(t for t in self._pending if t <= tag) if method.multiple else [tag]
        nack = isinstance(method, pika.spec.Basic.Nack)
        for t in tags:
            entry = self._pending.pop(t, None)
            if entry is None:
                continue
            index, message_id = entry
            returned = self._returned.pop(message_id, None)
            if nack:
                self._results[index] = TransientDeliveryError("RabbitMQ refused the message (basic.nack)")
            elif returned is not None:
                self._results[index] = TransientDeliveryError(returned)
            else:
                self._results[index] = None
        self._wake()


__all__ = ["AMQPTransport"]
