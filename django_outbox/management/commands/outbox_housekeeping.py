"""``manage.py outbox_housekeeping``: one round of retention, for cron (workers also run it themselves)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_outbox.conf import get_settings
from django_outbox.retention import housekeeping


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = (
        "Move finished outbox messages to the archive (or delete them) and drop archive days older than "
        "OUTBOX['RETENTION'], in small batches. Safe to run while workers are running."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", help="Database alias holding the outbox (default OUTBOX['DATABASE']).")
        parser.add_argument(
            "--batch-size",
            type=_positive_int,
            default=housekeeping.BATCH_SIZE,
            help=f"Messages per transaction (default {housekeeping.BATCH_SIZE}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"] or get_settings().DATABASE
        report = housekeeping.run(alias, batch_size=options["batch_size"])
        if options["verbosity"] >= 1:
            self.stdout.write(f"outbox housekeeping on {alias!r}: {report}")
