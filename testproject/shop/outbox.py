"""The demo's handlers, found by autodiscovery like admin.py. The worker calls them after commit."""

from django_outbox import outbox
from django_outbox.models import Message

from .models import Notification


def _note(message: Message, text: str) -> None:
    # get_or_create on the message uuid: a redelivery (at-least-once) does not notify twice.
    Notification.objects.get_or_create(
        message_uuid=message.uuid,
        defaults={"topic": message.topic, "order_id": message.payload["order_id"], "text": text},
    )


@outbox.handler("orders.created")
def order_created(message: Message) -> None:
    p = message.payload
    _note(message, f"warehouse told to ship {p['quantity']} x {p['item']} for order #{p['order_id']}")


@outbox.handler("emails.*")
def send_email(message: Message) -> None:
    p = message.payload
    _note(message, f"confirmation email for order #{p['order_id']} to {p['email']}")


@outbox.handler("orders.cancelled")
def order_cancelled(message: Message) -> None:
    _note(message, f"warehouse told to stop order #{message.payload['order_id']}")
