"""The demo: orders placed through the real views, relayed by the real worker to real destinations.

- ``orders.created`` goes as a signed webhook over HTTP to the shop's own consumer endpoint, served here
  on a free loopback port; the consumer verifies the signature and records a shipment via the inbox;
- the confirmation email goes through Django's mail API into the outbox, and the worker sends it with
  the real backend (files under EMAIL_FILE_PATH);
- ``orders.cancelled`` is handled by a local ``@outbox.handler``.
"""

import email
import json
import threading
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
from django.test import Client, override_settings

from django_outbox.models import Attempt, Message
from testproject.shop.models import Notification, Shipment


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class Command(BaseCommand):
    help = "Demo: place sample orders, run outbox_worker --until-empty, show what each destination received."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--orders", type=int, default=5)

    def handle(self, *args: Any, **options: Any) -> None:
        server = ThreadedWSGIServer(("127.0.0.1", 0), QuietHandler)
        server.set_app(WSGIHandler())
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_port}/webhooks/orders/"
        self.stdout.write(f"shop serving its webhook endpoint at {url}")
        outbox = dict(settings.OUTBOX)
        hooks = dict(outbox["TRANSPORTS"]["shop-webhooks"])
        hooks["OPTIONS"] = {**hooks["OPTIONS"], "URL": url}
        outbox["TRANSPORTS"] = {**outbox["TRANSPORTS"], "shop-webhooks": hooks}
        mail_dir = Path(settings.DEMO_MAIL_DIR)
        mails_before = set(mail_dir.glob("*")) if mail_dir.exists() else set()
        marks = (Shipment.objects.count(), Notification.objects.count(), Message.objects.order_by("-id").first())
        try:
            with override_settings(OUTBOX=outbox):
                self._run(options)
        finally:
            server.shutdown()
            server.server_close()
        self._report(marks, mail_dir, mails_before)

    def _run(self, options: dict[str, Any]) -> None:
        client = Client()
        items = ["teapot", "kettle", "mug", "saucer", "spoon"]
        order_id = None
        for i in range(options["orders"]):
            body = {"email": f"customer{i}@example.com", "item": items[i % len(items)], "quantity": i + 1}
            response = client.post("/orders/", json.dumps(body), content_type="application/json")
            order_id = response.json()["order_id"]
            self.stdout.write(f"placed order #{order_id} ({body['quantity']} x {body['item']})")
        if order_id is not None:
            client.post(f"/orders/{order_id}/cancel/")
            self.stdout.write(f"cancelled order #{order_id}")
        pending = Message.objects.filter(status=Message.Status.PENDING).count()
        self.stdout.write(f"\n{pending} messages waiting in the outbox; running the worker until it is empty\n")
        call_command("outbox_worker", "--until-empty", verbosity=options["verbosity"])

    def _report(self, marks: tuple[int, int, Message | None], mail_dir: Path, mails_before: set[Path]) -> None:
        shipments, notifications, last_message = marks
        self.stdout.write("\nthe webhook consumer received (signature verified, deduplicated by the inbox):")
        for shipment in Shipment.objects.order_by("id")[shipments:]:
            self.stdout.write(
                f"  shipment for order #{shipment.order_id}: {shipment.quantity} x {shipment.item}"
                f"  (webhook-id {shipment.webhook_id})"
            )
        self.stdout.write(f"\nthe mail backend sent (files in {mail_dir}):")
        for path in sorted(set(mail_dir.glob("*")) - mails_before, key=lambda p: p.stat().st_mtime_ns):
            for raw in path.read_bytes().split(b"\n" + b"-" * 79 + b"\n"):
                if raw.strip():
                    parsed = email.message_from_bytes(raw)
                    self.stdout.write(f"  to {parsed['To']}: {parsed['Subject']}")
        self.stdout.write("\nthe local handler noted:")
        for note in Notification.objects.order_by("id")[notifications:]:
            self.stdout.write(f"  {note.text}")
        new = Message.objects.filter(id__gt=last_message.id if last_message else 0)
        counts = {s: new.filter(status=s).count() for s in Message.Status.values}
        attempts = Attempt.objects.filter(message__in=new).count()
        self.stdout.write(
            "\noutbox: " + ", ".join(f"{k} {v}" for k, v in counts.items()) + f"; {attempts} attempts in the audit log"
        )
