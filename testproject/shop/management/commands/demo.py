"""Place a few orders through the real views, relay them with the real worker, show what was delivered."""

import json
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.test import Client

from django_outbox.models import Message
from testproject.shop.models import Notification


class Command(BaseCommand):
    help = "Demo: place sample orders, run outbox_worker --until-empty, print the deliveries."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--orders", type=int, default=5)

    def handle(self, *args: Any, **options: Any) -> None:
        client = Client()
        before = Notification.objects.count()
        items = ["teapot", "kettle", "mug", "saucer", "spoon"]
        for i in range(options["orders"]):
            body = {"email": f"customer{i}@example.com", "item": items[i % len(items)], "quantity": i + 1}
            response = client.post("/orders/", json.dumps(body), content_type="application/json")
            order_id = response.json()["order_id"]
            self.stdout.write(f"placed order #{order_id} ({body['quantity']} x {body['item']})")
        client.post(f"/orders/{order_id}/cancel/")
        self.stdout.write(f"cancelled order #{order_id}")
        pending = Message.objects.filter(status=Message.Status.PENDING).count()
        self.stdout.write(f"\n{pending} messages waiting in the outbox; running the worker until it is empty\n")
        call_command("outbox_worker", "--until-empty", verbosity=options["verbosity"])
        self.stdout.write("\ndelivered:")
        for note in Notification.objects.order_by("id")[before:]:
            self.stdout.write(f"  {note.topic:28} {note.text}")
        counts = {s: Message.objects.filter(status=s).count() for s in Message.Status.values}
        self.stdout.write("\noutbox: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
