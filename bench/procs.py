"""Worker processes for the benchmark: start, wait until ready, sample memory, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Proc:
    """A child process whose output lines are collected by a thread, so its pipe never fills."""

    def __init__(self, args: Sequence[str], *, env: dict[str, str] | None = None) -> None:
        self.args = list(args)
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            self.args,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            if not self.alive():
                raise RuntimeError(f"{self.args[:3]} exited before {what}:\n" + "\n".join(self.lines[-30:]))
            time.sleep(0.02)
        raise RuntimeError(f"{self.args[:3]}: no {what} within {timeout}s:\n" + "\n".join(self.lines[-30:]))

    def wait_for_line(self, text: str, timeout: float = 60) -> None:
        self.wait_for(lambda: any(text in line for line in self.lines), f"line {text!r}", timeout)

    def join_output(self) -> None:
        self._reader.join(timeout=5)

    def rss_kib(self) -> int:
        """Resident set size now (Linux ``/proc``)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self, timeout: float = 30) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        return self.proc.returncode


def stop_all(procs: Sequence[Proc]) -> None:
    for p in procs:
        if p.alive():
            p.proc.send_signal(signal.SIGTERM)
    for p in procs:
        p.stop()


def outbox_worker(dsn: str, *extra: str, env: dict[str, str] | None = None) -> Proc:
    return Proc(
        [sys.executable, str(ROOT / "manage.py"), "outbox_worker", *extra],
        env={"DJANGO_SETTINGS_MODULE": "bench.settings", "DATABASE_URL": dsn, **(env or {})},
    )


def baseline_relay(dsn: str) -> Proc:
    return Proc([sys.executable, str(ROOT / "bench" / "baseline_relay.py"), dsn])


def minimal_relay(dsn: str) -> Proc:
    return Proc([sys.executable, str(ROOT / "bench" / "minimal_relay.py"), dsn])
