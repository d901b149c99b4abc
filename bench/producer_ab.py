"""The producer side of two source trees in one process: this tree's ``send()`` and ``send_many()`` against
another tree's statement and uuid, interleaved one transaction at a time.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_producer_ab python bench/producer_ab.py BASE_TREE
        [--transactions 150] [--reps 5]

``BASE_TREE`` is a checkout (``git archive <commit> | tar -x -C DIR``) whose ``django_outbox/store/producing.py``
is loaded beside this tree's; each transaction of the ``base`` variant writes through its ``insert()`` and
``insert_many()`` with random (version 4) uuids, the ``new`` one through this tree's with its own uuids.
Validation (``outbox.send()``'s own Python) is this tree's in both, so the difference is the statement,
the uuid and the building of the returned messages. Each transaction creates one ``Order`` and then, by
kind: nothing (``plain``), one ``send()`` (``one``) or ``send_many()`` of 100 (``many``). Every repetition
starts from a vacuumed table holding only ``--history`` delivered rows (random uuids, as a deployment's
history has), after a ``CHECKPOINT``, as production runs between two; the figures are medians of the
repetitions' median times, with the WAL each kind wrote per transaction (``pg_current_wal_insert_lsn()``
before and after).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_producer_ab")
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

from bench.tables import ensure_database  # noqa: E402  (needs ROOT on the path)

KINDS = ("plain", "one", "many")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", type=Path, help="the other source tree")
    parser.add_argument("--transactions", type=int, default=150, help="of each kind and variant per repetition")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--history", type=int, default=0, help="delivered rows in the table throughout")
    parser.add_argument("--output", type=Path, help="write the repetitions and medians here as JSON")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"a comma-separated subset of {','.join(KINDS)}")
    args = parser.parse_args()
    ensure_database(os.environ["DATABASE_URL"])

    import django

    django.setup()
    import psycopg
    from django.core.management import call_command
    from django.db import connection, transaction

    import django_outbox.store as store_package
    from bench import tables
    from django_outbox import api, outbox
    from django_outbox.store import producing
    from testproject.shop.models import Order

    call_command("migrate", verbosity=0)
    with tables.connect(os.environ["DATABASE_URL"]) as conn:
        tables.truncate(conn)
        if args.history:
            tables.fill_history(conn, args.history)
        row = conn.execute(f"SELECT COALESCE(MAX(id), 0) FROM {tables.MESSAGE}").fetchone()
        assert row is not None
        kept = int(str(row[0]))
    spec = importlib.util.spec_from_file_location(
        "django_outbox.store.producing_base", args.base / "django_outbox" / "store" / "producing.py"
    )
    assert spec is not None and spec.loader is not None
    base = importlib.util.module_from_spec(spec)
    base.__package__ = "django_outbox.store"
    sys.modules[spec.name] = base
    spec.loader.exec_module(base)
    base.NewMessage = producing.NewMessage  # type: ignore[attr-defined]  # the one api builds
    variants: dict[str, tuple[Any, Any, Callable[[], uuid.UUID]]] = {
        "new": (producing.insert_many, producing.insert, api.new_uuid),
        "base": (base.insert_many, base.insert, uuid.uuid4),
    }
    monitor = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)

    def lsn() -> str:
        row = monitor.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        return str(row[0])

    def wal_since(start: str) -> int:
        row = monitor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)", [start]).fetchone()
        assert row is not None
        return int(row[0])

    times: dict[tuple[str, str], list[float]] = {}
    wal: dict[tuple[str, str], list[int]] = {}

    def one(variant: str, kind: str) -> None:
        store_package.insert_many, store_package.insert, api.new_uuid = variants[variant]
        start = lsn()
        started = time.perf_counter()
        with transaction.atomic():
            order = Order.objects.create(customer_email="buyer@example.com", item="book", quantity=1)
            payload = {"order_id": order.pk, "item": order.item}
            if kind == "one":
                outbox.send("bench.noop", payload)
            elif kind == "many":
                outbox.send_many([{"topic": "bench.noop", "payload": {**payload, "n": n}} for n in range(100)])
        times.setdefault((variant, kind), []).append(time.perf_counter() - started)
        wal.setdefault((variant, kind), []).append(wal_since(start))

    kinds = [kind for kind in KINDS if kind in args.kinds.split(",")]
    plan = [(variant, kind) for variant in variants for kind in kinds]
    reps: list[dict[str, dict[str, float]]] = []
    for rep in range(args.reps):
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {tables.MESSAGE} WHERE id > %s", [kept])
        monitor.execute(f"VACUUM ANALYZE {tables.MESSAGE}")
        monitor.execute("CHECKPOINT")
        times.clear()
        wal.clear()
        for i in range(args.transactions):
            for variant, kind in plan if i % 2 == 0 else plan[::-1]:
                one(variant, kind)
        result: dict[str, dict[str, float]] = {}
        for variant in variants:
            us = {kind: statistics.median(times[(variant, kind)]) * 1e6 for kind in kinds}
            result[variant] = {f"{kind}_us": us[kind] for kind in kinds}
            for kind in kinds:
                if kind != "plain":
                    result[variant][f"{kind}_wal_bytes"] = statistics.median(wal[(variant, kind)])
            if "many" in us and "one" in us:
                result[variant]["many_vs_one"] = us["many"] / us["one"]
            if "one" in us and "plain" in us:
                result[variant]["one_vs_plain"] = us["one"] / us["plain"]
        reps.append(result)
        print(
            f"rep {rep + 1}: "
            + "; ".join(f"{v} " + ", ".join(f"{k} {x:.2f}" for k, x in r.items()) for v, r in result.items()),
            flush=True,
        )
    print(f"\n{'figure':<18}" + "".join(f"{v:>14}" for v in variants))
    for figure in reps[0]["new"]:
        print(f"{figure:<18}" + "".join(f"{statistics.median([r[v][figure] for r in reps]):>14.2f}" for v in variants))
    if args.output is not None:
        medians = {v: {f: statistics.median([r[v][f] for r in reps]) for f in reps[0][v]} for v in variants}
        document = {"base": str(args.base), "history": args.history, "transactions": args.transactions}
        args.output.write_text(json.dumps({**document, "reps": reps, "medians": medians}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
