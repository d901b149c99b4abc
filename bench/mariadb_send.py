"""MariaDB: the cost of ``send()`` beside a hand-written floor, measured in the same run.

    DATABASE_URL=mysql://root@127.0.0.1:3306/bench_outbox python bench/mariadb_send.py [--transactions 1000]
        [--reps 3] [--output FILE]

Creates the database named in DATABASE_URL if needed, migrates it and empties the outbox tables: point it
at a database of its own. Each transaction is the business write (an order) plus one of:

- ``send``: ``outbox.send()`` of one message, no key;
- ``floor``: the same row written by one hand-written ``INSERT`` into the project's own table (what no
  outbox on this table can beat: one statement);
- ``send_keyed`` and ``floor_keyed``: the same with an ordering key, the floor then being the two
  statements per-key commit order needs on MariaDB (the key's lock row, then the row);
- ``plain``: the business write alone.

The kinds are interleaved one transaction at a time (the order reversed every other round), so each sees
the same load of a shared machine; the figures are ratios of median transaction times, per repetition,
and their median over the repetitions. The target: ``send`` at most 1.1x its floor.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

MODES = ["plain", "send", "floor", "send_keyed", "floor_keyed"]
FLOOR = (
    "INSERT INTO django_outbox_message (uuid, topic, `key`, payload, headers, idempotency_key, status, attempts,"
    " max_attempts, available_at, created_at, last_error) VALUES (REPLACE(UUID(), '-', ''), 'bench.noop', %s, %s,"
    " '{}', NULL, 'pending', 0, 5, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), '')"
)
LOCK = "INSERT INTO django_outbox_key_lock (`key`) VALUES (%s) ON DUPLICATE KEY UPDATE `key` = `key`"


def ensure_database(dsn: str) -> None:
    import MySQLdb

    url = urlparse(dsn)
    name = url.path.lstrip("/")
    conn = MySQLdb.connect(
        host=url.hostname or "127.0.0.1",
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
    )
    try:
        conn.cursor().execute(
            f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
        )
    finally:
        conn.close()


def measure(transactions: int, reps: int, log: Any) -> dict[str, Any]:
    from django.db import connection, transaction

    from django_outbox import outbox
    from testproject.shop.models import Order

    def one(mode: str, i: int) -> float:
        started = time.perf_counter()
        with transaction.atomic():
            order = Order.objects.create(customer_email="buyer@example.com", item="book", quantity=1 + i % 3)
            payload = {"order_id": order.pk, "item": order.item, "quantity": order.quantity}
            key = f"order-{i % 50}"
            if mode == "send":
                outbox.send("bench.noop", payload)
            elif mode == "send_keyed":
                outbox.send("bench.noop", payload, key=key)
            elif mode == "floor":
                with connection.cursor() as cursor:
                    cursor.execute(FLOOR, [None, json.dumps(payload)])
            elif mode == "floor_keyed":
                with connection.cursor() as cursor:
                    cursor.execute(LOCK, [key])
                    cursor.execute(FLOOR, [key, json.dumps(payload)])
        return time.perf_counter() - started

    def run(n: int) -> dict[str, float]:
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        for i in range(n):
            for mode in MODES if i % 2 == 0 else MODES[::-1]:
                times[mode].append(one(mode, i))
        return {mode: statistics.median(values) * 1e6 for mode, values in times.items()}

    def empty() -> None:
        with connection.cursor() as cursor:
            for table in ("django_outbox_message", "django_outbox_key_lock", "shop_order"):
                cursor.execute(f"DELETE FROM {table}")

    empty()
    run(max(50, transactions // 10))  # warm-up: connection, caches
    results: list[dict[str, float]] = []
    for rep in range(reps):
        empty()
        times = run(transactions)
        results.append(times)
        log(f"  rep {rep + 1}: " + ", ".join(f"{k} {v:.0f} µs" for k, v in times.items()))
    empty()

    def ratio(mode: str, reference: str) -> float:
        return round(statistics.median(r[mode] / r[reference] for r in results), 3)

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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transactions", type=int, default=1000, help="transactions of each kind per repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--output", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    dsn = os.environ.get("DATABASE_URL", "")
    if not dsn.startswith("mysql"):
        parser.error("DATABASE_URL must name a MariaDB database of the benchmark's own (mysql://...)")
    ensure_database(dsn)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", database="default", verbosity=0)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT VERSION()")
        version = cursor.fetchone()[0]
    print(f"send() on {version}: {args.transactions} transactions of each kind x {args.reps}", flush=True)
    figures = {"server": version, **measure(args.transactions, args.reps, lambda s: print(s, flush=True))}
    print(
        f"send() {figures['send_vs_floor']}x its hand-written INSERT floor (target <= 1.1x); keyed"
        f" {figures['send_keyed_vs_floor_keyed']}x its two-statement floor; send() {figures['send_vs_plain']}x"
        f" the business transaction alone (the floor {figures['floor_vs_plain']}x)"
    )
    if args.output:
        args.output.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
