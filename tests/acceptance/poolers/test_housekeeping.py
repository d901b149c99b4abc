"""Housekeeping behind PgBouncer in transaction pooling: one housekeeper at a time, and no lock left behind.

A pool of two server connections makes two clients share server sessions deterministically: PgBouncer
hands out server connections last-in first-out, so a client that starts a transaction right after
another client's statement gets the server session that statement ran on.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, connections
from django.utils import timezone

from django_outbox.models import Message
from django_outbox.retention import housekeeping
from tests.support import pgbouncer, pooled
from tests.support.factories import AttemptFactory, MessageFactory

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("postgres", "empty_archive"),
    pytest.mark.slow,
]
ALIAS = "through_pooler"


@pytest.fixture
def bouncer() -> Iterator[pgbouncer.PgBouncer]:
    """Transaction pooling only, with two server connections, in front of the server itself."""
    pgbouncer.require()
    host, port = pooled.direct() or (connection.settings_dict["HOST"] or "127.0.0.1", connection.settings_dict["PORT"])
    pooler = pgbouncer.PgBouncer("transaction", server_host=host, server_port=int(port or 5432), pool_size=2)
    try:
        yield pooler
    finally:
        for wrapper in opened:
            wrapper.close()
        opened.clear()
        pooler.stop()


opened: list[Any] = []


def through(pooler: pgbouncer.PgBouncer) -> Any:
    """This thread's ``connections[ALIAS]``: the test database, reached through the pooler."""
    settings = {**connection.settings_dict, "HOST": "127.0.0.1", "PORT": pooler.port}
    wrapper = type(connections["default"])(settings, ALIAS)
    connections[ALIAS] = wrapper
    opened.append(wrapper)
    return wrapper


def housekeeping_locks_held() -> int:
    """Advisory locks of housekeeping on this database held by any server session, seen past the pooler."""
    key = housekeeping.ADVISORY_LOCK_ID
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid::bigint = %s AND objid::bigint = %s AND objsubid = 1"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            [key >> 32, key & 0xFFFFFFFF],
        )
        return int(cursor.fetchone()[0])


def old_delivered() -> Message:
    when = timezone.now() - dt.timedelta(hours=2)
    message = MessageFactory.create(status="delivered", created_at=when, available_at=when, delivered_at=when)
    AttemptFactory(message=message, started_at=when, finished_at=when, outcome="delivered")
    return message


def after_first_lock(wrapper: Any, action: Callable[[], None]) -> Any:
    """An execute wrapper: ``action()`` once, right after the first statement that takes the lock."""
    fired = threading.Event()

    def run(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if "advisory" in sql and not fired.is_set():
            fired.set()
            action()
        return result

    return wrapper.execute_wrapper(run)


def in_thread(pooler: pgbouncer.PgBouncer, work: Callable[[], Any]) -> Callable[[], Any]:
    result: dict[str, Any] = {}

    def body() -> None:
        wrapper = through(pooler)
        opened.remove(wrapper)  # closed here: a connection is used by the thread that made it only
        try:
            result["value"] = work()
        finally:
            wrapper.close()

    def start() -> Any:
        thread = threading.Thread(target=body)
        thread.start()
        thread.join(30)
        assert not thread.is_alive(), "the second client never got a server connection"
        return result

    return start


def test_a_second_housekeeper_skips_while_the_first_is_in_its_round(bouncer):
    old_delivered()
    first = through(bouncer)
    second: dict[str, Any] = {}

    def second_housekeeper() -> None:
        second.update(in_thread(bouncer, lambda: housekeeping.run(ALIAS))())

    with after_first_lock(first, second_housekeeper):
        report = housekeeping.run(ALIAS)
    assert second["value"].skipped, f"two housekeepers at once: {report} and {second['value']}"
    assert not report.skipped and report.archived == 1
    assert housekeeping_locks_held() == 0


def test_no_housekeeping_lock_is_left_behind_when_another_client_takes_the_server_session(bouncer):
    """Another client's transaction starts on the server session that took the lock; the round goes on
    on the other one. A session lock would be released on the wrong session (a no-op) and stay held
    by the first, in the pool, for good: every later round would be skipped."""
    old_delivered()
    first = through(bouncer)
    holding, done = threading.Event(), threading.Event()

    def other_client() -> None:
        def hold() -> None:
            from django.db import transaction

            with transaction.atomic(using=ALIAS), connections[ALIAS].cursor() as cursor:
                cursor.execute("SELECT 1")
                holding.set()
                done.wait(30)

        threading.Thread(target=in_thread(bouncer, hold)).start()
        assert holding.wait(30)

    try:
        with after_first_lock(first, other_client):
            report = housekeeping.run(ALIAS)
    finally:
        done.set()
    assert not report.skipped and report.archived == 1
    assert housekeeping_locks_held() == 0, "the housekeeping lock outlived the round"
    old_delivered()
    assert housekeeping.run(ALIAS).archived == 1, "the next round is not locked out"
