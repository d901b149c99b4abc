"""The delivery threads' doorbell: each ring wakes one thread; stopping wakes them all."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from django_outbox.worker.doorbell import Doorbell


def _wait_in_threads(bell: Doorbell, count: int, timeout: float, then: Callable[[], None]) -> list[tuple[bool, float]]:
    """``count`` threads wait on ``bell``; once they all wait, ``then()`` runs. Each thread's (rung, seconds)."""
    results: list[tuple[bool, float]] = []
    lock = threading.Lock()

    def wait() -> None:
        started = time.monotonic()
        rung = bell.wait(timeout)
        with lock:
            results.append((rung, time.monotonic() - started))

    threads = [threading.Thread(target=wait) for _ in range(count)]
    for t in threads:
        t.start()
    time.sleep(0.1)  # let them all wait
    then()
    for t in threads:
        t.join()
    return results


def test_a_ring_wakes_one_waiting_thread_only():
    bell = Doorbell(2)
    results = _wait_in_threads(bell, 2, timeout=1.0, then=bell.ring)
    assert sorted(rung for rung, _ in results) == [False, True]
    woken = next(elapsed for rung, elapsed in results if rung)
    slept = next(elapsed for rung, elapsed in results if not rung)
    assert woken < 0.9 <= slept  # one answered the ring at once, the other slept its whole timeout


def test_a_ring_while_nobody_waits_is_kept_for_the_next_wait_and_answered_once():
    bell = Doorbell(1)
    bell.ring()
    assert bell.wait(5.0) is True
    assert bell.wait(0.05) is False


def test_kept_rings_are_capped_at_one_per_thread():
    bell = Doorbell(2)
    for _ in range(5):
        bell.ring()
    assert [bell.take(), bell.take(), bell.take()] == [True, True, False]


def test_open_wakes_every_thread_and_every_later_wait_returns_at_once():
    bell = Doorbell(3)
    results = _wait_in_threads(bell, 3, timeout=5.0, then=bell.open)
    assert [rung for rung, _ in results] == [True, True, True]
    assert max(elapsed for _, elapsed in results) < 4.0
    started = time.monotonic()
    assert bell.wait(5.0) is True
    assert bell.take() is True
    assert time.monotonic() - started < 1.0
