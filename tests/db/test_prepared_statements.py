"""The worker's claim and record are prepared on PostgreSQL, unless ``OUTBOX["PREPARED_STATEMENTS"]`` is off."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator

import pytest
from django.core.checks import run_checks
from django.db import connection, connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_outbox import store
from django_outbox.models import Message
from tests.support.factories import MessageFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _claim_and_record() -> None:
    for _ in range(2):
        MessageFactory()
        (claimed,) = store.claim("default", worker="w1", limit=10, lease_seconds=30)
        now = timezone.now()
        outcome = store.Outcome(
            message_id=claimed.pk, number=claimed.attempts, status="delivered", started_at=now, finished_at=now
        )
        assert store.record("default", worker="w1", outcomes=[outcome]) == set()


def _prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_claim_and_record_are_prepared_once_per_connection(postgres):
    connection.close()  # a fresh session: nothing prepared yet
    seen: list[str] = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        _claim_and_record()
    statements = _prepared()
    assert len(statements) == 2, statements  # one claim, one record, each prepared once for two uses
    assert any("SKIP LOCKED" in s for s in statements)
    assert any("INSERT INTO django_outbox_attempt" in s for s in statements)
    assert sum("SKIP LOCKED" in sql for sql in seen) == 2, "execute wrappers still see every execution"


def test_with_queries_logged_the_log_gets_the_full_text_unprepared(postgres):
    connection.close()
    with CaptureQueriesContext(connection) as queries:
        _claim_and_record()
    claims = [q["sql"] for q in queries.captured_queries if "SKIP LOCKED" in q["sql"]]
    assert len(claims) == 2 and "'w1'" in claims[0]  # parameters interpolated, as Django logs them
    assert _prepared() == []


@override_settings(OUTBOX={"PREPARED_STATEMENTS": False})
def test_nothing_is_prepared_when_switched_off(postgres):
    connection.close()
    _claim_and_record()
    assert _prepared() == []


@override_settings(OUTBOX={"PREPARED_STATEMENTS": "yes"})
def test_the_setting_must_be_a_boolean():
    errors = [e for e in run_checks() if e.id == "django_outbox.E003" and "PREPARED_STATEMENTS" in e.msg]
    assert errors and "True or False" in errors[0].msg


def _claimed_and_stored() -> tuple[Message, Message]:
    sent = MessageFactory.create()
    (claimed,) = store.claim("default", worker="w1", limit=10, lease_seconds=30)
    assert claimed.pk == sent.pk
    return claimed, Message.objects.get(pk=sent.pk)


FIELDS = [f.attname for f in Message._meta.concrete_fields]


def test_claimed_timestamps_equal_what_django_reads_in_utc(postgres):
    claimed, stored = _claimed_and_stored()
    assert {f: getattr(claimed, f) for f in FIELDS} == {f: getattr(stored, f) for f in FIELDS}
    for value in (claimed.available_at, claimed.created_at, claimed.locked_until):
        assert value.tzinfo is dt.UTC  # the very object Django's own loader pins


@contextlib.contextmanager
def _reconnected(**settings: object) -> Iterator[None]:
    """Settings that Django applies when it connects, on a fresh connection."""
    wrapper = connections["default"]  # the connection itself: ``connection`` is a proxy to it

    def reconnect() -> None:
        wrapper.close()
        for cached in ("timezone", "timezone_name"):
            wrapper.__dict__.pop(cached, None)

    reconnect()
    try:
        with override_settings(**settings):
            yield
            reconnect()
    finally:
        reconnect()


@pytest.mark.parametrize("settings", [{"USE_TZ": False}, {"TIME_ZONE": "Asia/Kolkata"}], ids=["naive", "Kolkata"])
def test_other_time_zone_settings_still_read_as_django_reads(postgres, settings):
    with _reconnected(**settings):
        claimed, stored = _claimed_and_stored()
        assert {f: getattr(claimed, f) for f in FIELDS} == {f: getattr(stored, f) for f in FIELDS}
        assert claimed.locked_until.tzinfo == stored.locked_until.tzinfo
        started = claimed.locked_until.replace(microsecond=123456)  # naive without USE_TZ, as Django's values are
        outcome = store.Outcome(
            message_id=claimed.pk, number=1, status="delivered", started_at=started, finished_at=started
        )
        assert store.record("default", worker="w1", outcomes=[outcome]) == set()
        assert Message.objects.get(pk=claimed.pk).attempt_log.get().started_at == started


def test_a_statement_name_taken_by_another_client_is_a_lost_statement_not_an_outage(postgres, caplog):
    """Behind transaction pooling another client's statement of the same name may sit on the server
    connection a transaction lands on: PostgreSQL then refuses the Bind ("bind message supplies 6
    parameters, but prepared statement "_pg3_0" requires 3"), before anything runs. Seen in CI through
    PgBouncer; here the same server session is made by hand, on a direct connection."""
    from django_outbox.store import cursors

    connection.close()
    cursors._UNPREPARED.discard("default")
    _claim_and_record()  # psycopg prepared the claim and the record on this session
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements")
        names = [row[0] for row in cursor.fetchall()]
        assert names, "nothing was prepared: the test would prove nothing"
        for name in names:  # what another client of the pooler left under the same names
            cursor.execute(f'DEALLOCATE "{name}"')
            cursor.execute(f'PREPARE "{name}" AS SELECT 1')
    MessageFactory()
    with caplog.at_level("WARNING", logger="django_outbox.store"):
        (claimed,) = store.claim("default", worker="w1", limit=10, lease_seconds=30)
    assert claimed.status == Message.Status.PROCESSING
    assert "prepared statements do not survive" in caplog.text
    assert "default" in cursors._UNPREPARED
    cursors._UNPREPARED.discard("default")
