"""Redis Streams: each message is one ``XADD`` entry; a batch goes out as one pipeline, one round trip.

Redis answers each ``XADD`` with the entry id once the entry is in the stream, which is the
confirmation. Redis does not dedupe: a retried batch can add an entry twice, so consumers dedupe on
the ``id`` field (the message uuid).

``SOCKET_TIMEOUT`` bounds each socket operation only, so a server that drips its replies would hold
the batch for ever; ``TIMEOUT`` bounds the whole batch (connect, pipeline, replies), enforced by a
:class:`~django_outbox.transports.deadlines.Watchdog` that shuts the connection down at the deadline. redis-py's
own retries are off: the outbox retries the batch, with backoff, as it does every failure.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from django.core.serializers.json import DjangoJSONEncoder

from ..exceptions import MissingExtraError, TransientDeliveryError
from .broker import (
    MAX_NETWORK_TIMEOUT,
    BrokerTransport,
    encode_payload,
    option,
    redact,
    render,
    url_rules,
    wrap,
)
from .deadlines import Watchdog, active

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise MissingExtraError(
        package="redis", extra="redis", feature="django_outbox.transports.redis.RedisStreamsTransport"
    ) from exc

if TYPE_CHECKING:
    from ..models import Message


#: A day: a longer deadline is a mistake (and overflows the watchdog's timer).
MAX_TIMEOUT = 86400.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class RedisStreamsOptions:
    url: str = option(kind=str, rules=url_rules(("redis", "rediss", "unix"), redis.connection.parse_url))
    stream: str = option("outbox:{topic}", kind=str, template=True)
    #: Redis reads MAXLEN as a signed 64-bit integer.
    maxlen: int | None = option(None, kind=(int, type(None)), minimum=1, maximum=2**63 - 1)
    socket_timeout: float = option(5.0, kind=float, minimum=0.1, maximum=MAX_NETWORK_TIMEOUT)
    #: One deadline for a whole batch (connect, XADDs, replies), enforced by the watchdog.
    timeout: float = option(10.0, kind=float, minimum=0.1, maximum=MAX_TIMEOUT)


_watched: dict[type, type] = {}


def _watched_connection_class(cls: type[redis.connection.AbstractConnection]) -> type:
    """``cls`` (plain, SSL or Unix socket) registering each socket it opens with the thread's watchdog."""
    found = _watched.get(cls)
    if found is None:

        class Watched(cls):  # type: ignore[valid-type,misc]
            _outbox_watchdog: Watchdog | None = None

            def _connect(self) -> object:
                sock = super()._connect()
                watchdog = active()
                if watchdog is not None:
                    self._outbox_watchdog = watchdog
                    watchdog.watch(sock)
                return sock

            def disconnect(self, *args: object, **kwargs: object) -> None:
                if self._outbox_watchdog is not None and self._sock is not None:
                    self._outbox_watchdog.forget(self._sock)  # before it is closed
                super().disconnect(*args, **kwargs)

        Watched.__name__ = Watched.__qualname__ = f"Watched{cls.__name__}"
        found = _watched.setdefault(cls, Watched)
    return found


class RedisStreamsTransport(BrokerTransport):
    options_class: ClassVar[type] = RedisStreamsOptions

    def __init__(self, *, name: str, options: Mapping[str, Any]) -> None:
        super().__init__(name=name, options=options)
        self.settings: RedisStreamsOptions
        self._client: redis.Redis | None = None
        self._watchdog = Watchdog()

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            timeout = min(self.settings.socket_timeout, self.settings.timeout)
            self._client = redis.Redis.from_url(
                self.settings.url,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry=Retry(NoBackoff(), 0),
            )
            pool = self._client.connection_pool
            pool.connection_class = _watched_connection_class(pool.connection_class)
        return self._client

    @staticmethod
    def fields(message: Message) -> dict[str, str]:
        """The entry's fields; ``key`` and ``idempotency_key`` are left out when the message has none."""
        fields = {
            "id": str(message.uuid),
            "topic": message.topic,
            "payload": encode_payload(message).decode(),
            "headers": json.dumps(message.headers or {}, cls=DjangoJSONEncoder, separators=(",", ":")),
        }
        if message.key is not None:
            fields["key"] = message.key
        if message.idempotency_key is not None:
            fields["idempotency_key"] = message.idempotency_key
        return fields

    def deliver_batch(self, messages: Sequence[Message]) -> list[BaseException | None]:
        maxlen = self.settings.maxlen
        where = f"Redis at {redact(self.settings.url)}"
        client = self.client
        self._watchdog.arm(self.settings.timeout)
        try:
            pipe = client.pipeline(transaction=False)
            for message in messages:
                pipe.xadd(
                    render(self.settings.stream, message),
                    self.fields(message),  # type: ignore[arg-type]
                    maxlen=maxlen,
                    approximate=maxlen is not None,
                )
            replies = pipe.execute(raise_on_error=False)
        except redis.RedisError as exc:
            expired = self._watchdog.expired()
            self._reset()
            if expired:
                error = TransientDeliveryError(
                    f"XADD to {where} did not complete within {self.settings.timeout:g} s (OPTIONS['TIMEOUT'] "
                    f"bounds the whole batch: connect, commands and replies); {type(exc).__name__}: {exc}"
                )
                error.__cause__ = exc
                return [error] * len(messages)
            return [wrap(exc, f"XADD to {where} failed")] * len(messages)
        finally:
            self._watchdog.disarm()
        if self._watchdog.fired:  # the deadline struck just after the replies: that connection is shut
            self._reset()
        return [wrap(r, f"XADD to {where} failed") if isinstance(r, BaseException) else None for r in replies]

    def _reset(self) -> None:
        """Drop pooled connections, so the next batch connects afresh (e.g. after a Redis restart)."""
        if self._client is not None:
            self._client.connection_pool.disconnect()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client.connection_pool.disconnect()
            self._client = None


__all__ = ["RedisStreamsTransport"]
