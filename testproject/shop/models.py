from django.db import models


class Order(models.Model):
    class Status(models.TextChoices):
        PLACED = "placed"
        CANCELLED = "cancelled"

    customer_email = models.EmailField()
    item = models.CharField(max_length=100)
    quantity = models.PositiveIntegerField(default=1)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PLACED)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"order #{self.pk}"


class Notification(models.Model):
    """What the demo's handlers 'sent': one row per delivery, so the demo can show them."""

    message_uuid = models.UUIDField()
    topic = models.CharField(max_length=200)
    order_id = models.BigIntegerField()
    text = models.TextField()
    sent_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.text


class Shipment(models.Model):
    """The warehouse's side: created by the webhook consumer, once per order event thanks to the inbox.

    Deliberately no unique constraint on the order: the inbox alone keeps redeliveries from shipping twice.
    """

    order_id = models.BigIntegerField()
    item = models.CharField(max_length=100)
    quantity = models.PositiveIntegerField()
    webhook_id = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"shipment of order #{self.order_id}"
