"""The demo's local handlers, found by autodiscovery like admin.py. The worker calls them after commit.

orders.created goes to the shop's webhook endpoint instead (OUTBOX["ROUTES"] in settings.py), and
emails go through the built-in email transport.
"""

from django_outbox import outbox
from django_outbox.models import Message

from .models import Notification


def _note(message: Message, text: str) -> None:
    # get_or_create on the message uuid: a redelivery (at-least-once) does not notify twice.
    Notification.objects.get_or_create(
        message_uuid=message.uuid,
        defaults={"topic": message.topic, "order_id": message.payload["order_id"], "text": text},
    )


@outbox.handler("orders.cancelled")
def order_cancelled(message: Message) -> None:
    _note(message, f"warehouse told to stop order #{message.payload['order_id']}")
