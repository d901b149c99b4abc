"""Redis Streams: each message is one ``XADD`` entry; a batch goes out as one pipeline, one round trip.

Redis answers each ``XADD`` with the entry id once the entry is in the stream, which is the
confirmation. Redis does not dedupe: a retried batch can add an entry twice, so consumers dedupe on
the ``id`` field (the message uuid).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from django.core.checks import CheckMessage
from django.core.serializers.json import DjangoJSONEncoder

from ..exceptions import MissingExtraError
from .broker import (
    MAX_NETWORK_TIMEOUT,
    BrokerTransport,
    encode_payload,
    option,
    redact,
    render,
    unreadable_url_error,
    url_error,
    wrap,
)

try:
    import redis
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise MissingExtraError(
        package="redis", extra="redis", feature="django_outbox.transports.redis.RedisStreamsTransport"
    ) from exc

if TYPE_CHECKING:
    from ..models import Message


@dataclasses.dataclass(frozen=True, kw_only=True)
class RedisStreamsOptions:
    url: str = option(kind=str)
    stream: str = option("outbox:{topic}", kind=str, template=True)
    #: Redis reads MAXLEN as a signed 64-bit integer.
    maxlen: int | None = option(None, kind=(int, type(None)), minimum=1, maximum=2**63 - 1)
    socket_timeout: float = option(5.0, kind=float, minimum=0.1, maximum=MAX_NETWORK_TIMEOUT)


class RedisStreamsTransport(BrokerTransport):
    options_class: ClassVar[type] = RedisStreamsOptions

    def __init__(self, *, name: str, options: Mapping[str, Any]) -> None:
        super().__init__(name=name, options=options)
        self.settings: RedisStreamsOptions
        self._client: redis.Redis | None = None

    @classmethod
    def check_combination(cls, name: str, options: Mapping[str, Any]) -> list[CheckMessage]:
        problem = url_error(name, "URL", options["URL"], ("redis", "rediss", "unix")) or unreadable_url_error(
            name, "URL", options["URL"], redis.connection.parse_url
        )
        return [problem] if problem else []

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            timeout = self.settings.socket_timeout
            self._client = redis.Redis.from_url(
                self.settings.url, socket_timeout=timeout, socket_connect_timeout=timeout
            )
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
        try:
            pipe = self.client.pipeline(transaction=False)
            for message in messages:
                pipe.xadd(
                    render(self.settings.stream, message),
                    self.fields(message),  # type: ignore[arg-type]
                    maxlen=maxlen,
                    approximate=maxlen is not None,
                )
            replies = pipe.execute(raise_on_error=False)
        except redis.RedisError as exc:
            self._reset()
            return [wrap(exc, f"XADD to {where} failed")] * len(messages)
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
