#!/usr/bin/env python3
"""Developer entry point that needs nothing but Python 3.11+.

    python3 dev.py demo     # make .venv, migrate a SQLite demo database, place orders, relay them
    python3 dev.py test     # ruff, mypy, the docs site, then the test suite on SQLite and PostgreSQL (and Django 6.x),
                            # and its core modules through PgBouncer in transaction and session pooling
    python3 dev.py test --pooler transaction -- tests/db/test_inbox.py   # one module through the pooler

It creates the virtual environments it needs (``.venv`` for Django 5.2 on this Python, ``.venv-django6``
on Python 3.12+ when one is found) and reinstalls them when pyproject.toml changes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent
DEFAULT_PG_URL = "postgres://postgres@127.0.0.1:5432/test"
DEFAULT_MARIADB_URL = "mysql://root@127.0.0.1:3306/test"
#: What the MariaDB cells run: every layer (issue 20). The tests of PostgreSQL-only machinery (PgBouncer,
#: LISTEN/NOTIFY, the role's timeouts, psycopg's pool, bench/run.py's smoke run) skip there, saying so; as
#: in the other cells, the suites marked slow run in the Django 5.2 cell only.
MARIADB_TESTS = [
    "tests/unit",
    "tests/db",
    "tests/worker",
    "tests/acceptance",
    "tests/integration",
]
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


def cmd_test(args: argparse.Namespace) -> None:
    python = main_venv()
    ci = os.environ.get("CI") == "true"
    pytest_args = list(args.pytest_args)
    if not args.no_lint:
        run(python, "-m", "ruff", "check", ".")
        run(python, "-m", "ruff", "format", "--check", ".")
        run(python, "-m", "mypy", ".")
        # The docs site: any broken link, anchor or page left out of the nav fails the build.
        run(python, "-m", "mkdocs", "build", "--strict", "--quiet", env={"NO_MKDOCS_2_WARNING": "1"})
    pg_url = os.environ.get("DATABASE_URL") or DEFAULT_PG_URL
    have_pg = postgres_reachable(pg_url)
    if not have_pg and args.database in ("all", "postgresql"):
        if ci:
            sys.exit(f"PostgreSQL is not reachable at {pg_url}; under CI=true that is a failure.")
        print(f"! PostgreSQL not reachable at {pg_url}: running on SQLite only", flush=True)
    mariadb_url = os.environ.get("MARIADB_URL") or DEFAULT_MARIADB_URL
    want_mariadb = args.database in ("all", "mariadb")
    have_mariadb = want_mariadb and postgres_reachable(mariadb_url, default_port=3306)
    if want_mariadb and not have_mariadb:
        if ci:
            sys.exit(f"MariaDB is not reachable at {mariadb_url}; under CI=true that is a failure.")
        print(f"! MariaDB not reachable at {mariadb_url}: skipping the MariaDB runs", flush=True)
    runs: list[tuple[str, Path, dict[str, str]]] = []
    pooler_modes = ["transaction", "session"] if args.pooler == "both" else [args.pooler]
    if (args.pooler != "none" and not pytest_args) or args.pooler not in ("both", "none"):
        if not have_pg or args.database in ("sqlite", "mariadb"):
            pooler_modes = []
        elif not PGBOUNCER.exists():
            if ci:
                sys.exit(f"{PGBOUNCER} is missing (apt-get install pgbouncer); under CI=true that is a failure.")
            print(f"! {PGBOUNCER} not found: skipping the runs through PgBouncer", flush=True)
            pooler_modes = []
    else:
        pooler_modes = []
    pooled = [(f"Django 5.2 / PostgreSQL through PgBouncer ({mode} pooling)", mode) for mode in pooler_modes]
    if args.pooler not in ("both", "none"):  # only that cell, e.g. dev.py test --pooler session -- tests/x.py
        pooled_only(python, pooled, pg_url, pytest_args)
        return
    if args.database in ("all", "sqlite"):
        runs.append(("Django 5.2 / SQLite", python, {"DATABASE_URL": ""}))
    if args.database in ("all", "postgresql") and have_pg:
        runs.append(("Django 5.2 / PostgreSQL", python, {"DATABASE_URL": pg_url}))
    if have_mariadb:
        runs.append(("Django 5.2 / MariaDB", python, {"DATABASE_URL": mariadb_url}))
    naive = [] if pytest_args else [label for label, _, _ in runs if "MariaDB" not in label]  # whole-suite runs
    if not args.no_django6:
        newer = find_python(12)
        if newer is None:
            if ci:
                sys.exit("Django 6.x needs Python 3.12+, and none was found; under CI=true that is a failure.")
            print("! no Python 3.12+ found: skipping the Django 6.x run", flush=True)
        else:
            python6 = ensure_venv(ROOT / ".venv-django6", newer, "django>=6,<7", group="test")
            if args.database in ("all", "postgresql") and have_pg:
                runs.append(("Django 6.x / PostgreSQL", python6, {"DATABASE_URL": pg_url}))
            if args.database in ("all", "sqlite"):
                runs.append(("Django 6.x / SQLite", python6, {"DATABASE_URL": ""}))
            if have_mariadb:
                runs.append(("Django 6.x / MariaDB", python6, {"DATABASE_URL": mariadb_url}))
    failed = []
    for label, interpreter, env in runs:
        # Heavy suites (real worker processes, poolers, shifted clocks, browsers: marked slow) run once,
        # in the Django 5.2 cells; the Django 6.x cells run the rest.
        once = ["-m", "not slow"] if label.startswith("Django 6") and not pytest_args else []
        print(f"\n=== {label}{' (without the slow suites, run above)' if once else ''} ===", flush=True)
        selected = pytest_args or (MARIADB_TESTS if "MariaDB" in label else [])
        if run(interpreter, "-m", "pytest", *once, *selected, env=env, check=False) != 0:
            failed.append(label)
    for label, mode in pooled:
        print(f"\n=== {label} ===", flush=True)
        if run(python, "-m", "pytest", *POOLER_TESTS, env=pooler_env(pg_url, mode), check=False) != 0:
            failed.append(label)
    for label, interpreter, env in [r for r in runs if r[0] in naive]:
        label = f"{label}, USE_TZ = False"
        print(f"\n=== {label} ===", flush=True)
        if run(interpreter, "-m", "pytest", *NAIVE_TIME_TESTS, env={**env, "TEST_USE_TZ": "0"}, check=False) != 0:
            failed.append(label)
    if failed:
        sys.exit(f"test runs failed: {', '.join(failed)}")
    print(
        f"\nall test runs passed: {', '.join([label for label, _, _ in runs] + [label for label, _ in pooled])}"
        + (", and USE_TZ = False" if naive else "")
    )


def pooler_env(pg_url: str, mode: str) -> dict[str, str]:
    """tests/settings.py starts the PgBouncer (tests/support/pooled.py) and points the test databases through it."""
    return {"DATABASE_URL": pg_url, "TEST_POOLER": mode, "TEST_POOLER_DIRECT": ""}


def pooled_only(python: Path, pooled: list[tuple[str, str]], pg_url: str, pytest_args: list[str]) -> None:
    if not pooled:
        sys.exit("no run through PgBouncer possible here (PostgreSQL or pgbouncer missing)")
    label, mode = pooled[0]
    print(f"\n=== {label} ===", flush=True)
    if run(python, "-m", "pytest", *(pytest_args or POOLER_TESTS), env=pooler_env(pg_url, mode), check=False):
        sys.exit(f"test run failed: {label}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the demo shop on SQLite")
    demo.add_argument("--orders", type=int, default=5)
    demo.set_defaults(func=cmd_demo)
    test = sub.add_parser("test", help="lint, type-check and run the test suite")
    test.add_argument("--database", choices=["all", "sqlite", "postgresql", "mariadb"], default="all")
    test.add_argument("--no-django6", action="store_true", help="skip the Django 6.x runs")
    test.add_argument("--no-lint", action="store_true", help="skip ruff and mypy")
    test.add_argument(
        "--pooler",
        choices=["both", "transaction", "session", "none"],
        default="both",
        help="the core modules through PgBouncer: both modes after a whole-suite run (default), one mode"
        " only (with the pytest arguments given, or the core modules), or none",
    )
    test.add_argument("pytest_args", nargs=argparse.REMAINDER, help="passed to pytest (after --)")
    test.set_defaults(func=cmd_test)
    args = parser.parse_args()
    if getattr(args, "pytest_args", None) and args.pytest_args[0] == "--":
        args.pytest_args = args.pytest_args[1:]
    args.func(args)


if __name__ == "__main__":
    main()
