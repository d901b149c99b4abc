"""Lint the outbox's migrations for operations that would stop ``send()`` on a live table.

    python tools/lint_migrations.py [--database-url postgres://postgres@127.0.0.1:5432/postgres]

Django writes each migration's PostgreSQL SQL (``manage.py sqlmigrate``, which needs a server to talk to
but changes nothing in it); Squawk, a linter made for PostgreSQL migrations, reads it and refuses what
takes a lock that blocks writes for the length of a table scan or waits for one in the lock queue: an
index built without ``CONCURRENTLY``, a ``NOT NULL`` column without a default, a constraint added
without ``NOT VALID``, a column's type changed, a missing ``lock_timeout``. Each finding names its rule;
https://squawkhq.com/docs/<rule> gives the safe recipe.

It also refuses, in a migration not marked ``post_deploy = True``, an operation that takes away what the
previous release's processes may still use while ``migrate`` runs (a column, a table, an index or a
constraint removed, a name changed): rule ``contract-without-post-deploy``. A post-deploy migration may
drop columns and tables (Squawk's ``ban-drop-column`` and ``ban-drop-table`` are lifted for it); it takes
away only what an earlier release stopped using.

Every migration after the initial one is linted. The initial migration is not: it creates the tables on
an empty database, where no lock can wait for or block anyone.

Squawk comes from the npm tree of tests/support/node (``npm ci --prefix tests/support/node``). The exit
status is 0 when every migration passes, 1 when one does not, 2 when the linter cannot run.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SQUAWK = ROOT / "tests" / "support" / "node" / "node_modules" / "@squawk-cli" / "linux-x64" / "bin" / "squawk"
APP = "django_outbox"
#: Where sqlmigrate connects when no PostgreSQL DATABASE_URL is set: the server's maintenance database.
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/postgres"

#: Squawk's rules left out, each because it judges what the models choose, not a lock:
EXCLUDED_RULES = (
    # the column types are the models' (Django's CharField is varchar(n), IntegerField integer);
    "prefer-text-field",
    "prefer-bigint-over-int",
    "prefer-bigint-over-smallint",
    # Django writes no IF NOT EXISTS, and records a migration only once it has run whole;
    "prefer-robust-stmts",
    # a statement_timeout would abort a CONCURRENTLY build that rightly takes minutes on a large table:
    # lock_timeout is the bound that keeps send() moving, and it stays required.
    "require-statement-timeout",
)


#: Operations that take away what the previous release's code may still read or write: allowed only in a
#: migration marked ``post_deploy = True``, which removes what an earlier release stopped using.
CONTRACT_OPERATIONS = frozenset(
    {
        "RemoveField",
        "DeleteModel",
        "RemoveIndex",
        "RemoveIndexConcurrently",
        "RemoveIndexOnline",
        "RemoveConstraint",
        "RenameField",
        "RenameModel",
        "RenameIndex",
        "AlterModelTable",
    }
)
#: Squawk's rules that a post-deploy migration is for: dropping what nothing reads any more.
POST_DEPLOY_ALLOWS = ("ban-drop-column", "ban-drop-table")


class LinterUnavailable(RuntimeError):
    """Squawk or a PostgreSQL connection is missing: nothing was linted."""


@dataclass(frozen=True, kw_only=True)
class Result:
    """What Squawk said about the linted migrations (``linted`` by name; none linted is a pass)."""

    linted: tuple[str, ...]
    returncode: int
    report: str

    @property
    def passed(self) -> bool:
        return self.returncode == 0


def squawk_path() -> Path:
    if not SQUAWK.exists():
        raise LinterUnavailable(
            f"{SQUAWK} is missing: install the npm packages of tests/support/node (npm ci --prefix tests/support/node)"
        )
    return SQUAWK


def migrations_to_lint(app_label: str = APP) -> list[str]:
    """The app's migrations in the order they apply, less the initial ones."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None, ignore_no_migrations=True)
    plan = [key for key in loader.graph.forwards_plan(*loader.graph.leaf_nodes(app_label)) if key[0] == app_label]
    return [name for _, name in plan if not loader.disk_migrations[app_label, name].initial]


def _operations(operations: Any) -> list[Any]:
    """Every operation, the ones inside a ``WithLockTimeout`` included."""
    found = []
    for operation in operations:
        found.append(operation)
        found.extend(_operations(getattr(operation, "operations", ())))
    return found


def is_post_deploy(app_label: str, name: str) -> bool:
    from django.db.migrations.loader import MigrationLoader

    migration = MigrationLoader(None, ignore_no_migrations=True).disk_migrations[app_label, name]
    return bool(getattr(migration, "post_deploy", False))


def contract_findings(app_label: str, names: list[str]) -> list[str]:
    """Expand, then contract: what the previous release uses is taken away only by a migration marked
    ``post_deploy = True`` (in a later release than the one that stopped using it)."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None, ignore_no_migrations=True)
    findings = []
    for name in names:
        migration = loader.disk_migrations[app_label, name]
        if getattr(migration, "post_deploy", False):
            continue
        for operation in _operations(migration.operations):
            if type(operation).__name__ in CONTRACT_OPERATIONS:
                findings.append(
                    f"{app_label}.{name}.sql:1:1: error: contract-without-post-deploy {operation.describe()}: the "
                    "previous release's processes still run while migrate does; take it away in a later release's "
                    "migration marked post_deploy = True (docs/upgrading.md, Expand, then contract)"
                )
    return findings


def migration_sql(app_label: str, name: str, using: str) -> str:
    from django.core.management import call_command

    out = io.StringIO()
    call_command("sqlmigrate", app_label, name, database=using, stdout=out, no_color=True)
    return out.getvalue()


def lint(app_label: str = APP, *, using: str = "default") -> Result:
    """Lint ``app_label``'s migrations after the initial one, with the SQL written for ``using`` (a
    PostgreSQL alias)."""
    from django.db import connections

    connection = connections[using]
    if connection.vendor != "postgresql":
        raise LinterUnavailable(f"database {using!r} is {connection.vendor}: Squawk reads PostgreSQL's SQL")
    squawk = squawk_path()
    names = migrations_to_lint(app_label)
    if not names:
        return Result(linted=(), returncode=0, report=f"{app_label}: no migration after the initial one\n")
    version: int = connection.pg_version  # type: ignore[attr-defined]  # PostgreSQL's backend has it
    major, minor = divmod(version, 10000)
    with tempfile.TemporaryDirectory(prefix="lint-migrations-") as folder:
        files = []
        for name in names:
            file = f"{app_label}.{name}.sql"  # as the report names it
            sql = migration_sql(app_label, name, using)
            if is_post_deploy(app_label, name):
                sql = f"-- squawk-ignore-file {','.join(POST_DEPLOY_ALLOWS)}\n{sql}"
            (Path(folder) / file).write_text(sql, encoding="utf-8")
            files.append(file)
        completed = subprocess.run(
            [
                str(squawk),
                f"--pg-version={major}.{minor}",
                f"--exclude={','.join(EXCLUDED_RULES)}",
                "--reporter=gcc",
                *files,
            ],
            capture_output=True,
            text=True,
            check=False,
            cwd=folder,  # no .squawk.toml of the caller's directory applies
        )
    findings = contract_findings(app_label, names)
    report = completed.stdout + completed.stderr + "".join(f"{line}\n" for line in findings)
    returncode = completed.returncode if completed.returncode != 0 or not findings else 1
    return Result(linted=tuple(names), returncode=returncode, report=report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        default=_postgres_url(os.environ.get("DATABASE_URL", "")),
        help="a PostgreSQL server for sqlmigrate to talk to (nothing is written); default: DATABASE_URL if it "
        f"is PostgreSQL, else {DEFAULT_URL}",
    )
    args = parser.parse_args(argv)
    os.environ["DATABASE_URL"] = args.database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.db import OperationalError

    try:
        result = lint()
    except (LinterUnavailable, OperationalError) as exc:
        print(f"lint_migrations: {exc}", file=sys.stderr)
        return 2
    print(result.report, end="")
    verdict = "pass" if result.passed else "FAIL"
    print(f"lint_migrations: {len(result.linted)} migration(s) of {APP} linted with Squawk: {verdict}")
    return 0 if result.passed else 1


def _postgres_url(url: str) -> str:
    return url if url.startswith(("postgres://", "postgresql://")) else DEFAULT_URL


if __name__ == "__main__":
    sys.exit(main())
