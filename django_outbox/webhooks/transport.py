"""POST each message to an HTTP endpoint as JSON, signed per Standard Webhooks.

The body is the Standard Webhooks envelope ``{"type": topic, "timestamp": ..., "data": payload}``
(``OPTIONS["FORMAT"] = "standard-webhooks"``, the default), so one endpoint can serve several topics, or
the bare payload (``"payload"``). The signature covers exactly the bytes sent.

One pooled ``httpx.Client`` per transport instance, and the relay builds one instance per worker
thread, so connections are reused without locking. Redirects are never followed and the address a
host name resolves to is checked at connect time, inside the connection pool (so a DNS answer that
changes between a check and the connect cannot slip through): private, loopback, link-local and other
non-global addresses are refused unless the host is in ``ALLOWED_HOSTS`` (which addresses count as
public is decided in ``ssrf.py``).
"""

from __future__ import annotations

import datetime as dt
import email.utils
import ipaddress
import json
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from django.core.serializers.json import DjangoJSONEncoder
from django.utils.module_loading import import_string

from ..exceptions import MissingExtraError, PermanentDeliveryError, TransientDeliveryError
from ..options import Problem, Rule, option, shown
from ..transports import cloudevents
from ..transports.base import BaseTransport
from ..transports.broker import MAX_NETWORK_TIMEOUT
from ..transports.cloudevents import CLOUDEVENTS, CLOUDEVENTS_STRUCTURED
from ..transports.cloudevents import PAYLOAD as PAYLOAD  # re-exported: the FORMAT values are named here too
from .signing import secret_key, sign
from .ssrf import is_public_address

try:
    import httpcore
    import httpx
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError(package="httpx", extra="webhooks", feature="WebhookTransport") from exc

if TYPE_CHECKING:
    from ..models import Message

DEFAULT_TIMEOUT = 10.0
#: TIMEOUT bounds: below 10 ms nothing answers; above an hour the delivery thread holds its batch that long.
MIN_TIMEOUT = 0.01
BODY_EXCERPT_BYTES = 1000
DRAIN_MAX_BYTES = 64 * 1024
WRITE_SLICE_BYTES = 16 * 1024
RETRYABLE_STATUSES = frozenset({408, 429})
USER_AGENT = "django-transactional-outbox webhook"
#: W3C trace context headers passed on to the receiver (docs/operating.md#tracing).
TRACE_HEADERS = ("traceparent", "tracestate")

#: The check ids of the webhook transport's options (docs/checks.md).
NO_TARGET = "django_outbox.E048"
BAD_URL = "django_outbox.E042"
BAD_SECRET = "django_outbox.E043"
BAD_RESOLVER = "django_outbox.E044"
BAD_TIMEOUT = "django_outbox.E045"
BAD_ALLOWED_HOSTS = "django_outbox.E046"
UNKNOWN_OPTION = "django_outbox.E047"
BAD_FORMAT = "django_outbox.E049"

#: ``OPTIONS["FORMAT"]`` values: the Standard Webhooks envelope (default), the bare payload, or a CloudEvent
#: (binary mode: ``ce-`` headers and the payload as body; structured: the JSON event format as body).
STANDARD_WEBHOOKS = "standard-webhooks"
FORMATS = (STANDARD_WEBHOOKS, PAYLOAD, CLOUDEVENTS, CLOUDEVENTS_STRUCTURED)


@dataclass(frozen=True, kw_only=True, slots=True)
class WebhookTarget:
    """Where one message goes; what an ``OPTIONS["RESOLVER"]`` function returns."""

    url: str
    secret: str


class BlockedAddressError(PermanentDeliveryError):
    """The target resolves to an address that webhooks may not reach (server-side request forgery guard)."""


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write waits at most until the current request's deadline.

    httpx's timeouts bound each read and each write, so a receiver that sends one byte per second
    keeps a request alive for ever. Here each operation gets ``min(its own timeout, time left)``, and
    none starts once the deadline has passed. Between requests (no deadline), a pooled connection
    behaves as a plain one.
    """

    def __init__(self, inner: httpcore.NetworkStream, backend: _GuardedBackend) -> None:
        self._inner = inner
        self._backend = backend

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._backend.budget(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        # In slices, so a receiver that reads slowly meets the deadline between two of them.
        view = memoryview(buffer)
        for start in range(0, len(view), WRITE_SLICE_BYTES):
            chunk = bytes(view[start : start + WRITE_SLICE_BYTES])
            self._inner.write(chunk, self._backend.budget(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        budget = self._backend.budget(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, budget), self._backend)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _GuardedBackend(httpcore.SyncBackend):
    """Resolves the host itself, refuses non-public addresses, then connects to the checked address.

    It also carries the deadline of the request in progress (``deadline``, a ``time.monotonic()``
    value, or None between requests), which every connection it made obeys. One backend serves one
    transport, and so one thread: the deadline needs no lock.
    """

    def __init__(self, allowed_hosts: Iterable[str]) -> None:
        self.allowed = {h.lower().strip("[]") for h in allowed_hosts}
        self.deadline: float | None = None

    def budget(self, timeout: float | None, error: type[Exception]) -> float | None:
        """How long the next operation may wait: its own timeout, cut to the time the request has left."""
        if self.deadline is None:
            return timeout
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise error("the request's deadline (OPTIONS['TIMEOUT']) has passed")
        return left if timeout is None else min(timeout, left)

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        addresses = self._resolve(host, port, self.budget(timeout, httpcore.ConnectTimeout))
        if host.lower() not in self.allowed:
            blocked = [a for a in addresses if not is_public_address(a)]
            if blocked:
                raise BlockedAddressError(
                    f"refused to send a webhook to {host!r}: it resolves to {', '.join(blocked)}, which is not a "
                    "public address. If this target is intended, add it to OPTIONS['ALLOWED_HOSTS']."
                )
        last: Exception | None = None
        for address in addresses:
            try:
                budget = self.budget(timeout, httpcore.ConnectTimeout)
                stream = super().connect_tcp(address, port, budget, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
            else:
                return _DeadlineStream(stream, self)
        raise last or httpcore.ConnectError(f"no address for {host!r}")

    @staticmethod
    def _resolve(host: str, port: int, timeout: float | None) -> list[str]:
        """The addresses of ``host``, waiting at most ``timeout`` for the system resolver.

        ``getaddrinfo()`` takes no timeout, so a name is looked up on a daemon thread that is left
        behind if the resolver hangs; IP literals need no look-up.
        """
        try:
            ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            pass
        else:
            return [host]
        found: list[str] = []
        failure: list[OSError] = []

        def look_up() -> None:
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                failure.append(exc)
            else:
                found.extend(dict.fromkeys(str(info[4][0]) for info in infos))

        thread = threading.Thread(target=look_up, name="outbox-webhook-dns", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            raise httpcore.ConnectTimeout(f"resolving {host!r} took longer than {timeout:g} s")
        if failure:
            raise httpcore.ConnectError(f"cannot resolve {host!r}: {failure[0]}") from failure[0]
        return found


class _GuardedTransport(httpx.HTTPTransport):
    def __init__(self, backend: _GuardedBackend) -> None:
        super().__init__(trust_env=False)
        # httpx has no public way to give its pool a network backend; replace the pool it built.
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=100,
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=backend,
        )


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())


def _is_http_url(url: object) -> bool:
    """Whether httpx can send to ``url``: http(s), a host, a port in range, no NUL or spaces in it."""
    if not isinstance(url, str) or any(ch.isspace() or not ch.isprintable() for ch in url):
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError when out of range)
        parsed = httpx.URL(url)
    except (ValueError, httpx.InvalidURL):  # "http://[::1", a port of 99999, a space in the host, NUL
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and bool(parsed.host)


def _header_value(text: str) -> str:
    """``text`` as an HTTP header value: ASCII as it is, anything else percent-encoded as UTF-8.

    HTTP header values are ASCII (httpx refuses others, so such a key failed every attempt until the
    message was dead), while ``send()`` takes any idempotency key other transports carry unchanged. The
    encoding is deterministic, so a receiver deduplicating on the header still sees one value per key.
    """
    if text.isascii() and text.isprintable():
        return text
    return urllib.parse.quote(text, safe="".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%"))


#: ``when`` in UTC as ISO 8601 with microseconds and ``Z`` (a naive datetime read in ``TIME_ZONE``).
utc_timestamp = cloudevents.utc_timestamp


def webhook_body(message: Message, body_format: str = STANDARD_WEBHOOKS) -> bytes:
    """The bytes POSTed (and signed) for ``message``: compact JSON, non-ASCII escaped.

    ``standard-webhooks``: ``{"type": topic, "timestamp": created_at in UTC, "data": payload}``, the
    envelope the specification recommends, whatever JSON the payload is (object, list, string, number
    or null); ``payload`` and ``cloudevents`` (binary mode, the attributes in headers): the payload alone;
    ``cloudevents-structured``: the CloudEvents JSON event format, the payload as its ``data``.
    """
    if body_format == CLOUDEVENTS_STRUCTURED:
        return cloudevents.structured(message)
    content: Any = message.payload
    if body_format == STANDARD_WEBHOOKS:
        content = {"type": message.topic, "timestamp": utc_timestamp(message.created_at), "data": message.payload}
    return json.dumps(content, cls=DjangoJSONEncoder, separators=(",", ":")).encode()


_URL_EXAMPLE = "Example: 'https://hooks.example.com/in'."
_FORMAT_HINT = (
    f"Use {STANDARD_WEBHOOKS!r} (the default: the Standard Webhooks envelope), {PAYLOAD!r} (the bare "
    f"payload), {CLOUDEVENTS!r} (CloudEvents binary mode) or {CLOUDEVENTS_STRUCTURED!r}."
)


def _url_refused(url: str) -> str | None:
    return None if _is_http_url(url) else f"= {shown(url)} is not an http(s) URL."


def _secret_refused(secret: str) -> str | None:
    try:
        secret_key(secret)
    except ValueError as exc:
        return f"is not usable: {exc}."
    return None


def _resolver_refused(resolver: object) -> str | None:
    try:  # the transport takes a dotted path or the function itself
        found = import_string(resolver) if isinstance(resolver, str) else resolver
    except Exception as exc:  # ImportError, ValueError (".x"), or what the module raised
        return f"= {shown(resolver)} cannot be imported: {exc}"
    return None if callable(found) else f"= {shown(resolver)} is not callable."


@dataclass(frozen=True, kw_only=True)
class WebhookOptions:
    """The webhook transport's ``OPTIONS``: URL and SECRET, or a RESOLVER that gives both per message."""

    url: str | None = option(
        None,
        kind=str,
        id=BAD_URL,
        hint=_URL_EXAMPLE,
        rules=(Rule(BAD_URL, _url_refused, _URL_EXAMPLE),),
    )
    secret: str | None = option(
        None,
        kind=str,
        id=BAD_SECRET,
        hint="Make one with django_outbox.webhooks.new_secret().",
        rules=(Rule(BAD_SECRET, _secret_refused, "Make one with django_outbox.webhooks.new_secret()."),),
    )
    resolver: Any = option(
        None,
        kind=object,
        id=BAD_RESOLVER,
        rules=(Rule(BAD_RESOLVER, _resolver_refused, "Give the dotted path of a function, or the function."),),
    )
    #: One deadline for connect, request, headers and body together.
    timeout: float = option(
        DEFAULT_TIMEOUT,
        kind=float,
        minimum=MIN_TIMEOUT,
        maximum=MAX_NETWORK_TIMEOUT,
        id=BAD_TIMEOUT,
        hint="Example: 'TIMEOUT': 10.",
    )
    allowed_hosts: tuple[str, ...] = option(
        (),
        kind=(list, tuple),
        items=str,
        id=BAD_ALLOWED_HOSTS,
        expected="a list of host names",
        hint="Example: 'ALLOWED_HOSTS': ['127.0.0.1'].",
    )
    #: What the body is: the Standard Webhooks envelope, the payload alone (as before the envelope), or a CloudEvent.
    format: str = option(STANDARD_WEBHOOKS, kind=str, choices=FORMATS, id=BAD_FORMAT, hint=_FORMAT_HINT)


class WebhookTransport(BaseTransport):
    options_class: ClassVar[type | None] = WebhookOptions
    unknown_option_id: ClassVar[str] = UNKNOWN_OPTION

    def __init__(self, *, name: str, options: Mapping[str, Any]) -> None:
        super().__init__(name=name, options=options)
        self.settings: WebhookOptions
        self.timeout = self.settings.timeout
        self.allowed_hosts = self.settings.allowed_hosts
        resolver = self.settings.resolver
        self.resolver: Callable[[Message], WebhookTarget | tuple[str, str]] | None = (
            import_string(resolver) if isinstance(resolver, str) else resolver
        )
        self._client: httpx.Client | None = None
        self._backend = _GuardedBackend(self.allowed_hosts)

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(
                transport=_GuardedTransport(self._backend),
                timeout=self.timeout,
                follow_redirects=False,
                trust_env=False,
                # identity: an error body is read raw, so a small compressed answer cannot unpack into
                # megabytes in memory before the excerpt is cut
                headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
            )
        return self._client

    def target(self, message: Message) -> WebhookTarget:
        if self.resolver is None:
            return WebhookTarget(url=self.options["URL"], secret=self.options["SECRET"])
        found = self.resolver(message)
        if isinstance(found, tuple) and len(found) == 2:
            found = WebhookTarget(url=found[0], secret=found[1])
        if not isinstance(found, WebhookTarget):
            raise PermanentDeliveryError(
                f"the webhook resolver returned {found!r} for message {message.uuid}; it must return a "
                "WebhookTarget(url=..., secret=...) or a (url, secret) tuple"
            )
        return found

    def deliver(self, message: Message) -> None:
        target = self.target(message)
        try:
            secret_key(target.secret)
        except ValueError as exc:
            raise PermanentDeliveryError(f"unusable webhook secret for {target.url}: {exc}") from exc
        body = webhook_body(message, self.settings.format)  # the bytes signed are the bytes sent
        msg_id = str(message.uuid)
        timestamp = int(time.time())
        body_format = self.settings.format
        headers = {
            "Content-Type": cloudevents.STRUCTURED_CONTENT_TYPE
            if body_format == CLOUDEVENTS_STRUCTURED
            else "application/json",
            **(cloudevents.binary_headers(message, "ce-", percent_encode=True) if body_format == CLOUDEVENTS else {}),
            "webhook-id": msg_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(target.secret, msg_id, timestamp, body),
            "Idempotency-Key": _header_value(message.idempotency_key or msg_id),
        }
        # The trace context, so the receiver continues the trace: the worker's delivery span while it
        # delivers (docs/operating.md#tracing), else what send() stored.
        for name in TRACE_HEADERS:
            value = (message.headers or {}).get(name)
            if isinstance(value, str) and value.isascii() and value.isprintable():
                headers[name] = value
        client = self.client
        # One deadline for connect, request, headers and body together: see _DeadlineStream.
        self._backend.deadline = time.monotonic() + self.timeout
        try:
            with client.stream("POST", target.url, content=body, headers=headers) as response:
                if response.is_success:
                    self._drain(response)
                    return
                excerpt = self._excerpt(response)
        except httpx.TimeoutException as exc:
            raise TransientDeliveryError(
                f"webhook to {target.url} timed out: it did not complete within {self.timeout:g} s "
                f"(OPTIONS['TIMEOUT'] bounds connect, headers and body together; {type(exc).__name__}: {exc})"
            ) from exc
        except httpx.TransportError as exc:
            raise TransientDeliveryError(f"webhook to {target.url} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self._backend.deadline = None
        status = response.status_code
        detail = f"webhook to {target.url} answered HTTP {status}"
        if 300 <= status < 400:
            detail += f" (redirect to {response.headers.get('Location', '?')}, not followed)"
        detail += f": {excerpt}" if excerpt else ""
        if status in RETRYABLE_STATUSES or status >= 500:
            raise TransientDeliveryError(detail, retry_after=retry_after_seconds(response.headers.get("Retry-After")))
        raise PermanentDeliveryError(detail)

    @staticmethod
    def _drain(response: httpx.Response) -> None:
        """Read a small body to the end, so the connection goes back to the pool instead of being closed.

        A body larger than ``DRAIN_MAX_BYTES`` is left unread (the connection is closed instead). A body
        that does not arrive before the deadline is a timeout like any other: the answer never completed.
        """
        seen = 0
        try:
            for chunk in response.iter_raw():
                seen += len(chunk)
                if seen > DRAIN_MAX_BYTES:
                    break
        except httpx.TimeoutException:
            raise
        except httpx.HTTPError:
            pass  # delivered all the same: the status line said so

    @staticmethod
    def _excerpt(response: httpx.Response) -> str:
        """The start of an error body, read raw and cut at ``BODY_EXCERPT_BYTES``; best effort."""
        data = b""
        try:
            for chunk in response.iter_raw():
                data += chunk
                if len(data) >= BODY_EXCERPT_BYTES:
                    break
        except httpx.HTTPError:
            pass  # an excerpt is best effort; the status decides
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            return f"({encoding}-encoded body not shown)" if data else ""
        text = data[:BODY_EXCERPT_BYTES].decode(response.encoding or "utf-8", errors="replace").strip()
        return text + ("..." if len(data) >= BODY_EXCERPT_BYTES else "")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    @classmethod
    def check_combination(cls, name: str, options: Mapping[str, Any]) -> list[Problem]:
        where = f"OUTBOX['TRANSPORTS'][{name!r}]['OPTIONS']"
        if "RESOLVER" in options and ("URL" in options or "SECRET" in options):
            return [
                Problem(
                    NO_TARGET,
                    f"{where}: RESOLVER replaces URL and SECRET; give one or the other.",
                    "Remove URL and SECRET.",
                )
            ]
        if "RESOLVER" not in options and ("URL" not in options or "SECRET" not in options):
            return [
                Problem(
                    NO_TARGET,
                    f"{where}: a webhook transport needs URL and SECRET, or a RESOLVER.",
                    "Add 'URL' and 'SECRET' (whsec_...), or 'RESOLVER': 'myapp.hooks.target_for'.",
                )
            ]
        return []


__all__ = ["BlockedAddressError", "WebhookTarget", "WebhookTransport"]
