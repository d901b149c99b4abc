"""``TEST_POOLER=transaction|session``: the whole test run reaches PostgreSQL through a private PgBouncer.

Production Django sites mostly reach PostgreSQL through a pooler, so the suite's core modules run a
second time that way (``dev.py test --pooler transaction``). ``tests/settings.py`` calls ``route()``
before Django connects: in the pytest process it starts a PgBouncer (``tests/support/pgbouncer.py``) in front of
the server of ``DATABASE_URL`` and points every database alias at it, so pytest-django creates the test
databases through the pooler (its wildcard entry), and worker processes started by the tests inherit the
pooler's address through ``DATABASE_URL``. ``TEST_POOLER_DIRECT`` keeps the server's own address, for the
few raw helpers that need a session of their own (a test's ``LISTEN``), and tells child processes that
a pooler is already running.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

#: Server connections per (database, user): fewer than the suite's clients in transaction pooling, as
#: in production; in session pooling every client holds one, so enough for the busiest test.
POOL_SIZE = {"transaction": 8, "session": 40}

_bouncer: Any = None


def mode() -> str | None:
    value = os.environ.get("TEST_POOLER") or None
    if value is not None and value not in POOL_SIZE:
        raise RuntimeError(f"TEST_POOLER={value!r}: use 'transaction' or 'session'")
    return value


def direct() -> tuple[str, int] | None:
    """The PostgreSQL server's own address when the run goes through a pooler, else None."""
    value = os.environ.get("TEST_POOLER_DIRECT")
    if not value:
        return None
    host, _, port = value.rpartition(":")
    return host, int(port)


def route(databases: dict[str, dict[str, Any]]) -> None:
    pool_mode = mode()
    if pool_mode is None:
        return
    default = databases["default"]
    if "postgresql" not in default["ENGINE"]:
        raise RuntimeError("TEST_POOLER needs DATABASE_URL to name a PostgreSQL server")
    if direct() is not None:
        return  # a child process: DATABASE_URL already names the pooler
    global _bouncer
    from . import pgbouncer

    if not pgbouncer.available():
        raise RuntimeError("TEST_POOLER needs Debian's pgbouncer (apt-get install pgbouncer)")
    host, port = default.get("HOST") or "127.0.0.1", int(default.get("PORT") or 5432)
    _bouncer = pgbouncer.PgBouncer(pool_mode, server_host=host, server_port=port, pool_size=POOL_SIZE[pool_mode])
    atexit.register(_bouncer.stop)
    os.environ["TEST_POOLER_DIRECT"] = f"{host}:{port}"
    for settings in databases.values():
        if "postgresql" in settings["ENGINE"]:
            settings["HOST"], settings["PORT"] = "127.0.0.1", _bouncer.port


def bouncer() -> Any:
    """The PgBouncer of this run (pytest process only), or None."""
    return _bouncer


def release(database: str) -> None:
    """Close the pooler's server connections to ``database``, so that it can be dropped."""
    if _bouncer is not None:
        _bouncer.admin(f"KILL {database}")
