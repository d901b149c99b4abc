"""Idempotent views scripted by their request body, for tests that drive them through real HTTP.

Body keys (all optional): ``gate`` block inside the view until the test sets ``GATE.release``;
``fail`` = ``"raise"`` or ``"503"``. With ``PROBE_HANG_FILE`` in the environment (a server process
started by a test) the view writes that file once its writes are done and then hangs, to be killed.
"""

import hashlib
import json
import os
import threading
import time
from pathlib import Path

from django.core.files.uploadedfile import TemporaryUploadedFile
from django.core.files.uploadhandler import TemporaryFileUploadHandler
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.middleware.csrf import get_token
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt

from django_outbox import outbox
from django_outbox.idempotency import IdempotencyOptions, IdempotentMixin, idempotent
from django_outbox.models import IdempotencyRecord
from testproject.shop.models import Order


class Gate:
    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def reset(self) -> None:
        self.entered.clear()
        self.release.clear()


GATE = Gate()


def _create(request: HttpRequest) -> HttpResponse:
    data = json.loads(request.body or b"{}")
    order = Order.objects.create(customer_email=data.get("email", "probe@example.com"), item=data.get("item", "mug"))
    outbox.send("probe.created", {"order_id": order.pk})
    if data.get("gate"):
        GATE.entered.set()
        GATE.release.wait(30)
    hang_file = os.environ.get("PROBE_HANG_FILE")
    if hang_file:
        Path(hang_file).write_text(str(order.pk))
        time.sleep(120)
    if data.get("fail") == "raise":
        raise RuntimeError("probe: failure requested")
    if data.get("fail") == "503":
        return JsonResponse({"error": "try later"}, status=503)
    response = JsonResponse({"order_id": order.pk}, status=201)
    response["Location"] = f"/orders/{order.pk}/"
    response["X-Probe"] = "yes"
    return response


@csrf_exempt
@idempotent(required=True, lock_timeout=1, replay_headers=["X-Probe"])
def create_order(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return JsonResponse({"orders": Order.objects.count()})
    return _create(request)


@csrf_exempt
@idempotent
def create_order_optional(request: HttpRequest) -> HttpResponse:
    return _create(request)


@csrf_exempt
@idempotent(ttl=60)
def stream(request: HttpRequest) -> StreamingHttpResponse:
    Order.objects.create(customer_email="stream@example.com", item="mug")
    return StreamingHttpResponse(iter([b"a", b"b"]))


@csrf_exempt
@idempotent
def claim_visible(request: HttpRequest) -> HttpResponse:
    """Reports whether another connection can see this request's claim while the view runs."""
    seen: list[bool] = []

    def look() -> None:
        try:
            seen.append(IdempotencyRecord.objects.filter(state=IdempotencyRecord.State.IN_PROGRESS).exists())
        finally:
            connections.close_all()

    thread = threading.Thread(target=look)
    thread.start()
    thread.join(10)
    return JsonResponse({"visible": seen == [True]})


class OrderCreateView(IdempotentMixin, View):
    idempotency = IdempotencyOptions(required=True)

    def post(self, request: HttpRequest) -> HttpResponse:
        return _create(request)


@method_decorator(idempotent(required=True), name="dispatch")
class DecoratedOrderCreateView(View):
    def post(self, request: HttpRequest) -> HttpResponse:
        return _create(request)


def _describe_body(request: HttpRequest) -> dict[str, object]:
    """Everything an upload view can see of its body: the form (files by content digest) or the raw bytes."""
    if request.content_type in ("multipart/form-data", "application/x-www-form-urlencoded"):
        files: dict[str, list[dict[str, object]]] = {}
        for field, uploads in request.FILES.lists():
            files[field] = []
            for upload in uploads:
                digest = hashlib.sha256()
                for chunk in upload.chunks():
                    digest.update(chunk)
                files[field].append(
                    {
                        "name": upload.name,
                        "size": upload.size,
                        "content_type": upload.content_type,
                        "sha256": digest.hexdigest(),
                        "on_disk": isinstance(upload, TemporaryUploadedFile),
                    }
                )
        fields = {k: v for k, v in request.POST.lists() if k != "csrfmiddlewaretoken"}
        return {"fields": fields, "files": files}
    return {"body_sha256": hashlib.sha256(request.body).hexdigest()}


def _upload(request: HttpRequest) -> HttpResponse:
    seen = _describe_body(request)
    order = Order.objects.create(customer_email="upload@example.com", item="upload")
    return JsonResponse({"order_id": order.pk, "seen": seen}, status=201)


def csrf_token(request: HttpRequest) -> HttpResponse:
    """A real CSRF token (and its cookie), for clients of the CSRF-protected upload views."""
    return JsonResponse({"token": get_token(request)})


#: The same upload view four ways: plain or @idempotent, behind the CSRF middleware (which parses the
#: form before the view) or exempt from it (the body is still unread when @idempotent sees it).
upload_plain = _upload
upload = idempotent(required=True)(_upload)
upload_plain_exempt = csrf_exempt(_upload)
upload_exempt = csrf_exempt(idempotent(required=True)(_upload))


@csrf_exempt
@idempotent(required=True)
def upload_to_disk(request: HttpRequest) -> HttpResponse:
    """A view that picks its own upload handlers, as Django allows until the form is parsed."""
    request.upload_handlers = [TemporaryFileUploadHandler(request)]
    return _upload(request)
