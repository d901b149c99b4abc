"""``async def`` views that send through the outbox, for the ASGI test (tests/integration/test_async_views.py).

The body says how: ``{"n": 1, "how": "asend" | "asend_many" | "atomic" | "nested", "fail": bool}``.
"""

from __future__ import annotations

import json

from asgiref.sync import async_to_sync, sync_to_async
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from django_outbox import outbox
from testproject.shop.models import Order


class Refused(Exception):
    """The failure a request asked for, after its writes."""


def _place_order(n: int, fail: bool) -> str:
    """The recommended pattern: the business write and the message in one sync function under atomic()."""
    with transaction.atomic():
        order = Order.objects.create(customer_email=f"buyer-{n}@example.com", item="book")
        message = outbox.send("probe.async", {"n": n, "order_id": order.pk}, idempotency_key=f"order-{n}")
        if fail:
            raise Refused
    return str(message.uuid)


def _place_order_nested(n: int, fail: bool) -> str:
    """Sync code holding atomic() that calls async code: its asend() joins this transaction."""

    async def notify() -> str:
        message = await outbox.asend("probe.async", {"n": n}, idempotency_key=f"order-{n}")
        return str(message.uuid)

    with transaction.atomic():
        Order.objects.create(customer_email=f"buyer-{n}@example.com", item="book")
        uuid = async_to_sync(notify)()
        if fail:
            raise Refused
    return uuid


@csrf_exempt
async def async_send(request: HttpRequest) -> HttpResponse:
    data = json.loads(request.body)
    n, how, fail = int(data["n"]), data.get("how", "asend"), bool(data.get("fail"))
    try:
        if how == "asend":
            message = await outbox.asend("probe.async", {"n": n}, idempotency_key=f"order-{n}")
            if fail:
                raise Refused  # too late: asend() in autocommit has committed the message already
            uuids = [str(message.uuid)]
        elif how == "asend_many":
            batch = [{"topic": "probe.async", "payload": {"n": n, "i": i}, "key": f"k-{n}"} for i in range(3)]
            uuids = [str(m.uuid) for m in await outbox.asend_many(batch)]
        elif how == "atomic":
            uuids = [await sync_to_async(_place_order)(n, fail)]
        elif how == "nested":
            uuids = [await sync_to_async(_place_order_nested)(n, fail)]
        else:
            return JsonResponse({"error": f"unknown how {how!r}"}, status=400)
    except Refused:
        return JsonResponse({"error": "refused"}, status=409)
    except (TypeError, ValueError) as exc:  # send()'s validation, through the await
        return JsonResponse({"error": str(exc), "type": type(exc).__name__}, status=422)
    return JsonResponse({"uuids": uuids}, status=201)


@csrf_exempt
async def async_send_invalid(request: HttpRequest) -> HttpResponse:
    """asend() with a payload send() refuses: the same error, raised through the await."""
    try:
        await outbox.asend("probe.async", {"bad": float("nan")})
    except TypeError as exc:
        return JsonResponse({"error": str(exc)}, status=422)
    return JsonResponse({"error": "accepted"}, status=500)
