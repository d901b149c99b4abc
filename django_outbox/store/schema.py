"""Whether a database has the outbox's migrations: a worker of a new release may start before ``migrate``.

A rolling deploy replaces processes in whatever order the platform picks. A new worker that claimed with
columns its database lacks would fail every statement and, restarted by its supervisor, fill the logs; so
the worker command asks this first and waits, and ``manage.py check`` warns.
"""

from __future__ import annotations

import socket

APP = "django_outbox"


def unapplied(alias: str) -> list[str]:
    """The outbox migrations this code ships and database ``alias`` lacks, in the order they apply.

    Migrations the database has and this code does not know (a previous release's worker on a migrated
    database) are not this question's: expand/contract keeps the old code working on them.
    Raises the driver's error when the database cannot be read.
    """
    from django.db import connections
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connections[alias])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes(APP))
    return [f"{migration.app_label}.{migration.name}" for migration, backwards in plan if not backwards]


def reachable(alias: str, timeout: float = 2.0) -> bool:
    """Whether ``alias``'s server answers on its port within ``timeout``: a check that reads the database
    must not hang a ``manage.py check`` run where the database is away (an image build, a laptop)."""
    from django.db import connections

    settings = connections[alias].settings_dict
    if connections[alias].vendor == "sqlite":
        return True
    host = settings.get("HOST") or ""
    if not host or host.startswith("/"):
        return True  # a Unix socket: connecting fails at once when nothing listens
    default = 3306 if connections[alias].vendor == "mysql" else 5432
    try:
        port = int(settings.get("PORT") or default)
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False
