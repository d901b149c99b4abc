"""What a migration costs the requests that send while it runs: the online operations against Django's own.

    python bench/online_migrations.py [--databases postgresql,mysql] [--rows 1000000,10000000]
        [--pending 100000] [--reps 3] [--variants online,plain,package] [--json FILE]

Per database and table size (``--rows`` delivered messages in ``bench_online``, or ``BENCH_DATABASE``), per
repetition and variant, with ``--pending`` pending messages, ``outbox.send()`` every 5 ms and two workers
draining, it runs ``manage.py migrate`` one migration at a time through three changes to the message table (an
index on ``topic``, a column that may be NULL, a check constraint on it). ``online``: the three written with
``django_outbox.store.online`` (tests/support/migration_samples); ``plain``: as ``makemigrations`` writes them
(the reference, in the same run, alternating which goes first); ``package``: the package's own migrations
after its initial one, with workers on the code before them. Per change: how long ``migrate`` took, the
longest ``send()`` overlapping it and, as the floor, the longest of the seconds before; failed sends and
worker error lines are counted. Medians over the repetitions."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import common, procs, tables
from bench.common import median

#: The package's migrations the samples build on (each variant repeats them), where each run goes back to.
BASE = "0003_mysql_claim_key_index"
STEPS = ("0002_index", "0003_column", "0004_check")
#: Per variant: its migration module (``package``: the package's own), the migration it starts from, its steps.
VARIANTS: dict[str, tuple[str | None, str, tuple[str, ...]]] = {
    "online": ("tests.support.migration_samples.safe", BASE, STEPS),
    "plain": ("tests.support.migration_samples.plain", BASE, STEPS),
    "package": (None, "0001_initial", ("0002_pending_unkeyed_index", "0003_mysql_claim_key_index")),
}
#: The workers of the ``package`` variant run the code before its migrations (the previous release, as
#: far as the schema goes); the package's own code would wait for them to be applied.
WORKER_MODULE = {"package": "tests.support.migration_samples.initial"}
#: A send() call: its start, its duration, its failure (or "").
Call = tuple[float, float, str]
#: Seconds of load before the first migration (the floor is measured there) and between migrations.
SETTLE = 3.0


def migrate(variant: str, *args: str) -> float:
    """``manage.py migrate *args`` with ``variant``'s migrations; its seconds."""
    module = VARIANTS[variant][0]
    extra = {"BENCH_MIGRATION_MODULE": module} if module else {}
    return common.manage(os.environ["DATABASE_URL"], "migrate", *args, "-v0", quiet=True, **extra)


def produce(stopping: threading.Event, calls: list[Call]) -> None:
    """``outbox.send()`` every 5 ms in a transaction of its own; each call's start, duration and failure."""
    from django.db import connections, transaction

    from django_outbox import outbox

    try:
        while not stopping.is_set():
            started, error = time.monotonic(), ""
            try:
                with transaction.atomic():
                    outbox.send("bench.noop", {"order_id": len(calls), "item": "book"})
            except Exception as exc:
                error = repr(exc)[:200]
            calls.append((started, time.monotonic() - started, error))
            stopping.wait(max(0.0, 0.005 - calls[-1][1]))
    finally:
        connections.close_all()


def longest_call(calls: list[Call], start: float, end: float) -> float:
    """The longest call that overlapped [start, end]."""
    return max((took for began, took, _ in calls if began <= end and began + took >= start), default=0.0)


def run_variant(vendor: str, variant: str, pending: int) -> dict[str, Any]:
    _, start, steps = VARIANTS[variant]
    if start != BASE:
        migrate(variant, "django_outbox", start)
    tables.fill(vendor, pending)
    module = WORKER_MODULE.get(variant)
    env = {"BENCH_MIGRATION_MODULE": module} if module else {}
    workers = [procs.outbox_worker(os.environ["DATABASE_URL"], "--poll-interval", "0.2", env=env) for _ in range(2)]
    stopping, calls = threading.Event(), list[Call]()
    producer = threading.Thread(target=produce, args=(stopping, calls), daemon=True)
    producer.start()
    figures: dict[str, Any] = {}
    try:
        time.sleep(SETTLE)
        for step in steps:
            floor = longest_call(calls, time.monotonic() - SETTLE + 0.5, time.monotonic())
            started = time.monotonic()
            took = migrate(variant, "django_outbox", step)
            longest = longest_call(calls, started, time.monotonic())
            figures[step] = {"migrate_s": took, "longest_send_s": longest, "floor_s": floor}
            time.sleep(SETTLE)
    finally:
        stopping.set()
        producer.join(timeout=30)
        procs.stop_all(workers)
    errors = [line for w in workers for line in w.lines if "Traceback" in line or "ERROR" in line or "rror:" in line]
    migrate(variant, "django_outbox", BASE)
    common.sql("DELETE FROM django_outbox_message WHERE status <> 'delivered'")
    return {
        "steps": figures,
        "sends": len(calls),
        "failed_sends": sum(1 for *_, error in calls if error),
        "first_failure": next((error for *_, error in calls if error), ""),
        "worker_error_lines": errors[:5],
        "worker_errors": len(errors),
    }


def report(runs: dict[str, list[dict[str, Any]]]) -> None:
    """Medians over the repetitions; the longest send() also as a ratio to ``plain``'s at the same change."""

    def of(variant: str, step: str, field: str) -> float:
        return median([float(run["steps"][step][field]) for run in runs[variant]])

    for variant in runs:
        for step in VARIANTS[variant][2]:
            longest, floor, took = (of(variant, step, f) for f in ("longest_send_s", "floor_s", "migrate_s"))
            plain = of("plain", step, "longest_send_s") if "plain" in runs and step in STEPS else 0.0
            vs = f" ({longest / plain:.2f}x plain's)" if plain else ""
            longest_ms, floor_ms = f"{longest * 1000:.0f} ms{vs}", f"{floor * 1000:.0f} ms"
            print(f"  {variant} {step}: migrate {took:.2f} s, longest send {longest_ms}, floor {floor_ms}", flush=True)


def measure(vendor: str, sizes: list[int], pending: int, reps: int, variants: list[str]) -> dict[str, Any]:
    common.setup_django()
    results: dict[str, Any] = {}
    from django.db import connections

    for rows in sizes:
        connections.close_all()
        tables.ensure_database(os.environ["DATABASE_URL"], fresh=True)
        migrate("online")
        migrate("online", "django_outbox", BASE)
        filled = time.monotonic()
        tables.fill(vendor, rows, status="delivered")
        print(f"{vendor}: {rows:,} delivered messages in {time.monotonic() - filled:.0f} s", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in variants}
        for rep, first in enumerate(common.interleaved(reps)):
            for variant in variants if first else variants[::-1]:
                runs[variant].append(run := run_variant(vendor, variant, pending))
                failed = f"{run['failed_sends']} failed sends {run['first_failure']}"
                print(f"  rep {rep + 1} {variant}: {failed}, worker errors {run['worker_error_lines'][:1]}", flush=True)
        results[str(rows)] = runs
        print(f"{vendor}, {rows:,} delivered + {pending:,} pending, medians of {reps}:")
        report(runs)
    return results


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--databases", default="postgresql,mysql")
    parser.add_argument("--rows", default="1000000,10000000")
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="online, plain, package")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes, variants = [int(r) for r in args.rows.split(",")], args.variants.split(",")
    common.by_database(args, "bench_online", lambda vendor: measure(vendor, sizes, args.pending, args.reps, variants))


if __name__ == "__main__":
    main()
