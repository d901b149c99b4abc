"""System checks of the inbox and idempotent endpoints (ids E060-E069, W060-W069; see docs/checks.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Tags, Warning

from .. import conf
from ..options import register_check

#: INBOX_RETENTION is shorter than this outbox may spend retrying one message.
SHORT_INBOX_RETENTION = "django_outbox.W060"


@register_check(Tags.compatibility)
def check_inbox_retention(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """The inbox forgets a message after INBOX_RETENTION; a redelivery after that would run twice."""
    if conf.problems():
        return []
    s = conf.get_settings()
    span = retry_span(s.MAX_ATTEMPTS, s.BACKOFF_BASE_SECONDS, s.BACKOFF_MAX_SECONDS) + s.MAX_ATTEMPTS * s.LEASE_SECONDS
    if s.INBOX_RETENTION.total_seconds() >= span:
        return []
    return [
        Warning(
            f"OUTBOX['INBOX_RETENTION'] ({s.INBOX_RETENTION}) is shorter than the {span:.0f} seconds this outbox may "
            "spend retrying one message, so a late redelivery could be processed twice.",
            hint="Keep inbox receipts longer than any producer keeps retrying (the default is 7 days).",
            id=SHORT_INBOX_RETENTION,
        )
    ]


def retry_span(attempts: int, base: float, cap: float) -> float:
    """The longest total backoff of ``attempts`` attempts: sum of min(cap, base * 2**(n - 1)), n < attempts.

    In closed form once the delay reaches the cap: summing term by term raised OverflowError at the
    1,026th attempt (2**1025 is no float) and would loop two billion times for MAX_ATTEMPTS = 2**31 - 1.
    """
    total, delay, retries = 0.0, float(base), attempts - 1
    while retries > 0 and 0 < delay < cap:  # at most ~1,100 doublings, even from the smallest float
        total += delay
        delay *= 2
        retries -= 1
    return total + retries * min(delay, cap) if retries > 0 else total
