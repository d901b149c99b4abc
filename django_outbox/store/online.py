"""Migration operations that change the outbox's tables while they are in use.

A rolling deploy runs ``migrate`` while the previous release's processes call ``send()`` and claim: an
operation that holds a write-blocking lock for a table scan stops every request that sends, and one that
merely *waits* for a lock queues every later ``send()`` behind it. Django's own operations do either on a
large table; these do neither, on each database the outbox supports:

- ``AddIndexOnline`` / ``RemoveIndexOnline``: PostgreSQL ``CREATE/DROP INDEX CONCURRENTLY`` (the migration
  must set ``atomic = False``), MariaDB/MySQL ``ALGORITHM=INPLACE, LOCK=NONE`` (the server refuses rather
  than block writes; a partial index is left out there, as the initial migration leaves out the
  model's others: MariaDB and MySQL ignore the condition and would index every row), SQLite as Django
  does it (one writer at a time: there is no online there).
- ``WithLockTimeout``: runs other operations under a short lock wait (PostgreSQL ``lock_timeout``,
  MariaDB/MySQL ``lock_wait_timeout``) and tries again after a pause when the lock is not had in time, each
  try in its own transaction or savepoint, so a long transaction holding the table costs a failed try,
  not a queue of stalled requests.
- ``AddCheckNotValid`` / ``ValidateCheck``: PostgreSQL adds a check ``NOT VALID`` (no scan under the
  strong lock) and validates it apart (a scan under a lock that lets writes through); elsewhere the
  constraint is added whole by the first and the second does nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import NotSupportedError, OperationalError, models, transaction
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.operations import AddConstraint, AddIndex, RemoveIndex
from django.db.migrations.operations.base import Operation
from django.db.migrations.state import ProjectState

logger = logging.getLogger("django_outbox.migrations")

#: PostgreSQL's SQLSTATE for a lock not had within ``lock_timeout`` (lock_not_available).
PG_LOCK_NOT_AVAILABLE = "55P03"
#: MariaDB/MySQL's error for a lock wait that ran out (ER_LOCK_WAIT_TIMEOUT; metadata locks included).
MYSQL_LOCK_WAIT_TIMEOUT = 1205
#: What MariaDB/MySQL is told for an index change: done in place, writes never blocked, or refused.
MYSQL_ONLINE = " ALGORITHM=INPLACE LOCK=NONE"


class LockNotAcquired(OperationalError):
    """Every try of a ``WithLockTimeout`` met the lock held: the migration stops, nothing of it applied."""


def _vendor(schema_editor: BaseDatabaseSchemaEditor) -> str:
    return str(schema_editor.connection.vendor)


def _refuse_a_transaction(operation: Operation, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.collect_sql:  # sqlmigrate, the linter: nothing runs, in a transaction or not
        return
    if _vendor(schema_editor) == "postgresql" and schema_editor.connection.in_atomic_block:
        raise NotSupportedError(
            f"{type(operation).__name__} builds the index CONCURRENTLY, which PostgreSQL refuses inside a "
            "transaction: set atomic = False on the migration."
        )


@contextmanager
def _no_lock_timeout(schema_editor: BaseDatabaseSchemaEditor) -> Iterator[None]:
    """A concurrent build waits for every transaction older than it, and waiting blocks no one; a
    ``lock_timeout`` the migration set for its other steps would only abort the build half done."""
    if _vendor(schema_editor) != "postgresql":
        yield
        return
    if schema_editor.collect_sql:  # sqlmigrate, and the linter reading it: the wait is unbounded on purpose
        schema_editor.collected_sql.append("SET lock_timeout = 0;")
        yield
        schema_editor.collected_sql.append("RESET lock_timeout;")
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        before = cursor.fetchone()[0]
        cursor.execute("SET lock_timeout = 0")
    try:
        yield
    finally:
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("SELECT set_config('lock_timeout', %s, false)", [before])


def _drop_invalid_leftover(schema_editor: BaseDatabaseSchemaEditor, name: str) -> None:
    """A concurrent build that failed (cancelled, a duplicate in a unique index) leaves an INVALID index
    under the name; a second ``migrate`` must replace it, not stop at "already exists"."""
    if schema_editor.collect_sql:
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE c.relname = %s AND NOT i.indisvalid AND pg_table_is_visible(c.oid)",
            [name],
        )
        invalid = cursor.fetchone() is not None
    if invalid:
        logger.warning("dropping the invalid index %s a failed concurrent build left, to build it again", name)
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(name)}")


def _add_index(schema_editor: BaseDatabaseSchemaEditor, model: type[models.Model], index: models.Index) -> None:
    vendor = _vendor(schema_editor)
    if vendor == "postgresql":
        _drop_invalid_leftover(schema_editor, str(index.name))
        with _no_lock_timeout(schema_editor):
            schema_editor.add_index(model, index, concurrently=True)  # type: ignore[call-arg]
    elif vendor == "mysql":
        if index.condition is not None:  # no partial index there: the whole one would be another index
            return
        statement = index.create_sql(model, schema_editor)
        if statement is not None:  # None: a partial or functional index this server cannot hold
            schema_editor.execute(f"{statement}{MYSQL_ONLINE}", params=None)
    else:
        schema_editor.add_index(model, index)


def _remove_index(schema_editor: BaseDatabaseSchemaEditor, model: type[models.Model], index: models.Index) -> None:
    vendor = _vendor(schema_editor)
    if vendor == "postgresql":
        with _no_lock_timeout(schema_editor):
            schema_editor.remove_index(model, index, concurrently=True)  # type: ignore[call-arg]
    elif vendor == "mysql":  # MariaDB's DROP INDEX takes no algorithm clause; its ALTER TABLE does
        if index.condition is not None:  # never made there (``_add_index``)
            return
        table, name = schema_editor.quote_name(model._meta.db_table), schema_editor.quote_name(str(index.name))
        schema_editor.execute(f"ALTER TABLE {table} DROP INDEX {name}, ALGORITHM=INPLACE, LOCK=NONE")
    else:
        schema_editor.remove_index(model, index)


class AddIndexOnline(AddIndex):
    """``AddIndex`` that never blocks writes to the table while the index is built."""

    atomic = False

    def describe(self) -> str:
        return f"Create index {self.index.name} on {self.model_name} without blocking writes"

    def database_forwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        _refuse_a_transaction(self, schema_editor)
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            _add_index(schema_editor, model, self.index)

    def database_backwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        _refuse_a_transaction(self, schema_editor)
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            _remove_index(schema_editor, model, self.index)


class RemoveIndexOnline(RemoveIndex):
    """``RemoveIndex`` that never blocks writes to the table; its backwards builds the index online."""

    atomic = False

    def describe(self) -> str:
        return f"Remove index {self.name} from {self.model_name} without blocking writes"

    def database_forwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        _refuse_a_transaction(self, schema_editor)
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = from_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            _remove_index(schema_editor, model, index)

    def database_backwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        _refuse_a_transaction(self, schema_editor)
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            _add_index(schema_editor, model, index)


class WithLockTimeout(Operation):
    """Run ``operations`` waiting at most ``timeout`` seconds for each lock, trying ``attempts`` times.

    Between tries it pauses (``pause`` seconds, growing with each try) with no lock held or asked for, so
    the requests queued behind the failed try go through. Each try runs in a transaction of its own (a
    savepoint when the migration is atomic; on MariaDB/MySQL each DDL statement commits by itself, and a
    timed-out one changed nothing). When every try fails, ``LockNotAcquired`` says so and the migration
    stops, to be run again when the long transaction that held the table has ended.
    """

    reduces_to_sql = False

    def __init__(
        self, operations: Sequence[Operation], *, timeout: float = 2.0, attempts: int = 10, pause: float = 1.0
    ) -> None:
        if not operations:
            raise ValueError("WithLockTimeout needs at least one operation")
        if not (0 < timeout <= 3600) or timeout != timeout:
            raise ValueError(f"WithLockTimeout's timeout must be a number of seconds in (0, 3600], not {timeout!r}")
        if not (1 <= attempts <= 1000):
            raise ValueError(f"WithLockTimeout's attempts must be between 1 and 1000, not {attempts!r}")
        if not (0 <= pause <= 600) or pause != pause:
            raise ValueError(f"WithLockTimeout's pause must be a number of seconds in [0, 600], not {pause!r}")
        self.operations = list(operations)
        self.timeout = float(timeout)
        self.attempts = int(attempts)
        self.pause = float(pause)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs = {"timeout": self.timeout, "attempts": self.attempts, "pause": self.pause}
        return (self.__class__.__qualname__, [self.operations], kwargs)

    def describe(self) -> str:
        inner = "; ".join(operation.describe() for operation in self.operations)
        return f"{inner} (waiting at most {self.timeout:g} s for a lock, {self.attempts} tries)"

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        for operation in self.operations:
            operation.state_forwards(app_label, state)

    def database_forwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        def forwards() -> None:
            state = from_state.clone()
            for operation in self.operations:
                before = state.clone()
                operation.state_forwards(app_label, state)
                operation.database_forwards(app_label, schema_editor, before, state)

        self._with_retries(schema_editor, forwards)

    def database_backwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        def backwards() -> None:  # from_state holds the operations' changes, to_state is before them
            states = [to_state.clone()]
            for operation in self.operations[:-1]:
                state = states[-1].clone()
                operation.state_forwards(app_label, state)
                states.append(state)
            for operation, before in zip(reversed(self.operations), reversed(states), strict=True):
                after = before.clone()
                operation.state_forwards(app_label, after)
                operation.database_backwards(app_label, schema_editor, after, before)

        self._with_retries(schema_editor, backwards)

    def _with_retries(self, schema_editor: BaseDatabaseSchemaEditor, run: Any) -> None:
        vendor = _vendor(schema_editor)
        if schema_editor.collect_sql:  # sqlmigrate: say the bound, then what runs under it
            self._collect(schema_editor, vendor, run)
            return
        for attempt in range(1, self.attempts + 1):
            try:
                self._try_once(schema_editor, vendor, run)
                return
            except OperationalError as exc:
                if not _lock_ran_out(exc) or isinstance(exc, LockNotAcquired):
                    raise
                if attempt == self.attempts:
                    raise LockNotAcquired(
                        f"{self.describe()}: the lock was not had in any of {self.attempts} tries of "
                        f"{self.timeout:g} s; a long transaction holds the table (PostgreSQL: pg_stat_activity; "
                        f"MariaDB/MySQL: SHOW PROCESSLIST). Nothing of this operation was applied: run migrate "
                        f"again when it has ended. ({exc})"
                    ) from exc
                wait = min(self.pause * attempt, 60.0)
                logger.warning(
                    "lock not had within %g s (try %d of %d): trying again in %g s",
                    self.timeout,
                    attempt,
                    self.attempts,
                    wait,
                )
                time.sleep(wait)

    def _try_once(self, schema_editor: BaseDatabaseSchemaEditor, vendor: str, run: Any) -> None:
        connection = schema_editor.connection
        deferred = len(schema_editor.deferred_sql)
        if vendor == "postgresql":
            with transaction.atomic(using=connection.alias):
                with connection.cursor() as cursor:
                    cursor.execute("SELECT current_setting('lock_timeout')")
                    before = cursor.fetchone()[0]
                    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{int(self.timeout * 1000)}ms"])
                run()
                self._run_deferred(schema_editor, deferred)
                with connection.cursor() as cursor:  # the migration's later steps wait as they did before
                    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [before])
        elif vendor == "mysql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT @@SESSION.lock_wait_timeout")
                before = int(cursor.fetchone()[0])
                cursor.execute("SET SESSION lock_wait_timeout = %s", [max(1, round(self.timeout))])
            try:
                run()
                self._run_deferred(schema_editor, deferred)
            finally:
                with connection.cursor() as cursor:
                    cursor.execute("SET SESSION lock_wait_timeout = %s", [before])
        else:
            run()

    @staticmethod
    def _run_deferred(schema_editor: BaseDatabaseSchemaEditor, since: int) -> None:
        """Statements Django defers to the end of the migration (a foreign key, an index of a new column)
        run inside the try, under its bound, not after it without one."""
        statements = schema_editor.deferred_sql[since:]
        del schema_editor.deferred_sql[since:]
        for statement in statements:
            schema_editor.execute(statement)

    def _collect(self, schema_editor: BaseDatabaseSchemaEditor, vendor: str, run: Any) -> None:
        if vendor == "postgresql":
            schema_editor.collected_sql.append(f"SET lock_timeout = '{int(self.timeout * 1000)}ms';")
            run()
            schema_editor.collected_sql.append("RESET lock_timeout;")
        elif vendor == "mysql":
            schema_editor.collected_sql.append(f"SET SESSION lock_wait_timeout = {max(1, round(self.timeout))};")
            run()
        else:
            run()


def _lock_ran_out(exc: BaseException) -> bool:
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) == PG_LOCK_NOT_AVAILABLE:
        return True
    args: tuple[object, ...] = exc.args
    return bool(args) and args[0] == MYSQL_LOCK_WAIT_TIMEOUT


class AddCheckNotValid(AddConstraint):
    """Add a ``CheckConstraint`` without scanning the table under a lock that blocks writes.

    PostgreSQL: ``NOT VALID``, a moment's lock; rows written from then on are checked, the existing ones
    only by ``ValidateCheck``. MariaDB/MySQL can add a check only by copying the table under a lock that
    blocks writes (``ALGORITHM=COPY, LOCK=SHARED``: about 1.3 s per 100,000 rows): there the check stays
    in Django's state and the server is not given it, which the log says. SQLite rebuilds the table, as
    it does for any constraint (one writer at a time: there is no online there).
    """

    def __init__(self, model_name: str, constraint: models.CheckConstraint) -> None:
        if not isinstance(constraint, models.CheckConstraint):
            raise TypeError(f"AddCheckNotValid takes a CheckConstraint, not {type(constraint).__name__}")
        super().__init__(model_name, constraint)

    def describe(self) -> str:
        return f"Add check {self.constraint.name} to {self.model_name}, not validated yet"

    def database_forwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        vendor = _vendor(schema_editor)
        if vendor == "mysql":
            logger.info(
                "check %s is not added to %s on MariaDB/MySQL: it would copy the table under a write lock",
                self.constraint.name,
                model._meta.db_table,
            )
        elif vendor != "postgresql":
            schema_editor.add_constraint(model, self.constraint)
        else:
            statement = self.constraint.create_sql(model, schema_editor)
            schema_editor.execute(f"{statement} NOT VALID", params=None)

    def database_backwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        if _vendor(schema_editor) != "mysql":  # MariaDB/MySQL never had it
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class ValidateCheck(Operation):
    """Check the rows a ``AddCheckNotValid`` did not: PostgreSQL scans under ``SHARE UPDATE EXCLUSIVE``,
    which lets ``send()`` and the workers write meanwhile. Nothing to do elsewhere."""

    reduces_to_sql = True
    reversible = True

    def __init__(self, model_name: str, name: str) -> None:
        self.model_name = model_name
        self.name = name

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (self.__class__.__qualname__, [], {"model_name": self.model_name, "name": self.name})

    def describe(self) -> str:
        return f"Validate check {self.name} of {self.model_name}"

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        return None

    def database_forwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if _vendor(schema_editor) != "postgresql" or not self.allow_migrate_model(
            schema_editor.connection.alias, model
        ):
            return
        table = schema_editor.quote_name(model._meta.db_table)
        schema_editor.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {schema_editor.quote_name(self.name)}")

    def database_backwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        return None  # a validated constraint stays valid; AddCheckNotValid's backwards drops it
