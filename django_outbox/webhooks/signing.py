"""Standard Webhooks signatures: made by the webhook transport, checked by ``verify()`` in receivers.

The signed content is ``{webhook-id}.{webhook-timestamp}.{body}`` with HMAC-SHA256 under a
``whsec_``-prefixed base64 secret; the ``webhook-signature`` header is ``v1,<base64>`` (several,
space-separated, while a secret is being rotated). Any implementation of the specification can verify
what the outbox sends. Needs no extra package, so receiving apps need not install httpx.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Sequence
from typing import Any

from django.http import HttpRequest

from ..exceptions import OutboxError

SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_SECONDS = 300


class WebhookVerificationError(OutboxError):
    """A received webhook is not authentic or not fresh; answer it with 400 and do not act on it."""


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_...`` secret; ``ValueError`` says what is wrong with a bad one."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise ValueError("a webhook secret must be a string starting with 'whsec_' followed by base64")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except binascii.Error as exc:
        raise ValueError(f"the part of the webhook secret after 'whsec_' is not valid base64: {exc}") from exc
    if len(key) < 16:
        raise ValueError("a webhook secret must hold at least 16 random bytes (24 and more are usual)")
    return key


def new_secret() -> str:
    """A fresh secret to share with one subscriber."""
    import secrets

    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode("ascii")


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value for one request."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def verify(request: HttpRequest, secret: str | Sequence[str], *, tolerance: float = DEFAULT_TOLERANCE_SECONDS) -> Any:
    """Check a received webhook and return its JSON payload; raise ``WebhookVerificationError`` otherwise.

    ``secret`` may be a list while a secret is being rotated. ``tolerance`` bounds the clock skew and
    the replay window in seconds; within it, dedupe on the ``webhook-id`` header.
    """
    msg_id = request.headers.get("webhook-id")
    stamp = request.headers.get("webhook-timestamp")
    signatures = request.headers.get("webhook-signature")
    if not (msg_id and stamp and signatures):
        raise WebhookVerificationError(
            "missing webhook-id, webhook-timestamp or webhook-signature header: not a signed webhook"
        )
    try:
        timestamp = int(stamp)
    except ValueError as exc:
        raise WebhookVerificationError(f"webhook-timestamp {stamp!r} is not a Unix time in seconds") from exc
    skew = time.time() - timestamp
    if abs(skew) > tolerance:
        raise WebhookVerificationError(
            f"webhook-timestamp is {abs(skew):.0f}s in the {'past' if skew > 0 else 'future'}, beyond the "
            f"{tolerance:.0f}s tolerance: a replay, or a clock that is wrong on one side"
        )
    secrets = [secret] if isinstance(secret, str) else list(secret)
    body = request.body
    offered = [s.split(",", 1)[1] for s in signatures.split() if s.startswith("v1,")]
    for candidate in secrets:
        try:
            expected = sign(candidate, msg_id, timestamp, body).split(",", 1)[1]
        except ValueError as exc:
            raise WebhookVerificationError(f"the secret given to verify() is not usable: {exc}") from exc
        if any(hmac.compare_digest(expected, o) for o in offered):
            break
    else:
        raise WebhookVerificationError("no webhook-signature matches: wrong secret, or the body was altered")
    try:
        return json.loads(body)
    except ValueError as exc:
        raise WebhookVerificationError(f"the signed body is not JSON: {exc}") from exc
