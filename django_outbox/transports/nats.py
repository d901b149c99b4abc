"""NATS JetStream: publish with ``Nats-Msg-Id`` = message uuid and wait for the stream's PubAck.

The server drops a second publish with the same ``Nats-Msg-Id`` inside the stream's duplicate window,
so retries after a lost PubAck do not store the message twice. nats-py is asyncio; the worker is not.
Each transport instance (one per worker thread) owns a private event loop and one connection, and runs
the loop only while it delivers. Reconnecting is ours rather than the client's: its background
reconnect would only make progress while the loop runs, so a lost connection is closed and the next
batch connects afresh.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ..exceptions import MissingExtraError, TransientDeliveryError
from ..options import BAD_TEMPLATE, Problem, Rule, shown
from . import cloudevents
from .base import BAD_OPTION
from .broker import (
    CONTENT_TYPE,
    MAX_NETWORK_TIMEOUT,
    BrokerTransport,
    combination_error,
    encode_payload,
    option,
    render,
    text_headers,
    url_rules,
    wrap,
)

try:
    import nats
    import nats.errors
    import nats.js.errors
    from nats.aio.client import Client as NATSClient
    from nats.js import JetStreamContext
    from nats.js.api import StreamConfig
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise MissingExtraError(
        package="nats-py", extra="nats", feature="django_outbox.transports.nats.NATSTransport"
    ) from exc

if TYPE_CHECKING:
    from ..models import Message

MSG_ID_HEADER = "Nats-Msg-Id"
#: Seconds a failed connection may take to close before it is dropped.
CLOSE_GRACE_SECONDS = 2.0


def _is_stream_name(stream: str) -> bool:
    """What nats-py and the server take as a stream name (probed against the server, see the tests)."""
    return bool(stream) and not any(ch.isspace() or ch in ".*>/\\\x00" or not ch.isprintable() for ch in stream)


def _is_subject(subject: str) -> bool:
    """A subject JetStream answers a publish to: no whitespace, no empty token."""
    return not any(ch.isspace() or not ch.isprintable() for ch in subject) and all(subject.split("."))


def _server_address(url: str) -> tuple[str, int | None]:
    """The host and port nats-py will connect to; ValueError for a URL it could not use."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError("no host")
    return parts.hostname, parts.port  # .port raises ValueError when out of range


def _stream_refused(stream: str) -> str | None:
    return None if _is_stream_name(stream) else f"= {shown(stream)} is not a JetStream stream name."


def _subject_refused(subject: str) -> str | None:
    if _is_subject(subject.replace("{topic}", "topic")):
        return None
    return (
        f"= {shown(subject)} is not a NATS subject: it has whitespace or an empty token ('a..b', a leading or "
        "trailing '.')."
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class NATSOptions:
    servers: str | tuple[str, ...] = option(
        kind=(str, list),
        items=str,
        nonempty=True,
        nonempty_items=True,
        rules=url_rules(("nats", "tls", "ws", "wss"), _server_address),
    )
    subject: str = option(
        "{topic}", kind=str, template=True, rules=(Rule(BAD_TEMPLATE, _subject_refused, "Example: 'outbox.{topic}'."),)
    )
    stream: str | None = option(
        None,
        kind=(str, type(None)),
        rules=(
            Rule(
                BAD_OPTION,
                _stream_refused,
                "Use letters, digits, '-' and '_' (no '.', '*', '>', '/', '\\', spaces or NUL).",
            ),
        ),
    )
    create_stream: bool = option(False, kind=bool)
    stream_subjects: tuple[str, ...] | None = option(
        None, kind=(list, type(None)), items=str, nonempty=True, nonempty_items=True
    )
    #: NATS keeps it in nanoseconds (int64); a day is far more than any redelivery needs.
    duplicate_window: float = option(120.0, kind=float, minimum=0.1, maximum=24 * 3600)
    ack_timeout: float = option(10.0, kind=float, minimum=0.1, maximum=MAX_NETWORK_TIMEOUT)
    connect_timeout: float = option(5.0, kind=float, minimum=0.1, maximum=MAX_NETWORK_TIMEOUT)
    #: "payload" (the headers below), or a CloudEvent per the NATS binding (binary or structured).
    format: str = option(cloudevents.PAYLOAD, kind=str, choices=cloudevents.BROKER_FORMATS)


class NATSTransport(BrokerTransport):
    options_class: ClassVar[type] = NATSOptions

    def __init__(self, *, name: str, options: Mapping[str, Any]) -> None:
        super().__init__(name=name, options=options)
        self.settings: NATSOptions
        self._loop = asyncio.new_event_loop()
        self._nc: NATSClient | None = None
        self._js: JetStreamContext | None = None

    @classmethod
    def check_combination(cls, name: str, options: Mapping[str, Any]) -> list[Problem]:
        found: list[Problem] = []
        if options.get("CREATE_STREAM") and not (options.get("STREAM") and options.get("STREAM_SUBJECTS")):
            found.append(
                combination_error(
                    name,
                    "CREATE_STREAM needs STREAM (its name) and STREAM_SUBJECTS (the subjects it captures).",
                    "Example: 'STREAM': 'OUTBOX', 'STREAM_SUBJECTS': ['orders.>'].",
                )
            )
        return found

    # --- delivery --------------------------------------------------------------------------------

    def deliver_batch(self, messages: Sequence[Message]) -> list[BaseException | None]:
        """Publish the batch; the whole call takes at most CONNECT_TIMEOUT + ACK_TIMEOUT (+ closing).

        Each step of nats-py has its own timeout (TCP connect, INFO, PONG, stream look-up, PubAcks), so a
        server that answers each just in time would add them up; one ``wait_for`` bounds them together.
        """
        bound = self.settings.connect_timeout + self.settings.ack_timeout
        try:
            return self._loop.run_until_complete(asyncio.wait_for(self._publish(messages), bound))
        except TimeoutError as exc:
            self._loop.run_until_complete(self._disconnect())
            error = TransientDeliveryError(
                f"publishing to NATS timed out: a batch has at most {bound:g} s (OPTIONS CONNECT_TIMEOUT + "
                "ACK_TIMEOUT) to connect and be acknowledged"
            )
            error.__cause__ = exc
            return [error] * len(messages)
        except Exception as exc:
            self._loop.run_until_complete(self._disconnect())
            return [wrap(exc, "publishing to NATS failed")] * len(messages)

    async def _publish(self, messages: Sequence[Message]) -> list[BaseException | None]:
        js = await self._connected()
        settings = self.settings
        subjects = [render(settings.subject, m) for m in messages]
        futures: list[asyncio.Future[Any]] = []
        for message, subject in zip(messages, subjects, strict=True):
            headers = text_headers(message)
            headers[MSG_ID_HEADER] = str(message.uuid)
            body = encode_payload(message)
            if settings.format == cloudevents.CLOUDEVENTS:
                headers.update(cloudevents.binary_headers(message, "ce-"))
                headers["Content-Type"] = CONTENT_TYPE
            elif settings.format == cloudevents.CLOUDEVENTS_STRUCTURED:
                headers["Content-Type"] = cloudevents.STRUCTURED_CONTENT_TYPE
                body = cloudevents.structured(message)
            futures.append(await js.publish_async(subject, body, headers=headers, stream=settings.stream))
        await asyncio.wait(futures, timeout=settings.ack_timeout)
        results: list[BaseException | None] = []
        lost = False
        for future, subject in zip(futures, subjects, strict=True):
            if not future.done():
                future.cancel()
                lost = True
                results.append(TransientDeliveryError(f"no PubAck from NATS within {settings.ack_timeout}s"))
            elif future.exception() is not None:
                results.append(self._explain(future.exception(), subject))
            else:
                results.append(None)  # stored, or dropped by the server as a duplicate of a stored one
        if lost:
            await self._disconnect()
        return results

    def _explain(self, exc: BaseException | None, subject: str) -> BaseException:
        assert exc is not None
        if isinstance(exc, nats.js.errors.NoStreamResponseError):
            error = TransientDeliveryError(
                f"no JetStream stream captures subject {subject!r} (the server answered 'no responders'). "
                "Create a stream whose subjects include it (e.g. nats stream add OUTBOX --subjects 'orders.>'), "
                "or set OPTIONS 'CREATE_STREAM': True with 'STREAM' and 'STREAM_SUBJECTS'."
            )
            error.__cause__ = exc
            return error
        return wrap(exc, f"JetStream refused the publish to {subject!r}")

    # --- connection ------------------------------------------------------------------------------

    async def _connected(self) -> JetStreamContext:
        nc = self._nc
        if nc is not None and nc.is_connected and self._js is not None:
            return self._js
        await self._disconnect()
        settings = self.settings
        servers = [settings.servers] if isinstance(settings.servers, str) else list(settings.servers)
        nc = NATSClient()
        self._nc = nc  # before connecting, so a failed handshake's socket is closed by _disconnect()
        await nc.connect(
            servers=servers,
            allow_reconnect=False,
            connect_timeout=max(1, round(settings.connect_timeout)),
            max_reconnect_attempts=0,
            error_cb=self._ignore,
            disconnected_cb=self._ignore_event,
            closed_cb=self._ignore_event,
        )
        self._js = nc.jetstream(timeout=settings.ack_timeout)
        if settings.create_stream:
            await self._ensure_stream(self._js)
        return self._js

    async def _ensure_stream(self, js: JetStreamContext) -> None:
        settings = self.settings
        assert settings.stream is not None and settings.stream_subjects is not None
        try:
            await js.stream_info(settings.stream)
        except nats.js.errors.NotFoundError:
            await js.add_stream(
                StreamConfig(
                    name=settings.stream,
                    subjects=list(settings.stream_subjects),
                    duplicate_window=settings.duplicate_window,
                )
            )

    async def _disconnect(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is None:
            return
        if not nc.is_closed:
            try:
                await asyncio.wait_for(nc.close(), CLOSE_GRACE_SECONDS)
            except asyncio.CancelledError:  # the batch's own bound ran out while closing
                self._abort(nc)
                raise
            except Exception:
                self._abort(nc)
        # let the socket's close callbacks run on this loop, which stops as soon as we return
        for _ in range(3):
            await asyncio.sleep(0)

    @staticmethod
    def _abort(nc: NATSClient) -> None:
        """Drop the socket of a client whose close did not finish (a hung server does not read our goodbye).

        nats-py offers no abort; its TCP transport keeps asyncio's writer as ``_io_writer``.
        """
        writer = getattr(getattr(nc, "_transport", None), "_io_writer", None)
        transport = getattr(writer, "transport", None)
        if transport is not None:
            transport.abort()

    @staticmethod
    async def _ignore(exc: Exception) -> None:
        """Connection errors surface as failed deliveries; the client's own report would only duplicate them."""

    @staticmethod
    async def _ignore_event() -> None:
        pass

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._loop.run_until_complete(self._disconnect())
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        finally:
            self._loop.close()


__all__ = ["NATSTransport"]
