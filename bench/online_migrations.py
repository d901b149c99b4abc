"""What a migration costs the requests that send while it runs: the online operations against Django's own.

    python bench/online_migrations.py [--databases postgresql,mysql] [--rows 1000000,10000000]
        [--pending 100000] [--reps 3] [--json FILE]

For each database and each table size it makes a database of its own (``bench_online``), migrates it to
the outbox's own migrations (``BASE``), fills the message table with ``--rows`` delivered messages, and then, per
repetition and per variant, with ``--pending`` pending messages added, a producer calling ``outbox.send()``
every 5 ms (each in a transaction of its own, as a request) and two ``outbox_worker`` processes draining,
runs ``manage.py migrate`` one migration at a time through three changes to the message table:

- ``index``: a new index on ``topic``;
- ``column``: a new column that may be NULL;
- ``check``: a check constraint on that column.

The ``package`` variant runs the package's own migrations after its initial one (``STEPS_OF``) the same
way, from ``0001_initial``, with workers that run the code before them (docs/upgrading.md gives its row).

The variants are the same three migrations written two ways (tests/support/migration_samples): ``online``
with ``django_outbox.store.online`` (an index built concurrently / in place, a bounded lock wait with
retries, a check added ``NOT VALID`` and validated apart), and ``plain`` as ``makemigrations`` writes them
(``AddIndex``, ``AddField``, ``AddConstraint``): the reference, run in the same process layout in the same
run, alternating which goes first. After each variant the database migrates back, with no load.

Per change it reports how long ``migrate`` took, the longest ``send()`` that overlapped it, and, as the
floor, the longest ``send()`` of the seconds before it with no migration running; failed sends and lines
of worker errors are counted. Medians over the repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import procs  # noqa: E402  (needs ROOT on the path)

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


def env_for(vendor: str, module: str | None = None) -> dict[str, str]:
    env = {"DJANGO_SETTINGS_MODULE": "bench.settings", "DATABASE_URL": DSN[vendor], "BENCH_LOG_LEVEL": "WARNING"}
    if module:
        env["BENCH_MIGRATION_MODULE"] = module
    return env


def manage(vendor: str, *args: str, module: str | None = None) -> float:
    started = time.monotonic()
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env={**os.environ, **env_for(vendor, module)},
        check=True,
        capture_output=True,
        text=True,
    )
    return time.monotonic() - started


def raw(vendor: str) -> Any:
    url = urlparse(DSN[vendor])
    if vendor == "postgresql":
        import psycopg

        return psycopg.connect(DSN[vendor], autocommit=True)
    import MySQLdb

    return MySQLdb.connect(host=url.hostname or "127.0.0.1", port=url.port or 3306, user="root", autocommit=True)


def recreate(vendor: str) -> None:
    name = urlparse(DSN[vendor]).path.lstrip("/")
    if vendor == "postgresql":
        import psycopg

        with psycopg.connect(DSN[vendor].rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
    else:
        conn = raw(vendor)
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.cursor().execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
        conn.close()
    manage(vendor, "migrate", "-v0", module=VARIANTS["online"])
    manage(vendor, "migrate", "django_outbox", BASE, "-v0", module=VARIANTS["online"])


def execute(vendor: str, sql: str) -> None:
    conn = raw(vendor)
    try:
        if vendor == "mysql":
            conn.cursor().execute(f"USE `{urlparse(DSN[vendor]).path.lstrip('/')}`")
        conn.cursor().execute(sql)
    finally:
        conn.close()


def fill(vendor: str, n: int, *, status: str) -> None:
    delivered = "NULL" if status == "pending" else ("now()" if vendor == "postgresql" else "UTC_TIMESTAMP(6)")
    attempts = 0 if status == "pending" else 1
    for start in range(0, n, CHUNK):
        size = min(CHUNK, n - start)
        execute(vendor, FILL[vendor].format(n=size, status=status, attempts=attempts, delivered=delivered))
    execute(vendor, "ANALYZE TABLE django_outbox_message" if vendor == "mysql" else "ANALYZE django_outbox_message")


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
    worker_env = env_for(vendor, WORKER_MODULE.get(variant))
    workers = [
        procs.Proc([sys.executable, str(ROOT / "manage.py"), "outbox_worker", "--poll-interval", "0.2"], env=worker_env)
        for _ in range(2)
    ]
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
        for worker in workers:
            worker.proc.terminate()
        for worker in workers:
            worker.proc.wait(timeout=60)
            worker.join_output()
    errors = [line for w in workers for line in w.lines if "Traceback" in line or "ERROR" in line or "rror:" in line]
    manage(vendor, "migrate", "django_outbox", BASE, "-v0", module=VARIANTS[variant])
    execute(vendor, "DELETE FROM django_outbox_message WHERE status <> 'delivered'")
    return {
        "steps": steps,
        "sends": len(producer.calls),
        "failed_sends": sum(1 for *_, error in producer.calls if error),
        "first_failure": next((error for *_, error in producer.calls if error), ""),
        "worker_error_lines": errors[:5],
        "worker_errors": len(errors),
    }


def median_of(runs: list[dict[str, Any]], step: str, field: str) -> float:
    return float(statistics.median(float(run["steps"][step][field]) for run in runs))


def report(vendor: str, rows: int, pending: int, runs: dict[str, list[dict[str, Any]]]) -> None:
    reps = len(next(iter(runs.values())))
    print(f"\n{vendor}, {rows:,} delivered + {pending:,} pending, medians of {reps}:")
    print(f"{'change':<26} {'variant':<7} {'migrate':>9} {'longest send':>13} {'floor':>8} {'vs plain':>9}")
    for variant in runs:
        for step in STEPS_OF[variant]:
            plain = median_of(runs["plain"], step, "longest_send_s") if "plain" in runs and step in STEPS else 0.0
            longest = median_of(runs[variant], step, "longest_send_s")
            ratio = f"{longest / plain:>8.2f}x" if plain else f"{'':>9}"
            print(
                f"{step[5:]:<26} {variant:<7} {median_of(runs[variant], step, 'migrate_s'):>8.2f}s "
                f"{longest * 1000:>10.0f} ms {median_of(runs[variant], step, 'floor_s') * 1000:>5.0f} ms {ratio}"
            )
    for variant in runs:
        failed = sum(run["failed_sends"] for run in runs[variant])
        errors = sum(run["worker_errors"] for run in runs[variant])
        print(f"{variant}: {failed} failed sends, {errors} worker error lines", flush=True)


def measure(vendor: str, sizes: list[int], pending: int, reps: int, variants: list[str]) -> dict[str, Any]:
    import django

    django.setup()
    results: dict[str, Any] = {}
    for rows in sizes:
        recreate(vendor)
        filled = time.monotonic()
        fill(vendor, rows, status="delivered")
        print(f"{vendor}: {rows:,} delivered messages in {time.monotonic() - filled:.0f} s", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in variants}
        for rep in range(reps):
            for variant in variants if rep % 2 == 0 else list(reversed(variants)):
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--databases", default="postgresql,mysql")
    parser.add_argument("--rows", default="1000000,10000000")
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="online, plain, package")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    vendors = args.databases.split(",")
    if len(vendors) > 1:  # one process per database: Django reads its settings once per process
        combined: dict[str, Any] = {}
        for vendor in vendors:
            command = [sys.executable, __file__, f"--databases={vendor}", f"--rows={args.rows}"]
            command += [f"--pending={args.pending}", f"--reps={args.reps}", f"--variants={args.variants}"]
            part = args.json.with_suffix(f".{vendor}.json") if args.json else None
            if part:
                command.append(f"--json={part}")
            subprocess.run(command, check=True)
            if part:
                combined.update(json.loads(part.read_text()))
                part.unlink()
        if args.json:
            args.json.write_text(json.dumps(combined, indent=2))
        return
    os.environ.update(env_for(vendors[0]))
    variants = args.variants.split(",")
    results = measure(vendors[0], [int(r) for r in args.rows.split(",")], args.pending, args.reps, variants)
    if args.json:
        args.json.write_text(json.dumps({vendors[0]: results}, indent=2))


if __name__ == "__main__":
    main()
