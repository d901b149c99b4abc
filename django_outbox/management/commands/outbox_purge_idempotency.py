"""``manage.py outbox_purge_idempotency``: delete expired ``Idempotency-Key`` records (run it hourly or daily)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_outbox.conf import get_settings
from django_outbox.idempotency import records as idempotency_records


class Command(BaseCommand):
    help = "Delete stored Idempotency-Key responses whose key has expired (see OUTBOX['IDEMPOTENCY_KEY_TTL'])."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", help="Database alias (default OUTBOX['DATABASE']).")

    def handle(self, *args: Any, **options: Any) -> None:
        deleted = idempotency_records.purge(options["database"] or get_settings().DATABASE)
        if options["verbosity"] >= 1:
            self.stdout.write(f"deleted {deleted} expired idempotency record{'s' if deleted != 1 else ''}")
