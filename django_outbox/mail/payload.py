"""An ``EmailMessage`` as JSON and back, so the worker sends exactly what the caller built.

Binary parts travel as base64. ``Date`` and ``Message-ID`` are fixed when the email is written, so a
retried delivery is the same email (receivers can dedupe on Message-ID) and the bytes the worker sends
match what ``message()`` would have produced in the caller's process.
"""

from __future__ import annotations

import base64
import email
import email.policy
from email.mime.base import MIMEBase
from email.utils import formatdate, make_msgid
from typing import Any

import django
from django.conf import settings
from django.core.mail import EmailMessage, EmailMultiAlternatives
from django.core.mail.utils import DNS_NAME

FORMAT_VERSION = 1


def _content(value: object) -> dict[str, Any]:
    if isinstance(value, str):
        return {"content": value}
    if isinstance(value, EmailMessage):  # message/rfc822 attachments
        value = value.message().as_bytes()
    elif isinstance(value, email.message.Message):
        value = value.as_bytes()
    if isinstance(value, bytes | bytearray | memoryview):
        return {"content_b64": base64.b64encode(bytes(value)).decode("ascii")}
    return {"content": str(value)}  # lazy translation strings and the like


def _restore(entry: dict[str, Any]) -> str | bytes:
    if "content_b64" in entry:
        return base64.b64decode(entry["content_b64"])
    return str(entry["content"])


def _mime_part(data: bytes) -> Any:
    """Rebuild an attachment given as a MIME object, in the type this Django accepts."""
    if django.VERSION >= (6, 0):  # MIMEPart, parsed with the modern policy
        return email.message_from_bytes(data, policy=email.policy.default)
    parsed = email.message_from_bytes(data)
    part = MIMEBase(parsed.get_content_maintype(), parsed.get_content_subtype())
    for name in list(part.keys()):
        del part[name]
    for name, value in parsed.items():
        part[name] = value
    part.set_payload(parsed.get_payload())
    return part


def to_payload(message: EmailMessage, *, view_id: str | None) -> dict[str, Any]:
    """The JSON-ready form of ``message``; raises ``TypeError`` for what cannot be rebuilt faithfully."""
    # Pairs, not an object: PostgreSQL's jsonb would reorder the keys, and header order is in the bytes.
    headers = [[str(k), str(v)] for k, v in message.extra_headers.items()]
    names = {k.lower() for k, _ in headers}
    if "date" not in names:
        headers.append(["Date", formatdate(localtime=settings.EMAIL_USE_LOCALTIME)])
    if "message-id" not in names:
        headers.append(["Message-ID", make_msgid(domain=DNS_NAME.get_fqdn())])
    attachments: list[dict[str, Any]] = []
    for attachment in message.attachments:
        if isinstance(attachment, email.message.Message):  # MIMEBase (Django 5.2) or MIMEPart (6+)
            attachments.append({"mime_b64": base64.b64encode(attachment.as_bytes()).decode("ascii")})
            continue
        filename, content, mimetype = attachment
        attachments.append(
            {"filename": None if filename is None else str(filename), "mimetype": mimetype, **_content(content)}
        )
    payload: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "subject": str(message.subject),
        "body": str(message.body),
        "from_email": str(message.from_email),
        "to": [str(a) for a in message.to],
        "cc": [str(a) for a in message.cc],
        "bcc": [str(a) for a in message.bcc],
        "reply_to": [str(a) for a in message.reply_to],
        "headers": headers,
        "content_subtype": message.content_subtype,
        "encoding": None if message.encoding is None else str(message.encoding),
        "alternatives": [
            {"mimetype": mimetype, **_content(content)} for content, mimetype in getattr(message, "alternatives", [])
        ],
        "attachments": attachments,
        "view_id": view_id,
    }
    # Django 5.2 lets subclasses change these; Django 6 removed them, so they are kept only when set.
    for name, default in (("mixed_subtype", "mixed"), ("alternative_subtype", "alternative")):
        value = getattr(message, name, default)
        if value != default:
            payload[name] = value
    return payload


def from_payload(payload: dict[str, Any]) -> EmailMultiAlternatives:
    """The email to hand to the real backend; ``EmailMultiAlternatives`` renders plain emails identically."""
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        raise ValueError(f"not an outbox email payload (format {FORMAT_VERSION} expected)")
    message = EmailMultiAlternatives(
        subject=payload["subject"],
        body=payload["body"],
        from_email=payload["from_email"],
        to=payload["to"],
        cc=payload["cc"],
        bcc=payload["bcc"],
        reply_to=payload["reply_to"],
        headers={name: value for name, value in payload["headers"]},
    )
    message.content_subtype = payload["content_subtype"]
    message.encoding = payload["encoding"]
    for name in ("mixed_subtype", "alternative_subtype"):
        if name in payload:
            setattr(message, name, payload[name])
    for alternative in payload["alternatives"]:
        message.attach_alternative(_restore(alternative), alternative["mimetype"])
    for attachment in payload["attachments"]:
        if "mime_b64" in attachment:
            message.attachments.append(_mime_part(base64.b64decode(attachment["mime_b64"])))
        else:
            # Appended as stored: attach() would re-guess types and re-decode text.
            message.attachments.append((attachment["filename"], _restore(attachment), attachment["mimetype"]))
    return message


def html_of(payload: dict[str, Any]) -> str | None:
    """The HTML a reader sees: the text/html alternative, or the body of an HTML-only email."""
    if not isinstance(payload, dict):
        return None
    for alternative in payload.get("alternatives", []):
        if alternative.get("mimetype") == "text/html":
            content = _restore(alternative)
            return content.decode() if isinstance(content, bytes) else content
    if payload.get("content_subtype") == "html":
        return str(payload.get("body", ""))
    return None


def header(payload: dict[str, Any], name: str) -> str | None:
    for key, value in payload.get("headers", []) if isinstance(payload, dict) else []:
        if key.lower() == name.lower():
            return str(value)
    return None


def recipients_of(payload: dict[str, Any]) -> list[str]:
    if not isinstance(payload, dict):
        return []
    return [str(a) for key in ("to", "cc", "bcc") for a in payload.get(key, [])]
