"""The outbox's pytest fixtures, loaded by pytest through the ``pytest11`` entry point of the package.

Like pytest-django's ``mailoutbox``: ``outbox_messages`` is there in every project that installs the
outbox and uses pytest-django, with nothing to add to ``conftest.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from . import OutboxMessages


@pytest.fixture
def outbox_messages(request: pytest.FixtureRequest) -> OutboxMessages:
    """The messages the test sent on the default database, oldest first (see ``OutboxMessages``).

    It asks for pytest-django's ``db`` fixture unless the test already uses ``transactional_db``, so a
    test that takes it may touch the database, as with ``mailoutbox`` it may send mail.
    """
    if "transactional_db" not in request.fixturenames and not _transactional(request):
        request.getfixturevalue("db")
    else:
        request.getfixturevalue("transactional_db")
    return OutboxMessages()


def _transactional(request: pytest.FixtureRequest) -> bool:
    marker: Any = request.node.get_closest_marker("django_db")
    return bool(marker and (marker.kwargs.get("transaction") or (marker.args and marker.args[0])))
