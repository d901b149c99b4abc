from django.db import models


class Delivery(models.Model):
    """One row per successful handler call: what the outside world would have received."""

    message_id = models.BigIntegerField()
    message_uuid = models.UUIDField()
    topic = models.CharField(max_length=200)
    key = models.CharField(max_length=200, blank=True, default="")
    attempt = models.PositiveIntegerField()
    pid = models.PositiveIntegerField()
    delivered_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.topic} #{self.message_id} attempt {self.attempt}"
