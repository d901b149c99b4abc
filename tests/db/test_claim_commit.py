"""The claim's commit waits for the disk, as every statement of the outbox does (PostgreSQL).

Committing the claim asynchronously was tried and rejected: after a database crash that forgot a
claim, its attempt number could be claimed again by another delivery thread of the same worker, and
the record's fence (worker and attempt number) could no longer tell the two deliveries apart
(docs/performance.md). This pins the decision.
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
        row = cursor.fetchone()
        assert row is not None
        return str(row[0])


@pytest.mark.parametrize("found", [True, False], ids=["claimed", "nothing due"])
def test_the_claim_commits_durably(postgres, found):
    if found:
        MessageFactory()
    with transaction.atomic():  # to look inside the claim's transaction, which is otherwise its own
        claimed = store.claim("default", worker="w1", limit=10, lease_seconds=30)
        assert len(claimed) == int(found)
        assert _synchronous_commit() == "on"


def test_the_record_commits_durably(postgres):
    MessageFactory()
    (claimed,) = store.claim("default", worker="w1", limit=10, lease_seconds=30)
    now = timezone.now()
    outcome = store.Outcome(
        message_id=claimed.pk, number=claimed.attempts, status="delivered", started_at=now, finished_at=now
    )
    with transaction.atomic():
        assert store.record("default", worker="w1", outcomes=[outcome]) == set()
        assert _synchronous_commit() == "on"
