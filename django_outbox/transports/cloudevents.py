"""CloudEvents 1.0: one envelope for the webhook, Kafka, RabbitMQ and NATS transports.

``OPTIONS["FORMAT"]`` picks it: ``"cloudevents"`` (binary content mode: the attributes travel as the
protocol's headers, the payload JSON as the body) or ``"cloudevents-structured"`` (the JSON event
format: attributes and ``data`` in one JSON body). The attributes are the same everywhere: ``id`` =
uuid, ``source`` = ``OUTBOX["CLOUDEVENTS_SOURCE"]``, ``type`` = topic, ``subject`` = key,
``time`` = created_at, ``datacontenttype`` = ``application/json``, extension ``idempotencykey``;
only the header names differ by binding (``ce-`` on HTTP, AMQP 0-9-1 and NATS, ``ce_`` on Kafka).

The outbox's own headers (``Outbox-*``, ``Idempotency-Key``, the webhook signature) stay as they are in
every format, so a consumer can move from one format to another without losing its dedupe key.
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.parse
from typing import TYPE_CHECKING, Any

from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

if TYPE_CHECKING:
    from ..models import Message

#: ``OPTIONS["FORMAT"]`` values shared by the broker transports (``payload``: the envelope of before).
PAYLOAD = "payload"
CLOUDEVENTS = "cloudevents"
CLOUDEVENTS_STRUCTURED = "cloudevents-structured"
BROKER_FORMATS = (PAYLOAD, CLOUDEVENTS, CLOUDEVENTS_STRUCTURED)

SPECVERSION = "1.0"
DATA_CONTENT_TYPE = "application/json"
#: The media type of the JSON event format, the body's type in structured mode.
STRUCTURED_CONTENT_TYPE = "application/cloudevents+json"
#: The extension carrying ``idempotency_key`` (lower-case letters and digits, as the specification asks).
IDEMPOTENCY_KEY_ATTRIBUTE = "idempotencykey"


def utc_timestamp(when: dt.datetime) -> str:
    """``when`` in UTC as RFC 3339 with microseconds and ``Z``: ``2026-12-01T12:00:00.123456Z``.

    A naive datetime (``USE_TZ = False``) is wall-clock time in ``TIME_ZONE``, as Django stores it, not
    UTC: read as UTC it would be hours off in every project outside UTC.
    """
    if timezone.is_naive(when):
        when = timezone.make_aware(when, timezone.get_default_timezone())
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def attributes(message: Message) -> dict[str, str]:
    """The event's context attributes, each in its string form, in the specification's order."""
    from ..conf import get_settings

    found = {
        "specversion": SPECVERSION,
        "id": str(message.uuid),
        "source": get_settings().CLOUDEVENTS_SOURCE,
        "type": message.topic,
    }
    if message.key is not None:
        found["subject"] = message.key
    found["time"] = utc_timestamp(message.created_at or timezone.now())
    found["datacontenttype"] = DATA_CONTENT_TYPE
    if message.idempotency_key is not None:
        found[IDEMPOTENCY_KEY_ATTRIBUTE] = message.idempotency_key
    return found


def structured(message: Message) -> bytes:
    """The JSON event format: the attributes and ``data`` (the payload) in one compact UTF-8 object."""
    event: dict[str, Any] = {**attributes(message), "data": message.payload}
    return json.dumps(event, cls=DjangoJSONEncoder, separators=(",", ":"), ensure_ascii=False).encode()


def binary_headers(message: Message, prefix: str, *, percent_encode: bool = False) -> dict[str, str]:
    """The attributes as ``prefix``-named headers, without ``datacontenttype`` (the protocol's own
    content type carries it: HTTP ``Content-Type``, AMQP ``content_type``, Kafka and NATS ``content-type``).

    ``percent_encode``: as the HTTP binding asks, space, ``"``, ``%`` and anything outside printable
    ASCII are percent-encoded (UTF-8), so any key or topic fits a header.
    """
    return {
        prefix + name: _percent_encoded(value) if percent_encode else value
        for name, value in attributes(message).items()
        if name != "datacontenttype"
    }


def _percent_encoded(value: str) -> str:
    return "".join(
        ch if 0x21 <= ord(ch) <= 0x7E and ch not in '"%' else urllib.parse.quote(ch, safe="") for ch in value
    )


__all__ = [
    "BROKER_FORMATS",
    "CLOUDEVENTS",
    "CLOUDEVENTS_STRUCTURED",
    "DATA_CONTENT_TYPE",
    "PAYLOAD",
    "STRUCTURED_CONTENT_TYPE",
    "attributes",
    "binary_headers",
    "structured",
    "utc_timestamp",
]
