"""The core system checks: the settings, each transport's options, the database and its LISTEN.

Every configuration mistake is reported by ``manage.py check`` with a stable id, listed in
docs/checks.md; the worker command runs the checks before it starts. Other features register their
own checks with ``options.register_check`` in their own modules (``inbox/checks.py``), which
``OutboxConfig.ready()`` imports.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning

from . import conf
from .exceptions import MissingExtraError, OutboxImproperlyConfigured
from .options import check_failed, register_check
from .store import SUPPORTED_VENDORS

#: The outbox database is neither PostgreSQL, SQLite nor MariaDB/MySQL.
UNSUPPORTED_DATABASE = "django_outbox.E005"
#: SQLite with deferred transactions: concurrent writers may hit "database is locked".
SQLITE_DEFERRED = "django_outbox.W001"
#: The workers' LISTEN hears nothing sent through OUTBOX["DATABASE"]: they will only poll.
LISTEN_HEARS_NOTHING = "django_outbox.W002"
#: The outbox database lacks migrations this code ships: its workers wait, its send() may fail.
MIGRATIONS_UNAPPLIED = "django_outbox.W004"
#: MariaDB below 10.6 or MySQL below 8.0.1 (no SKIP LOCKED), or below what the installed Django supports.
MYSQL_TOO_OLD = "django_outbox.E110"
#: Statement-based binary logging: SKIP LOCKED is unsafe for it (ER_BINLOG_UNSAFE_SKIP_LOCKED).
MYSQL_STATEMENT_BINLOG = "django_outbox.E111"
#: An isolation level under which the claim's head-of-key probe locks (SERIALIZABLE) or reads uncommitted rows.
MYSQL_ISOLATION = "django_outbox.E112"
#: No index behind the claim's ORDER BY: SKIP LOCKED sessions then lock what they scan and starve each other.
MYSQL_CLAIM_INDEX = "django_outbox.E113"
#: The initial migration's MariaDB/MySQL shapes are missing: no unique idempotency key index, no per-key lock rows.
MYSQL_SHAPES_MISSING = "django_outbox.E114"
#: A ``sql_mode`` the outbox's writes cannot work under (MariaDB's EMPTY_STRING_IS_NULL).
MYSQL_SQL_MODE = "django_outbox.E115"
#: sql_mode flags under which the outbox cannot store a message, and why.
SQL_MODES_REFUSED = {
    "EMPTY_STRING_IS_NULL": "stores every '' as NULL, and the outbox writes '' to NOT NULL columns (an attempt's "
    "error, a message's last error): every send() fails with an IntegrityError",
}


@register_check(Tags.compatibility)
def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    found: list[CheckMessage] = [p.error() for p in conf.problems()]
    if found:
        return found
    outbox_settings = conf.get_settings()
    for name, transport in outbox_settings.TRANSPORTS.items():
        from .transports.registry import transport_class

        where = f"OUTBOX['TRANSPORTS'][{name!r}]"
        try:
            cls = transport_class(transport.backend)
        except OutboxImproperlyConfigured as exc:
            missing_extra = isinstance(exc, MissingExtraError)
            found.append(
                Error(
                    str(exc),
                    hint="Check the dotted path, and install the extra it names.",
                    id=conf.MISSING_EXTRA if missing_extra else conf.BAD_BACKEND,
                    obj=where,
                )
            )
            continue
        try:  # a transport's own check (perhaps a third party's) must not hide the others' findings
            found += cls.check(name, transport.options)
        except Exception as exc:
            found.append(check_failed(f"{cls.__module__}.{cls.__qualname__}.check", exc, obj=where))
    return found


@register_check(Tags.database)
def check_listen(
    app_configs: Sequence[AppConfig] | None = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """W002: the workers' LISTEN hears nothing (a pooler in transaction pooling), so they only poll.

    A database check (``manage.py check --database default``, and ``migrate``): it connects and tries.
    """
    if conf.problems():
        return []
    outbox_settings = conf.get_settings()
    alias = outbox_settings.DATABASE
    if not databases or alias not in databases or not outbox_settings.NOTIFY:
        return []
    from django.db import connections

    if connections[alias].vendor != "postgresql":
        return []
    import psycopg

    from .worker.listener import hears_itself, listen_alias
    from .worker.listener import raw_params as _raw_params

    target = listen_alias(alias)
    try:
        with psycopg.connect(**_raw_params(target), autocommit=True) as conn:
            heard = hears_itself(conn, alias)
    except Exception:  # an unreachable database is not this check's to report
        return []
    if heard:
        return []
    return [
        Warning(
            f"A LISTEN on database {target!r} does not hear notifications sent through {alias!r}: a connection "
            "pooler in transaction pooling is in the way, so workers will only poll, and a message waits up to "
            f"OUTBOX['POLL_INTERVAL_SECONDS'] ({outbox_settings.POLL_INTERVAL_SECONDS:g} s) instead of "
            "milliseconds after its commit.",
            hint="Add a DATABASES alias that reaches the same server directly and name it in "
            "OUTBOX['LISTEN_DATABASE'] (docs/deploying.md).",
            id=LISTEN_HEARS_NOTHING,
        )
    ]


@register_check(Tags.compatibility)
def check_migrations(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """W004: the outbox's migrations are not all applied on its database.

    Not a database-tagged check, so a plain ``manage.py check`` (the usual step before a deploy's
    ``migrate``) says it; it reads the ``django_migrations`` table when the server answers within 2 s,
    and says nothing when it does not (an image build with no database is not this check's to fail).
    """
    if conf.problems() or _running_command() in MIGRATION_COMMANDS:
        return []
    from .store import schema

    alias = conf.get_settings().DATABASE
    try:
        if not schema.reachable(alias):
            return []
        missing = schema.unapplied(alias)
    except Exception:  # no database, no access (a test without it), no permission: not this check's to report
        return []
    if not missing:
        return []
    return [
        Warning(
            f"Database {alias!r} lacks {len(missing)} of the outbox's migrations ({', '.join(missing)}): "
            "outbox_worker waits for them before it claims, and send() may fail until they are applied.",
            hint="Run manage.py migrate (docs/upgrading.md gives the deploy order).",
            id=MIGRATIONS_UNAPPLIED,
        )
    ]


#: Commands that make or apply migrations: they run the checks before they apply anything, and a warning
#: asking the reader who runs ``migrate`` to run ``migrate`` is noise.
MIGRATION_COMMANDS = frozenset(
    {"migrate", "makemigrations", "squashmigrations", "sqlmigrate", "showmigrations", "optimizemigration"}
)


def _running_command() -> str:
    """The management command this process was started for (``manage.py migrate``, ``django-admin
    migrate``, ``python -m django migrate``), read where Django's own command-line utility reads it."""
    return sys.argv[1] if len(sys.argv) > 1 else ""


@register_check(Tags.compatibility)
def check_database(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    alias = conf.get_settings().DATABASE if not conf.problems() else "default"
    return database_messages(alias, settings.DATABASES.get(alias, {}))


def database_messages(alias: str, db: Mapping[str, Any]) -> list[CheckMessage]:
    engine = str(db.get("ENGINE", ""))
    vendor = engine.rsplit(".", 1)[-1]
    vendor = {"sqlite3": "sqlite", "postgresql_psycopg2": "postgresql"}.get(vendor, vendor)
    if vendor not in SUPPORTED_VENDORS:
        return [
            Error(
                f"The outbox database {alias!r} uses {engine}; django_outbox supports PostgreSQL, SQLite and "
                "MariaDB/MySQL.",
                hint="Point OUTBOX['DATABASE'] at a supported database.",
                id=UNSUPPORTED_DATABASE,
            )
        ]
    if vendor == "sqlite" and db.get("OPTIONS", {}).get("transaction_mode") != "IMMEDIATE":
        return [
            Warning(
                f"SQLite database {alias!r} uses deferred transactions; concurrent workers and web requests may "
                "fail with 'database is locked'.",
                hint="Set DATABASES[...]['OPTIONS'] = {'transaction_mode': 'IMMEDIATE', 'timeout': 20, "
                "'init_command': 'PRAGMA journal_mode=WAL;'} (docs/settings.md#sqlite).",
                id=SQLITE_DEFERRED,
            )
        ]
    return []


@register_check(Tags.database)
def check_mysql(
    app_configs: Sequence[AppConfig] | None = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """E110-E115: a MariaDB/MySQL server the claim cannot rely on. A database check: it connects."""
    alias = conf.get_settings().DATABASE if not conf.problems() else "default"
    if not databases or alias not in databases:
        return []
    return mysql_findings(alias)


def mysql_findings(alias: str) -> list[CheckMessage]:
    """E110-E115 for one alias, whichever it is: ``outbox_worker --database`` runs them for its own."""
    from django.db import connections
    from django.db.utils import NotSupportedError

    conn = connections[alias]
    if conn.vendor != "mysql":
        return []
    from .store import mysql

    try:
        facts = mysql.server_facts(conn)
    except NotSupportedError as exc:  # Django's own minimum, refused when it connects
        return [
            Error(
                f"Database {alias!r}: {exc}",
                hint="Upgrade the server to what the installed Django supports (docs/databases.md).",
                id=MYSQL_TOO_OLD,
            )
        ]
    with conn.cursor() as cursor:
        cursor.execute("SELECT @@SESSION.sql_mode")
        (sql_mode,) = cursor.fetchone()
    return [*mysql_messages(alias, facts), *sql_mode_messages(alias, str(sql_mode or ""))]


def sql_mode_messages(alias: str, sql_mode: str) -> list[CheckMessage]:
    """E115: the flags of the connection's ``sql_mode`` (the server's, or an ``init_command``'s) that break
    every write. The other modes managed services ship work (tests/db/test_mysql_modes.py)."""
    flags = {flag.strip().upper() for flag in sql_mode.split(",")}
    return [
        Error(
            f"Database {alias!r} runs with sql_mode {flag}, which {why}.",
            hint=f"Remove {flag} from the sql_mode: the server's, or DATABASES[{alias!r}]['OPTIONS']['init_command'].",
            id=MYSQL_SQL_MODE,
        )
        for flag, why in SQL_MODES_REFUSED.items()
        if flag in flags
    ]


def mysql_messages(alias: str, facts: Mapping[str, Any]) -> list[CheckMessage]:
    """The findings for one server's facts (``store.mysql.server_facts``); apart so tests can feed any."""
    found: list[CheckMessage] = []
    from .store import mysql

    minimum = mysql.MARIADB_MIN if facts["mariadb"] else mysql.MYSQL_MIN
    if tuple(facts["version_tuple"]) < minimum:
        name = "MariaDB" if facts["mariadb"] else "MySQL"
        found.append(
            Error(
                f"Database {alias!r} is {name} {facts['version']}, which has no SELECT ... FOR UPDATE SKIP LOCKED; "
                f"the outbox needs {name} {'.'.join(map(str, minimum))} or later.",
                hint="Upgrade the server (docs/databases.md).",
                id=MYSQL_TOO_OLD,
            )
        )
    if facts["log_bin"] and facts["binlog_format"] == "STATEMENT":
        found.append(
            Error(
                f"Database {alias!r} logs statements (binlog_format = STATEMENT): the claim's SKIP LOCKED is unsafe "
                "for statement-based replication (ER_BINLOG_UNSAFE_SKIP_LOCKED), and replicas may differ.",
                hint="Set binlog_format = ROW (or MIXED) on the server.",
                id=MYSQL_STATEMENT_BINLOG,
            )
        )
    if facts["isolation"] not in ("READ-COMMITTED", "REPEATABLE-READ"):
        found.append(
            Error(
                f"Database {alias!r} runs at {facts['isolation']}: under SERIALIZABLE the claim's check for an "
                "earlier message of a key takes shared locks that stall producers and other workers; under "
                "READ UNCOMMITTED it sees rows that may roll back.",
                hint="Use Django's default, DATABASES[...]['OPTIONS']['isolation_level'] = 'read committed'.",
                id=MYSQL_ISOLATION,
            )
        )
    indexes = facts["indexes"]
    if indexes and indexes.get(mysql.CLAIM_INDEX) != "status,id":
        found.append(
            Error(
                f"Database {alias!r}: the message table lacks index {mysql.CLAIM_INDEX} (status, id), which the "
                "claim's ORDER BY walks; without it two workers' SKIP LOCKED claims lock what they scan and one "
                "gets nothing.",
                hint="Run manage.py migrate django_outbox; do not drop the outbox's indexes.",
                id=MYSQL_CLAIM_INDEX,
            )
        )
    if indexes and (mysql.IDEMPOTENCY_INDEX not in indexes or not facts["key_lock"]):
        found.append(
            Error(
                f"Database {alias!r}: the outbox's tables lack their MariaDB/MySQL shapes (no unique index on "
                "idempotency_key, or no django_outbox_key_lock table): a repeated idempotency key would write a "
                "second message, and a key's messages could commit out of order.",
                hint="Run manage.py migrate django_outbox; a database migrated before the first release must be "
                "at its last migration (docs/upgrading.md).",
                id=MYSQL_SHAPES_MISSING,
            )
        )
    return found
