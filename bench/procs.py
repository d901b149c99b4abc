"""Worker processes for the benchmark: start, wait until ready, sample memory, stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import django_env

ROOT = Path(__file__).resolve().parent.parent


class Proc:
    """A child process whose output lines are collected by a thread, so its pipe never fills."""

    def __init__(self, args: Sequence[str], *, env: dict[str, str] | None = None) -> None:
        self.args = list(args)
        self.lines: list[str] = []
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(
            self.args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

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
        status = Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
        return next((int(line.split()[1]) for line in status if line.startswith("VmRSS:")), 0)

    def stop(self, timeout: float = 30, *, signalled: bool = False) -> int:
        """SIGTERM (unless ``signalled`` already: a worker takes a second one as "stop at once", with its
        deliveries in progress), then a kill after ``timeout``."""
        if self.alive() and not signalled:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.join_output()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


def stop_all(procs: Sequence[Proc]) -> None:
    for p in procs:
        if p.alive():
            p.proc.send_signal(signal.SIGTERM)
    for p in procs:
        p.stop(signalled=True)


def outbox_worker(dsn: str, *extra: str, env: dict[str, str] | None = None) -> Proc:
    return Proc([sys.executable, str(ROOT / "manage.py"), "outbox_worker", *extra], env=django_env(dsn, **(env or {})))


def last_line(args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 900) -> str:
    """Run ``args`` to the end; its last line of output (it failing raises)."""
    p = Proc(args, env=env)
    code = p.proc.wait(timeout=timeout)
    p.join_output()
    if code != 0:
        raise RuntimeError(f"{p.args[:4]}: exit {code}:\n" + "\n".join(p.lines[-30:]))
    return p.lines[-1] if p.lines else ""


def script(name: str, *args: str, env: dict[str, str] | None = None) -> Proc:
    """``bench/<name>`` run by this interpreter."""
    return Proc([sys.executable, str(ROOT / "bench" / name), *args], env=env)


def wait_drained(done: Callable[[], bool], workers: Sequence[Proc], what: str, timeout: float) -> float:
    """Poll ``done`` every 10 ms until it holds, then the time; a worker that dies or a timeout raises (a stuck
    worker must not hang the run)."""
    deadline = time.monotonic() + timeout
    while not done():
        for p in workers:
            if not p.alive():
                raise RuntimeError(f"{what}: a worker died:\n" + "\n".join(p.lines[-30:]))
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{what}: not drained in {timeout:.0f}s:\n" + "\n".join(workers[0].lines[-30:]))
        time.sleep(0.01)
    return time.time()


@contextmanager
def udp_receiver() -> Iterator[tuple[int, dict[str, float]]]:
    """A loopback UDP port and the times ``"<id> <time>"`` datagrams reported there (bench/noop), by id."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    arrived: dict[str, float] = {}
    done = threading.Event()

    def receive() -> None:
        while not done.is_set():
            try:
                message_id, at = sock.recv(100).decode().split()
            except TimeoutError:
                continue
            arrived[message_id] = float(at)

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1], arrived
    finally:
        done.set()
        thread.join()
        sock.close()


def wait_for_all(arrived: dict[str, float], sent: dict[str, Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(arrived) < len(sent) and time.monotonic() < deadline:
        time.sleep(0.02)
