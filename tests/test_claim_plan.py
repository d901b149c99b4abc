"""The claim reads only what is deliverable: partial indexes, never a sequential scan (PostgreSQL)."""

from __future__ import annotations

import pytest
from django.db import connection

from django_outbox import store

pytestmark = pytest.mark.django_db(transaction=True)

FILL = """
INSERT INTO django_outbox_message (uuid, topic, key, payload, headers, status, attempts, max_attempts,
    available_at, created_at, delivered_at, last_error, visible_after_xid)
SELECT md5(i::text)::uuid, 'probe.t', 'key-' || (i % 500), '{}'::jsonb, '{}'::jsonb,
       CASE WHEN i % 100 = 0 THEN 'pending' WHEN i % 997 = 0 THEN 'dead' ELSE 'delivered' END,
       1, 5, now(), now(), now(), '', 1
FROM generate_series(1, 30000) AS i
"""


def test_the_claim_uses_the_partial_indexes_and_no_sequential_scan(postgres):
    with connection.cursor() as cursor:
        cursor.execute(FILL)
        cursor.execute("ANALYZE django_outbox_message")
        for topics in (None, ["probe.*"]):
            sql, params = store.claim_sql(connection, worker="w", limit=100, lease_seconds=60, topics=topics)
            cursor.execute("EXPLAIN " + sql, params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "Seq Scan" not in plan, plan
            assert "Index Scan using outbox_msg_pending_idx on django_outbox_message c" in plan, plan
            assert "using outbox_msg_key_open_idx on django_outbox_message b" in plan, plan
            assert "using outbox_msg_unfenced_idx" in plan, plan
