"""Django tasks: django-tasks-db's workload against ``django_outbox.tasks.OutboxBackend``, same run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_tasks .venv-django6/bin/python bench/tasks.py

No-op tasks, each enqueued with a business row in one committed transaction, drained by idle workers
(``db_worker``, ``outbox_worker``) taking turns to go first, each in a database of its own on the same
server. Needs Django 6 (``django.tasks``) and bench/compare_setup.sh's environment.
"""

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import common, figures, procs, tables
from bench.common import ROOT, median

PEER_PYTHON = ROOT / "bench" / ".venv-compare" / "bin" / "python"
PEER_TABLE = "django_tasks_database_dbtaskresult"


def peer(name: str, python: str, dsn: str, settings: str, worker: list[str], **kw: Any) -> figures.System:
    """One of the two: its worker, and ``bench.compare.tasks_peer`` (``migrate``; ``fill N``: N tasks, each
    with a business row, in one committed transaction) run by ``python`` on ``settings`` in ``dsn``."""
    env = {"DJANGO_SETTINGS_MODULE": settings, "DATABASE_URL": dsn, "BENCH_COMPARE_DSN": dsn}
    env |= {"BENCH_TASKS_SYSTEM": name, "PYTHONPATH": str(ROOT)}
    tasks_peer = [python, "-m", "bench.compare.tasks_peer"]
    procs.last_line([*tasks_peer, "migrate"], env=env)
    return figures.System(
        name=name,
        start=lambda ctx: procs.Proc([python, *worker], env=env),
        fill=lambda ctx, n: float(procs.last_line([*tasks_peer, "fill", str(n)], env=env)),
        dsn=lambda ctx: dsn,
        seconds_per_message=0.05,
        **kw,
    )


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--messages", type=int, default=2000, help="tasks per drain for the outbox")
    parser.add_argument("--peer-messages", type=int, default=500, help="tasks per drain for django-tasks-db")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--processes", default="1,4", help="comma-separated worker process counts")
    parser.add_argument(
        "--output", type=Path, default=ROOT / "bench" / "results" / f"tasks-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    args = parser.parse_args(argv)
    dsn = os.environ.get("DATABASE_URL", "")
    if not dsn.startswith("postgres"):
        parser.error("DATABASE_URL must name a PostgreSQL database of the benchmark's own")
    if not PEER_PYTHON.exists():
        parser.error(f"{PEER_PYTHON} does not exist: run bench/compare_setup.sh first")
    ctx = figures.Context(dsn=dsn, sizes=figures.Sizes())
    tables.ensure_database(ctx.beside("_peer"))
    tables.ensure_database(dsn)
    db_worker = ["-m", "django", "db_worker", "--interval", "0.1", "--no-startup-delay", "--no-reload"]
    systems = [
        peer(
            "django-tasks-db",
            str(PEER_PYTHON),
            ctx.beside("_peer"),
            "bench.compare.tasks_settings",
            db_worker,
            ready="Starting worker",
            reset=(f"TRUNCATE {PEER_TABLE}",),
            busy=figures.busy_sql(PEER_TABLE, "'READY', 'RUNNING'"),
        ),
        peer(
            "outbox-tasks",
            sys.executable,
            dsn,
            "bench.settings",
            [str(ROOT / "manage.py"), "outbox_worker", "--batch-size", "100"],
            ready="relaying",
            reset=figures.OUTBOX_RESET,
            busy=figures.OUTBOX_BUSY,
        ),
    ]
    sizes = {"django-tasks-db": args.peer_messages, "outbox-tasks": args.messages}
    result: dict[str, object] = {"messages": sizes}
    for processes in [int(x) for x in args.processes.split(",")]:
        rates: dict[str, list[float]] = {s.name: [] for s in systems}
        for first in common.interleaved(args.reps):
            for s in systems if first else systems[::-1]:
                rates[s.name].append(figures.drain_once(ctx, s, processes, sizes[s.name]))
        medians = {name: median(r) for name, r in rates.items()}
        ratio = medians["outbox-tasks"] / medians["django-tasks-db"]
        result[f"x{processes}"] = {"per_s": medians, "reps": rates, "ratio_outbox_to_peer": ratio}
        print(f"{processes} worker(s): " + ", ".join(f"{k} {v:,.0f}/s" for k, v in medians.items()), flush=True)
    common.write_json(args.output, result)
    print(f"written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
