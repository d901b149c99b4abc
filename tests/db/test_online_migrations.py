"""The operations the outbox's migrations use on live tables (django_outbox.store.online), applied to the
message table of the real test database while other sessions write to it.

What makes each one online is shown against the server itself: a concurrent index build that lets an
insert commit while it waits for an older transaction (where Django's AddIndex, the control, queues the
insert), a bounded lock wait that gives up, lets the queue through and tries again, a check added without a
scan and validated apart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import NotSupportedError, connection, connections, models, transaction
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.operations.base import Operation
from django.db.migrations.state import ProjectState
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_outbox.store.online import (
    AddCheckNotValid,
    AddIndexOnline,
    LockNotAcquired,
    RemoveIndexOnline,
    ValidateCheck,
    WithLockTimeout,
)
from tests.support import schema
from tests.support.database import connect_raw, connect_raw_mysql
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

APP = "django_outbox"
TABLE = "django_outbox_message"
INDEX = models.Index(fields=["topic", "created_at"], name="outbox_online_probe_idx")
COLUMN = "online_probe"


def initial_state() -> ProjectState:
    return MigrationLoader(connection).project_state((APP, schema.package_latest()), at_end=True)


def forwards(operation: Operation, state: ProjectState | None = None, *, atomic: bool = False) -> ProjectState:
    before = state or initial_state()
    after = before.clone()
    operation.state_forwards(APP, after)
    with connection.schema_editor(atomic=atomic) as editor:
        operation.database_forwards(APP, editor, before, after)
    return after


def backwards(operation: Operation, after: ProjectState) -> None:
    before = initial_state()
    with connection.schema_editor(atomic=False) as editor:
        operation.database_backwards(APP, editor, after, before)


def indexes() -> dict[str, Any]:
    with connection.cursor() as cursor:
        return connection.introspection.get_constraints(cursor, TABLE)


def columns() -> set[str]:
    with connection.cursor() as cursor:
        return {c.name for c in connection.introspection.get_table_description(cursor, TABLE)}


def insert_row(cursor: Any, topic: str = "online.probe") -> None:
    cursor.execute(
        f"INSERT INTO {TABLE} (uuid, topic, payload, headers, status, attempts, max_attempts, available_at,"
        " created_at, last_error) VALUES (%s, %s, '{}', '{}', 'delivered', 1, 5, %s, %s, '')",
        [_uuid(), topic, _now(), _now()],
    )


def _uuid() -> str:
    import uuid

    value = uuid.uuid4()
    return str(value) if connection.vendor == "postgresql" else value.hex


def _now() -> Any:
    from django.utils import timezone

    now = timezone.now()
    return now if connection.vendor == "postgresql" else now.replace(tzinfo=None)


@pytest.fixture
def other_session() -> Iterator[Any]:
    """A second session of the test database: PostgreSQL's in a transaction, MariaDB's as a producer's."""
    if connection.vendor == "postgresql":
        raw = connect_raw()
    elif connection.vendor == "mysql":
        raw = connect_raw_mysql()
    else:
        pytest.skip("one writer at a time on SQLite: nothing is online there")
    try:
        yield raw
    finally:
        raw.rollback()
        raw.close()


def test_an_index_is_built_and_dropped_online_on_every_database() -> None:
    operation = AddIndexOnline("message", INDEX)
    with CaptureQueriesContext(connection) as queries:
        after = forwards(operation)
    assert indexes()[INDEX.name]["columns"] == ["topic", "created_at"]
    sql = " ".join(q["sql"] for q in queries.captured_queries)
    if connection.vendor == "postgresql":
        assert "CREATE INDEX CONCURRENTLY" in sql, sql
    if connection.vendor == "mysql":
        assert "ALGORITHM=INPLACE LOCK=NONE" in sql, sql  # the server refuses rather than block writes
    removal = RemoveIndexOnline("message", INDEX.name)
    with CaptureQueriesContext(connection) as queries:
        back = forwards(removal, after)
    assert INDEX.name not in indexes()
    sql = " ".join(q["sql"] for q in queries.captured_queries)
    if connection.vendor == "postgresql":
        assert "DROP INDEX CONCURRENTLY" in sql, sql
    if connection.vendor == "mysql":
        assert "LOCK=NONE" in sql, sql
    # and back again: removal's backwards builds it online, the addition's drops it
    with connection.schema_editor(atomic=False) as editor:
        removal.database_backwards(APP, editor, back, after)
    assert INDEX.name in indexes()
    backwards(operation, after)
    assert INDEX.name not in indexes()


@pytest.mark.postgres
def test_a_concurrent_build_in_a_transaction_is_refused_with_what_to_change() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL builds concurrently only outside a transaction")
    with pytest.raises(NotSupportedError, match="set atomic = False on the migration"):
        forwards(AddIndexOnline("message", INDEX), atomic=True)
    assert INDEX.name not in indexes()


@pytest.mark.postgres
def test_a_leftover_invalid_index_of_a_failed_build_is_built_again() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("only PostgreSQL's concurrent builds leave invalid indexes")
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE INDEX {INDEX.name} ON {TABLE} (topic, created_at)")
        cursor.execute(
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass", [INDEX.name]
        )  # what a cancelled CREATE INDEX CONCURRENTLY leaves
    after = forwards(AddIndexOnline("message", INDEX))
    with connection.cursor() as cursor:
        cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass", [INDEX.name])
        assert cursor.fetchone() == (True,)
    backwards(AddIndexOnline("message", INDEX), after)


def _in_thread(work: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def _waiting(query_start: str) -> bool:
    raw = connect_raw(autocommit=True)
    with raw:
        row = raw.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE %s AND wait_event_type = 'Lock'",
            [f"{query_start}%"],
        ).fetchone()
    return bool(row and row[0])


@pytest.mark.postgres
@pytest.mark.parametrize("online", [True, False], ids=["AddIndexOnline", "control: Django's AddIndex"])
def test_an_insert_commits_while_the_online_build_waits_for_an_older_transaction(
    online: bool, other_session: Any
) -> None:
    """A writer's open transaction keeps the build waiting; a ``send()``'s insert must not queue behind it.
    Django's plain AddIndex is the control: its SHARE lock, queued behind the writer, queues the insert."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL: the lock queue of a concurrent build")
    insert_row(other_session.cursor())  # an open transaction that wrote: ROW EXCLUSIVE held, an xid
    from django.db.migrations.operations import AddIndex

    operation = AddIndexOnline("message", INDEX) if online else AddIndex("message", INDEX)
    thread, errors = _in_thread(lambda: forwards(operation))
    try:
        wait_for(lambda: _waiting("CREATE INDEX"), timeout=30, interval=0.05)
        producer = connect_raw()
        with producer:
            producer.execute("SET lock_timeout = '3s'")  # a request that waited this long has failed
            if online:
                insert_row(producer.cursor(), "online.during")
                producer.commit()
            else:
                import psycopg

                with pytest.raises(psycopg.errors.LockNotAvailable):
                    insert_row(producer.cursor(), "online.during")
    finally:
        other_session.commit()
        thread.join(timeout=60)
    assert not thread.is_alive() and not errors, errors
    assert INDEX.name in indexes()
    with connection.cursor() as cursor:
        cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass", [INDEX.name])
        assert cursor.fetchone() == (True,)
        cursor.execute(f"SELECT count(*) FROM {TABLE} WHERE topic = 'online.during'")
        assert cursor.fetchone() == ((1,) if online else (0,))
        cursor.execute(f"DROP INDEX {INDEX.name}")


def _hold_the_table(session: Any) -> None:
    """An open transaction that read the table: the lock every DDL statement must wait for."""
    cursor = session.cursor()
    cursor.execute(f"SELECT count(*) FROM {TABLE}")
    cursor.fetchall()


class _Retries(logging.Handler):
    def __init__(self, on_first: Callable[[], None] | None) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.on_first = on_first

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        if self.on_first is not None and len(self.messages) == 1:
            self.on_first()


@pytest.fixture
def retries() -> Iterator[Callable[[Callable[[], None] | None], _Retries]]:
    logger = logging.getLogger("django_outbox.migrations")
    level = logger.level
    logger.setLevel(logging.WARNING)  # the suite's settings may quiet the package's loggers
    handlers: list[_Retries] = []

    def attach(on_first: Callable[[], None] | None) -> _Retries:
        handler = _Retries(on_first)
        logger.addHandler(handler)
        handlers.append(handler)
        return handler

    yield attach
    for handler in handlers:
        logger.removeHandler(handler)
    logger.setLevel(level)


def _add_column(attempts: int) -> WithLockTimeout:
    timeout = 0.2 if connection.vendor == "postgresql" else 1.0  # MariaDB/MySQL count whole seconds
    return WithLockTimeout([_add_field(models.IntegerField(null=True))], timeout=timeout, attempts=attempts, pause=0.05)


def _add_field(field: models.Field[Any, Any]) -> Operation:
    from django.db.migrations.operations import AddField

    return AddField("message", COLUMN, field)


def test_a_bounded_lock_wait_gives_up_lets_the_queue_through_and_tries_again(other_session: Any, retries: Any) -> None:
    _hold_the_table(other_session)
    seen = retries(other_session.commit)  # the long transaction ends while the migration pauses
    operation = _add_column(attempts=3)
    after = forwards(operation)
    assert COLUMN in columns()
    assert len(seen.messages) == 1 and "try 1 of 3" in seen.messages[0], seen.messages
    backwards(operation, after)
    assert COLUMN not in columns()


def test_every_try_meeting_the_lock_stops_the_migration_with_nothing_applied(other_session: Any, retries: Any) -> None:
    _hold_the_table(other_session)
    seen = retries(None)
    with pytest.raises(LockNotAcquired, match="Nothing of this operation was applied"):
        forwards(_add_column(attempts=3))
    assert len(seen.messages) == 2, seen.messages  # a pause after the first two tries, none after the last
    other_session.commit()
    assert COLUMN not in columns()


def test_a_bounded_lock_wait_in_an_atomic_migration_keeps_what_came_before(other_session: Any, retries: Any) -> None:
    """In an atomic migration each try is a savepoint: a failed try undoes itself, not the migration."""
    if connection.vendor != "postgresql":
        pytest.skip("only PostgreSQL runs DDL in a transaction")
    _hold_the_table(other_session)
    retries(other_session.commit)
    operation = _add_column(attempts=3)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '7s'")
        after = forwards(operation, atomic=True)
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('lock_timeout')")
            assert cursor.fetchone() == ("7s",)  # the migration's own setting is back for its later steps
    assert COLUMN in columns()
    backwards(operation, after)


def test_a_lock_timeout_runs_plainly_where_there_is_no_lock_to_wait_for() -> None:
    operation = _add_column(attempts=1)
    after = forwards(operation)
    assert COLUMN in columns()
    backwards(operation, after)
    assert COLUMN not in columns()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"timeout": float("nan")}, "timeout"),
        ({"timeout": float("inf")}, "timeout"),
        ({"timeout": 0}, "timeout"),
        ({"attempts": 0}, "attempts"),
        ({"attempts": 2**63}, "attempts"),
        ({"pause": -1}, "pause"),
    ],
)
def test_absurd_bounds_are_refused_when_the_migration_is_loaded(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WithLockTimeout([_add_field(models.IntegerField(null=True))], **arguments)
    with pytest.raises(ValueError, match="at least one operation"):
        WithLockTimeout([])


def test_sqlmigrate_shows_the_bound_before_the_statements_it_bounds() -> None:
    operation = WithLockTimeout([_add_field(models.IntegerField(null=True))], timeout=1.5)
    before = initial_state()
    after = before.clone()
    operation.state_forwards(APP, after)
    with connection.schema_editor(collect_sql=True, atomic=False) as editor:
        operation.database_forwards(APP, editor, before, after)
    sql = "\n".join(editor.collected_sql)
    if connection.vendor == "postgresql":
        assert sql.index("SET lock_timeout = '1500ms'") < sql.index("ADD COLUMN") < sql.index("RESET lock_timeout")
    elif connection.vendor == "mysql":
        assert sql.index("lock_wait_timeout = 2") < sql.index("ADD COLUMN")
    assert COLUMN not in columns()


def test_a_check_is_added_without_a_scan_and_validated_apart() -> None:
    check = models.CheckConstraint(condition=models.Q(attempts__lte=1000), name="outbox_online_probe_check")
    add, validate = AddCheckNotValid("message", check), ValidateCheck("message", check.name)
    with connection.cursor() as cursor:
        insert_row(cursor)
    with CaptureQueriesContext(connection) as queries:
        after = forwards(add)
    if connection.vendor == "mysql":
        # a check there means a copy of the table under a write lock: the server is not given it
        assert check.name not in indexes()
        assert not [q for q in queries.captured_queries if "ALTER TABLE" in q["sql"]], queries.captured_queries
    else:
        assert check.name in indexes()
    if connection.vendor == "postgresql":
        assert _validated(check.name) is False  # added without reading a row
    forwards(validate, after)
    if connection.vendor == "postgresql":
        assert _validated(check.name) is True
    backwards(add, after)
    assert check.name not in indexes()


@pytest.mark.postgres
def test_validating_finds_a_row_the_check_refuses_and_keeps_the_constraint_for_new_rows() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("only PostgreSQL adds a check without reading the rows")
    from django.db import IntegrityError

    check = models.CheckConstraint(condition=models.Q(attempts__lte=0), name="outbox_online_probe_check")
    with connection.cursor() as cursor:
        insert_row(cursor)  # attempts = 1: refused by the check
    add = AddCheckNotValid("message", check)
    after = forwards(add)  # added: the old row is not read
    with pytest.raises(IntegrityError):
        forwards(ValidateCheck("message", check.name), after)
    assert _validated(check.name) is False
    backwards(add, after)


def _validated(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT convalidated FROM pg_constraint WHERE conname = %s", [name])
        return bool(cursor.fetchone()[0])


def test_an_add_check_not_valid_takes_only_a_check() -> None:
    with pytest.raises(TypeError, match="CheckConstraint"):
        AddCheckNotValid("message", models.UniqueConstraint(fields=["topic"], name="x"))  # type: ignore[arg-type]


def test_the_operations_survive_a_migration_files_round_trip() -> None:
    """makemigrations writes and Django loads migrations by deconstructing their operations."""
    from django.db.migrations.writer import OperationWriter

    for operation in (
        AddIndexOnline("message", INDEX),
        RemoveIndexOnline("message", INDEX.name),
        WithLockTimeout([_add_field(models.IntegerField(null=True))], timeout=1.5, attempts=4, pause=0.5),
        ValidateCheck("message", "outbox_online_probe_check"),
    ):
        text, imports = OperationWriter(operation, indentation=0).serialize()
        assert "django_outbox.store.online" in " ".join(imports), (text, imports)
        namespace: dict[str, Any] = {}
        source = "\n".join([*sorted(imports), "from django.db import migrations, models", f"op = {text.rstrip(',')}"])
        exec(source, namespace)
        assert type(namespace["op"]) is type(operation)
        assert OperationWriter(namespace["op"], indentation=0).serialize()[0] == text  # loaded as it was written


@override_settings(MIGRATION_MODULES={APP: "tests.support.migration_samples.safe"})
def test_a_migration_written_with_them_migrates_forwards_and_back() -> None:
    """Through Django's own executor, as ``migrate`` runs it: three non-atomic migrations."""
    checked = () if connection.vendor == "mysql" else ("outbox_msg_priority_check",)
    call_command("migrate", APP, "0004_check", verbosity=0)
    try:
        assert "priority" in columns()
        assert {"outbox_msg_topic_idx", *checked} <= set(indexes())
    finally:
        call_command("migrate", APP, schema.package_latest(), verbosity=0)
    assert "priority" not in columns()
    assert not {"outbox_msg_topic_idx", "outbox_msg_priority_check"} & set(indexes())
