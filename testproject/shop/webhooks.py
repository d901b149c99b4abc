"""A consumer of our own ``orders.created`` webhooks: verify the signature, then process once via the inbox.

This is what a *receiving* service writes. Webhooks arrive at least once (a timeout on our side makes
the sender retry), so the effect (a shipment) is recorded with the message id in one transaction.

Signatures follow the Standard Webhooks scheme: ``webhook-signature`` holds space-separated
``v1,<base64 HMAC-SHA256>`` entries over ``"{webhook-id}.{webhook-timestamp}.{body}"``, keyed with the
base64 part of a ``whsec_...`` secret; timestamps older than five minutes are refused (replay attacks).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from django_outbox import inbox

from .models import Shipment

TOLERANCE_SECONDS = 5 * 60
INBOX_SOURCE = "shop-webhooks"


class InvalidSignature(Exception):
    pass


def sign(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value for a payload (what the sender computes)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def verify(secret: str, request: HttpRequest) -> str:
    """Check the signature and timestamp of a request; returns its webhook id."""
    webhook_id = request.headers.get("webhook-id", "")
    timestamp = request.headers.get("webhook-timestamp", "")
    signatures = request.headers.get("webhook-signature", "")
    if not (webhook_id and timestamp.isdigit() and signatures):
        raise InvalidSignature("missing webhook-id, webhook-timestamp or webhook-signature header")
    if abs(time.time() - int(timestamp)) > TOLERANCE_SECONDS:
        raise InvalidSignature("timestamp outside the tolerance window")
    expected = sign(secret, webhook_id, int(timestamp), request.body)
    if not any(hmac.compare_digest(expected, candidate) for candidate in signatures.split()):
        raise InvalidSignature("no matching signature")
    return webhook_id


@csrf_exempt
@require_POST
def receive_order_webhook(request: HttpRequest) -> HttpResponse:
    try:
        webhook_id = verify(settings.SHOP_WEBHOOK_SECRET, request)
    except InvalidSignature as exc:
        return JsonResponse({"error": str(exc)}, status=401)
    event = json.loads(request.body)
    order = event["payload"] if "payload" in event else event
    with inbox.receive(INBOX_SOURCE, webhook_id) as receipt:
        if receipt.duplicate:
            # Already processed: answer 2xx so that the sender stops retrying.
            return JsonResponse({"status": "duplicate", "first_received_at": receipt.received_at.isoformat()})
        Shipment.objects.create(
            order_id=order["order_id"], item=order["item"], quantity=order["quantity"], webhook_id=webhook_id
        )
    return JsonResponse({"status": "processed"})
