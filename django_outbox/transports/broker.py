"""What the message-broker transports share: typed options with their checks, and the message's wire form.

Every broker sees the same facts about a message (its uuid, topic, key, idempotency key, user headers
and JSON payload) under the same names, so a consumer reading from RabbitMQ, Redis or NATS dedupes and
routes the same way. Options are declared once, as a frozen dataclass per transport (``options.option``
fields): the transport reads them, and ``manage.py check`` reports every problem with them before a
worker starts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from django.core.serializers.json import DjangoJSONEncoder

from ..options import Problem, Rule, shown
from ..options import option as option  # re-exported: the broker modules declared their options with it
from .base import BatchTransport

if TYPE_CHECKING:
    from ..models import Message

#: Header names the outbox sets on every message; user headers with the same name are overridden.
MESSAGE_ID_HEADER = "Outbox-Message-Id"
TOPIC_HEADER = "Outbox-Topic"
KEY_HEADER = "Outbox-Key"
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
CONTENT_TYPE = "application/json"

#: Longest any network timeout option may be: an hour. Sockets refuse some huge values (OverflowError),
#: and a delivery thread waiting longer than that holds its whole batch.
MAX_NETWORK_TIMEOUT = 3600.0

#: A broker URL with the wrong scheme, or one the client library cannot read.
BAD_URL = "django_outbox.E053"
#: Options that are each valid alone but contradict each other.
CONTRADICTION = "django_outbox.E054"


class BrokerTransport(BatchTransport):
    """A transport to a message broker; its ``OPTIONS`` are its ``options_class`` (see ``options.option``)."""

    options_class: ClassVar[type]


def combination_error(name: str, text: str, hint: str) -> Problem:
    where = f"OUTBOX['TRANSPORTS'][{name!r}]['OPTIONS']"
    return Problem(CONTRADICTION, f"{where}: {text}", hint)


def url_rules(schemes: tuple[str, ...], parse: Callable[[str], object]) -> tuple[Rule, Rule]:
    """E053 when a URL (or a URL of a list) does not start with one of ``schemes``, then when the client
    library's own parser (no network) refuses it: a bad port, host or query."""

    def urls(value: str | tuple[str, ...]) -> list[str]:
        return [value] if isinstance(value, str) else list(value)

    def foreign(value: str | tuple[str, ...]) -> str | None:
        for url in urls(value):
            if (url.split("://", 1)[0] if "://" in url else "") not in schemes:
                return f"= {shown(redact(url))} is not a URL this transport understands."
        return None

    def unreadable(value: str | tuple[str, ...]) -> str | None:
        for url in urls(value):
            try:
                parse(url)
            except Exception as exc:
                return f"= {shown(redact(url))} cannot be read: {type(exc).__name__}: {str(exc)[:200]}"
        return None

    return (
        Rule(BAD_URL, foreign, f"Use a URL starting with {' or '.join(s + '://' for s in schemes)}."),
        Rule(BAD_URL, unreadable, "Check the host, the port (1-65535) and the query parameters."),
    )


def redact(url: str) -> str:
    """The URL without its password, fit for logs and error messages."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in credentials else url


def render(template: str, message: Message) -> str:
    return template.format(topic=message.topic)


def encode_payload(message: Message) -> bytes:
    return json.dumps(message.payload, cls=DjangoJSONEncoder, separators=(",", ":"), ensure_ascii=False).encode()


def outbox_headers(message: Message) -> dict[str, str]:
    """The outbox's own headers: what a consumer needs to dedupe and to route by key."""
    headers = {MESSAGE_ID_HEADER: str(message.uuid), TOPIC_HEADER: message.topic}
    if message.key is not None:
        headers[KEY_HEADER] = message.key
    if message.idempotency_key is not None:
        headers[IDEMPOTENCY_KEY_HEADER] = message.idempotency_key
    return headers


def text_headers(message: Message) -> dict[str, str]:
    """User headers then the outbox's, every value a string (non-strings as JSON), for text-only brokers."""
    headers = {
        str(k): v if isinstance(v, str) else json.dumps(v, cls=DjangoJSONEncoder)
        for k, v in (message.headers or {}).items()
    }
    headers.update(outbox_headers(message))
    return headers


def wrap(exc: BaseException, prefix: str) -> BaseException:
    """``exc`` as a retryable delivery error that keeps its cause, unless it already is a delivery error."""
    from ..exceptions import DeliveryError, TransientDeliveryError

    if isinstance(exc, DeliveryError):
        return exc
    wrapped = TransientDeliveryError(f"{prefix}: {str(exc).strip() or type(exc).__name__}")
    wrapped.__cause__ = exc
    return wrapped
