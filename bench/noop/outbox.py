"""The benchmark's handler: does nothing, but for a message with the header ``bench-latency`` sends
``"<id> <time.time()>"`` over UDP to the harness (``BENCH_UDP_PORT``), which knows when it was committed."""

import os
import socket
import time

from django_outbox import outbox
from django_outbox.models import Message

_PORT = int(os.environ.get("BENCH_UDP_PORT", "0"))
_SOCK = socket.socket(socket.AF_INET, socket.SOCK_DGRAM) if _PORT else None


@outbox.handler("bench.*")
def noop(message: Message) -> None:
    if _SOCK is not None and "bench-latency" in message.headers:
        _SOCK.sendto(f"{message.id} {time.time()!r}".encode(), ("127.0.0.1", _PORT))
