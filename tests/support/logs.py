"""What a logger of the package says during a test, from any thread, at a level the test settings mute."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


class _Kept(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__()
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def captured(name: str = "django_outbox.relay", level: int = logging.WARNING) -> Iterator[list[logging.LogRecord]]:
    """The records ``name`` emits meanwhile (the test settings log errors only: the level is lowered)."""
    records: list[logging.LogRecord] = []
    handler = _Kept(records)
    logger = logging.getLogger(name)
    before = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)
