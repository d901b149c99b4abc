"""A consumer of our own ``orders.created`` webhooks: verify the signature, then process once via the inbox.

This is what a *receiving* service writes. Webhooks arrive at least once (a timeout on our side makes
the sender retry), so the effect (a shipment) is recorded with the message id in one transaction.

Signatures follow the Standard Webhooks scheme; ``django_outbox.webhooks.verify()`` checks them,
refuses timestamps older than five minutes (replay attacks) and returns the body as sent: the envelope
``{"type": topic, "timestamp": ..., "data": payload}``. The endpoint acts on the topics it knows and
acknowledges the others, so the sender may route more topics here without retrying them for ever.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from django_outbox import inbox, webhooks

from .models import Shipment

INBOX_SOURCE = "shop-webhooks"
ORDER_CREATED = "orders.created"


@csrf_exempt
@require_POST
def receive_order_webhook(request: HttpRequest) -> HttpResponse:
    try:
        event = webhooks.verify(request, settings.SHOP_WEBHOOK_SECRET)
    except webhooks.WebhookVerificationError as exc:
        return JsonResponse({"error": str(exc)}, status=401)
    if not isinstance(event, dict) or event.get("type") != ORDER_CREATED:
        return JsonResponse({"status": "ignored"})  # not ours to act on; 2xx so that it is not retried
    webhook_id = request.headers["webhook-id"]
    order = event["data"]
    with inbox.receive(INBOX_SOURCE, webhook_id) as receipt:
        if receipt.duplicate:
            # Already processed: answer 2xx so that the sender stops retrying.
            return JsonResponse({"status": "duplicate", "first_received_at": receipt.received_at.isoformat()})
        Shipment.objects.create(
            order_id=order["order_id"], item=order["item"], quantity=order["quantity"], webhook_id=webhook_id
        )
    return JsonResponse({"status": "processed"})
