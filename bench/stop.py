"""How long an idle worker takes to stop on SIGTERM, beside a bare management command's stop.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_outbox python bench/stop.py [--runs N] [--idle S]

Each run starts ``outbox_worker`` (PostgreSQL, listening; SQLite, polling), waits until it is idle, sends
SIGTERM and times the exit; the reference is ``manage.py bench_idle`` (bench/noop): the same process
layout, one connection, nothing but the wait. Medians of the runs; the target is 0.5 s.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_outbox")
from bench import common  # noqa: E402
from bench.procs import Proc  # noqa: E402

TARGET_SECONDS = 0.5


def one_stop(args: list[str], ready: str, idle: float) -> float:
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
    w, r = common.median(worker_s), common.median(reference_s)
    return {
        "worker_s": w,
        "reference_s": r,
        "added_s": w - r,
        "ratio": w / r if r else None,
        "ok": w <= TARGET_SECONDS or w - r <= TARGET_SECONDS,
        "runs": {"worker": worker_s, "reference": reference_s},
    }


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--runs", type=int, default=5, help="runs of each (median; at least 3)")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds idle before the signal")
    parser.add_argument("--output", type=Path, help="JSON file to write")
    args = parser.parse_args(argv)
    common.setup_django("default", "sqlite")
    runs = max(3, args.runs)
    results = {
        name: measure(alias, runs, args.idle) for name, alias in (("postgresql", "default"), ("sqlite", "sqlite"))
    }
    print(f"idle worker, SIGTERM to exit (median of {runs}; reference: a bare management command)")
    rows = [
        (name, f"{r['worker_s']:.2f} s", f"{r['reference_s']:.2f} s", f"{r['added_s']:+.2f} s", f"{r['ratio']:.2f}x")
        for name, r in results.items()
    ]
    print(common.markdown(("database", "worker", "reference", "added", "ratio"), rows))
    if args.output:
        common.write_json(args.output, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
