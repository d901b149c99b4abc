"""The claim commits without waiting for the disk; the record and everything else stay durable (PostgreSQL).

A claim only leases: if a database crash forgets it, its messages are pending again and the delivery
is recorded as a lost lease (docs/reliability.md). The record is what the audit log keeps, so it waits.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_outbox import store

from .factories import MessageFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


@pytest.mark.parametrize("found", [True, False], ids=["claimed", "nothing due"])
def test_the_claim_asks_its_own_transaction_not_to_wait_for_the_disk(postgres, found):
    if found:
        MessageFactory()
    assert _synchronous_commit() == "on"
    with transaction.atomic():  # to look inside the claim's transaction, which is otherwise its own
        claimed = store.claim("default", worker="w1", limit=10, lease_seconds=30)
        assert len(claimed) == int(found)
        assert _synchronous_commit() == "off"
    assert _synchronous_commit() == "on", "the setting is local to the claim's transaction"


def test_the_record_and_the_next_transactions_wait_for_the_disk(postgres):
    MessageFactory()
    (claimed,) = store.claim("default", worker="w1", limit=10, lease_seconds=30)
    now = timezone.now()
    outcome = store.Outcome(
        message_id=claimed.pk, number=claimed.attempts, status="delivered", started_at=now, finished_at=now
    )
    with transaction.atomic():
        assert store.record("default", worker="w1", outcomes=[outcome]) == set()
        assert _synchronous_commit() == "on"
    with transaction.atomic():  # a handler's own transaction on the worker's connection
        assert _synchronous_commit() == "on"
