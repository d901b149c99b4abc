"""How fast a keyed backlog drains by the number of keys, and what one claim costs by the backlog behind a few.

Drain: ``--messages`` pending messages round-robin over K keys (``--keys``; 0: none), committed at once, two
``outbox_worker --until-empty`` processes: the rate from the first to the last ``delivered_at`` (by ``--cut``),
against the unkeyed drain of the same repetition. Claim cost: the median of 20 claims of 100 (each released
again) from B (``--backlogs``) pending messages on 5 keys, which should not grow with B.
"""

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import common, procs, tables
from bench.common import median, sql

PROCESSES = 2


def refill(vendor: str, n: int, keys: int) -> None:
    sql("DELETE FROM django_outbox_attempt")
    sql("DELETE FROM django_outbox_message")
    tables.fill(vendor, n, key=f"CONCAT('key-', i % {keys})" if keys else "NULL")


def drain(vendor: str, messages: int, keys: int, cut: float) -> float:
    refill(vendor, messages, keys)
    dsn = os.environ["DATABASE_URL"]
    workers = [procs.outbox_worker(dsn, "--until-empty", "--poll-interval", "0.2") for _ in range(PROCESSES)]
    deadline = time.monotonic() + cut
    try:
        while any(w.alive() for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        procs.stop_all(workers)
    count, first, last = sql(
        "SELECT COUNT(*), MIN(delivered_at), MAX(delivered_at) FROM django_outbox_message WHERE status = 'delivered'"
    )[0]
    if not count or first is None or last is None or last <= first:
        return 0.0
    return float(count) / float((last - first).total_seconds())


def claim_cost(vendor: str, backlog: int) -> float:
    from django.db import connection

    from django_outbox.store import claiming

    refill(vendor, backlog, 5)
    times = []
    for _ in range(20):
        started = time.perf_counter()
        claimed = claiming.claim("default", worker="bench:1:claim", limit=100, lease_seconds=60)
        times.append(time.perf_counter() - started)
        ids = ",".join(str(m.id) for m in claimed) or "0"
        sql(
            "UPDATE django_outbox_message SET status = 'pending', attempts = 0, locked_by = NULL, locked_until = NULL"
            f" WHERE id IN ({ids})"
        )
    connection.close()
    return median(times)


def measure(vendor: str, args: Any) -> dict[str, Any]:
    tables.ensure_database(os.environ["DATABASE_URL"], fresh=True)
    common.setup_django("default")
    rates: dict[int, list[float]] = {int(k): [] for k in args.keys.split(",")}
    for rep in range(args.reps):
        for keys, rate in rates.items():
            rate.append(drain(vendor, args.messages, keys, args.cut))
        print(f"{vendor} rep {rep + 1}: " + ", ".join(f"{k or 'no'} keys {r[-1]:,.0f}/s" for k, r in rates.items()))
    ratios = {k: [r / u if u else float("nan") for r, u in zip(rates[k], rates[0], strict=True)] for k in rates}
    costs = {}
    for backlog in (int(b) for b in args.backlogs.split(",")):
        costs[backlog] = claim_cost(vendor, backlog)
        print(f"claim of 100 with {backlog:,} pending on 5 keys: {costs[backlog] * 1000:.2f} ms", flush=True)
    return {"rates": rates, "ratios": ratios, "claim_cost_s": costs}


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--databases", default="postgresql,mysql")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--keys", default="0,10000,100,5,1")
    parser.add_argument("--cut", type=float, default=90.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--backlogs", default="1000,10000,100000")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.keys.split(",")[0] != "0":
        parser.error("--keys must start with 0: every figure is a ratio to the unkeyed drain of its repetition")
    common.by_database(
        args, "bench_keyed", lambda vendor: measure(vendor, args), messages=args.messages, processes=PROCESSES
    )


if __name__ == "__main__":
    main()
