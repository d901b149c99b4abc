"""The claim of a 100-message batch costs the same on a small and on a huge message table.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/outbox_claim_bench python bench/claim_cost.py [--rows 2000000]

It creates the database if needed and migrates it, then measures ``store.claim(limit=100)`` (the real
statement, rolled back after each run so every run sees the same rows) in three states of the table:

1. 10,000 delivered messages (keyed, 1,000 keys) + 1,000 claimable pending messages;
2. the same after growing to ``--rows`` delivered messages (default 2,000,000);
3. the same plus 200 blocked keys: each a dead message followed by ``--followers`` pending ones, all
   older than the claimable messages, so every claim walks past them.

It prints the fastest, median and 95th-percentile claim time of each state and fails (exit 1) when
state 2 or 3 is more than ``--tolerance`` (default 25%) slower than state 1. The comparison uses the
fastest run (as ``timeit`` does): on a machine shared with other work the median and the tail measure
the neighbours as much as the claim. It also fails or when the claim's plan has a sequential scan of the
message table or does not use the partial index of pending messages.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.tables import ensure_database  # noqa: E402  (needs ROOT on the path)

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/outbox_claim_bench")
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
os.environ["DEBUG"] = "false"

TABLE = "django_outbox_message"
# Delivered history: keyed like a real application's (1,000 keys, so each key has a long past).
DELIVERED = """
INSERT INTO django_outbox_message (uuid, topic, key, payload, headers, status, attempts, max_attempts,
    available_at, created_at, delivered_at, last_error)
SELECT md5(i::text || clock_timestamp()::text)::uuid, 'topic.' || (i %% 20), 'key-' || (i %% 1000),
       jsonb_build_object('order_id', i), '{}'::jsonb, 'delivered', 1, 5,
       now() - interval '1 day', now() - interval '1 day', now() - interval '1 day', ''
FROM generate_series(1, %(n)s) AS i
"""
# Claimable now: half keyed (one message per fresh key), half keyless.
PENDING = """
INSERT INTO django_outbox_message (uuid, topic, key, payload, headers, status, attempts, max_attempts,
    available_at, created_at, last_error)
SELECT md5(i::text || clock_timestamp()::text)::uuid, 'topic.' || (i %% 20),
       CASE WHEN i %% 2 = 0 THEN 'fresh-' || i END, jsonb_build_object('order_id', i), '{}'::jsonb,
       'pending', 0, 5, now() - interval '1 minute', now() - interval '1 minute', ''
FROM generate_series(1, %(n)s) AS i
"""
BLOCKED = """
INSERT INTO django_outbox_message (uuid, topic, key, payload, headers, status, attempts, max_attempts,
    available_at, created_at, last_error)
SELECT md5(k::text || '-' || j::text || clock_timestamp()::text)::uuid, 'topic.1', 'blocked-' || k,
       '{}'::jsonb, '{}'::jsonb, CASE WHEN j = 0 THEN 'dead' ELSE 'pending' END,
       CASE WHEN j = 0 THEN 5 ELSE 0 END, 5, now() - interval '1 hour', now() - interval '1 hour',
       CASE WHEN j = 0 THEN 'refused' ELSE '' END
FROM generate_series(1, 200) AS k, generate_series(0, %(followers)s) AS j
ORDER BY k, j
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000, help="delivered rows of the big table")
    parser.add_argument("--followers", type=int, default=5, help="pending messages behind each blocked key")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--tolerance", type=float, default=0.25)
    args = parser.parse_args()
    ensure_database(os.environ["DATABASE_URL"])

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from django_outbox import store

    call_command("migrate", database="default", verbosity=0)

    def run(sql: str, **params: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)

    def settle() -> None:
        run(f"VACUUM ANALYZE {TABLE}")

    def measure(label: str) -> float:
        times = []
        for _ in range(args.repeat):
            with transaction.atomic():
                started = time.perf_counter()
                claimed = store.claim("default", worker="bench", limit=100, lease_seconds=60)
                times.append((time.perf_counter() - started) * 1000)
                transaction.set_rollback(True)
            assert len(claimed) == 100, f"{label}: claimed {len(claimed)}"
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {TABLE}")
            total = cursor.fetchone()[0]
        p95 = statistics.quantiles(times, n=20)[-1]
        print(f"{label:<46}{total:>11,}{min(times):>9.2f}{statistics.median(times):>11.2f}{p95:>9.2f}", flush=True)
        return min(times)

    def plan() -> str:
        sql, params = store.claim_sql(connection, worker="bench", limit=100, lease_seconds=60)
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + sql, params)
            return "\n".join(row[0] for row in cursor.fetchall())

    print("resetting the table ...", flush=True)
    run(f"TRUNCATE {TABLE} CASCADE")
    run(DELIVERED, n=10_000)
    run(PENDING, n=1_000)
    settle()
    print(f"\n{'state':<46}{'rows':>11}{'min ms':>9}{'median ms':>11}{'p95 ms':>9}")
    small = measure("1. 10,000 delivered")

    print(f"growing to {args.rows:,} delivered rows ...", flush=True)
    started = time.monotonic()
    run(f"DELETE FROM {TABLE} WHERE status = 'pending'")
    run(DELIVERED, n=args.rows - 10_000)
    run(PENDING, n=1_000)  # newest again, as in a live system
    settle()
    print(f"(filled in {time.monotonic() - started:.0f}s)", flush=True)
    big = measure(f"2. {args.rows:,} delivered")

    run(f"DELETE FROM {TABLE} WHERE status = 'pending'")
    run(BLOCKED, followers=args.followers)
    run(PENDING, n=1_000)
    settle()
    blocked = measure(f"3. + 200 blocked keys x {args.followers} waiting")

    claim_plan = plan()
    failures = []
    for label, value in (("big table", big), ("blocked keys", blocked)):
        if value > small * (1 + args.tolerance):
            failures.append(f"{label}: {value:.2f} ms is more than {args.tolerance:.0%} above {small:.2f} ms")
    if f"Seq Scan on {TABLE}" in claim_plan:
        failures.append("the claim plans a sequential scan of the message table")
    if "outbox_msg_pending_idx" not in claim_plan:
        failures.append("the claim does not use the partial index of pending messages")
    print("\nclaim plan:\n" + claim_plan + "\n")
    for failure in failures:
        print("FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
