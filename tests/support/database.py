"""The test database seen from a test: its vendor, a raw connection of its own, marks for pooled runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from . import pooled


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def connect_raw(*, direct: bool = False, **options: Any) -> Any:
    """A psycopg connection of its own to the test database (PostgreSQL), beside Django's.

    ``direct``: to the server itself even when the run goes through a pooler (``TEST_POOLER``), for a
    helper that needs a session of its own, such as a test's ``LISTEN``.
    """
    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)  # Django's, for its own connections
    params.pop("context", None)
    if direct and (server := pooled.direct()) is not None:
        params["host"], params["port"] = server
    return psycopg.connect(**{**params, **options})  # options may name another database (dbname)


def is_mysql() -> bool:
    return connection.vendor == "mysql"


def connect_raw_mysql() -> Any:
    """A mysqlclient connection of its own to the test database (MariaDB/MySQL), beside Django's; not in
    autocommit, as a producer's transaction."""
    import MySQLdb

    settings = connection.settings_dict
    return MySQLdb.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=int(settings["PORT"] or 3306),
        user=settings["USER"] or "root",
        password=settings["PASSWORD"] or "",
        database=settings["NAME"],
        charset="utf8mb4",
    )


#: For tests of a worker woken by NOTIFY with the default settings: through transaction pooling its
#: LISTEN cannot hear by nature (the worker says so once and polls;
#: tests/acceptance/poolers/test_pgbouncer.py covers that, and OUTBOX["LISTEN_DATABASE"], which mends it).
needs_session_listen = pytest.mark.skipif(
    pooled.mode() == "transaction",
    reason="a worker's LISTEN through transaction pooling hears nothing "
    "(see tests/acceptance/poolers/test_pgbouncer.py)",
)


def is_postgres_alias(alias: str) -> bool:
    from django.db import connections

    return connections[alias].vendor == "postgresql"


def neighbour_database() -> str:
    """The name of another database on the test database's server (``<name>_neighbour``), made if missing.

    Named after the database of ``DATABASE_URL`` (``hproducer`` -> ``hproducer_neighbour``, CI's ``test``
    -> ``test_neighbour``), so parallel runs against one server use neighbours of their own.
    """
    import psycopg
    from psycopg import sql

    name = str(connection.settings_dict["NAME"]).removeprefix("test_") + "_neighbour"
    with connect_raw(direct=True, autocommit=True, dbname="postgres") as server:
        exists = server.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if exists is None:
            try:
                server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            except psycopg.errors.DuplicateDatabase:  # another run made it in between
                pass
    return name


@contextlib.contextmanager
def neighbour_transaction() -> Iterator[Any]:
    """A transaction left open, holding a transaction id, in another database of the same server.

    What a busy neighbour looks like to this database: nothing it can see or lock, but a transaction
    that keeps the server's oldest running xid (every snapshot's ``xmin``) where it is until it ends.
    """
    conn = connect_raw(direct=True, dbname=neighbour_database())  # not autocommit: the transaction stays open
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS busy (n int)")
        conn.commit()
        conn.execute("INSERT INTO busy VALUES (1)")  # a write: the transaction takes an xid
        yield conn
    finally:
        conn.rollback()
        conn.close()


@contextlib.contextmanager
def empty_database(tmp_path: Any) -> Iterator[dict[str, str]]:
    """A database with no tables on the test database's server (a file under ``tmp_path`` on SQLite), as
    a new deploy meets it before ``migrate``: yields the environment that points a process's settings at
    it, and drops it afterwards. Named after the test database, so parallel runs each have their own."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        yield {"DATABASE_URL": "", "SQLITE_PATH": str(tmp_path / "empty.sqlite3")}
        return
    name = f"{settings['NAME']}_empty"
    if connection.vendor == "postgresql":
        from psycopg import sql

        def run(statement: str) -> None:
            with connect_raw(direct=True, autocommit=True, dbname="postgres") as server:
                server.execute(sql.SQL(statement).format(sql.Identifier(name)))

        host = f"{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}"
        url = f"postgres://{settings['USER'] or 'postgres'}@{host}/{name}"
        drop = "DROP DATABASE IF EXISTS {} WITH (FORCE)"
    else:

        def run(statement: str) -> None:
            conn = connect_raw_mysql()
            try:
                conn.cursor().execute(statement.format(f"`{name}`"))
            finally:
                conn.close()

        url = (
            f"mysql://{settings['USER'] or 'root'}@{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 3306}/{name}"
        )
        drop = "DROP DATABASE IF EXISTS {}"
    run(drop)
    run("CREATE DATABASE {}" + (" CHARACTER SET utf8mb4" if connection.vendor == "mysql" else ""))
    try:
        yield {"DATABASE_URL": url, "SQLITE_PATH": ""}
    finally:
        run(drop)
