from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator

import pytest
from django.db import connection
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from django_outbox.routing import registry

from .support import IN_CI, pooled
from .support.database import is_postgres, is_postgres_alias
from .support.processes import WorkerProcess
from .support.servers import HTTPServer

#: Fixtures more than one layer uses; the helpers are imported from their ``tests.support`` module.
pytest_plugins = ["tests.support.archive", "tests.support.browser", "tests.support.mail"]

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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test's captured output may hold what a hostile input put there (a lone surrogate in an error
    text the relay logged): pytest-xdist sends each report to the main process as UTF-8, and one such
    character would end the worker process. Escaped here, as the relay escapes it in what it stores."""
    report = yield
    report.sections = [(title, _encodable(text)) for title, text in report.sections]
    return report


def _encodable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked ``database_independent`` proves something no database changes (a transport's wire,
    a browser, a scrape): run in every database's cell it would only repeat itself, so it runs in the
    SQLite cells, which every run has, once per Django version."""
    if connection.vendor == "sqlite":
        return
    once = pytest.mark.skip(reason="independent of the suite's database: run in the SQLite cells")
    for item in items:
        if item.get_closest_marker("database_independent"):
            item.add_marker(once)


def pytest_report_header() -> str | None:
    bouncer = pooled.bouncer()
    if bouncer is None:
        return None
    return f"through PgBouncer ({bouncer.mode} pooling) on 127.0.0.1:{bouncer.port}, server at {pooled.direct()}"


@pytest.fixture(scope="session", autouse=True)
def _json_support_known(django_db_setup, django_db_blocker) -> None:
    """Django 6.x's model checks ask each database whether it supports JSON fields, so a test that runs
    ``run_checks()`` (as ``manage.py check`` does) would need database access. The answer is cached on
    the connection: ask once, up front. (tests/unit/conftest.py replaces this and the next fixture for
    the unit layer, which sets up no database at all.)"""
    from django.db import connections

    with django_db_blocker.unblock():
        for alias in connections:
            connections[alias].features.supports_json_field  # noqa: B018


@pytest.fixture(scope="session", autouse=True)
def _pooler_lets_go(django_db_setup, django_db_blocker) -> Iterator[None]:
    """Under ``TEST_POOLER``, the pooler keeps server connections to the test databases after the run:
    close them before pytest-django drops those databases (set up after it, so torn down before)."""
    yield
    if pooled.bouncer() is None:
        return
    from django.db import connections

    with django_db_blocker.unblock():
        names = {connections[alias].settings_dict["NAME"] for alias in connections if is_postgres_alias(alias)}
    for name in names:
        pooled.release(name)


@pytest.fixture
def postgres() -> None:
    """For tests of PostgreSQL-only behaviour (the suite also runs on SQLite, where these skip)."""
    if not is_postgres():
        pytest.skip("PostgreSQL-only behaviour; this run uses " + connection.vendor)


@pytest.fixture
def server_database() -> None:
    """For tests that need a database server with row locks shared by many processes (PostgreSQL,
    MariaDB/MySQL): SQLite serialises its writers."""
    if connection.vendor not in ("postgresql", "mysql"):
        pytest.skip("needs PostgreSQL or MariaDB; this run uses " + connection.vendor)


@pytest.fixture
def mysql() -> None:
    """For tests of MariaDB/MySQL-only behaviour (skipped on the other databases)."""
    if connection.vendor != "mysql":
        pytest.skip("MariaDB/MySQL-only behaviour; this run uses " + connection.vendor)


@pytest.fixture
def server() -> Iterator[HTTPServer]:
    """A real HTTP server on loopback recording every request (tests/support/servers.py)."""
    srv = HTTPServer()
    yield srv
    srv.stop()


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
