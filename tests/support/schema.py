"""The outbox's schema as a database holds it, and as the models declare it, in one comparable shape.

``snapshot()`` introspects the app's tables through Django's introspection (columns, indexes,
constraints) and adds what that does not show: on PostgreSQL each index's definition (its access method
and partial predicate), each constraint's definition, the table's storage parameters and partitioning;
on SQLite each index's SQL (partial predicates); on MariaDB/MySQL the table's engine and collation.
``declared()`` builds the tables the models declare with Django's schema editor in an empty namespace
of the same server (a schema on PostgreSQL, a database on MariaDB/MySQL, an in-memory database on
SQLite) and takes their snapshot, before and after the vendor shapes of the initial migration. Two
snapshots compare with ``==``; ``diff()`` says how they differ, a fact a line, and ``changed()`` where.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.apps import apps
from django.db.backends.base.base import BaseDatabaseWrapper

APP = "django_outbox"
PREFIX = "django_outbox_"

#: Schema-qualified names in PostgreSQL's definitions ("ON public.django_outbox_message"): the twin's
#: schema differs, the definition does not.
_QUALIFIED = re.compile(r"\b(ON|REFERENCES) (ONLY )?\w+\.")


def snapshot(connection: BaseDatabaseWrapper, *, column_order: bool = False) -> dict[str, Any]:
    """Every table of the app with its columns, indexes and constraints; ``column_order`` also records
    the order of the columns (which no model declares once a column was added to an existing table)."""
    introspection = connection.introspection
    tables: dict[str, Any] = {}
    with connection.cursor() as cursor:
        names = sorted(name for name in introspection.table_names(cursor) if name.startswith(PREFIX))
        for table in names:
            description = introspection.get_table_description(cursor, table)
            columns = {
                info.name: {key: _plain(value) for key, value in info._asdict().items() if key != "name"}
                for info in description
            }
            constraints = {
                name: {
                    key: _plain(value)
                    for key, value in sorted(constraint.items())
                    # PostgreSQL's "options" of a constraint that is no index are its table's storage
                    # parameters, recorded once below.
                    if key != "options" or constraint.get("index")
                }
                for name, constraint in introspection.get_constraints(cursor, table).items()
            }
            entry: dict[str, Any] = {"columns": columns, "constraints": constraints}
            if column_order:
                entry["column_order"] = [info.name for info in description]
            entry.update(_vendor_details(connection, cursor, table))
            tables[table] = entry
    return tables


def _plain(value: Any) -> Any:
    """Introspection gives tuples, sets and lists; JSON and ``==`` want one spelling of each."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in sorted(value.items())}
    return value


def _vendor_details(connection: BaseDatabaseWrapper, cursor: Any, table: str) -> dict[str, Any]:
    if connection.vendor == "postgresql":
        cursor.execute(
            "SELECT c.relkind, c.reloptions, pg_get_partkeydef(c.oid), format_type(a.atttypid, a.atttypmod), a.attname"
            " FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
            " WHERE c.oid = %s::regclass",
            [table],
        )
        rows = cursor.fetchall()
        relkind, reloptions, partition_key = rows[0][:3]
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND schemaname = current_schema()",
            [table],
        )
        indexes = {name: _QUALIFIED.sub(r"\1 \2", definition) for name, definition in cursor.fetchall()}
        cursor.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass", [table]
        )
        constraint_definitions = {name: _QUALIFIED.sub(r"\1 \2", d) for name, d in cursor.fetchall()}
        return {
            "kind": relkind,
            "storage_parameters": sorted(reloptions or []),
            "partition_key": partition_key,
            "types": {name: sql_type for *_, sql_type, name in rows},
            "index_definitions": indexes,
            "constraint_definitions": constraint_definitions,
        }
    if connection.vendor == "mysql":
        cursor.execute(
            "SELECT engine, table_collation FROM information_schema.tables"
            " WHERE table_schema = DATABASE() AND table_name = %s",
            [table],
        )
        engine, collation = cursor.fetchone()
        cursor.execute(
            "SELECT column_name, column_type FROM information_schema.columns"
            " WHERE table_schema = DATABASE() AND table_name = %s",
            [table],
        )
        return {"engine": engine, "collation": collation, "types": dict(sorted(cursor.fetchall()))}
    cursor.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = %s", [table])
    return {"index_definitions": dict(sorted(cursor.fetchall()))}


def diff(
    expected: dict[str, Any], actual: dict[str, Any], *, labels: tuple[str, str] = ("declared", "database")
) -> str:
    """The facts of two snapshots that differ, one a line (table, section, name: value); empty when they
    agree."""
    return "\n".join(difflib.unified_diff(_facts(expected), _facts(actual), *labels, lineterm="", n=0))


def _facts(tables: dict[str, Any]) -> list[str]:
    facts: list[str] = []
    for table, entry in sorted(tables.items()):
        for section, value in sorted(entry.items()):
            if isinstance(value, dict):
                facts.extend(f"{table} {section} {name}: {_json(v)}" for name, v in sorted(value.items()))
            else:
                facts.append(f"{table} {section}: {_json(value)}")
    return facts


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


@dataclasses.dataclass(frozen=True)
class Declared:
    """What the models declare (``models``), and that with the initial migration's vendor shapes (``shaped``)."""

    models: dict[str, Any]
    shaped: dict[str, Any]


def package_latest() -> str:
    """The name of the package's last migration (whatever ``MIGRATION_MODULES`` says): where a test that
    applied sample migrations on top of it goes back to."""
    import django_outbox.migrations

    folder = Path(django_outbox.migrations.__file__).parent
    return sorted(p.stem for p in folder.glob("[0-9][0-9][0-9][0-9]_*.py"))[-1]


def _later_partial_indexes() -> list[tuple[str, str]]:
    """(table, index) of each partial index a migration after the initial one adds with ``AddIndexOnline``,
    which leaves them out on MariaDB/MySQL."""
    from django.db.migrations.loader import MigrationLoader

    from django_outbox.store.online import AddIndexOnline

    found = []
    for (app, name), migration in MigrationLoader(None, ignore_no_migrations=True).disk_migrations.items():
        if app != APP or name == "0001_initial":
            continue
        for operation in migration.operations:
            if isinstance(operation, AddIndexOnline) and operation.index.condition is not None:
                model = apps.get_model(APP, operation.model_name)
                found.append((model._meta.db_table, str(operation.index.name)))
    return found


def declared(connection: BaseDatabaseWrapper) -> Declared:
    """The tables the models declare, built beside the migrated ones on the same server (so version and
    server settings are the same), before and after the initial migration's vendor shapes."""
    initial = importlib.import_module("django_outbox.migrations.0001_initial")
    with _empty_namespace(connection) as twin:
        with twin.schema_editor(atomic=False) as editor:
            for model in apps.get_app_config(APP).get_models():
                if model._meta.managed and not model._meta.proxy:
                    editor.create_model(model)
        models_only = snapshot(twin)
        with twin.schema_editor(atomic=False) as editor:
            initial.vendor_shapes(apps, editor)
            if twin.vendor == "mysql":  # the online operations of later migrations make no partial index there
                for table, index in _later_partial_indexes():
                    editor.execute(f"DROP INDEX {index} ON {table}")
                # ... and 0003 gives them the open keys' index a partial index gives the others
                importlib.import_module("django_outbox.migrations.0003_mysql_claim_key_index").add(apps, editor)
        return Declared(models=models_only, shaped=snapshot(twin))


def changed(expected: dict[str, Any], actual: dict[str, Any]) -> set[tuple[str, ...]]:
    """Where two snapshots differ: (table,) for a table only one has, else (table, section[, name])."""
    found: set[tuple[str, ...]] = set()
    for table in expected.keys() | actual.keys():
        if table not in expected or table not in actual:
            found.add((table,))
            continue
        for section in expected[table].keys() | actual[table].keys():
            before, after = expected[table].get(section), actual[table].get(section)
            if isinstance(before, dict) and isinstance(after, dict):
                found.update((table, section, n) for n in before.keys() | after.keys() if before.get(n) != after.get(n))
            elif before != after:
                found.add((table, section))
    return found


@contextlib.contextmanager
def _empty_namespace(connection: BaseDatabaseWrapper) -> Iterator[BaseDatabaseWrapper]:
    """A second connection whose unqualified table names land in a namespace of its own."""
    twin = connection.copy()
    scratch = f"outbox_declared_{os.getpid()}"
    if connection.vendor == "sqlite":
        twin.settings_dict["NAME"] = ":memory:"
        try:
            yield twin
        finally:
            # Django keeps an in-memory database open on close(), for the tests that share it.
            if twin.connection is not None:
                twin.connection.close()
        return
    with twin.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"DROP SCHEMA IF EXISTS {scratch} CASCADE")
            cursor.execute(f"CREATE SCHEMA {scratch}")
            cursor.execute(f"SET search_path TO {scratch}")
        else:
            cursor.execute("SELECT @@character_set_database, @@collation_database")
            charset, collation = cursor.fetchone()
            cursor.execute(f"DROP DATABASE IF EXISTS {scratch}")
            cursor.execute(f"CREATE DATABASE {scratch} CHARACTER SET {charset} COLLATE {collation}")
            cursor.execute(f"USE {scratch}")
    try:
        yield twin
    finally:
        with twin.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"DROP SCHEMA {scratch} CASCADE")
            else:
                cursor.execute(f"DROP DATABASE {scratch}")
        twin.close()
