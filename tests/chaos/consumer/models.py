"""The consumer's own business tables: what "applied twice" and "lost" are counted from.

``Effect`` has no unique constraint on the message on purpose: the database must be able to hold a
double application, or the audit could never see one. ``Account`` is the counter the effect moves, so
a double application also shows as a wrong balance.
"""

from __future__ import annotations

from django.db import models


class Account(models.Model):
    name = models.CharField(max_length=50, unique=True)
    balance = models.BigIntegerField(default=0)
    applied = models.BigIntegerField(default=0)

    # Declared, since the type checker's settings (tests.settings) do not install this app.
    objects: models.Manager[Account] = models.Manager()

    def __str__(self) -> str:
        return f"{self.name}: {self.balance}"


class Effect(models.Model):
    """One row per application of a message's effect."""

    message_uuid = models.UUIDField(db_index=True)
    account = models.CharField(max_length=50)
    amount = models.IntegerField()
    attempt = models.PositiveIntegerField()
    pid = models.PositiveIntegerField()
    applied_at = models.DateTimeField(auto_now_add=True)

    objects: models.Manager[Effect] = models.Manager()

    def __str__(self) -> str:
        return f"{self.message_uuid} +{self.amount} to {self.account}"
