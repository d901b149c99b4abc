"""What the metrics need before prometheus-client: the bounded ``topic`` label and the server's address.

The ``topic`` label is bounded: each series costs a scraper memory for as long as it lives.

With ``OUTBOX["METRICS_TOPIC_LABELS"]`` set, a topic's label is the first pattern it matches, or
``"other"``; unset, it is the topic itself (fine for a few dozen topics, not for one per customer).
"""

from __future__ import annotations

import functools
import ipaddress

from ..conf import get_settings
from ..routing import matches

OTHER = "other"


@functools.lru_cache(maxsize=4096)
def _label(topic: str, patterns: tuple[str, ...] | None) -> str:
    if patterns is None:
        return topic
    return next((p for p in patterns if matches(p, topic)), OTHER)


def topic_label(topic: str) -> str:
    """The label value that counts ``topic``."""
    patterns = get_settings().METRICS_TOPIC_LABELS
    return _label(topic, None if patterns is None else tuple(patterns))


def check_address(text: str) -> str:
    """``--metrics-addr``: an IP address (v4 or v6) or ``localhost``; a host name would bind wherever it resolves."""
    if text == "localhost":
        return text
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ValueError(f"{text!r} is not an IP address (e.g. 127.0.0.1, 0.0.0.0 or ::1)") from None
