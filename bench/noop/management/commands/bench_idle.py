"""``manage.py bench_idle``: the reference of the stop figure (bench/stop.py). A bare management command in
``outbox_worker``'s process layout (``manage.py``, the same settings, one database connection open) that
waits for SIGTERM and returns: what a process costs to stop with nothing of its own to wind down."""

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand
from django.db import connections


class Command(BaseCommand):
    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--database", default="default")

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
        connections[options["database"]].ensure_connection()
        self.stdout.write("idle", ending="\n")
        self.stdout.flush()
        while not stop.wait(0.05):
            pass
