"""What the message-broker transports share: typed options with their checks, and the message's wire form.

Every broker sees the same facts about a message (its uuid, topic, key, idempotency key, user headers
and JSON payload) under the same names, so a consumer reading from RabbitMQ, Redis or NATS dedupes and
routes the same way. Options are declared once, as a frozen dataclass per transport: the transport
reads them, and ``manage.py check`` reports every problem with them before a worker starts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import string
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from django.core.checks import CheckMessage, Error
from django.core.serializers.json import DjangoJSONEncoder

from ..conf import shown
from ..exceptions import OutboxImproperlyConfigured
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

#: The placeholders a name template (stream, subject, routing key) may use.
TEMPLATE_FIELDS = frozenset({"topic"})

Options = TypeVar("Options")


def option(
    default: Any = dataclasses.MISSING,
    *,
    kind: type | tuple[type, ...],
    minimum: float | None = None,
    maximum: float | None = None,
    template: bool = False,
    choices: tuple[str, ...] = (),
    items: type | None = None,
    max_bytes: int | None = None,
) -> Any:
    """Declare a transport option (spelt in capitals in ``OPTIONS``); with no default it is required.

    A numeric option needs both bounds (NaN, infinity and absurd values must not reach a socket or a
    broker's frame); ``max_bytes`` bounds a string's UTF-8 length (AMQP's 255-byte short strings).
    """
    kinds = set(kind) if isinstance(kind, tuple) else {kind}
    if kinds & {int, float} and (minimum is None or maximum is None):
        raise TypeError("a numeric option needs a minimum and a maximum")
    metadata = {
        "kind": kind,
        "minimum": minimum,
        "maximum": maximum,
        "template": template,
        "choices": choices,
        "items": items,
        "max_bytes": max_bytes,
    }
    if isinstance(default, list | dict):
        raise TypeError("use a tuple or None as an option default")
    return dataclasses.field(default=default, metadata=metadata)


def _describe(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {str: "a string", int: "an integer", float: "a number", bool: "True or False", list: "a list"}
    return " or ".join(names.get(k, "None" if k is type(None) else k.__name__) for k in kinds)


def template_problem(template: str) -> str | None:
    """Why ``template`` cannot name a stream, subject or routing key, or None if it can.

    Only a bare ``{topic}``: a conversion or format spec (``{topic:>99999999999}``) would pass here and
    then fail, or fill memory, at every delivery.
    """
    try:
        parsed = [(f, conversion, spec) for _, f, spec, conversion in string.Formatter().parse(template)]
    except ValueError as exc:
        return f"is not a valid template ({exc})"
    fields = {f for f, _, _ in parsed if f is not None}
    unknown = sorted(fields - TEMPLATE_FIELDS)
    if unknown:
        return f"uses {', '.join('{' + f + '}' for f in unknown)}; only {{topic}} is available"
    if any(f is not None and (conversion or spec) for f, conversion, spec in parsed):
        return "formats {topic} (a conversion or format spec); write plain {topic}"
    if "\x00" in template or _utf8_length(template) is None:
        return "contains a NUL character or a lone surrogate"
    return None


def _in_range(value: float, minimum: float, maximum: float | None) -> bool:
    """``minimum <= value <= maximum`` for finite values; NaN compares false and must not pass either."""
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return minimum <= value and (maximum is None or value <= maximum)


def _utf8_length(text: str) -> int | None:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def option_problems(cls: type, name: str, options: Mapping[str, Any]) -> list[Error]:
    """Unknown options (E050), values of the wrong type or range (E051), bad name templates (E052)."""
    where = f"OUTBOX['TRANSPORTS'][{name!r}]['OPTIONS']"
    fields = {f.name.upper(): f for f in dataclasses.fields(cls)}
    found: list[Error] = []
    for key in sorted(set(options) - set(fields), key=str):
        found.append(
            Error(
                f"{where} has an unknown option {shown(key)}.",
                hint=f"Options of this transport: {', '.join(sorted(fields))}.",
                id="django_outbox.E050",
                obj=where,
            )
        )
    for key, f in fields.items():
        if key not in options:
            continue
        value, meta = options[key], f.metadata
        kind = meta["kind"]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        accepted = tuple({float: (int, float)}.get(k, (k,)) for k in kinds)
        flat = tuple(t for group in accepted for t in group)
        ok = isinstance(value, flat) and not (isinstance(value, bool) and bool not in kinds)
        if ok and isinstance(value, list) and meta["items"] is not None:
            ok = bool(value) and all(isinstance(item, meta["items"]) and item for item in value)
        if ok and isinstance(value, int | float) and meta["minimum"] is not None:
            ok = _in_range(value, meta["minimum"], meta["maximum"])
        if ok and meta["choices"] and value not in meta["choices"]:
            ok = False
        if ok and meta["max_bytes"] is not None and isinstance(value, str):
            length = _utf8_length(value)
            ok = length is not None and length <= meta["max_bytes"]
        if not ok:
            expected = _describe(kind)
            if meta["minimum"] is not None:
                expected += f" from {meta['minimum']} to {meta['maximum']}"
            if meta["max_bytes"] is not None:
                expected += f" of at most {meta['max_bytes']} bytes in UTF-8"
            if meta["choices"]:
                expected = f"one of {', '.join(meta['choices'])}"
            if meta["items"] is not None:
                expected = "a non-empty list of non-empty strings"
            found.append(
                Error(
                    f"{where}[{key!r}] must be {expected}, not {shown(value)}.",
                    hint="Fix the value, or remove the option to use its default.",
                    id="django_outbox.E051",
                    obj=where,
                )
            )
            continue
        if meta["template"] and isinstance(value, str):
            problem = template_problem(value)
            if problem:
                found.append(
                    Error(
                        f"{where}[{key!r}] = {shown(value)} {problem}.",
                        hint="Example: 'outbox.{topic}'.",
                        id="django_outbox.E052",
                        obj=where,
                    )
                )
    return found


class BrokerTransport(BatchTransport):
    """A transport whose ``OPTIONS`` are described by a dataclass; see :func:`option`."""

    options_class: ClassVar[type]

    def __init__(self, *, name: str, options: Mapping[str, Any]) -> None:
        super().__init__(name=name, options=options)
        found = self.check(name, options)
        if found:
            first = found[0]
            raise OutboxImproperlyConfigured(f"{first.msg} {first.hint or ''} ({first.id}; run 'manage.py check')")
        values = {k.lower(): (tuple(v) if isinstance(v, list) else v) for k, v in options.items()}
        self.settings: Any = self.options_class(**values)

    @classmethod
    def check(cls, name: str, options: Mapping[str, Any]) -> list[CheckMessage]:
        required = tuple(
            f.name.upper() for f in dataclasses.fields(cls.options_class) if f.default is dataclasses.MISSING
        )
        missing = [
            Error(
                f"Transport {name!r} ({cls.__module__}.{cls.__qualname__}) needs OPTIONS[{key!r}].",
                hint=f"Add {key!r} to OUTBOX['TRANSPORTS'][{name!r}]['OPTIONS'].",
                id="django_outbox.E013",
            )
            for key in required
            if key not in options
        ]
        found: list[CheckMessage] = [*missing, *option_problems(cls.options_class, name, options)]
        if not found:
            found += cls.check_combination(name, options)
        return found

    @classmethod
    def check_combination(cls, name: str, options: Mapping[str, Any]) -> list[CheckMessage]:
        """Problems between options that are each valid alone (E054); none by default."""
        return []


def combination_error(name: str, text: str, hint: str) -> Error:
    where = f"OUTBOX['TRANSPORTS'][{name!r}]['OPTIONS']"
    return Error(f"{where}: {text}", hint=hint, id="django_outbox.E054", obj=where)


def url_error(name: str, key: str, url: str, schemes: tuple[str, ...]) -> Error | None:
    """E053 when ``url`` does not start with one of ``schemes``."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme in schemes:
        return None
    where = f"OUTBOX['TRANSPORTS'][{name!r}]['OPTIONS']"
    return Error(
        f"{where}[{key!r}] = {redact(url)!r} is not a URL this transport understands.",
        hint=f"Use a URL starting with {' or '.join(s + '://' for s in schemes)}.",
        id="django_outbox.E053",
        obj=where,
    )


def unreadable_url_error(name: str, key: str, url: str, parse: Callable[[str], object]) -> Error | None:
    """E053 when the client library's own parser (no network) refuses ``url``: a bad port, host or query."""
    try:
        parse(url)
    except Exception as exc:
        where = f"OUTBOX['TRANSPORTS'][{name!r}]['OPTIONS']"
        return Error(
            f"{where}[{key!r}] = {shown(redact(url))} cannot be read: {type(exc).__name__}: {str(exc)[:200]}",
            hint="Check the host, the port (1-65535) and the query parameters.",
            id="django_outbox.E053",
            obj=where,
        )
    return None


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
