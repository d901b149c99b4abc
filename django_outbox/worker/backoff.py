"""The retry policy: how long a failed message waits before its next attempt.

The store records whatever delay the worker hands it; choosing that delay is decided here.
"""

from __future__ import annotations

import logging
import math
import random

from ..conf import OutboxSettings, get_settings
from ..exceptions import DeliveryError
from ..store.models import Message

logger = logging.getLogger("django_outbox.relay")


#: The longest retry delay the relay ever computes, whatever the settings, the attempt number or a
#: destination's ``Retry-After`` say: ten years, beyond any sensible cap and far inside what a datetime
#: and the databases hold, so that ``finished + timedelta(seconds=delay)`` cannot overflow.
MAX_DELAY_SECONDS = 10 * 365.25 * 24 * 3600.0
#: Beyond this the exponential part stops growing: ``2.0 ** 1024`` overflows a float, while any base
#: times ``2.0 ** 1023`` is a float (or infinity), which the cap then bounds.
_MAX_EXPONENT = 1023


def _seconds(value: object) -> float | None:
    """A number of seconds clamped into [0, MAX_DELAY_SECONDS]; None for NaN and for what is no number.

    Settings, a transport's ``retry_after`` or a stored value may be anything (an int too big for a
    float, infinity, a string): each is judged here, so the arithmetic after it cannot raise.
    """
    try:
        number = float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int beyond a float's range: the far end of its sign
        return MAX_DELAY_SECONDS if value > 0 else 0.0  # type: ignore[operator]
    except (TypeError, ValueError):
        return None
    if math.isnan(number):
        return None
    return min(max(number, 0.0), MAX_DELAY_SECONDS)


def backoff_seconds(
    attempt: int,
    *,
    base: float,
    cap: float,
    retry_after: float | None = None,
    retry_after_cap: float | None = None,
) -> float:
    """Capped exponential backoff with jitter (half fixed, half random), at least ``retry_after``.

    ``retry_after`` (a destination's wish) is honoured up to ``retry_after_cap``. The result is finite
    and within [0, MAX_DELAY_SECONDS] for any input: the exponent is capped before it is computed, NaN
    and non-numbers fall back to the defaults (a NaN ``retry_after`` is ignored), infinities and
    negatives are clamped. A worker must never die on a message because of the arithmetic of its retry.
    """
    defaults = OutboxSettings()
    base_s = _seconds(base)
    cap_s = _seconds(cap)
    base_s = defaults.BACKOFF_BASE_SECONDS if base_s is None else base_s
    cap_s = defaults.BACKOFF_MAX_SECONDS if cap_s is None else cap_s
    exponent = min(max(attempt - 1, 0), _MAX_EXPONENT)
    ceiling = min(cap_s, base_s * 2.0**exponent)
    delay = ceiling / 2 + random.uniform(0, ceiling / 2)
    wish = _seconds(retry_after)
    if wish is not None:
        wish_cap = MAX_DELAY_SECONDS if retry_after_cap is None else _seconds(retry_after_cap)
        delay = max(delay, min(wish, cap_s if wish_cap is None else wish_cap))
    return min(float(delay), MAX_DELAY_SECONDS)


def retry_delay(message: Message, exc: BaseException) -> float:
    """Seconds until the retry, bounded (``backoff_seconds``); a destination's ``retry_after`` is
    honoured up to ``RETRY_AFTER_MAX_SECONDS``. Settings that cannot be read now, or a
    ``retry_after`` that raises when read, give the default backoff rather than no outcome."""
    try:
        conf = get_settings()
        base, cap = conf.BACKOFF_BASE_SECONDS, conf.BACKOFF_MAX_SECONDS
        retry_after_cap = conf.RETRY_AFTER_MAX_SECONDS
    except Exception:
        logger.exception("OUTBOX settings unreadable while scheduling a retry; using the default backoff")
        defaults = OutboxSettings()
        base, cap, retry_after_cap = defaults.BACKOFF_BASE_SECONDS, defaults.BACKOFF_MAX_SECONDS, None
    try:
        retry_after = exc.retry_after if isinstance(exc, DeliveryError) else None
    except Exception:
        retry_after = None  # a property that raises: no wish to honour
    return backoff_seconds(
        message.attempts,
        base=base,
        cap=cap,
        retry_after=retry_after,
        retry_after_cap=cap if retry_after_cap is None else retry_after_cap,
    )
