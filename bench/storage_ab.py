"""Two source trees of the outbox side by side: the same drain, interleaved, each on a database of its own.

    python bench/storage_ab.py --tree main=/path/to/main --tree branch=. [--messages 20000] [--reps 3]
        [--processes 1,4] [--history 200000] [--dsn-prefix postgres://postgres@127.0.0.1:5432/bench_ab]

A change to the schema or to the worker's Python is kept only if it pays against the tree it replaces,
measured in the same run (docs/performance.md). Each tree's ``manage.py migrate`` builds its own schema in
``<prefix>_<name>``; each repetition then fills the same backlog of pending messages (over ``--history``
delivered ones, so the indexes have a realistic size), starts that tree's ``outbox_worker`` processes and
times the drain. Besides the rate it prints what each drain cost the message table: index entries scanned
and written are not visible directly, but the share of HOT updates (``n_tup_hot_upd / n_tup_upd``) and the
table's and indexes' growth are.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import procs, tables  # noqa: E402
from bench.figures import interleaved  # noqa: E402


def migrate(tree: Path, dsn: str) -> None:
    tables.ensure_database(dsn)
    env = {**os.environ, "DATABASE_URL": dsn, "DJANGO_SETTINGS_MODULE": "bench.settings"}
    env.pop("PYTHONPATH", None)
    subprocess.run([sys.executable, str(tree / "manage.py"), "migrate", "-v0"], cwd=tree, env=env, check=True)


def worker(tree: Path, dsn: str) -> procs.Proc:
    env = {"DJANGO_SETTINGS_MODULE": "bench.settings", "DATABASE_URL": dsn, "PYTHONPATH": str(tree)}
    return procs.Proc([sys.executable, str(tree / "manage.py"), "outbox_worker", "--batch-size", "100"], env=env)


STATS = (
    "SELECT n_tup_upd, n_tup_hot_upd, pg_relation_size(relid), pg_indexes_size(relid)"
    " FROM pg_stat_user_tables WHERE relname = 'django_outbox_message'"
)


def drain(tree: Path, dsn: str, processes: int, n: int, history: int) -> dict[str, float]:
    with tables.connect(dsn) as conn:
        tables.truncate(conn)
        if history:
            tables.fill_history(conn, history)
        tables.vacuum(conn)
    started = [worker(tree, dsn) for _ in range(processes)]
    try:
        for p in started:
            p.wait_for_line("relaying")
        time.sleep(0.5)
        with tables.connect(dsn) as conn:
            time.sleep(0.6)  # the statistics collector's flush, so the counters below start from this drain
            before = conn.execute(STATS).fetchone()
            t0 = tables.fill_pending(conn, n, analyze=True)
            while conn.execute(
                "SELECT EXISTS (SELECT 1 FROM django_outbox_message WHERE status IN ('pending', 'processing'))"
            ).fetchone()[0]:  # type: ignore[index]
                for p in started:
                    if not p.alive():
                        raise RuntimeError("worker died:\n" + "\n".join(p.lines[-30:]))
                time.sleep(0.01)
            t1 = time.time()
    finally:
        procs.stop_all(started)
    with tables.connect(dsn) as conn:
        time.sleep(0.6)
        after = conn.execute(STATS).fetchone()
    assert before is not None and after is not None
    upd = int(after[0]) - int(before[0])  # type: ignore[call-overload]
    hot = int(after[1]) - int(before[1])  # type: ignore[call-overload]
    return {
        "rate": n / (t1 - t0),
        "hot_share": hot / upd if upd else 0.0,
        "index_growth_mb": (int(after[3]) - int(before[3])) / 1e6,  # type: ignore[call-overload]
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH of a source tree")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--processes", default="1")
    parser.add_argument("--history", type=int, default=200_000)
    parser.add_argument("--dsn-prefix", default="postgres://postgres@127.0.0.1:5432/bench_ab")
    args = parser.parse_args()
    trees = {}
    for spec in args.tree:
        name, _, path = spec.partition("=")
        trees[name] = (Path(path).resolve(), f"{args.dsn_prefix}_{name}")
    for tree, dsn in trees.values():
        migrate(tree, dsn)
    names = list(trees)
    for processes in [int(p) for p in args.processes.split(",")]:
        results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        for first in interleaved(args.reps):
            for name in names if first else names[::-1]:
                tree, dsn = trees[name]
                figures = drain(tree, dsn, processes, args.messages, args.history)
                results[name].append(figures)
                print(
                    f"  x{processes} {name}: {figures['rate']:,.0f}/s hot {figures['hot_share']:.0%}"
                    f" index +{figures['index_growth_mb']:.1f} MB",
                    flush=True,
                )
        reference = statistics.median(r["rate"] for r in results[names[0]])
        for name in names:
            rate = statistics.median(r["rate"] for r in results[name])
            ratios = [r["rate"] / o["rate"] for r, o in zip(results[name], results[names[0]], strict=True)]
            print(
                f"x{processes} {name}: median {rate:,.0f}/s, {rate / reference:.2f}x of {names[0]}"
                f" (paired ratios {', '.join(f'{x:.2f}' for x in ratios)}),"
                f" hot {statistics.median(r['hot_share'] for r in results[name]):.0%},"
                f" index growth {statistics.median(r['index_growth_mb'] for r in results[name]):.1f} MB",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
