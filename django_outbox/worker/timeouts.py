"""Bounding a delivery call in time, although Python threads cannot be killed.

Each delivery thread of the relay hands its calls to one helper thread of its own and waits at most
``HANDLER_TIMEOUT_SECONDS``. When the wait runs out, the helper is abandoned (a daemon thread, so it
never keeps the process alive) and the next call gets a fresh helper; the attempt is recorded as failed
at once, so the message's lease is released and it is retried or goes dead like any failure. The hung
call may still finish later: delivery stays at-least-once, and the late delivery shows up next to an
attempt whose error says it timed out. Whatever the hung call was using (the thread's transports, its
database connection) is released by the helper itself once the call returns, never from another thread.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from django.db import connections

from .. import store
from ..exceptions import DeliveryTimeoutError

T = TypeVar("T")
Cleanup = Callable[[], None]

_numbers = itertools.count(1)


class _Job(Generic[T]):
    def __init__(self, func: Callable[[], T]) -> None:
        self.func = func
        self.finished = threading.Event()
        self.lock = threading.Lock()
        self.result: T | None = None
        self.error: BaseException | None = None
        self.cleanup: Cleanup | None = None  # set when the caller gave up on this job
        self.abandoned = False


class BoundedCaller:
    """Runs one call at a time on a helper thread; ``call()`` raises ``DeliveryTimeoutError`` after ``timeout``."""

    def __init__(self, timeout: float, *, name: str = "outbox-delivery") -> None:
        self.timeout = timeout
        self.name = name
        self.abandoned = 0
        self._jobs: queue.SimpleQueue[_Job[object] | None] | None = None

    def call(self, func: Callable[[], T], *, on_timeout: Callable[[], Cleanup | None]) -> T:
        """``func()`` on the helper thread. On timeout, ``on_timeout()`` runs here and returns what the
        abandoned helper must run once the hung call returns (e.g. closing the transports it used)."""
        job: _Job[T] = _Job(func)
        self._helper().put(job)  # type: ignore[arg-type]
        if not job.finished.wait(self.timeout):
            with job.lock:
                if not job.finished.is_set():
                    job.abandoned = True
                    job.cleanup = on_timeout()
                    self._jobs = None  # the helper is stuck: the next call starts another
                    self.abandoned += 1
                    raise DeliveryTimeoutError(
                        f"delivery timed out after {self.timeout:g} s (OUTBOX['HANDLER_TIMEOUT_SECONDS']); the "
                        "call was abandoned and may still complete later, so the message may be delivered twice"
                    )
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]

    def close(self) -> None:
        """Let the current helper finish its loop and close its database connections."""
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None

    def _helper(self) -> queue.SimpleQueue[_Job[object] | None]:
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            thread = threading.Thread(
                target=_serve, args=(self._jobs,), name=f"{self.name}-call-{next(_numbers)}", daemon=True
            )
            thread.start()
        return self._jobs


def _serve(jobs: queue.SimpleQueue[_Job[object] | None]) -> None:
    try:
        while (job := jobs.get()) is not None:
            store.refresh_connections()  # as the delivery thread does per batch: drop a broken connection
            try:
                job.result = job.func()
            except BaseException as exc:  # handed to the waiting thread, which raises it
                job.error = exc
            with job.lock:
                job.finished.set()
                abandoned, cleanup = job.abandoned, job.cleanup
            if abandoned:
                if cleanup is not None:
                    cleanup()
                return  # the caller has moved on to another helper
    finally:
        connections.close_all()
