"""What a migration costs the requests that send while it runs: the online operations against Django's own.

    python bench/online_migrations.py [--databases postgresql,mysql] [--rows 1000000,10000000]
        [--pending 100000] [--reps 3] [--variants online,plain,package] [--json FILE]

Per database and table size (``--rows`` delivered messages in ``bench_online``), per repetition and
variant, with ``--pending`` pending messages, ``outbox.send()`` every 5 ms and two workers draining, it
runs ``manage.py migrate`` one migration at a time through three changes to the message table (an index
on ``topic``, a column that may be NULL, a check constraint on it). ``online``: the three written with
``django_outbox.store.online`` (tests/support/migration_samples); ``plain``: as ``makemigrations`` writes
them (the reference, in the same run, alternating which goes first); ``package``: the package's own
migrations after its initial one, with workers on the code before them. Per change: how long ``migrate``
took, the longest ``send()`` overlapping it and, as the floor, the longest of the seconds before; failed
sends and worker error lines are counted. Medians over the repetitions.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import common, procs, tables  # noqa: E402
from bench.common import median  # noqa: E402

DSN = {
    "postgresql": "postgres://postgres@127.0.0.1:5432/bench_online",
    "mysql": "mysql://root@127.0.0.1:3306/bench_online",
}
#: Migration modules by variant; ``package``: the package's own migrations after its initial one.
VARIANTS: dict[str, str | None] = {
    "online": "tests.support.migration_samples.safe",
    "plain": "tests.support.migration_samples.plain",
    "package": None,
}
#: The package's migrations the samples build on (each variant repeats them), where each run goes back to.
BASE = "0003_mysql_claim_key_index"
STEPS = ("0002_index", "0003_column", "0004_check")
#: Each variant's steps, and the migration it starts from.
STEPS_OF = {"online": STEPS, "plain": STEPS, "package": ("0002_pending_unkeyed_index", "0003_mysql_claim_key_index")}
START_OF = {"online": BASE, "plain": BASE, "package": "0001_initial"}
#: The workers of the ``package`` variant run the code before its migrations (the previous release, as
#: far as the schema goes); the package's own code would wait for them to be applied.
WORKER_MODULE = {"package": "tests.support.migration_samples.initial"}
CHUNK = 1_000_000
#: Seconds of load before the first migration (the floor is measured there) and between migrations.
SETTLE = 3.0

FILL = {
    "postgresql": """
INSERT INTO django_outbox_message (uuid, topic, payload, headers, status, attempts, max_attempts,
    available_at, created_at, delivered_at, last_error)
SELECT gen_random_uuid(), 'bench.noop', jsonb_build_object('order_id', i, 'item', 'book'), '{{}}'::jsonb,
    '{status}', {attempts}, 5, now(), now(), {delivered}, ''
FROM generate_series(1, {n}) AS i
""",
    "mysql": """
INSERT INTO django_outbox_message (uuid, topic, payload, headers, status, attempts, max_attempts,
    available_at, created_at, delivered_at, last_error)
SELECT UUID(), 'bench.noop', JSON_OBJECT('order_id', seq, 'item', 'book'), '{{}}', '{status}', {attempts}, 5,
    UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), {delivered}, ''
FROM seq_1_to_{n}
""",
}


def manage(vendor: str, *args: str, module: str | None = None) -> float:
    extra = {"BENCH_MIGRATION_MODULE": module} if module else {}
    return common.manage(DSN[vendor], *args, quiet=True, BENCH_LOG_LEVEL="WARNING", **extra)


def recreate(vendor: str) -> None:
    from django.db import connections

    connections.close_all()
    tables.ensure_database(DSN[vendor], fresh=True)
    manage(vendor, "migrate", "-v0", module=VARIANTS["online"])
    manage(vendor, "migrate", "django_outbox", BASE, "-v0", module=VARIANTS["online"])


def fill(vendor: str, n: int, *, status: str) -> None:
    delivered = "NULL" if status == "pending" else ("now()" if vendor == "postgresql" else "UTC_TIMESTAMP(6)")
    attempts = 0 if status == "pending" else 1
    for start in range(0, n, CHUNK):
        size = min(CHUNK, n - start)
        common.sql(FILL[vendor].format(n=size, status=status, attempts=attempts, delivered=delivered))
    common.sql("ANALYZE TABLE django_outbox_message" if vendor == "mysql" else "ANALYZE django_outbox_message")


class Producer(threading.Thread):
    """``outbox.send()`` every 5 ms in a transaction of its own; each call's start, duration and failure."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stopping = threading.Event()
        self.calls: list[tuple[float, float, str]] = []

    def run(self) -> None:
        from django.db import connections, transaction

        from django_outbox import outbox

        try:
            while not self.stopping.is_set():
                started = time.monotonic()
                error = ""
                try:
                    with transaction.atomic():
                        outbox.send("bench.noop", {"order_id": len(self.calls), "item": "book"})
                except Exception as exc:
                    error = repr(exc)[:200]
                took = time.monotonic() - started
                self.calls.append((started, took, error))
                self.stopping.wait(max(0.0, 0.005 - took))
        finally:
            connections.close_all()

    def longest(self, start: float, end: float) -> float:
        """The longest call that overlapped [start, end]."""
        return max((took for began, took, _ in self.calls if began <= end and began + took >= start), default=0.0)


def run_variant(vendor: str, variant: str, pending: int) -> dict[str, Any]:
    if START_OF[variant] != BASE:
        manage(vendor, "migrate", "django_outbox", START_OF[variant], "-v0", module=VARIANTS[variant])
    fill(vendor, pending, status="pending")
    module = WORKER_MODULE.get(variant)
    env = common.django_env(
        DSN[vendor], BENCH_LOG_LEVEL="WARNING", **({"BENCH_MIGRATION_MODULE": module} if module else {})
    )
    command = [sys.executable, str(ROOT / "manage.py"), "outbox_worker", "--poll-interval", "0.2"]
    workers = [procs.Proc(command, env=env) for _ in range(2)]
    producer = Producer()
    producer.start()
    steps: dict[str, Any] = {}
    try:
        time.sleep(SETTLE)
        for step in STEPS_OF[variant]:
            floor_start = time.monotonic() - SETTLE + 0.5
            floor = producer.longest(floor_start, time.monotonic())
            started = time.monotonic()
            took = manage(vendor, "migrate", "django_outbox", step, "-v0", module=VARIANTS[variant])
            steps[step] = {
                "migrate_s": took,
                "longest_send_s": producer.longest(started, time.monotonic()),
                "floor_s": floor,
            }
            time.sleep(SETTLE)
    finally:
        producer.stopping.set()
        producer.join(timeout=30)
        procs.stop_all(workers)
    errors = [line for w in workers for line in w.lines if "Traceback" in line or "ERROR" in line or "rror:" in line]
    manage(vendor, "migrate", "django_outbox", BASE, "-v0", module=VARIANTS[variant])
    common.sql("DELETE FROM django_outbox_message WHERE status <> 'delivered'")
    return {
        "steps": steps,
        "sends": len(producer.calls),
        "failed_sends": sum(1 for *_, error in producer.calls if error),
        "first_failure": next((error for *_, error in producer.calls if error), ""),
        "worker_error_lines": errors[:5],
        "worker_errors": len(errors),
    }


def median_of(runs: list[dict[str, Any]], step: str, field: str) -> float:
    return median([float(run["steps"][step][field]) for run in runs])


def report(vendor: str, rows: int, pending: int, runs: dict[str, list[dict[str, Any]]]) -> None:
    print(f"\n{vendor}, {rows:,} delivered + {pending:,} pending, medians of {len(next(iter(runs.values())))}:")
    table = []
    for variant in runs:
        for step in STEPS_OF[variant]:
            plain = median_of(runs["plain"], step, "longest_send_s") if "plain" in runs and step in STEPS else 0.0
            longest, floor = median_of(runs[variant], step, "longest_send_s"), median_of(runs[variant], step, "floor_s")
            took = f"{median_of(runs[variant], step, 'migrate_s'):.2f} s"
            ratio = f"{longest / plain:.2f}x" if plain else ""
            table.append((step[5:], variant, took, f"{longest * 1000:.0f} ms", f"{floor * 1000:.0f} ms", ratio))
    print(common.markdown(("change", "variant", "migrate", "longest send", "floor", "vs plain"), table))
    for variant in runs:
        failed = sum(run["failed_sends"] for run in runs[variant])
        errors = sum(run["worker_errors"] for run in runs[variant])
        print(f"{variant}: {failed} failed sends, {errors} worker error lines", flush=True)


def measure(vendor: str, sizes: list[int], pending: int, reps: int, variants: list[str]) -> dict[str, Any]:
    common.setup_django()
    results: dict[str, Any] = {}
    for rows in sizes:
        recreate(vendor)
        filled = time.monotonic()
        fill(vendor, rows, status="delivered")
        print(f"{vendor}: {rows:,} delivered messages in {time.monotonic() - filled:.0f} s", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in variants}
        for rep, first in enumerate(common.interleaved(reps)):
            for variant in variants if first else variants[::-1]:
                run = run_variant(vendor, variant, pending)
                runs[variant].append(run)
                print(
                    f"  rep {rep + 1} {variant}: {json.dumps(run['steps'])} failed sends {run['failed_sends']}"
                    f" {run['first_failure']}, worker errors {run['worker_errors']} {run['worker_error_lines'][:1]}",
                    flush=True,
                )
        results[str(rows)] = runs
        report(vendor, rows, pending, runs)
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
    vendors = args.databases.split(",")
    if len(vendors) > 1:  # one process per database: Django reads its settings once per process
        common.each_database(args, vendors)
        return
    os.environ["DATABASE_URL"] = DSN[vendors[0]]
    os.environ["BENCH_LOG_LEVEL"] = "WARNING"
    variants = args.variants.split(",")
    results = measure(vendors[0], [int(r) for r in args.rows.split(",")], args.pending, args.reps, variants)
    if args.json:
        common.write_json(args.json, {vendors[0]: results})


if __name__ == "__main__":
    main()
