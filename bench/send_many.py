"""``outbox.send_many()``: 100 messages in one business transaction against one ``send()``.

    python bench/send_many.py [--transactions 200] [--reps 5] [--database default|sqlite]

Each transaction creates one ``Order`` (the business row) and then writes, by kind:

- ``plain``: nothing more (the business transaction alone);
- ``send_1``: one ``outbox.send()``;
- ``keyed_send_1``: one ``outbox.send()`` with a key (on PostgreSQL it takes the key's advisory lock);
- ``send_many_100``: one ``outbox.send_many()`` of 100 messages;
- ``send_loop_100``: 100 ``outbox.send()`` calls, what ``send_many()`` replaces.

The kinds are interleaved one transaction at a time (the order reversed every other round), so each sees
the same load of a shared machine; each repetition gives the median transaction time of every kind, and
the figures are medians of the repetitions' ratios. The target: ``send_many_100`` at most 2x ``send_1``.
Prints a table and writes ``bench/results/performance-send-many.json``. Exit 1 when the target is missed.

``default`` is PostgreSQL from ``DATABASE_URL`` (a database of its own, made if missing); ``sqlite`` is
the benchmark's SQLite file (bench/settings.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.tables import ensure_database  # noqa: E402  (needs ROOT on the path)

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/outbox_send_many_bench")
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

KINDS = ("plain", "send_1", "keyed_send_1", "send_many_100", "send_loop_100")
TARGET = 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transactions", type=int, default=200, help="transactions of each kind per repetition")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--database", default="default", choices=["default", "sqlite"])
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "performance-send-many.json")
    args = parser.parse_args()
    ensure_database(os.environ["DATABASE_URL"])

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections, transaction

    from django_outbox import outbox
    from django_outbox.models import Message
    from testproject.shop.models import Order

    alias = args.database
    call_command("migrate", database=alias, verbosity=0)
    conn = connections[alias]

    def one(kind: str, i: int) -> float:
        started = time.perf_counter()
        with transaction.atomic(using=alias):
            order = Order.objects.using(alias).create(customer_email="buyer@example.com", item="book", quantity=1)
            payload = {"order_id": order.pk, "item": order.item}
            if kind == "send_1":
                outbox.send("bench.noop", payload, using=alias)
            elif kind == "keyed_send_1":
                outbox.send("bench.noop", payload, key=f"order-{order.pk}", using=alias)
            elif kind == "send_many_100":
                outbox.send_many(
                    [{"topic": "bench.noop", "payload": {**payload, "n": n}} for n in range(100)], using=alias
                )
            elif kind == "send_loop_100":
                for n in range(100):
                    outbox.send("bench.noop", {**payload, "n": n}, using=alias)
        return time.perf_counter() - started

    def empty() -> None:
        with conn.cursor() as cursor:
            for table in (Message._meta.db_table, Order._meta.db_table):
                cursor.execute(f"DELETE FROM {table}")
        if conn.vendor == "postgresql":
            with conn.cursor() as cursor:
                cursor.execute(f"VACUUM ANALYZE {Message._meta.db_table}")

    def run(n: int) -> dict[str, float]:
        times: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for i in range(n):
            for kind in KINDS if i % 2 == 0 else KINDS[::-1]:
                times[kind].append(one(kind, i))
        return {kind: median(values) * 1e6 for kind, values in times.items()}

    empty()
    run(max(10, args.transactions // 10))  # warm-up: connections, caches, plans
    reps = []
    for rep in range(args.reps):
        empty()
        times = run(args.transactions)
        reps.append(times)
        print(f"rep {rep + 1}: " + ", ".join(f"{k} {v:.0f} µs" for k, v in times.items()), flush=True)

    def ratio(kind: str, reference: str) -> float:
        return median([r[kind] / r[reference] for r in reps])

    result = {
        "database": conn.vendor,
        "transactions_per_kind_and_rep": args.transactions,
        "reps": reps,
        "us_per_tx": {kind: median([r[kind] for r in reps]) for kind in KINDS},
        "send_many_100_vs_send_1": ratio("send_many_100", "send_1"),
        "send_loop_100_vs_send_1": ratio("send_loop_100", "send_1"),
        "send_many_100_vs_send_loop_100": ratio("send_many_100", "send_loop_100"),
        "send_1_vs_plain": ratio("send_1", "plain"),
        "keyed_send_1_vs_send_1": ratio("keyed_send_1", "send_1"),
        "target": f"send_many_100 <= {TARGET}x send_1",
    }
    result["ok"] = result["send_many_100_vs_send_1"] <= TARGET
    print(f"\n{'kind':<16}{'µs/tx (median)':>16}")
    for kind in KINDS:
        print(f"{kind:<16}{result['us_per_tx'][kind]:>16.0f}")
    print(
        f"\nsend_many(100) / send() x1: {result['send_many_100_vs_send_1']:.2f}x (target <= {TARGET}x)"
        f"\n100 x send() / send() x1: {result['send_loop_100_vs_send_1']:.2f}x"
        f"\nsend_many(100) / 100 x send(): {result['send_many_100_vs_send_loop_100']:.2f}x"
        f"\nsend() x1 / business transaction alone: {result['send_1_vs_plain']:.2f}x"
        f"\nkeyed send() / send(): {result['keyed_send_1_vs_send_1']:.2f}x"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
