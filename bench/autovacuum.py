"""What the initial migration's autovacuum settings buy: a steady outbox with a long history, tuned against default.

On a private server (PostgreSQL's default autovacuum, which the shared one may run without; fsync off: pages
read are measured, not durability), per setting (the migration's ``SET``, or ``RESET``; alternating): a
``--history`` of delivered messages, then ``--rate`` messages a second while one worker relays them, for
``--seconds``. Every 5 s: the pages (and time) of the claim's index walk to the first 100 pending, dead row
versions, autovacuum runs and pending messages; medians and maxima over the window's second half.
"""

import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import common, procs, tables
from bench.common import median
from tests.chaos.run import PrivateCluster

WALK = (
    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT id FROM django_outbox_message"
    " WHERE status = 'pending' AND available_at <= now() ORDER BY id LIMIT 100"
)
STATS = (
    "SELECT n_dead_tup, autovacuum_count, (SELECT count(*) FROM django_outbox_message WHERE status = 'pending')"
    " FROM pg_stat_user_tables WHERE relname = 'django_outbox_message'"
)


def walk(conn: Any) -> tuple[int, float]:
    """The pages the claim's index walk reads, and its milliseconds."""
    with conn.transaction():
        conn.execute("SET LOCAL enable_sort = off")
        plan = conn.execute(WALK).fetchone()[0][0]
    top = plan["Plan"]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0)), float(plan["Execution Time"])


def stats(conn: Any) -> list[float]:
    """The message table's dead row versions, autovacuum runs and pending messages."""
    return [float(value) for value in conn.execute(STATS).fetchone()]


def run_once(dsn: str, *, tuned: bool, history: int, rate: int, seconds: float) -> dict[str, Any]:
    initial = importlib.import_module("django_outbox.migrations.0001_initial")
    # Only the autovacuum settings: the fillfactor beside them is kept in both runs.
    autovacuum = {k: v for k, v in initial.PG_MESSAGE_STORAGE.items() if k.startswith("autovacuum_")}
    change = ", ".join(f"{k} = {v}" for k, v in autovacuum.items()) if tuned else ", ".join(autovacuum)
    with tables.connect(dsn) as conn:
        tables.truncate(conn)
        conn.execute(f"ALTER TABLE {tables.MESSAGE} {'SET' if tuned else 'RESET'} ({change})")
        tables.fill_history(conn, history)
        tables.vacuum(conn)
        conn.execute("CHECKPOINT")
        vacuums_before = stats(conn)[1]
        options = conn.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [tables.MESSAGE]).fetchone()
    # Housekeeping off: its archiving of the history, not the relaying, would decide when autovacuum runs.
    worker = procs.outbox_worker(dsn, "--batch-size", "100", env={"BENCH_HOUSEKEEPING_INTERVAL": "0"})
    per_tx, sent = max(1, rate // 10), 0
    samples: list[dict[str, float]] = []
    try:
        worker.wait_for_line("relaying")
        with tables.connect(dsn) as producer, tables.connect(dsn) as conn:
            started = next_at = time.monotonic()
            next_sample = started + 5.0
            while time.monotonic() - started < seconds:
                tables.fill_pending(producer, per_tx)  # a commit every 0.1 s
                sent += per_tx
                if time.monotonic() >= next_sample:
                    next_sample += 5.0
                    pages, ms = walk(conn)
                    dead, vacuums, pending = stats(conn)
                    t = time.monotonic() - started
                    samples.append({"t": t, "pages": pages, "ms": ms, "dead": dead, "pending": pending})
                    samples[-1]["vacuums"] = vacuums - vacuums_before
                next_at += 0.1
                time.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        procs.stop_all([worker])
    late = [s for s in samples if s["t"] >= seconds / 2]
    result: dict[str, Any] = {"tuned": tuned, "reloptions": options[0] if options else None, "sent": sent}
    result["autovacuum_runs"] = samples[-1]["vacuums"] if samples else 0
    for name, key in (("walk_pages", "pages"), ("walk_ms", "ms"), ("dead", "dead")):
        result |= {f"{name}_median": median([s[key] for s in late]), f"{name}_max": max(s[key] for s in late)}
    return result | {"pending_max": max(s["pending"] for s in samples), "samples": samples}


def main() -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=500, help="messages per second (default 500)")
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cluster = PrivateCluster(55433)
    try:
        cluster.start()
        os.environ["DATABASE_URL"] = cluster.url
        common.setup_django("default")
        results = []
        for first in common.interleaved(args.reps):
            for tuned in (first, not first):
                print(f"{'tuned' if tuned else 'default'} ...", flush=True)
                result = run_once(cluster.url, tuned=tuned, history=args.history, rate=args.rate, seconds=args.seconds)
                results.append(result)
                print("  " + ", ".join(f"{k} {v:,.2f}" for k, v in result.items() if isinstance(v, float)), flush=True)
    finally:
        from django.db import connections

        connections.close_all()
        cluster.remove()
    if args.json:
        common.write_json(args.json, {"args": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
