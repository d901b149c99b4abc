"""System checks of the inbox and idempotent endpoints (ids E060-E069, W060-W069; see docs/checks.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Tags, Warning, register

from . import conf


@register(Tags.compatibility)
def check_inbox_retention(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """The inbox forgets a message after INBOX_RETENTION; a redelivery after that would run twice."""
    if conf.problems():
        return []
    s = conf.get_settings()
    backoff = sum(min(s.BACKOFF_MAX_SECONDS, s.BACKOFF_BASE_SECONDS * 2 ** (n - 1)) for n in range(1, s.MAX_ATTEMPTS))
    span = backoff + s.MAX_ATTEMPTS * s.LEASE_SECONDS
    if s.INBOX_RETENTION.total_seconds() >= span:
        return []
    return [
        Warning(
            f"OUTBOX['INBOX_RETENTION'] ({s.INBOX_RETENTION}) is shorter than the {span:.0f} seconds this outbox may "
            "spend retrying one message, so a late redelivery could be processed twice.",
            hint="Keep inbox receipts longer than any producer keeps retrying (the default is 7 days).",
            id="django_outbox.W060",
        )
    ]
