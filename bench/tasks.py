"""Django tasks: django-tasks-db's workload against ``django_outbox.tasks.OutboxBackend``, same run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_tasks \\
        .venv-django6/bin/python bench/tasks.py [--messages 2000] [--peer-messages 500] [--reps 3]

N no-op tasks, each enqueued with a business row in one committed transaction, drained by 1 and 4 idle
workers (``db_worker``, ``outbox_worker``), the systems taking turns to go first, each in a database of its
own on the same server. Needs Django 6 (``django.tasks``) and bench/compare_setup.sh's environment.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import psycopg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import common, figures, procs, tables  # noqa: E402
from bench.common import median  # noqa: E402

DEFAULT_PEER_PYTHON = ROOT / "bench" / ".venv-compare" / "bin" / "python"


@dataclass(frozen=True, kw_only=True)
class Peer:
    name: str
    python: str
    dsn: str
    settings: str
    worker: list[str]
    ready_line: str
    busy_sql: str
    reset_sql: list[str]
    system_env: str

    def env(self) -> dict[str, str]:
        return {
            "DJANGO_SETTINGS_MODULE": self.settings,
            "DATABASE_URL": self.dsn,
            "BENCH_COMPARE_DSN": self.dsn,
            "BENCH_TASKS_SYSTEM": self.system_env,
            "PYTHONPATH": str(ROOT),
        }

    def run(self, *args: str) -> str:
        p = procs.Proc([self.python, "-m", "bench.compare.tasks_peer", *args], env=self.env())
        code = p.proc.wait(timeout=900)
        p.join_output()
        if code != 0:
            raise RuntimeError(f"{self.name} {args}: exit {code}:\n" + "\n".join(p.lines[-30:]))
        return p.lines[-1] if p.lines else ""


def peers(dsn: str, peer_python: str) -> list[Peer]:
    parsed = urlparse(dsn)
    peer_dsn = parsed._replace(path=parsed.path + "_peer").geturl()
    return [
        Peer(
            name="django-tasks-db",
            python=peer_python,
            dsn=peer_dsn,
            settings="bench.compare.tasks_settings",
            worker=["-m", "django", "db_worker", "--interval", "0.1", "--no-startup-delay", "--no-reload"],
            ready_line="Starting worker",
            busy_sql=figures.busy_sql("django_tasks_database_dbtaskresult", "'READY', 'RUNNING'"),
            reset_sql=["TRUNCATE django_tasks_database_dbtaskresult"],
            system_env="django-tasks-db",
        ),
        Peer(
            name="outbox-tasks",
            python=sys.executable,
            dsn=dsn,
            settings="bench.compare.outbox_tasks_settings",
            worker=[str(ROOT / "manage.py"), "outbox_worker", "--batch-size", "100"],
            ready_line="relaying",
            busy_sql=figures.OUTBOX_BUSY,
            reset_sql=list(figures.OUTBOX_RESET),
            system_env="outbox",
        ),
    ]


def drain_once(peer: Peer, processes: int, n: int) -> float:
    """Tasks per second for ``processes`` idle workers to drain ``n`` tasks committed at once."""
    with psycopg.connect(peer.dsn, autocommit=True) as conn:
        for statement in peer.reset_sql:
            conn.execute(statement)
    started = [procs.Proc([peer.python, *peer.worker], env=peer.env()) for _ in range(processes)]
    try:
        for p in started:
            p.wait_for_line(peer.ready_line)
        time.sleep(0.5)  # let them settle into their idle wait
        t0 = float(peer.run("fill", str(n)))
        with psycopg.connect(peer.dsn, autocommit=True) as poll:
            done = lambda: not (poll.execute(peer.busy_sql).fetchone() or [False])[0]  # noqa: E731
            t1 = procs.wait_drained(done, started, f"{peer.name} draining {n}", 120 + n / 20)
    finally:
        procs.stop_all(started)
    return n / (t1 - t0)


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--messages", type=int, default=2000, help="tasks per drain for the outbox")
    parser.add_argument("--peer-messages", type=int, default=500, help="tasks per drain for django-tasks-db")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--processes", default="1,4", help="comma-separated worker process counts")
    parser.add_argument("--peer-python", default=str(DEFAULT_PEER_PYTHON), help="bench/compare_setup.sh's venv")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    dsn = os.environ.get("DATABASE_URL", "")
    if not dsn.startswith("postgres"):
        parser.error("DATABASE_URL must name a PostgreSQL database of the benchmark's own")
    if not Path(args.peer_python).exists():
        parser.error(f"{args.peer_python} does not exist: run bench/compare_setup.sh first")
    systems = peers(dsn, args.peer_python)
    for peer in systems:
        tables.ensure_database(peer.dsn)
        peer.run("migrate")
    sizes = {"django-tasks-db": args.peer_messages, "outbox-tasks": args.messages}
    result: dict[str, object] = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "messages": sizes,
    }
    for processes in [int(x) for x in args.processes.split(",")]:
        rates: dict[str, list[float]] = {p.name: [] for p in systems}
        for first in common.interleaved(args.reps):
            for peer in systems if first else systems[::-1]:
                rates[peer.name].append(drain_once(peer, processes, sizes[peer.name]))
        medians = {name: median(r) for name, r in rates.items()}
        result[f"x{processes}"] = {
            "per_s": medians,
            "reps": rates,
            "ratio_outbox_to_peer": medians["outbox-tasks"] / medians["django-tasks-db"],
        }
        print(
            f"{processes} worker(s): django-tasks-db {medians['django-tasks-db']:,.0f}/s, "
            f"outbox-tasks {medians['outbox-tasks']:,.0f}/s "
            f"(x{medians['outbox-tasks'] / medians['django-tasks-db']:.1f})",
            flush=True,
        )
    output = args.output or ROOT / "bench" / "results" / f"tasks-{time.strftime('%Y%m%d-%H%M%S')}.json"
    common.write_json(output, result)
    print(f"written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
