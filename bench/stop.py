"""How long an idle worker takes to stop on SIGTERM, beside a bare management command's stop.

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


def one_stop(command: str, database: str, ready: str, idle: float) -> float:
    proc = Proc(
        [sys.executable, "manage.py", command, "--database", database], env={"DJANGO_SETTINGS_MODULE": "bench.settings"}
    )
    proc.wait_for_line(ready, timeout=120)
    time.sleep(idle)
    started = time.monotonic()
    proc.proc.send_signal(signal.SIGTERM)
    proc.proc.wait(timeout=60)
    elapsed = time.monotonic() - started
    proc.join_output()
    if proc.proc.returncode != 0:
        raise RuntimeError(f"{command} exited {proc.proc.returncode}:\n" + "\n".join(proc.lines[-30:]))
    return elapsed


def main() -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--runs", type=int, default=5, help="runs of each (median; at least 3)")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds idle before the signal")
    parser.add_argument("--output", type=Path, required=True, help="JSON file")
    args = parser.parse_args()
    common.setup_django("default", "sqlite")
    results = {}
    print(f"idle worker, SIGTERM to exit (median of {max(3, args.runs)}; reference: a bare management command)")
    for name, database in (("postgresql", "default"), ("sqlite", "sqlite")):
        runs: dict[str, list[float]] = {"worker": [], "reference": []}
        for _ in range(max(3, args.runs)):  # interleaved, so a change of load on the machine falls on both
            runs["worker"].append(one_stop("outbox_worker", database, "delivered 0", args.idle))
            runs["reference"].append(one_stop("bench_idle", database, "idle", args.idle))
        w, r = common.median(runs["worker"]), common.median(runs["reference"])
        ok = w <= TARGET_SECONDS or w - r <= TARGET_SECONDS
        results[name] = {"worker_s": w, "reference_s": r, "added_s": w - r, "ratio": w / r, "ok": ok, "runs": runs}
        print(f"  {name}: worker {w:.2f} s, reference {r:.2f} s, added {w - r:+.2f} s, ratio {w / r:.2f}x")
    common.write_json(args.output, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
