"""Two schemas of the message table under the same code, in one process, interleaved batch by batch.

    python bench/schema_ab.py [--before 0001_initial] [--batches 300] [--history 200000]
        [--dsn-prefix postgres://postgres@127.0.0.1:5432/bench_schema]

On a machine shared with other work a drain's rate moves by 2x from one minute to the next, which hides
what a schema change buys. This measures the hot path's three statements, ``send()`` (one message per
transaction), the claim of 100 and the record of 100, on two databases migrated to two states of the
schema (``<prefix>_before`` at ``--before``, ``<prefix>_after`` at the latest migration), alternating
between them batch by batch in a random order, and reports the median of the paired ratios after/before
(below 1: the new schema is cheaper). Both tables carry ``--history`` delivered rows.

``--before`` names a migration of this tree. The figures of docs/performance.md ("The hot table") compare
two states of the schema from before its migrations were folded into one initial migration: to measure
those again, run this script from a checkout of a commit before the fold, with ``--before 0006``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

from bench import tables  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="0001_initial")
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--history", type=int, default=200_000)
    parser.add_argument("--dsn-prefix", default="postgres://postgres@127.0.0.1:5432/bench_schema")
    args = parser.parse_args()
    dsns = {name: f"{args.dsn_prefix}_{name}" for name in ("before", "after")}
    for dsn in dsns.values():
        tables.ensure_database(dsn)
    os.environ["DATABASE_URL"] = dsns["after"]

    import django
    from django.conf import settings

    settings.DATABASES["before"] = {**settings.DATABASES["default"], "NAME": dsns["before"].rsplit("/", 1)[1]}
    django.setup()
    from django.core.management import call_command
    from django.db import connections, transaction
    from django.utils import timezone

    from django_outbox import outbox, store

    call_command("migrate", database="before", verbosity=0)
    call_command("migrate", "django_outbox", args.before, database="before", verbosity=0)  # backwards
    call_command("migrate", database="default", verbosity=0)
    aliases = {"before": "before", "after": "default"}
    for dsn in dsns.values():
        with tables.connect(dsn) as conn:
            tables.truncate(conn)
            if args.history:
                tables.fill_history(conn, args.history)
            tables.vacuum(conn)

    def one(alias: str) -> tuple[float, float, float]:
        t = time.perf_counter()
        for i in range(100):
            with transaction.atomic(using=alias):
                outbox.send("bench.noop", {"order_id": i, "item": "book"}, using=alias)
        send_s = time.perf_counter() - t
        t = time.perf_counter()
        batch = store.claim(alias, worker="bench:ab", limit=100, lease_seconds=60)
        claim_s = time.perf_counter() - t
        now = timezone.now()
        outcomes = [
            store.Outcome(message_id=m.id, number=m.attempts, status=store.DELIVERED, started_at=now, finished_at=now)
            for m in batch
        ]
        t = time.perf_counter()
        store.record(alias, worker="bench:ab", outcomes=outcomes)
        return send_s, claim_s, time.perf_counter() - t

    for alias in aliases.values():  # warm both connections and their prepared statements
        for _ in range(5):
            one(alias)
    samples: dict[str, list[tuple[float, float, float]]] = {"before": [], "after": []}
    rng = random.Random(19)
    for _ in range(args.batches):
        order = ["before", "after"]
        rng.shuffle(order)
        for name in order:
            samples[name].append(one(aliases[name]))
    for name in ("before", "after"):
        connections[aliases[name]].close()
    labels = ("send x100", "claim 100", "record 100")
    print(f"{args.batches} interleaved batches, {args.history:,} rows of history, before = migration {args.before}")
    for i, label in enumerate(labels):
        before = [s[i] for s in samples["before"]]
        after = [s[i] for s in samples["after"]]
        ratios = [a / b for a, b in zip(after, before, strict=True)]
        b, a = statistics.median(before) * 1e3, statistics.median(after) * 1e3
        print(
            f"  {label:<11} before {b:7.2f} ms  after {a:7.2f} ms"
            f"  paired ratio median {statistics.median(ratios):.3f}"
            f" (quartiles {statistics.quantiles(ratios, n=4)[0]:.2f}-{statistics.quantiles(ratios, n=4)[2]:.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
