"""``manage.py bench_idle``: the reference for the stop figure (bench/stop.py).

A bare management command in the same process layout as ``outbox_worker`` (``manage.py``, the same
settings, one database connection opened), that waits for SIGTERM and returns: what a process costs to
stop when it has nothing of its own to wind down.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand
from django.db import connections


class Command(BaseCommand):
    help = "Wait for SIGTERM, then exit (the reference of bench/stop.py)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--database", default="default")

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        connections[options["database"]].ensure_connection()
        self.stdout.write("idle", ending="\n")
        self.stdout.flush()
        while not stop.wait(0.05):
            pass
