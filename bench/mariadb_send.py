"""MariaDB: the cost of ``send()`` beside a hand-written floor, measured in the same run.

    DATABASE_URL=mysql://root@127.0.0.1:3306/bench_outbox python bench/mariadb_send.py [--transactions 1000]
        [--reps 3] [--output FILE]

Creates, migrates and empties the database of DATABASE_URL. Each transaction is the business write (an
order) plus: ``send`` (``outbox.send()``, no key); ``floor`` (the same row by one hand-written ``INSERT``
into the project's own table); ``send_keyed`` and ``floor_keyed`` (with a key, the floor then being the
two statements per-key order needs on MariaDB: the key's lock row, then the row); ``plain`` (nothing).
The kinds are interleaved one transaction at a time; the figures are ratios of median transaction times,
their median over the repetitions. The target: ``send`` at most 1.1x its floor.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import common  # noqa: E402

MODES = ["plain", "send", "floor", "send_keyed", "floor_keyed"]
FLOOR = (
    "INSERT INTO django_outbox_message (uuid, topic, `key`, payload, headers, idempotency_key, status, attempts,"
    " max_attempts, available_at, created_at, last_error) VALUES (REPLACE(UUID(), '-', ''), 'bench.noop', %s, %s,"
    " '{}', NULL, 'pending', 0, 5, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), '')"
)
LOCK = "INSERT INTO django_outbox_key_lock (`key`) VALUES (%s) ON DUPLICATE KEY UPDATE `key` = `key`"


def measure(transactions: int, reps: int, log: Any) -> dict[str, Any]:
    from django_outbox import outbox

    def write(mode: str, i: int, order: Any) -> None:
        payload, key = common.order_payload(order), f"order-{i % 50}"
        if mode == "send":
            outbox.send("bench.noop", payload)
        elif mode == "send_keyed":
            outbox.send("bench.noop", payload, key=key)
        elif mode == "floor":
            common.execute(FLOOR, [None, json.dumps(payload)])
        elif mode == "floor_keyed":
            common.execute(LOCK, [key])
            common.execute(FLOOR, [key, json.dumps(payload)])

    def run(n: int) -> dict[str, float]:
        return common.per_transaction(MODES, n, lambda m, i: common.business_transaction(i, lambda o: write(m, i, o)))

    def empty() -> None:
        for table in ("django_outbox_message", "django_outbox_key_lock", "shop_order"):
            common.sql(f"DELETE FROM {table}")

    empty()
    run(max(50, transactions // 10))  # warm-up: connection, caches
    results: list[dict[str, float]] = []
    for rep in range(reps):
        empty()
        results.append(run(transactions))
        log(f"  rep {rep + 1}: " + ", ".join(f"{k} {v:.0f} µs" for k, v in results[-1].items()))
    empty()

    def ratio(mode: str, reference: str) -> float:
        return round(common.ratio(results, mode, reference), 3)

    return {
        "transactions_per_kind_per_rep": transactions,
        "reps": results,
        "send_vs_floor": ratio("send", "floor"),
        "send_keyed_vs_floor_keyed": ratio("send_keyed", "floor_keyed"),
        "send_vs_plain": ratio("send", "plain"),
        "floor_vs_plain": ratio("floor", "plain"),
        "send_keyed_vs_plain": ratio("send_keyed", "plain"),
    }


def main() -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--transactions", type=int, default=1000, help="transactions of each kind per repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--output", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("mysql"):
        parser.error("DATABASE_URL must name a MariaDB database of the benchmark's own (mysql://...)")
    common.setup_django("default")
    version = common.sql("SELECT VERSION()")[0][0]
    print(f"send() on {version}: {args.transactions} transactions of each kind x {args.reps}", flush=True)
    figures = {"server": version, **measure(args.transactions, args.reps, lambda s: print(s, flush=True))}
    print(
        f"send() {figures['send_vs_floor']}x its hand-written INSERT floor (target <= 1.1x); keyed"
        f" {figures['send_keyed_vs_floor_keyed']}x its two-statement floor; send() {figures['send_vs_plain']}x"
        f" the business transaction alone (the floor {figures['floor_vs_plain']}x)"
    )
    if args.output:
        common.write_json(args.output, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
