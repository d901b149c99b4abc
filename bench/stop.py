"""How long an idle worker takes to stop on SIGTERM, beside a bare management command's stop.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_outbox python bench/stop.py [--runs N] [--idle S]

Each run starts ``manage.py outbox_worker`` (PostgreSQL: its ``default`` database, listening; SQLite: the
``sqlite`` database, polling), waits until it is idle, sends SIGTERM and times the exit; the reference is
``manage.py bench_idle`` (bench/noop), a command of the same process layout that opens its connection
and only waits for the signal, so what is left is what the worker itself adds. Medians of the runs, in
seconds, and the ratio to the reference; the target is 0.5 s for the worker.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_outbox")
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

TARGET_SECONDS = 0.5


def one_stop(args: list[str], ready: str, idle: float) -> float:
    from bench.procs import Proc

    proc = Proc([sys.executable, "manage.py", *args], env={"DJANGO_SETTINGS_MODULE": "bench.settings"})
    proc.wait_for_line(ready, timeout=120)
    time.sleep(idle)
    started = time.monotonic()
    proc.proc.send_signal(signal.SIGTERM)
    proc.proc.wait(timeout=60)
    elapsed = time.monotonic() - started
    proc.join_output()
    if proc.proc.returncode != 0:
        raise RuntimeError(f"{args} exited {proc.proc.returncode}:\n" + "\n".join(proc.lines[-30:]))
    return elapsed


def measure(database: str, runs: int, idle: float) -> dict[str, object]:
    worker = ["outbox_worker", "--database", database]
    reference = ["bench_idle", "--database", database]
    worker_s, reference_s = [], []
    for _ in range(runs):  # interleaved, so a change of load on the machine falls on both
        worker_s.append(one_stop(worker, "delivered 0", idle))
        reference_s.append(one_stop(reference, "idle", idle))
    w, r = statistics.median(worker_s), statistics.median(reference_s)
    return {
        "worker_s": w,
        "reference_s": r,
        "added_s": w - r,
        "ratio": w / r if r else None,
        "ok": w <= TARGET_SECONDS or w - r <= TARGET_SECONDS,
        "runs": {"worker": worker_s, "reference": reference_s},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs of each (median; at least 3)")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds idle before the signal")
    parser.add_argument("--output", type=Path, help="JSON file to write")
    args = parser.parse_args(argv)
    from bench import tables

    tables.ensure_database(os.environ["DATABASE_URL"])
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", database="default", verbosity=0)
    call_command("migrate", database="sqlite", verbosity=0)
    runs = max(3, args.runs)
    results = {
        name: measure(alias, runs, args.idle) for name, alias in (("postgresql", "default"), ("sqlite", "sqlite"))
    }
    print(f"idle worker, SIGTERM to exit (median of {runs}; reference: a bare management command)")
    print("| database | worker | reference | added | ratio |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['worker_s']:.2f} s | {r['reference_s']:.2f} s | {r['added_s']:+.2f} s | {r['ratio']:.2f}x |"
        )
    if args.output:
        args.output.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
