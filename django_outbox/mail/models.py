"""The email log: outbox messages on the email topic, as their own admin page."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..conf import EMAIL_TOPIC
from ..store.models import Message
from .payload import html_of, recipients_of


class EmailManager(models.Manager["OutboxEmail"]):
    def get_queryset(self) -> models.QuerySet[OutboxEmail]:
        return super().get_queryset().filter(topic=EMAIL_TOPIC)


class OutboxEmail(Message):
    objects: ClassVar[EmailManager] = EmailManager()

    class Meta:
        proxy = True
        app_label = "django_outbox"
        verbose_name = _("email")
        verbose_name_plural = _("email log")

    @property
    def email(self) -> dict[str, Any]:
        return self.payload if isinstance(self.payload, dict) else {}

    @property
    def subject(self) -> str:
        return str(self.email.get("subject", ""))

    @property
    def recipients(self) -> list[str]:
        return recipients_of(self.email)

    @property
    def html(self) -> str | None:
        return html_of(self.email)
