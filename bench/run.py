"""The outbox's benchmark: every figure beside its reference, measured in the same run, as a ratio.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_outbox python bench/run.py [--quick | --smoke]
        [--only SECTION,...] [--compare-python PATH] [--output FILE] [--history-rows N] [--memory-messages N]

It creates, migrates and empties the database of DATABASE_URL (and ``<name>_<section>`` beside it): point it at
one of its own. The sections of bench/figures.py and bench/mariadb.py run in this process, then each of
``SCRIPTS`` in a process of its own (``{"failed": status}`` if it fails; the run goes on). ``mariadb`` runs in
``MARIADB_URL``; with no MariaDB there it is skipped, unless named or ``CI=true``. ``--smoke`` runs in seconds
(CI: the harness still works; its figures mean nothing). It prints docs/performance.md's table
(bench/table.py) and, unless ``--smoke``, draws the drain (bench/plot.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import table  # noqa: E402
from bench.common import parser, write_json  # noqa: E402

COMPARE_PYTHON = ROOT / "bench" / ".venv-compare" / "bin" / "python"


@dataclasses.dataclass(frozen=True)
class Script:
    """A section that needs a process of its own: its own Django settings (read once per process), private
    servers (chaos, autovacuum), brokers or another interpreter (tasks: Django 6)."""

    script: str  # from the repository's root
    output: str  # the script's flag for its JSON file
    full: str = ""  # the arguments of each size
    quick: str = ""
    smoke: str = ""
    database: bool = False  # gets DATABASE_URL: a PostgreSQL database of its own, beside the harness's
    mariadb: bool = False  # takes --databases: postgresql, and mysql when a MariaDB answers
    python: Path | None = None  # the interpreter it needs, when not this one


#: The sections run by their own script, in this order after the harness's own.
SCRIPTS: dict[str, Script] = {
    "send_many": Script(
        "bench/send_many_scale.py",
        "--output",
        database=True,
        quick="--items 5000 --keyed-items 20000 --reps 3",
        smoke="--items 200 --keyed-items 500 --reps 1",
    ),
    "keyed_drain": Script(
        "bench/keyed_drain.py",
        "--json",
        mariadb=True,
        quick="--messages 20000 --backlogs 1000,10000 --cut 90",
        smoke="--messages 300 --keys 0,5,1 --reps 1 --backlogs 1000 --cut 30",
    ),
    "brokers": Script(
        "bench/brokers.py",
        "--json",
        database=True,
        quick="--messages 5000 --rounds 3",
        smoke="--messages 200 --rounds 1",
    ),
    "topology": Script("bench/topology.py", "--output", database=True, quick="--quick", smoke="--smoke"),
    "migrations": Script(
        "bench/online_migrations.py",
        "--json",
        mariadb=True,
        quick="--rows 1000000 --reps 3",
        smoke="--rows 20000 --pending 1000 --reps 1",
    ),
    "autovacuum": Script(
        "bench/autovacuum.py",
        "--json",
        quick="--history 1000000 --seconds 180 --reps 1",
        smoke="--history 20000 --rate 100 --seconds 10 --reps 1",
    ),
    "tasks": Script(
        "bench/tasks.py",
        "--output",
        database=True,
        python=ROOT / ".venv-django6" / "bin" / "python",
        quick="--messages 1000 --peer-messages 300",
        smoke="--messages 50 --peer-messages 50 --reps 1 --processes 1",
    ),
    "chaos": Script("tests/chaos/run.py", "--json", quick="--quick", smoke="--quick"),
}
SECTIONS = (
    *("send", "drain", "latency", "enqueue", "keyed", "scale", "opentx", "memory", "compare", "mariadb"),
    *SCRIPTS,
)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_outbox")
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    args_parser = parser(__doc__)
    mode = args_parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="smaller sizes: a few minutes")
    mode.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition: seconds (CI)")
    args_parser.add_argument("--only", help=f"comma-separated sections among {','.join(SECTIONS)}")
    compare = str(COMPARE_PYTHON) if COMPARE_PYTHON.exists() else None  # made by bench/compare_setup.sh
    args_parser.add_argument("--compare-python", default=compare, help="the peers' interpreter")
    args_parser.add_argument("--output", type=Path, help="JSON file (default bench/results/<timestamp>.json)")
    args_parser.add_argument("--history-rows", type=int, help="rows of history for the large claim-cost size")
    args_parser.add_argument("--memory-messages", type=int, help="messages the memory figure relays")
    args = args_parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else set(SECTIONS)
    if only - set(SECTIONS):
        args_parser.error(f"unknown sections {sorted(only - set(SECTIONS))}; choose among {', '.join(SECTIONS)}")

    from bench import common, figures, mariadb

    with_mariadb = mariadb.reachable(mariadb.url())
    if "mariadb" in only and not with_mariadb:
        if args.only or os.environ.get("CI") == "true":
            args_parser.error(f"no MariaDB answers at MARIADB_URL={mariadb.url()}")
        only.discard("mariadb")
        print(f"! no MariaDB at {mariadb.url()}: the mariadb section is skipped", flush=True)
    dsn = os.environ["DATABASE_URL"]
    if not dsn.startswith("postgres"):
        args_parser.error("DATABASE_URL must name a PostgreSQL database of the benchmark's own")
    common.setup_django("default")

    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    longer = {"history_large": args.history_rows, "memory_messages": args.memory_messages}
    sizes = dataclasses.replace(figures.SIZES[size_name], **{k: v for k, v in longer.items() if v})
    ctx = figures.Context(dsn=dsn, sizes=sizes, compare_python=args.compare_python, log=lambda s: print(s, flush=True))
    results: dict[str, Any] = {"mode": size_name, "environment": figures.environment(dsn), "figures": {}}
    out = results["figures"]
    maria: dict[str, Any] = {"messages": sizes.mariadb_messages, "processes": sizes.mariadb_processes}
    maria |= {"reps": sizes.reps, "transactions": sizes.mariadb_transactions, "log": ctx.log}
    # (section, JSON key, title, measure)
    steps: list[tuple[str, str, str, Callable[[], Any]]] = [
        ("send", "send", "a. send() overhead", lambda: figures.send_overhead(ctx)),
        ("send", "send_batch", "a. 100 messages in one transaction", lambda: figures.send_batch(ctx)),
        ("drain", "drain", "b. drain throughput", lambda: figures.drain(ctx)),
        ("latency", "latency_neighbour", "c. latency (busy neighbour)", lambda: figures.latency_neighbour(ctx)),
        ("enqueue", "enqueue", "c. enqueue concurrency", lambda: figures.enqueue(ctx)),
        ("keyed", "keyed", "c. keyed producers", lambda: figures.keyed_producers(ctx)),
        ("scale", "claim_cost", "d. claim cost vs history", lambda: figures.claim_cost(ctx)),
        ("opentx", "open_transaction", "d. open transaction", lambda: figures.open_transaction(ctx, **_expected(out))),
        ("memory", "memory", "e. memory", lambda: figures.memory(ctx)),
        ("compare", "compare", "comparisons", lambda: figures.compare(ctx, out.get("drain", {}))),
        ("mariadb", "mariadb", "f. MariaDB: drain and send()", lambda: mariadb.measure(mariadb.url(), **maria)),
    ]
    for section, script in SCRIPTS.items():
        run = functools.partial(run_script, script, section, size_name, dsn, with_mariadb)
        steps.append((section, section, f"{section} ({script.script})", run))
    output = args.output or ROOT / "bench" / "results" / f"{dt.datetime.now():%Y%m%d-%H%M%S}-{size_name}.json"
    started = time.monotonic()
    for section, key, title, measure in steps:
        if section not in only:
            continue
        print(f"{title} ...", flush=True)
        t = time.monotonic()
        out[key] = measure()
        print(f"  ({time.monotonic() - t:.0f}s)", flush=True)
        # after every section, so that a long run stopped part-way keeps what it measured
        results["seconds"], results["notes"] = time.monotonic() - started, ctx.notes
        write_json(output, results)
    print(f"\n{table.render(results)}\n\nwrote {output}")
    if "drain" in out and not args.smoke:
        from bench import plot

        plot.draw(results, plot.PICTURE)
        print(f"drew {plot.PICTURE}")
    return 0


def run_script(script: Script, section: str, size_name: str, dsn: str, with_mariadb: bool) -> Any:
    """Run one script section, with its own settings and database; its JSON, or ``{"failed": exit status}`` (the
    run goes on with the rest)."""
    args = getattr(script, size_name).split()
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    if script.database:
        env["DATABASE_URL"] = f"{dsn}_{section}"
    if script.mariadb:
        args += ["--databases", "postgresql,mysql" if with_mariadb else "postgresql"]
        env["BENCH_DATABASE"] = f"{urlparse(dsn).path.lstrip('/')}_{section}"  # on each server
        env["BENCH_POSTGRESQL"] = urlparse(dsn)._replace(path="").geturl()  # the harness's server
    if script.python and not script.python.exists():
        print(f"! {section}: {script.python.relative_to(ROOT)} is missing (python3 dev.py makes it)", flush=True)
        return {"failed": "no interpreter"}
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / f"{section}.json"
        command = [str(script.python or sys.executable), str(ROOT / script.script), *args, script.output, str(output)]
        status = subprocess.run(command, cwd=ROOT, env=env).returncode
        figures = json.loads(output.read_text()) if output.exists() else {}
    if status:
        print(f"! {section}: {script.script} exited {status}", flush=True)
        return {**figures, "failed": status} if isinstance(figures, dict) else {"figures": figures, "failed": status}
    return figures


def _expected(out: dict[str, Any]) -> dict[str, float]:
    """``open_transaction``'s ``expected_rate``: this run's one-process drain rate, if the drain ran."""
    one = out.get("drain", {}).get("by_processes", {}).get("1")
    return {"expected_rate": float(one["outbox_per_s"]) if one else 5000.0}


if __name__ == "__main__":
    sys.exit(main())
