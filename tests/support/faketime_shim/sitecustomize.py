"""Loaded (as ``sitecustomize``) only by the tests' clock-shifted processes, under libfaketime.

The processes fake the wall clock only (``FAKETIME_DONT_FAKE_MONOTONIC=1``), as a host whose clock is
off would: its monotonic clock still runs true. libfaketime 0.9.10 (Debian's) then breaks Python 3.11's
``time.sleep()``, which sleeps with ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``: the library
rewrites the monotonic deadline as if it were faked and the kernel answers EINVAL
(wolfcw/libfaketime#426). Faking the monotonic clock too is no way out: lock and event timeouts
(``sem_clockwait``) then hang (wolfcw/libfaketime#390). So ``time.sleep`` waits on an event instead,
which sleeps on the true monotonic clock, as ``time.sleep`` does without the bug.
"""

import threading
import time
from typing import SupportsIndex


def _sleep(seconds: float | SupportsIndex, /) -> None:
    length = float(seconds)
    if length < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(length)


time.sleep = _sleep
