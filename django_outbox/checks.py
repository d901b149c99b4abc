"""System checks: every configuration mistake is reported by ``manage.py check`` with a stable id.

The ids are listed in docs/checks.md. The worker command runs them before it starts.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from . import conf
from .exceptions import MissingExtraError, OutboxImproperlyConfigured
from .store import SUPPORTED_VENDORS

logger = logging.getLogger("django_outbox.checks")

Check = Callable[..., list[CheckMessage]]


def check_failed(what: str, exc: Exception, *, obj: object = None) -> Error:
    """E007: ``what`` raised instead of reporting; the problem it looked for may still be there."""
    detail = f"{type(exc).__name__}: {str(exc).strip()[:500]}".rstrip(": ")
    logger.error("the check %s failed to run", what, exc_info=exc)
    return Error(
        f"The check {what} failed to run: {detail}",
        hint="What it checks is unverified; the other checks still ran. The traceback is logged to the "
        "'django_outbox.checks' logger; fix the setting it names, or report the bug with that traceback.",
        id="django_outbox.E007",
        obj=obj,
    )


def register_check(*tags: str) -> Callable[[Check], Check]:
    """``django.core.checks.register``, but a check that raises reports E007 instead of aborting ``check``.

    A traceback out of ``run_checks()`` stops ``manage.py check``, ``migrate`` and the worker's start
    without saying which setting is wrong, and hides every other check's findings.
    """

    def decorate(check: Check) -> Check:
        @functools.wraps(check)
        def guarded(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
            try:
                return list(check(app_configs, **kwargs))
            except Exception as exc:
                return [check_failed(f"{check.__module__}.{check.__qualname__}", exc)]

        guarded.outbox_guarded = True  # type: ignore[attr-defined]
        register(*tags)(guarded)
        return guarded

    return decorate


@register_check(Tags.compatibility)
def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    found: list[CheckMessage] = [Error(p.msg, hint=p.hint, id=p.id) for p in conf.problems()]
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
                    id="django_outbox.E012" if missing_extra else "django_outbox.E011",
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

    from .wakeup import _raw_params, hears_itself, listen_alias

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
            id="django_outbox.W002",
        )
    ]


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
                hint="Set DATABASES[...]['OPTIONS'] = {'transaction_mode': 'IMMEDIATE', 'timeout': 20, "
                "'init_command': 'PRAGMA journal_mode=WAL;'} (docs/settings.md#sqlite).",
                id="django_outbox.W001",
            )
        ]
    return []


from .inbox import checks as inbox_checks  # noqa: E402, F401  (registers the inbox and idempotency checks, with register_check)
