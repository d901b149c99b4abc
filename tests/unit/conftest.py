"""The unit layer: no database, no network, nothing running. Tests here that ask for a database fail."""

from __future__ import annotations

import pytest
from django.db import connections

#: pytest-django's and Django's fixtures that reach a database or a server.
DATABASE_FIXTURES = frozenset(
    {"db", "transactional_db", "django_db_setup", "live_server", "admin_client", "admin_user"}
)

#: Every database this project supports (PostgreSQL; SQLite, which Python builds with JSON1) stores JSON.
JSON_VENDORS = frozenset({"postgresql", "sqlite"})


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
    """Replaces tests/conftest.py's fixture of that name, which sets up the test database to ask.

    Django 6.x's model checks ask each database whether it supports JSON fields, which would connect
    from a unit test that runs ``run_checks()``. The answer holds for every supported vendor, so tell
    Django instead of asking (unless an earlier layer of the same run asked already)."""
    for alias in connections:
        features = connections[alias].features
        if "supports_json_field" not in features.__dict__ and connections[alias].vendor in JSON_VENDORS:
            features.supports_json_field = True
