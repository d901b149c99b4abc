#!/usr/bin/env python3
"""Developer entry point that needs nothing but Python 3.11+.

    python3 dev.py demo           # make .venv, migrate a SQLite demo database, place orders, relay them
    python3 dev.py test           # all that CI runs: lint, types, the docs site, the unit layer, the suite on
                                  # SQLite, PostgreSQL and MariaDB for Django 5.2 and 6.x, through PgBouncer,
                                  # with USE_TZ = False, and the quick chaos runs; side by side, timed
    python3 dev.py test --quick   # the inner loop: lint, types, the unit and database layers on SQLite and
                                  # PostgreSQL for Django 5.2
    python3 dev.py test -- tests/db/test_send.py                          # chosen tests, on each database
    python3 dev.py test --pooler transaction -- tests/db/test_inbox.py   # one module through the pooler

It creates the virtual environments it needs (``.venv`` for Django 5.2 on this Python, ``.venv-django6``
on Python 3.12+ when one is found) and reinstalls them when pyproject.toml changes. The runs of ``test``
(its "cells") go side by side, each pytest run spread over processes by pytest-xdist with test databases
of its own; each cell's output is printed whole when it ends, and a table of every step's wall time closes
the run (docs/contributing.md).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent
DEFAULT_PG_URL = "postgres://postgres@127.0.0.1:5432/test"
DEFAULT_MARIADB_URL = "mysql://root@127.0.0.1:3306/test"
#: Run once more with USE_TZ = False (naive times in a zone away from UTC): what handles time.
NAIVE_TIME_TESTS = [
    "tests/db/test_housekeeping.py",
    "tests/unit/test_retention_settings.py",
    "tests/worker/test_relay.py",
    "tests/acceptance/test_worker_processes.py",
    "tests/db/admin/test_admin.py",
    "tests/db/test_status_command.py",
    "tests/db/test_ordering.py",
]
#: Run once more through a private PgBouncer in each pool mode (Django 5.2, PostgreSQL): the core
#: scenarios (send in the caller's transaction, workers exactly once, SIGKILL, retries, dead, the admin's
#: actions, Idempotency-Key endpoints, the inbox, ordering, housekeeping) with the default settings.
POOLER_TESTS = [
    "tests/db/test_send.py",
    "tests/db/test_send_idempotency.py",
    "tests/acceptance/test_worker_processes.py",
    "tests/worker/test_relay.py",
    "tests/db/admin/test_admin.py",
    "tests/db/test_idempotency.py",
    "tests/db/test_inbox.py",
    "tests/db/test_ordering.py",
    "tests/db/test_housekeeping.py",
    "tests/worker/test_wakeup.py",
]
PGBOUNCER = Path("/usr/sbin/pgbouncer")
SQUAWK = ROOT / "tests" / "support" / "node" / "node_modules" / "@squawk-cli" / "linux-x64" / "bin" / "squawk"


def run(*cmd: str | Path, env: dict[str, str] | None = None, check: bool = True) -> int:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    result = subprocess.run([str(c) for c in cmd], cwd=ROOT, env={**os.environ, **(env or {})})
    if check and result.returncode != 0:
        sys.exit(result.returncode)
    return result.returncode


def find_python(min_minor: int) -> str | None:
    """A CPython 3.x (x >= min_minor) that really runs: pyenv's versions, then PATH (shims may be dead)."""
    if sys.version_info >= (3, min_minor):
        return sys.executable
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [
        str(p)
        for minor in range(13, min_minor - 1, -1)
        for p in sorted(pyenv_root.glob(f"3.{minor}.*/bin/python3"), reverse=True)
    ]
    candidates += [found for minor in range(13, min_minor - 1, -1) if (found := shutil.which(f"python3.{minor}"))]
    for candidate in candidates:
        probe = subprocess.run(
            [candidate, "-c", "import sys, venv; print(sys.version_info[:2])"], capture_output=True, text=True
        )
        if probe.returncode == 0:
            return candidate
    return None


def ensure_venv(path: Path, python: str, django_spec: str, group: str = "dev") -> Path:
    """Create or refresh a virtualenv with the project installed in editable mode, and one of
    pyproject.toml's dependency groups (``dev``: tests, lint and docs; ``test``: the tests only)."""
    stamp_text = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes()
        + re.findall(rb"^__version__ = .*$", (ROOT / "django_outbox" / "__init__.py").read_bytes(), re.M)[0]
        + f"{django_spec} {group}".encode()
    ).hexdigest()
    stamp = path / ".dev-stamp"
    bin_python = path / "bin" / "python"
    if bin_python.exists() and stamp.exists() and stamp.read_text() == stamp_text:
        return bin_python
    if not bin_python.exists():
        run(python, "-m", "venv", path)
    # Dependency groups (PEP 735) need pip 25.1 or later: a venv's own pip may be older.
    run(bin_python, "-m", "pip", "install", "--quiet", "--upgrade", "pip>=25.1")
    run(
        bin_python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "-e",
        ROOT,
        "--group",
        f"{ROOT / 'pyproject.toml'}:{group}",
        django_spec,
    )
    stamp.write_text(stamp_text)
    return bin_python


def main_venv() -> Path:
    return ensure_venv(ROOT / ".venv", sys.executable, "django>=5.2,<6")


def postgres_reachable(url: str, *, default_port: int = 5432) -> bool:
    """Whether the database server of ``url`` accepts connections (PostgreSQL, or MariaDB on 3306)."""
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or default_port), timeout=2):
            return True
    except OSError:
        return False


def cmd_demo(args: argparse.Namespace) -> None:
    python = main_venv()
    env = {"DATABASE_URL": ""} if "DATABASE_URL" not in os.environ else {}
    env["SQLITE_PATH"] = str(ROOT / "demo.sqlite3")
    run(python, "manage.py", "migrate", "--verbosity", "0", env=env)
    run(python, "manage.py", "demo", "--orders", str(args.orders), env=env)


@dataclass
class Cell:
    """One step of ``dev.py test``: a command, its environment, and how many processes it keeps busy."""

    label: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    weight: int = 1
    #: The label of a cell that must have passed before this one starts (its virtual environment).
    needs: str | None = None


@dataclass
class Outcome:
    cell: Cell
    returncode: int
    started: float
    seconds: float
    #: CPU seconds of the cell's process tree (what a busy machine divides among the cells).
    cpu: float
    counts: dict[str, int]


#: pytest's closing line, "1764 passed, 32 skipped in 794.02s (0:13:14)" (with -q; framed by = without).
SUMMARY = re.compile(r"^=*\s*((?:\d+ [a-z]+(?:, )?)+) in [\d.]+s", re.M)
COUNT = re.compile(r"(\d+) ([a-z]+)")
COVERAGE_DIR = ROOT / ".coverage-data"


def pytest_counts(text: str) -> dict[str, int]:
    found = SUMMARY.findall(text)
    if not found:
        return {}
    counts: dict[str, int] = {}
    for number, word in COUNT.findall(found[-1]):
        word = {"error": "errors", "warning": "warnings"}.get(word, word)
        counts[word] = counts.get(word, 0) + int(number)
    return counts


def clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}:{rest:02d}"


def run_cells(cells: list[Cell], slots: int) -> list[Outcome]:
    """Run the cells side by side, at most ``slots`` processes' worth at once, in the order given (the
    longest first), the next starting when its processes fit in the slots left. Each
    cell's output goes to a log of its own and is printed whole when the cell ends, so outputs never mix."""
    logs = ROOT / ".dev-logs"
    logs.mkdir(exist_ok=True)
    pending = list(cells)
    running: dict[subprocess.Popen[bytes], tuple[Cell, float, Path]] = {}
    outcomes: list[Outcome] = []
    began = time.monotonic()
    # SIGTERM (a CI's timeout, kill) ends the run as Ctrl-C does: through the finally below, cells and all.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        while pending or running:
            busy = sum(cell.weight for cell, _, _ in running.values())
            passed = {o.cell.label for o in outcomes if o.returncode == 0}
            done = {o.cell.label for o in outcomes}
            for cell in [c for c in pending if c.needs in done and c.needs not in passed]:
                pending.remove(cell)  # what it needs failed: it cannot run
                print(f"=== {cell.label}: not run ({cell.needs} failed) ===\n", flush=True)
                outcomes.append(Outcome(cell, 1, time.monotonic() - began, 0.0, 0.0, {}))
            # In order, the longest first: a later, smaller cell never jumps the queue, or the long ones
            # would start last and the run would end on them; only a cell waiting for what it needs (a
            # virtual environment still being made) is passed over.
            while True:
                ready = [c for c in pending if c.needs is None or c.needs in passed]
                if not ready or (running and busy + ready[0].weight > slots):
                    break
                cell = ready[0]
                pending.remove(cell)
                log = logs / (re.sub(r"[^a-z0-9]+", "-", cell.label.lower()).strip("-") + ".log")
                print(f"[{clock(time.monotonic() - began)}] started: {cell.label}", flush=True)
                with log.open("wb") as out:
                    proc = subprocess.Popen(
                        cell.argv,
                        cwd=ROOT,
                        env={**os.environ, **cell.env},
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # Ctrl-C here stops its whole process group, below
                    )
                running[proc] = (cell, time.monotonic(), log)
                busy += cell.weight
            time.sleep(0.2)
            for proc in list(running):
                # wait4: the exit status and the CPU time of the cell's whole process tree (pytest waits
                # for its xdist processes and for every worker process a test starts).
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid == 0:
                    continue
                proc.returncode = os.waitstatus_to_exitcode(status)
                cell, started, log = running.pop(proc)
                seconds = time.monotonic() - started
                text = log.read_text(errors="replace")
                cpu = usage.ru_utime + usage.ru_stime
                outcome = Outcome(cell, proc.returncode, started - began, seconds, cpu, pytest_counts(text))
                outcomes.append(outcome)
                verdict = "passed" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
                print(f"\n=== {cell.label} ===\n+ {' '.join(cell.argv)}\n{text.rstrip()}", flush=True)
                print(f"=== {cell.label}: {verdict} in {clock(seconds)} ===\n", flush=True)
    finally:
        for proc in running:  # interrupted: no cell outlives the command
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    return outcomes


def print_table(outcomes: list[Outcome], setup: float, wall: float) -> bool:
    """Every step's start, wall time and counts, so a change that makes one slower shows at once. Starts
    count from the first cell; the main virtual environment (made or checked first) is the setup row."""
    setup_label = "virtual environment, Django 5.2 (made or checked)"
    width = max(len(setup_label), *(len(o.cell.label) for o in outcomes))
    print(f"\n{'step':<{width}}  start   wall    cpu  result")
    print(f"{setup_label:<{width}}  {'':>5}  {clock(setup):>5}")
    totals: dict[str, int] = {}
    for o in sorted(outcomes, key=lambda o: o.started):
        for word, number in o.counts.items():
            totals[word] = totals.get(word, 0) + number
        counts = ", ".join(f"{n} {w}" for w, n in o.counts.items())
        result = ("ok" if o.returncode == 0 else f"FAILED (exit {o.returncode})") + (f": {counts}" if counts else "")
        print(f"{o.cell.label:<{width}}  {clock(o.started):>5}  {clock(o.seconds):>5}  {clock(o.cpu):>5}  {result}")
    failed = [o.cell.label for o in outcomes if o.returncode != 0]
    cpu = sum(o.cpu for o in outcomes)
    print(f"{'the whole run':<{width}}  {'':>5}  {clock(wall):>5}  {clock(cpu):>5}")
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    # The closing line: the tests of every cell together.
    failures = totals.get("failed", 0) + totals.get("errors", 0)
    print(f"\ntotal: {totals.get('passed', 0)} passed, {failures} failed, {totals.get('skipped', 0)} skipped")
    return not failed


def pytest_cell(
    label: str,
    python: Path,
    selected: list[str],
    env: dict[str, str],
    *,
    processes: int,
    suffix: str,
    extra: list[str] | None = None,
    coverage: bool = False,
    needs: str | None = None,
) -> Cell:
    """A pytest run with test databases of its own (``suffix``), spread over ``processes`` by pytest-xdist
    (whole modules to one process: a module's fixtures and its order stay as written)."""
    spread = ["-n", str(processes), "--dist", "loadfile"] if processes > 1 else ["-p", "no:xdist"]
    runner = [str(python), "-m", "coverage", "run", "-m", "pytest"] if coverage else [str(python), "-m", "pytest"]
    cell_env = {**env, "TEST_DATABASE_SUFFIX": suffix}
    if coverage:
        cell_env.update(coverage_env())
    # The slowest tests of the cell, in its log: what to look at first when the run grows.
    argv = [*runner, *spread, "--durations=15", *(extra or []), *selected]
    return Cell(label, argv, cell_env, weight=max(processes, 1), needs=needs)


def coverage_env() -> dict[str, str]:
    """Each process (xdist's, the workers a test starts, a chaos run's) writes its own data file here;
    pyproject.toml's [tool.coverage] measures the package, lines and branches, in subprocesses too."""
    return {"COVERAGE_FILE": str(COVERAGE_DIR / ".coverage"), "COVERAGE_RCFILE": str(ROOT / "pyproject.toml")}


def cmd_test(args: argparse.Namespace) -> None:
    began = time.monotonic()
    python = main_venv()
    ci = os.environ.get("CI") == "true"
    pytest_args = list(args.pytest_args)
    whole = not pytest_args  # the whole suite, as against tests chosen on the command line
    quick = args.quick
    if args.coverage:
        shutil.rmtree(COVERAGE_DIR, ignore_errors=True)
        COVERAGE_DIR.mkdir()
    pg_url = os.environ.get("DATABASE_URL") or DEFAULT_PG_URL
    have_pg = args.database in ("all", "postgresql") and postgres_reachable(pg_url)
    if not have_pg and args.database in ("all", "postgresql"):
        if ci:
            sys.exit(f"PostgreSQL is not reachable at {pg_url}; under CI=true that is a failure.")
        print(f"! PostgreSQL not reachable at {pg_url}: running without it", flush=True)
    mariadb_url = os.environ.get("MARIADB_URL") or DEFAULT_MARIADB_URL
    want_mariadb = args.database in ("all", "mariadb") and not quick
    have_mariadb = want_mariadb and postgres_reachable(mariadb_url, default_port=3306)
    if want_mariadb and not have_mariadb:
        if ci:
            sys.exit(f"MariaDB is not reachable at {mariadb_url}; under CI=true that is a failure.")
        print(f"! MariaDB not reachable at {mariadb_url}: skipping the MariaDB runs", flush=True)
    pooler_modes = ["transaction", "session"] if args.pooler == "both" else [args.pooler]
    if args.pooler == "none" or quick or (args.pooler == "both" and not whole) or not have_pg:
        pooler_modes = []
    elif not PGBOUNCER.exists():
        if ci:
            sys.exit(f"{PGBOUNCER} is missing (apt-get install pgbouncer); under CI=true that is a failure.")
        print(f"! {PGBOUNCER} not found: skipping the runs through PgBouncer", flush=True)
        pooler_modes = []
    if args.pooler not in ("both", "none"):  # only that cell, e.g. dev.py test --pooler session -- tests/x.py
        pooled_only(python, pooler_modes, pg_url, pytest_args)
        return
    python6: Path | None = None
    if not args.no_django6 and not quick:
        newer = find_python(12)
        if newer is None:
            if ci:
                sys.exit("Django 6.x needs Python 3.12+, and none was found; under CI=true that is a failure.")
            print("! no Python 3.12+ found: skipping the Django 6.x cells", flush=True)
        else:
            python6 = ROOT / ".venv-django6" / "bin" / "python"
    setup = time.monotonic() - began

    databases: list[tuple[str, str, dict[str, str]]] = []  # (name, suffix, environment)
    if have_pg:
        databases.append(("PostgreSQL", "pg", {"DATABASE_URL": pg_url}))
    if have_mariadb:
        databases.append(("MariaDB", "maria", {"DATABASE_URL": mariadb_url}))
    if args.database in ("all", "sqlite"):
        databases.append(("SQLite", "lite", {"DATABASE_URL": ""}))
    versions: list[tuple[str, str, Path]] = [("Django 5.2", "dj5", python)]
    if python6 is not None:
        versions.append(("Django 6.x", "dj6", python6))

    def processes(label: str) -> int:
        return args.processes or PROCESSES.get(label, 2)

    cov = args.coverage
    cells: list[Cell] = []
    if python6 is not None:
        # Made (or checked) beside the Django 5.2 cells, which start at once: its cells wait for it.
        make = f"import dev; dev.ensure_venv(dev.ROOT / '.venv-django6', {newer!r}, 'django>=6,<7', group='test')"
        cells.append(Cell(VENV6, [sys.executable, "-c", make], weight=0))
    # The database layers (or the tests named) on each database and Django version, the heaviest first.
    # The suites marked slow (real processes, poolers, browsers, shifted clocks) run in the Django 5.2
    # cells only.
    selected = (DATABASE_LAYERS_QUICK if quick else DATABASE_LAYERS) if whole else pytest_args
    for version, vtag, interpreter in versions:
        once = ["-m", "not slow"] if vtag == "dj6" and whole else []  # tests named by hand run as asked
        for name, dtag, env in databases:
            label = f"{version} / {name}"
            spread = processes(label) if whole else 1
            cells.append(
                pytest_cell(
                    label,
                    interpreter,
                    selected,
                    env,
                    processes=spread,
                    suffix=f"{vtag}{dtag}",
                    extra=once,
                    coverage=cov,
                    needs=VENV6 if vtag == "dj6" else None,
                )
            )
    if whole:
        # The unit layer needs no database: once per Django version.
        for version, vtag, interpreter in versions:
            unit_env = {"DATABASE_URL": ""}
            cells.append(
                pytest_cell(
                    f"{version} / unit layer",
                    interpreter,
                    ["tests/unit"],
                    unit_env,
                    processes=1,
                    suffix=f"{vtag}unit",
                    coverage=cov,
                    needs=VENV6 if vtag == "dj6" else None,
                )
            )
        for mode in pooler_modes:
            label = f"Django 5.2 / PostgreSQL through PgBouncer ({mode} pooling)"
            cells.append(
                pytest_cell(
                    label,
                    python,
                    POOLER_TESTS,
                    pooler_env(pg_url, mode),
                    processes=2,
                    suffix=f"pgb{mode[0]}",
                    coverage=cov,
                )
            )
        if not quick:
            # The modules that handle time, with naive datetimes (Django 5.2, SQLite and PostgreSQL).
            for version, vtag, interpreter in versions[:1]:
                for name, dtag, env in databases:
                    if name == "MariaDB":
                        continue
                    label = f"{version} / {name}, USE_TZ = False"
                    naive_env = {**env, "TEST_USE_TZ": "0"}
                    cells.append(
                        pytest_cell(
                            label,
                            interpreter,
                            NAIVE_TIME_TESTS,
                            naive_env,
                            processes=2,
                            suffix=f"{vtag}{dtag}naive",
                            coverage=cov,
                        )
                    )
        if not args.no_chaos and not quick:
            cells += chaos_cells(python, databases, pooler_modes, coverage=cov)
    if not args.no_lint:
        cells += [
            Cell("ruff check", [str(python), "-m", "ruff", "check", "."]),
            Cell("ruff format --check", [str(python), "-m", "ruff", "format", "--check", "."]),
            Cell("mypy", [str(python), "-m", "mypy", "."]),
        ]
        if have_pg:
            # Squawk over each migration after the initial one (docs/upgrading.md): an operation that would
            # stop send() on a live table fails. It needs tests/support/node's packages (npm ci).
            if SQUAWK.exists() or ci:
                lint = [str(python), "tools/lint_migrations.py", "--database-url", pg_url]
                cells.append(Cell("migration linter (Squawk)", lint))
            else:
                print(f"! {SQUAWK} missing (npm ci --prefix tests/support/node): not linting migrations", flush=True)
        if not quick:
            # The docs site: any broken link, anchor or page left out of the nav fails the build.
            docs = [str(python), "-m", "mkdocs", "build", "--strict", "--quiet"]
            cells.append(Cell("mkdocs build --strict", docs, {"NO_MKDOCS_2_WARNING": "1"}))
    cells.sort(key=lambda cell: -EXPECTED_MINUTES.get(cell.label, 1.0))
    outcomes = run_cells(cells, args.slots)
    passed = print_table(outcomes, setup, time.monotonic() - began)
    if cov:
        report_coverage(python)
    if not passed:
        sys.exit(1)


#: The cell that makes (or checks) the Django 6.x virtual environment.
VENV6 = "virtual environment, Django 6.x"

#: Each cell's wall time on a quiet 2-core machine, in minutes (the table of a full run): cells start in
#: this order, the longest first, so that the run does not end on a long one started late. A cell not
#: listed counts as a minute.
EXPECTED_MINUTES = {
    VENV6: 99.0,  # first: the Django 6.x cells wait for it
    "Django 5.2 / PostgreSQL": 10.0,
    "Django 5.2 / MariaDB": 8.0,
    "Django 5.2 / SQLite": 5.0,
    "Django 6.x / PostgreSQL": 5.0,
    "Django 6.x / MariaDB": 4.5,
    "Django 6.x / SQLite": 3.0,
    "chaos: Redis, MariaDB": 1.8,
    "chaos: Redis, PostgreSQL through PgBouncer": 1.6,
    "chaos: Kafka, PostgreSQL": 1.4,
    "chaos: Redis, PostgreSQL": 1.3,
    "chaos: Redis, SQLite": 1.2,
    "Django 5.2 / PostgreSQL through PgBouncer (session pooling)": 1.7,
    "Django 5.2 / PostgreSQL through PgBouncer (transaction pooling)": 1.6,
    "mypy": 1.5,
}

#: pytest-xdist processes of the cells that hold the heavy suites, so they end with the others (2 for the
#: rest): on its own the Django 5.2 / PostgreSQL cell is twice as long as any other.
PROCESSES = {"Django 5.2 / PostgreSQL": 3}

#: The layers that need a database; tests/unit runs once per Django version, apart.
DATABASE_LAYERS = ["tests/db", "tests/worker", "tests/integration", "tests/acceptance"]
#: --quick: the database layer only.
DATABASE_LAYERS_QUICK = ["tests/db"]


#: A chaos run's slots: its producers, workers, consumer and private server keep about a core busy, and
#: its deadline (the drain after the faults) assumes they have it; two at once beside a database cell
#: on two cores miss it.
CHAOS_WEIGHT = 3


def chaos_cells(
    python: Path, databases: list[tuple[str, str, dict[str, str]]], pooler_modes: list[str], *, coverage: bool
) -> list[Cell]:
    """The short fault-injection scenarios (tests/chaos/run.py --quick): each on a private server of its own
    (killed and restarted mid-run), so they run beside the test cells. Each fails if a message is lost, a
    duplicate is not explained by the audit log, or an effect was lost or applied twice."""
    names = {name for name, _, _ in databases}
    runs: list[tuple[str, list[str]]] = []
    if "PostgreSQL" in names:
        runs += [("chaos: Redis, PostgreSQL", ["--broker", "redis"])]
        runs += [("chaos: Kafka, PostgreSQL", ["--broker", "kafka"])]
        if "transaction" in pooler_modes:
            runs += [("chaos: Redis, PostgreSQL through PgBouncer", ["--broker", "redis", "--pooler", "transaction"])]
    if "SQLite" in names:
        runs += [("chaos: Redis, SQLite", ["--broker", "redis", "--database", "sqlite"])]
    if "MariaDB" in names:
        runs += [("chaos: Redis, MariaDB", ["--broker", "redis", "--database", "mariadb"])]
    runner = [str(python), "-m", "coverage", "run"] if coverage else [str(python)]
    env = coverage_env() if coverage else {}
    return [
        Cell(label, [*runner, "tests/chaos/run.py", "--quick", *more], env, weight=CHAOS_WEIGHT) for label, more in runs
    ]


def report_coverage(python: Path) -> None:
    """Line and branch coverage of django_outbox over every cell, combined."""
    env = coverage_env()
    run(python, "-m", "coverage", "combine", "--quiet", env=env, check=False)
    run(python, "-m", "coverage", "report", "--skip-covered", "--sort", "cover", env=env, check=False)
    run(python, "-m", "coverage", "json", "--quiet", "-o", COVERAGE_DIR / "coverage.json", env=env, check=False)


def pooler_env(pg_url: str, mode: str) -> dict[str, str]:
    """tests/settings.py starts the PgBouncer (tests/support/pooled.py) and points the test databases through it."""
    return {"DATABASE_URL": pg_url, "TEST_POOLER": mode, "TEST_POOLER_DIRECT": ""}


def pooled_only(python: Path, pooler_modes: list[str], pg_url: str, pytest_args: list[str]) -> None:
    if not pooler_modes:
        sys.exit("no run through PgBouncer possible here (PostgreSQL or pgbouncer missing)")
    mode = pooler_modes[0]
    print(f"\n=== Django 5.2 / PostgreSQL through PgBouncer ({mode} pooling) ===", flush=True)
    if run(python, "-m", "pytest", *(pytest_args or POOLER_TESTS), env=pooler_env(pg_url, mode), check=False):
        sys.exit(f"test run failed: PgBouncer ({mode} pooling)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the demo shop on SQLite")
    demo.add_argument("--orders", type=int, default=5)
    demo.set_defaults(func=cmd_demo)
    test = sub.add_parser("test", help="lint, type-check and run the test suite")
    test.add_argument(
        "--quick",
        action="store_true",
        help="the inner loop: lint, types, unit and database layers on SQLite and PostgreSQL, Django 5.2",
    )
    test.add_argument("--database", choices=["all", "sqlite", "postgresql", "mariadb"], default="all")
    test.add_argument("--no-django6", action="store_true", help="skip the Django 6.x cells")
    test.add_argument("--no-lint", action="store_true", help="skip ruff, mypy and the docs build")
    test.add_argument("--no-chaos", action="store_true", help="skip the quick chaos runs")
    test.add_argument(
        "--pooler",
        choices=["both", "transaction", "session", "none"],
        default="both",
        help="the core modules through PgBouncer: both modes in a whole run (default), one mode"
        " only (with the pytest arguments given, or the core modules), or none",
    )
    cores = os.cpu_count() or 2
    test.add_argument(
        "--processes",
        type=int,
        help="pytest-xdist processes of each database cell (default: 3 for Django 5.2 on PostgreSQL, 2 for the others)",
    )
    test.add_argument(
        "--slots",
        type=int,
        default=(7 * cores) // 2,
        help=f"processes' worth of cells run at once (default 3.5 per core: {(7 * cores) // 2}, the three Django 5.2"
        " cells side by side on two cores; more made tests with real time windows miss them); most tests wait on"
        " servers, sockets and worker processes, so a core keeps several busy",
    )
    test.add_argument(
        "--coverage", action="store_true", help="measure line and branch coverage of django_outbox, combined"
    )
    test.add_argument("pytest_args", nargs=argparse.REMAINDER, help="passed to pytest (after --)")
    test.set_defaults(func=cmd_test)
    args = parser.parse_args()
    if getattr(args, "pytest_args", None) and args.pytest_args[0] == "--":
        args.pytest_args = args.pytest_args[1:]
    args.func(args)


if __name__ == "__main__":
    main()
