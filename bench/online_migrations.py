"""What a migration costs the requests that send while it runs: the online operations against Django's own.

Per database and table size (``--rows`` delivered messages), each variant runs ``migrate`` one migration at a
time while ``outbox.send()`` runs every 5 ms and two workers drain ``--pending`` messages: ``online`` (three
changes written with ``django_outbox.store.online``: an index on ``topic``, a column that may be NULL, a check
on it), ``plain`` (the same as ``makemigrations`` writes them: the reference, the order alternating) and
``package`` (the package's own migrations, its workers on the code before them). Per change: ``migrate``'s
seconds and the longest ``send()`` overlapping it, against the longest of the seconds before.
"""

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import common, procs, tables

#: The package's migrations the samples build on (each variant repeats them), where each run goes back to.
BASE = "0003_mysql_claim_key_index"
STEPS = ("0002_index", "0003_column", "0004_check")
SAMPLES = "tests.support.migration_samples"
#: Per variant: the migration module that ``migrate`` and then the workers read (none: the package's own),
#: the migration it starts from and its steps. ``package``'s workers run the code before its migrations
#: (the previous release, as far as the schema goes): the package's own code would wait for them.
VARIANTS: dict[str, tuple[str | None, str | None, str, tuple[str, ...]]] = {
    "online": (f"{SAMPLES}.safe", None, BASE, STEPS),
    "plain": (f"{SAMPLES}.plain", None, BASE, STEPS),
    "package": (None, f"{SAMPLES}.initial", "0001_initial", ("0002_pending_unkeyed_index", BASE)),
}
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
    _, worker_module, start, steps = VARIANTS[variant]
    if start != BASE:
        migrate(variant, "django_outbox", start)
    tables.fill(vendor, pending)
    env = {"BENCH_MIGRATION_MODULE": worker_module} if worker_module else {}
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
            print(f"  {variant} {step}: migrate {took:.2f} s, longest send {longest:.3f} s, floor {floor:.3f} s")
            time.sleep(SETTLE)
    finally:
        stopping.set()
        producer.join(timeout=30)
        procs.stop_all(workers)
    errors = [line for w in workers for line in w.lines if "Traceback" in line or "ERROR" in line or "rror:" in line]
    migrate(variant, "django_outbox", BASE)
    common.sql("DELETE FROM django_outbox_message WHERE status <> 'delivered'")
    failures = [error for *_, error in calls if error]
    print(f"  {variant}: {len(failures)} failed sends {failures[:1]}, worker errors {errors[:1]}", flush=True)
    return {
        "steps": figures,
        "sends": len(calls),
        "failed_sends": len(failures),
        "first_failure": failures[0] if failures else "",
        "worker_error_lines": errors[:5],
        "worker_errors": len(errors),
    }


def measure(vendor: str, sizes: list[int], pending: int, reps: int) -> dict[str, Any]:
    """Per table size, each variant's runs, in an order reversed every other repetition."""
    common.setup_django()
    from django.db import connections

    results: dict[str, Any] = {}
    for rows in sizes:
        connections.close_all()
        tables.ensure_database(os.environ["DATABASE_URL"], fresh=True)
        migrate("online")
        migrate("online", "django_outbox", BASE)
        tables.fill(vendor, rows, status="delivered")
        print(f"{vendor}: {rows:,} delivered messages", flush=True)
        results[str(rows)] = runs = {variant: list[dict[str, Any]]() for variant in VARIANTS}
        for first in common.interleaved(reps):
            for variant in list(runs) if first else list(runs)[::-1]:
                runs[variant].append(run_variant(vendor, variant, pending))
    return results


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--databases", default="postgresql,mysql")
    parser.add_argument("--rows", default="1000000,10000000")
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes = [int(r) for r in args.rows.split(",")]
    common.by_database(args, "bench_online", lambda vendor: measure(vendor, sizes, args.pending, args.reps))


if __name__ == "__main__":
    main()
