"""``manage.py outbox_purge_inbox``: delete inbox receipts older than the retention (run it daily)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_outbox import inbox


def _positive_float(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = (
        "Delete inbox receipts older than OUTBOX['INBOX_RETENTION'] (or --older-than). A message redelivered "
        "after its receipt is gone is processed again, so keep the retention above the producers' retry span."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than", type=_positive_float, metavar="SECONDS", help="Override the retention for this run."
        )
        parser.add_argument("--database", help="Database alias (default OUTBOX['DATABASE']).")

    def handle(self, *args: Any, **options: Any) -> None:
        older_than = options["older_than"]
        deleted = inbox.purge(
            older_than=dt.timedelta(seconds=older_than) if older_than is not None else None,
            using=options["database"],
        )
        if options["verbosity"] >= 1:
            self.stdout.write(f"deleted {deleted} inbox receipt{'s' if deleted != 1 else ''}")
