"""The unit layer: no database, no network, nothing running. Tests here that ask for a database fail."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any, cast

import pytest
from django.core.checks.registry import registry

#: pytest-django's and Django's fixtures that reach a database or a server.
DATABASE_FIXTURES = frozenset(
    {"db", "transactional_db", "django_db_setup", "live_server", "admin_client", "admin_user"}
)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A unit test that wants a database belongs to tests/db (or a layer above): say so at once."""
    wanted = DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("django_db") is not None or wanted:
        pytest.fail(f"{item.nodeid} uses the database ({sorted(wanted) or 'django_db'}); move it out of tests/unit")


@pytest.fixture(scope="session", autouse=True)
def _pooler_lets_go() -> None:
    """Replaces tests/conftest.py's fixture of that name, which sets up the test database: no pooler here."""


@pytest.fixture(scope="session", autouse=True)
def _json_support_known() -> None:
    """Replaces tests/conftest.py's fixture of that name, which sets up the test database to ask it about
    JSON fields; here ``_model_checks_ask_no_server`` keeps the model checks from asking."""


@pytest.fixture(scope="package", autouse=True)
def _model_checks_ask_no_server() -> Iterator[None]:
    """Django 6.x's ``run_checks()`` hands every database alias to the model checks, and each model then
    asks its databases' backends about its fields, indexes and constraints: whether JSON fields are
    supported, and on MariaDB/MySQL nearly everything, since the answers depend on the server's version
    (a connection). Unit tests run the checks for the outbox's own verdicts, so here the model checks
    are given no database, as Django 5.2 gives them by default.

    Undone when the layer ends: a later layer of the same run (tests/db after tests/unit) checks models
    against the real server."""
    original: Any = next(c for c in registry.registered_checks if getattr(c, "__name__", "") == "check_all_models")

    @functools.wraps(original)  # keeps its tags
    def without_databases(app_configs: Any = None, **kwargs: Any) -> Any:
        return original(app_configs, **{**kwargs, "databases": []})

    registry.registered_checks.discard(original)
    registry.registered_checks.add(cast(Any, without_databases))
    yield
    registry.registered_checks.discard(without_databases)
    registry.registered_checks.add(original)
