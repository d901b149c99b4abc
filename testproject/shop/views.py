"""The demo's write path: each view changes an order and sends outbox messages in the same transaction."""

import json

from django.core.mail import send_mail
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.utils.html import escape
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from django_outbox import outbox
from django_outbox.idempotency import idempotent

from .models import Order


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> HttpResponse:
    data = json.loads(request.body or b"{}")
    with transaction.atomic():
        order = Order.objects.create(
            customer_email=data["email"], item=data["item"], quantity=int(data.get("quantity", 1))
        )
        payload = {"order_id": order.pk, "email": order.customer_email, "item": order.item, "quantity": order.quantity}
        outbox.send("orders.created", payload, key=f"order-{order.pk}")
        # With EMAIL_BACKEND = "django_outbox.mail.EmailBackend" this writes an outbox message, in this
        # transaction, instead of talking to the mail server; the worker sends it after the commit.
        send_mail(
            subject=f"Your order #{order.pk}",
            message=f"Thank you! We are preparing {order.quantity} x {order.item}.",
            html_message=f"<p>Thank you! We are preparing <b>{order.quantity} x {escape(order.item)}</b>.</p>",
            from_email=None,
            recipient_list=[order.customer_email],
        )
    return JsonResponse({"order_id": order.pk}, status=201)


@csrf_exempt
@require_POST
def cancel_order(request: HttpRequest, pk: int) -> HttpResponse:
    with transaction.atomic():
        order = get_object_or_404(Order.objects.select_for_update(), pk=pk)
        order.status = Order.Status.CANCELLED
        order.save(update_fields=["status"])
        outbox.send("orders.cancelled", {"order_id": order.pk}, key=f"order-{order.pk}")
    return JsonResponse({"order_id": order.pk, "status": order.status})


@csrf_exempt
@require_POST
@idempotent(required=True)
def create_order_api(request: HttpRequest) -> HttpResponse:
    """The API form of place_order: clients must send an ``Idempotency-Key``, so a retry never orders twice.

    No ``atomic()`` here: @idempotent already runs the view in a transaction that also stores the
    response, so the order, its message and the stored response commit together.
    """
    data = json.loads(request.body or b"{}")
    order = Order.objects.create(customer_email=data["email"], item=data["item"], quantity=int(data.get("quantity", 1)))
    payload = {"order_id": order.pk, "email": order.customer_email, "item": order.item, "quantity": order.quantity}
    outbox.send("orders.created", payload, key=f"order-{order.pk}")
    response = JsonResponse(payload, status=201)
    response["Location"] = f"/api/orders/{order.pk}/"
    return response
