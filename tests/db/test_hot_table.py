"""The hot table's shape at work: attempts without a database foreign key, and a lease extension that
rewrites no index entry (PostgreSQL)."""

from __future__ import annotations

import importlib

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_outbox import store
from django_outbox.models import Attempt, Message

pytestmark = pytest.mark.django_db(transaction=True)

initial = importlib.import_module("django_outbox.migrations.0001_initial")


def test_attempts_have_no_database_foreign_key_but_keep_the_relation():
    """The record checks that the message is there in its own statement; the database no longer does."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "django_outbox_attempt")
    assert not [name for name, c in constraints.items() if c["foreign_key"]], constraints
    message = Message.objects.create(topic="t", payload={}, max_attempts=5)
    now = timezone.now()
    Attempt.objects.create(message=message, number=1, started_at=now, finished_at=now, outcome="delivered")
    assert [a.number for a in message.attempt_log.all()] == [1]
    assert Attempt.objects.get().message == message


@pytest.mark.usefixtures("postgres")
def test_extending_a_lease_is_a_hot_update():
    """No index holds ``locked_until`` and the table keeps room on its pages, so the heartbeat rewrites
    no index entry."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'django_outbox_message'")
        (options,) = cursor.fetchone()
        assert f"fillfactor={initial.PG_MESSAGE_STORAGE['fillfactor']}" in options
    for i in range(20):
        Message.objects.create(topic="t", payload={"n": i}, max_attempts=5)
    claimed = store.claim("default", worker="w", limit=20, lease_seconds=60)
    assert len(claimed) == 20
    with connection.cursor() as cursor:
        cursor.execute("VACUUM django_outbox_message")  # the claim's old row versions, so each page has room
    counters = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'django_outbox_message'"
    with transaction.atomic(), connection.cursor() as cursor:  # the counters' difference in one transaction
        cursor.execute(counters)
        upd, hot = cursor.fetchone()
        assert store.extend_leases("default", worker="w", lease_seconds=120) == 20
        cursor.execute(counters)
        assert cursor.fetchone() == (upd + 20, hot + 20)
