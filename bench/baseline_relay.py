"""The same-table reference: bench/minimal_relay.py's relay on the very table the outbox uses.

    python bench/baseline_relay.py DSN

It pays every cost the project's schema imposes (its indexes, its wider updates): what a careful engineer
writes by hand in an afternoon, with no attempt log, retries or reaper. Its claim and acknowledgement, each
one statement, differ from the minimal relay's only in form (a materialized CTE; a fence on the status).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.minimal_relay import main

CLAIM = """
WITH picked AS MATERIALIZED (
    SELECT id FROM django_outbox_message WHERE status = 'pending' AND available_at <= now()
    ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
UPDATE django_outbox_message AS m SET status = 'processing', locked_by = %(me)s,
    locked_until = now() + make_interval(secs => %(lease)s), attempts = m.attempts + 1
FROM picked WHERE m.id = picked.id
RETURNING m.id, m.uuid, m.topic, m.key, m.payload, m.headers, m.attempts
"""
ACK = """
UPDATE django_outbox_message SET status = 'delivered', delivered_at = now(), locked_by = NULL, locked_until = NULL
WHERE id = ANY(%(ids)s) AND locked_by = %(me)s AND status = 'processing'
"""

if __name__ == "__main__":
    main(CLAIM, ACK, "baseline")
