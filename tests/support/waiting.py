"""Polling for what another thread or process does, with a failure that says what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_for(condition: Callable[[], object], timeout: float = 30, interval: float = 0.05) -> None:
    """Poll until ``condition()`` is truthy; fail the test with a clear message otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    pytest.fail(f"condition not met within {timeout}s: {getattr(condition, '__name__', condition)}")
