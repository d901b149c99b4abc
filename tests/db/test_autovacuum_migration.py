"""The message table ships with autovacuum settings for a queue (PostgreSQL), and they can be undone."""

from __future__ import annotations

import importlib

import pytest
from django.db import connection

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("postgres")]

migration = importlib.import_module("django_outbox.migrations.0003_message_autovacuum")


def table_options() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'django_outbox_message'")
        (options,) = cursor.fetchone()
    # Only the settings of this migration: 0008 adds a fillfactor beside them.
    return {k: v for k, v in (option.split("=", 1) for option in options or []) if k in migration.SETTINGS}


def test_migrated_table_carries_the_settings():
    assert table_options() == migration.SETTINGS


def test_reverse_resets_them_and_forward_sets_them_again():
    with connection.schema_editor() as editor:
        migration.untune(None, editor)
    assert table_options() == {}
    with connection.schema_editor() as editor:
        migration.tune(None, editor)
    assert table_options() == migration.SETTINGS
