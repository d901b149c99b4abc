"""System checks: every configuration mistake is reported by ``manage.py check`` with a stable id.

The ids are listed in docs/checks.md. The worker command runs them before it starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from . import (
    conf,
    inbox_checks,  # noqa: F401  (registers the inbox and idempotency checks)
)
from .exceptions import MissingExtraError, OutboxImproperlyConfigured
from .store import SUPPORTED_VENDORS


@register(Tags.compatibility)
def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    found: list[CheckMessage] = [Error(p.msg, hint=p.hint, id=p.id) for p in conf.problems()]
    if found:
        return found
    outbox_settings = conf.get_settings()
    for name, transport in outbox_settings.TRANSPORTS.items():
        from .transports.registry import transport_class

        try:
            cls = transport_class(transport.backend)
        except OutboxImproperlyConfigured as exc:
            missing_extra = isinstance(exc, MissingExtraError)
            found.append(
                Error(
                    str(exc),
                    hint="Check the dotted path, and install the extra it names.",
                    id="django_outbox.E012" if missing_extra else "django_outbox.E011",
                    obj=f"OUTBOX['TRANSPORTS'][{name!r}]",
                )
            )
            continue
        found += cls.check(name, transport.options)
    return found


@register(Tags.compatibility)
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
                f"The outbox database {alias!r} uses {engine}; django_outbox supports PostgreSQL and SQLite.",
                hint="Point OUTBOX['DATABASE'] at a supported database.",
                id="django_outbox.E005",
            )
        ]
    if vendor == "sqlite" and db.get("OPTIONS", {}).get("transaction_mode") != "IMMEDIATE":
        return [
            Warning(
                f"SQLite database {alias!r} uses deferred transactions; concurrent workers and web requests may "
                "fail with 'database is locked'.",
                hint="Set DATABASES[...]['OPTIONS'] = {'transaction_mode': 'IMMEDIATE', "
                "'init_command': 'PRAGMA journal_mode=WAL;'}.",
                id="django_outbox.W001",
            )
        ]
    return []
