"""The archive tables outside Django's test flush, emptied before and after each test that uses them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection

from django_outbox.retention import housekeeping


@pytest.fixture
def empty_archive(django_db_blocker) -> Iterator[None]:
    """The archive tables are not Django-managed, so the test flush leaves them alone: empty them here.

    Before the test as well as after: a test that archives without this fixture leaves rows behind, and
    which test runs next in the same process depends on how pytest-xdist shares the files out (seen: the
    admin listing the archive for a project that deletes, after another file's housekeeping run).
    """
    with django_db_blocker.unblock():
        empty()
    yield
    with django_db_blocker.unblock():
        empty()


def empty() -> None:
    with connection.cursor() as cursor:
        for table in (housekeeping.ARCHIVED_ATTEMPT, housekeeping.ARCHIVED_MESSAGE):
            cursor.execute(f"DELETE FROM {table}")
            if connection.vendor == "postgresql":
                for name in housekeeping.partitions(connection, table):
                    cursor.execute(f"DROP TABLE {name}")
