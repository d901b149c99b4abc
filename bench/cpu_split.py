"""Where a drain's CPU goes on a small machine: worker processes against the PostgreSQL backends serving them.

    python bench/cpu_split.py [--dsn postgres://postgres@127.0.0.1:5432/bench_cpu] [--processes 1,2,4]
        [--messages 20000] [--reps 3] [--tree NAME=PATH ...]

On two cores, two or four worker processes, their backends and the harness share the machine, so the drain
rate follows the CPU each message costs on both sides. For the outbox worker (``manage.py outbox_worker``
of each ``--tree``, default this one, batches of 100; the trees share one database, so one schema) and
the minimal reference (``bench/minimal_relay.py`` on its minimal twin table), interleaved in the same
run, each drain reads ``/proc/<pid>/stat`` (user + system time) of the worker processes and of every
backend connected to the database, from just before the backlog is committed to when it is drained.
It also prints the committed transactions per batch of 100 (in autocommit, one per statement or
pipeline; less the harness's own) and the buffers the drain touched in the table's indexes and heap
(``pg_statio_user_indexes``, ``pg_statio_user_tables``), a proxy for the index entries read and written.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import procs, tables  # noqa: E402
from bench.figures import interleaved  # noqa: E402
from bench.minimal_relay import CREATE, FILL  # noqa: E402
from bench.minimal_relay import TABLE as MINIMAL_TABLE  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system time of a process and its waited-for children, 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # after the command: state is field 3, utime 14, stime 15 (1-based, counting pid and comm)
    return (int(fields[11]) + int(fields[12])) / TICK


def backends(conn: Any) -> list[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchall()
    return [int(r[0]) for r in rows]


STATS = """
SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
       (SELECT COALESCE(sum(idx_blks_hit + idx_blks_read), 0) FROM pg_statio_user_indexes WHERE relname = %s),
       (SELECT COALESCE(sum(heap_blks_hit + heap_blks_read), 0) FROM pg_statio_user_tables WHERE relname = %s)
"""


def machine_busy() -> float:
    parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(v) for v in parts]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / TICK


def drain(kind: str, tree: Path, dsn: str, processes: int, n: int) -> dict[str, float]:
    table = "django_outbox_message" if kind != "minimal" else MINIMAL_TABLE
    with tables.connect(dsn) as conn:
        if kind != "minimal":
            tables.truncate(conn)
        else:
            conn.execute(f"TRUNCATE {MINIMAL_TABLE} RESTART IDENTITY")
    if kind != "minimal":
        env = {"DJANGO_SETTINGS_MODULE": "bench.settings", "DATABASE_URL": dsn, "PYTHONPATH": str(tree)}
        started = [
            procs.Proc([sys.executable, str(tree / "manage.py"), "outbox_worker", "--batch-size", "100"], env=env)
            for _ in range(processes)
        ]
        ready = "relaying"
    else:
        started = [procs.minimal_relay(dsn) for _ in range(processes)]
        ready = "ready"
    try:
        for p in started:
            p.wait_for_line(ready)
        time.sleep(0.5)
        with tables.connect(dsn) as conn:
            time.sleep(0.6)  # the statistics flush, so the counters start from this drain
            pids = backends(conn)
            before_stats = conn.execute(STATS, [table, table]).fetchone()
            before_w = sum(cpu_seconds(p.pid) for p in started)
            before_b = sum(cpu_seconds(pid) for pid in pids)
            before_m = machine_busy()
            if kind != "minimal":
                t0 = tables.fill_pending(conn, n, analyze=True)
            else:
                with conn.transaction():
                    conn.execute(FILL, {"n": n})
                    conn.execute(f"ANALYZE {MINIMAL_TABLE}")
                t0 = time.time()
            busy = f"SELECT EXISTS (SELECT 1 FROM {table} WHERE status IN ('pending', 'processing'))"
            polls = 1
            while conn.execute(busy).fetchone()[0]:  # type: ignore[index]
                polls += 1
                for p in started:
                    if not p.alive():
                        raise RuntimeError("worker died:\n" + "\n".join(p.lines[-30:]))
                time.sleep(0.01)
            t1 = time.time()
            after_w = sum(cpu_seconds(p.pid) for p in started)
            after_b = sum(cpu_seconds(pid) for pid in pids)
            after_m = machine_busy()
    finally:
        procs.stop_all(started)
    with tables.connect(dsn) as conn:
        time.sleep(0.6)  # the exited backends flushed their counters; the collector's view catches up
        after_stats = conn.execute(STATS, [table, table]).fetchone()
    assert before_stats is not None and after_stats is not None
    batches = n / 100
    return {
        "rate": n / (t1 - t0),
        "worker_us": (after_w - before_w) / n * 1e6,
        "backend_us": (after_b - before_b) / n * 1e6,
        "machine_us": (after_m - before_m) / n * 1e6,
        # less the harness's own: its polls, and the fill's transaction and the statistics read
        "xact_per_batch": (int(after_stats[0]) - int(before_stats[0]) - polls - 3) / batches,  # type: ignore[call-overload]
        "idx_bufs_per_msg": (int(after_stats[1]) - int(before_stats[1])) / n,  # type: ignore[call-overload]
        "heap_bufs_per_msg": (int(after_stats[2]) - int(before_stats[2])) / n,  # type: ignore[call-overload]
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default="postgres://postgres@127.0.0.1:5432/bench_cpu")
    parser.add_argument("--tree", action="append", help="NAME=PATH of a source tree (default: outbox=this one)")
    parser.add_argument("--processes", default="1,2,4")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    trees = {"minimal": ROOT}
    for spec in args.tree or [f"outbox={ROOT}"]:
        name, _, path = spec.partition("=")
        trees[name] = Path(path).resolve()
    tree = next(path for name, path in trees.items() if name != "minimal")
    tables.ensure_database(args.dsn)
    env = {**os.environ, "DATABASE_URL": args.dsn, "DJANGO_SETTINGS_MODULE": "bench.settings"}
    env.pop("PYTHONPATH", None)
    subprocess.run([sys.executable, str(tree / "manage.py"), "migrate", "-v0"], cwd=tree, env=env, check=True)
    with tables.connect(args.dsn) as conn:
        for statement in CREATE:
            conn.execute(statement)
    keys = ("rate", "worker_us", "backend_us", "machine_us", "xact_per_batch", "idx_bufs_per_msg", "heap_bufs_per_msg")
    for processes in [int(p) for p in args.processes.split(",")]:
        results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for first in interleaved(args.reps):
            for kind in list(trees) if first else list(trees)[::-1]:
                r = drain(kind, trees[kind], args.dsn, processes, args.messages)
                results[kind].append(r)
                print(f"  x{processes} {kind}: " + " ".join(f"{k} {r[k]:,.1f}" for k in keys), flush=True)
        for kind in trees:
            med = {k: statistics.median(r[k] for r in results[kind]) for k in keys}
            print(f"x{processes} {kind} median: " + " ".join(f"{k} {med[k]:,.1f}" for k in keys), flush=True)
        for kind in trees:
            if kind == "minimal":
                continue
            ratio = statistics.median(
                o["rate"] / m["rate"] for o, m in zip(results[kind], results["minimal"], strict=True)
            )
            print(f"x{processes} {kind}/minimal rate: {ratio:.2f}x (paired median)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
