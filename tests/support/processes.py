"""Real ``manage.py`` processes on the test database: the workers, a producer, their environment."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from django.db import connection, connections

from . import ROOT, pooled


def worker_env() -> dict[str, str]:
    """Environment for a subprocess that must use the same (test) database as this test."""
    settings = connection.settings_dict
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONUNBUFFERED": "1"}
    if connection.vendor == "postgresql":
        env["DATABASE_URL"] = (
            f"postgres://{settings['USER'] or 'postgres'}@{settings['HOST'] or '127.0.0.1'}:"
            f"{settings['PORT'] or 5432}/{settings['NAME']}"
        )
    elif connection.vendor == "mysql":
        env["DATABASE_URL"] = (
            f"mysql://{settings['USER'] or 'root'}@{settings['HOST'] or '127.0.0.1'}:"
            f"{settings['PORT'] or 3306}/{settings['NAME']}"
        )
    else:
        env["DATABASE_URL"] = ""
        env["SQLITE_PATH"] = str(settings["NAME"])
    if _other_was_created():
        env["TEST_OTHER_DATABASE_NAME"] = str(connections["other"].settings_dict["NAME"])
    else:
        env["TEST_WITHOUT_OTHER"] = "1"
    return env


def _other_was_created() -> bool:
    """Whether the session made the "other" test database: pytest-django creates it only when a collected
    test declares it, and then renames the alias to its ``TEST`` name (suffixed per pytest-xdist process)."""
    other = connections["other"].settings_dict
    return str(other["NAME"]) == str(other.get("TEST", {}).get("NAME"))


def send_in_process(topic: str, env: dict[str, str]) -> float:
    """``outbox.send(topic, {})`` in a process of its own (its own connection settings); returns when it
    committed, on ``time.monotonic()``."""
    code = f"from django_outbox import outbox; outbox.send({topic!r}, {{}})"
    command = [sys.executable, str(ROOT / "manage.py"), "shell", "-c", code]
    subprocess.run(command, cwd=ROOT, env={**worker_env(), **env}, check=True, timeout=60)
    return time.monotonic()


def no_pooler_artefact_taken_for_an_outage(out: str) -> None:
    """Through a pooler (``TEST_POOLER``), a worker must never take what the pooler does to prepared
    statements for a database outage, nor give up recording outcomes because of it (a duplicate)."""
    for line in out.splitlines():
        if ("unavailable" in line or "could not record" in line) and "prepared statement" in line:
            pytest.fail(f"a pooler artefact was treated as an outage: {line}\n{out[-3000:]}")


class WorkerProcess:
    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.args = args
        # Through a pooler the workers say what they take for outages, for the check above.
        logging = {"OUTBOX_LOG_LEVEL": "WARNING"} if pooled.mode() else {}
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "outbox_worker", *args],
            cwd=ROOT,
            env={**worker_env(), **logging, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> str:
        self.proc.send_signal(signal.SIGKILL)
        out, _ = self.proc.communicate(timeout=10)  # also closes the pipe
        no_pooler_artefact_taken_for_an_outage(out)
        return out

    def wait(self, timeout: float = 60) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        no_pooler_artefact_taken_for_an_outage(out)
        return self.proc.returncode, out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                out, _ = self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
            else:
                no_pooler_artefact_taken_for_an_outage(out)
        elif self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.communicate(timeout=10)  # it exited on its own: read the rest and close the pipe


@contextlib.contextmanager
def web_process(command: list[str], port: int, env: dict[str, str]) -> Iterator[str]:
    """A web server process of the tests' application on ``127.0.0.1:port``: its base URL once it listens
    (its output in the failure if it exits first), stopped after."""
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            pytest.fail(f"{command[:3]} exited with {proc.returncode}:\n{proc.stdout.read() if proc.stdout else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"{command[:3]} did not listen within 60 s")
            time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=10)
