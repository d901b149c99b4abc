from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from django_outbox.routing import registry

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI") == "true"

# Property-based tests: a capped profile under CI (the suite runs in four cells), a fuller one by hand
# (HYPOTHESIS_PROFILE=thorough). No deadline: a database round trip's time is machine noise. Tests that
# take a function-scoped fixture (db, a server) roll back or reset what each example wrote themselves.
SUPPRESSED = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
hypothesis_settings.register_profile(
    "ci", max_examples=40, deadline=None, suppress_health_check=SUPPRESSED, derandomize=True
)
hypothesis_settings.register_profile("dev", max_examples=100, deadline=None, suppress_health_check=SUPPRESSED)
hypothesis_settings.register_profile("thorough", max_examples=2000, deadline=None, suppress_health_check=SUPPRESSED)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if IN_CI else "dev"))


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def connect_raw(**options: Any) -> Any:
    """A psycopg connection of its own to the test database (PostgreSQL), beside Django's."""
    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)  # Django's, for its own connections
    params.pop("context", None)
    return psycopg.connect(**params, **options)


def require_service(name: str, host: str, port: int) -> None:
    """Skip when a service is missing on a laptop; under CI=true a missing service fails the test."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return
    except OSError as exc:
        if IN_CI:
            pytest.fail(f"{name} is not reachable at {host}:{port} ({exc}); under CI=true this is a failure")
        pytest.skip(f"{name} not reachable at {host}:{port}")


@pytest.fixture(scope="session", autouse=True)
def _json_support_known(django_db_setup, django_db_blocker) -> None:
    """Django 6.x's model checks ask each database whether it supports JSON fields, so a test that runs
    ``run_checks()`` (as ``manage.py check`` does) would need database access. The answer is cached on
    the connection: ask once, up front."""
    from django.db import connections

    with django_db_blocker.unblock():
        for alias in connections:
            connections[alias].features.supports_json_field  # noqa: B018


@pytest.fixture
def postgres() -> None:
    """For tests of PostgreSQL-only behaviour (the suite also runs on SQLite, where these skip)."""
    if not is_postgres():
        pytest.skip("PostgreSQL-only behaviour; this run uses " + connection.vendor)


@pytest.fixture
def handler() -> Iterator[Callable[[str, Callable[..., object]], None]]:
    """Register handlers for the test only."""
    added: list[str] = []

    def register(pattern: str, func: Callable[..., object]) -> None:
        registry.register(pattern, func)
        added.append(pattern)

    yield register
    for pattern in added:
        registry.unregister(pattern)


def worker_env() -> dict[str, str]:
    """Environment for a subprocess that must use the same (test) database as this test."""
    settings = connection.settings_dict
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONUNBUFFERED": "1"}
    if connection.vendor == "postgresql":
        env["DATABASE_URL"] = (
            f"postgres://{settings['USER'] or 'postgres'}@{settings['HOST'] or '127.0.0.1'}:"
            f"{settings['PORT'] or 5432}/{settings['NAME']}"
        )
    else:
        env["DATABASE_URL"] = ""
        env["SQLITE_PATH"] = str(settings["NAME"])
    return env


def send_in_process(topic: str, env: dict[str, str]) -> float:
    """``outbox.send(topic, {})`` in a process of its own (its own connection settings); returns when it
    committed, on ``time.monotonic()``."""
    code = f"from django_outbox import outbox; outbox.send({topic!r}, {{}})"
    command = [sys.executable, str(ROOT / "manage.py"), "shell", "-c", code]
    subprocess.run(command, cwd=ROOT, env={**worker_env(), **env}, check=True, timeout=60)
    return time.monotonic()


class WorkerProcess:
    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "outbox_worker", *args],
            cwd=ROOT,
            env={**worker_env(), **(env or {})},
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
        return out

    def wait(self, timeout: float = 60) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def worker_process() -> Iterator[Callable[..., WorkerProcess]]:
    """Start real ``manage.py outbox_worker`` processes on the test database; stopped at teardown."""
    started: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        worker = WorkerProcess(*args, env=env)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def wait_for(condition: Callable[[], object], timeout: float = 30, interval: float = 0.05) -> None:
    """Poll until ``condition()`` is truthy; fail the test with a clear message otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    pytest.fail(f"condition not met within {timeout}s: {getattr(condition, '__name__', condition)}")
