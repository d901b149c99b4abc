"""What the metrics need before prometheus-client: the bounded ``topic`` label and the server's address.

The ``topic`` label is bounded: each series costs a scraper memory for as long as it lives.

With ``OUTBOX["METRICS_TOPIC_LABELS"]`` set, a topic's label is the first pattern it matches, or
``"other"``; unset, it is the topic itself for the first ``MAX_TOPIC_LABELS`` topics a registry counts
(``TopicLabels``), and ``"other"`` after them, with one warning naming the setting: 10,000 topics, one
per tenant, made each scrape of a worker 1.9 MB and kept 30,000 series per worker in the scraper.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import threading

from ..conf import get_settings
from ..routing import matches

OTHER = "other"
#: Distinct topics one registry counts under their own name when ``METRICS_TOPIC_LABELS`` is unset.
MAX_TOPIC_LABELS = 500

logger = logging.getLogger("django_outbox.relay")


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


class TopicLabels:
    """``topic_label`` bounded for one registry: its series live as long as it does, so the bound is its own."""

    def __init__(self, limit: int = MAX_TOPIC_LABELS) -> None:
        self.limit = limit
        self._own: set[str] = set()
        self._lock = threading.Lock()
        self._warned = False

    def __call__(self, topic: str) -> str:
        label = topic_label(topic)
        if label != topic or topic in self._own:  # a pattern's value, or already counted under its name
            return label
        with self._lock:
            if topic in self._own or len(self._own) < self.limit:
                self._own.add(topic)
                return topic
            warn, self._warned = not self._warned, True
        if warn:
            logger.warning(
                "metrics: more than %d distinct topics, the others are counted as %r; set"
                ' OUTBOX["METRICS_TOPIC_LABELS"] to patterns that group them',
                self.limit,
                OTHER,
            )
        return OTHER
