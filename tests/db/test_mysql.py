"""MariaDB/MySQL: what the server does differently, proven on the real server (skipped elsewhere).

Per-key commit order rests on the key's lock row: a second producer of a key waits for the first
producer's transaction before it takes its id. The claim is two statements: the SKIP LOCKED select must
hand concurrent workers disjoint messages. Idempotency keys rest on the initial migration's unique index.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from django.core.checks import Error
from django.db import connection, connections, transaction

from django_outbox import outbox, store
from django_outbox.checks import (
    MYSQL_CLAIM_INDEX,
    MYSQL_ISOLATION,
    MYSQL_SHAPES_MISSING,
    MYSQL_STATEMENT_BINLOG,
    MYSQL_TOO_OLD,
    check_mysql,
    mysql_messages,
)
from django_outbox.models import Message
from django_outbox.store import mysql as store_mysql
from django_outbox.testing import relay_all
from tests.support.database import connect_raw_mysql
from tests.support.threads import key_lock_waiters
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_producers_of_one_key_commit_in_id_order(mysql, handler):
    """The first producer's transaction stays open; the second, of the same key, waits inside send()
    until it ends, so it can neither take a lower id nor commit first; nothing of the key is delivered
    early, and the key is delivered in send order."""
    seen: list[int] = []
    handler("ord.*", lambda message: seen.append(message.payload["n"]))
    first_sent, release, second_done = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def first() -> None:
        try:
            with transaction.atomic():
                outbox.send("ord.x", {"n": 1}, key="K🔑")
                first_sent.set()
                assert release.wait(30)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    def second() -> None:
        try:
            assert first_sent.wait(30)
            with transaction.atomic():
                outbox.send("ord.x", {"n": 2}, key="K🔑")
            second_done.set()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    try:
        assert first_sent.wait(30)
        wait_for(lambda: errors or key_lock_waiters() >= 1, timeout=30)  # the second producer waits on the key's row
        assert not errors, errors
        assert not second_done.is_set()
        relay_all()
        assert seen == [] and Message.objects.count() == 0  # nothing of the key committed yet
    finally:
        release.set()
        for thread in threads:
            thread.join(30)
    assert not errors, errors
    assert second_done.is_set()
    ones = Message.objects.get(payload__n=1)
    twos = Message.objects.get(payload__n=2)
    assert ones.id < twos.id
    wait_for(lambda: (relay_all(), seen)[1] == [1, 2], timeout=30)


def test_an_autocommit_keyed_send_holds_the_key_row_until_its_row_commits(mysql, handler):
    """In autocommit the lock statement would commit, and free the key's row, before the message is
    written: a producer of the key in a transaction could then take the next id, and the autocommit row,
    committed at once, be delivered before it. So the two statements share one transaction."""
    from django.test.utils import CaptureQueriesContext

    handler("ord.*", lambda message: None)
    assert connection.get_autocommit()
    with CaptureQueriesContext(connection) as queries:
        outbox.send("ord.x", {"n": 1}, key="K")
    statements = [q["sql"].split(" (")[0].split(" VALUES")[0] for q in queries.captured_queries]
    assert statements[0] == "BEGIN" and statements[-1] == "COMMIT", statements
    assert statements[1].startswith(f"INSERT INTO {store_mysql.KEY_LOCK}"), statements
    assert statements[2].startswith("INSERT INTO django_outbox_message"), statements
    assert len(statements) == 4, statements


def test_a_raw_producer_outside_django_is_ordered_too(mysql, handler):
    """The lock is the row, not a Python object: a producer on another connection holding the key's row
    makes send() wait for it, and a rolled-back holder lets it go."""
    handler("ord.*", lambda message: None)
    other = connect_raw_mysql()
    try:
        other.cursor().execute(
            f"INSERT INTO {store_mysql.KEY_LOCK} (`key`) VALUES (%s) ON DUPLICATE KEY UPDATE `key` = `key`", ["R"]
        )
        done = threading.Event()

        def send() -> None:
            try:
                outbox.send("ord.x", {"n": 1}, key="R")
                done.set()
            finally:
                connections.close_all()

        thread = threading.Thread(target=send)
        thread.start()
        wait_for(lambda: key_lock_waiters() >= 1, timeout=30)
        assert not done.is_set()
        other.rollback()
        thread.join(30)
        assert done.is_set()
    finally:
        other.close()


def test_concurrent_claims_get_disjoint_messages(mysql, handler):
    handler("ord.*", lambda message: None)
    for n in range(20):
        outbox.send("ord.x", {"n": n})
    held: list[int] = []
    other = connect_raw_mysql()
    try:
        cursor = other.cursor()
        cursor.execute(
            "SELECT id FROM django_outbox_message FORCE INDEX (outbox_msg_status_id_idx) WHERE status = 'pending'"
            " ORDER BY id LIMIT 5 FOR UPDATE SKIP LOCKED"
        )
        held = [row[0] for row in cursor.fetchall()]
        assert len(held) == 5
        claimed = store.claim("default", worker="w", limit=100, lease_seconds=60)
        assert len(claimed) == 15 and not {m.id for m in claimed} & set(held)
        assert all(m.status == "processing" and m.attempts == 1 and m.locked_by == "w" for m in claimed)
        stored = {m.id: m for m in Message.objects.filter(id__in=[m.id for m in claimed])}
        assert all(stored[m.id].locked_until == m.locked_until for m in claimed)
    finally:
        other.rollback()
        other.close()


def test_a_repeated_idempotency_key_in_an_open_transaction_keeps_it_usable(mysql, handler):
    handler("ord.*", lambda message: None)
    with transaction.atomic():
        first = outbox.send("ord.x", {"n": "🎉"}, idempotency_key="idem-🎉")
        again = outbox.send("ord.x", {"n": "🎉"}, idempotency_key="idem-🎉")
        other = outbox.send("ord.x", {"n": 2}, key="emoji-🔑")
    assert again.id == first.id
    assert Message.objects.count() == 2
    assert Message.objects.get(pk=first.pk).payload == {"n": "🎉"}
    assert Message.objects.get(pk=other.pk).key == "emoji-🔑"


def test_a_rollback_leaves_nothing(mysql, handler):
    handler("ord.*", lambda message: None)
    with transaction.atomic():
        outbox.send("ord.x", {"n": 1}, key="gone")
        transaction.set_rollback(True)
    assert Message.objects.count() == 0


def test_send_many_refuses_a_too_deep_item_before_it_locks_or_writes_anything(mysql, handler):
    """MariaDB keeps JSON to 31 levels: send_many() must find the item that nests deeper before it takes
    any key's lock row or writes a row, not while writing, and say which item it is. Another producer
    holds one of the batch's keys here: a batch that is refused anyway must not wait for it (nor hold
    the others' keys meanwhile)."""
    handler("ord.*", lambda message: None)
    deep: object = 1
    for _ in range(store_mysql.JSON_MAX_DEPTH + 1):
        deep = [deep]
    a, b = f"held-a-{uuid.uuid4()}", f"held-b-{uuid.uuid4()}"  # lock rows outlive a test's data
    items = [
        {"topic": "ord.x", "payload": {}, "key": a},
        {"topic": "ord.x", "payload": {}, "key": b},
        {"topic": "ord.x", "payload": deep, "key": b},
    ]
    other = connect_raw_mysql()
    try:
        cursor = other.cursor()
        cursor.execute(
            f"INSERT INTO {store_mysql.KEY_LOCK} (`key`) VALUES (%s) ON DUPLICATE KEY UPDATE `key` = `key`", [b]
        )  # held until other.rollback()
        with connection.cursor() as ours:
            ours.execute("SET SESSION innodb_lock_wait_timeout = 1")  # waiting for it would fail, not hang
        with transaction.atomic():
            with pytest.raises(ValueError, match=r"^outbox.send_many\(\): item 2: payload nests .* 32 levels deep"):
                outbox.send_many(items)
            with connection.cursor() as ours:
                ours.execute(f"SELECT count(*) FROM {store_mysql.KEY_LOCK} WHERE `key` IN (%s, %s)", [a, b])
                assert ours.fetchone() == (0,)  # no lock row of the batch's: it was refused before
        other.rollback()
        assert Message.objects.count() == 0
        assert [m.key for m in outbox.send_many(items[:2])] == [a, b]  # the keys are free
    finally:
        other.close()
        with connection.cursor() as ours:
            ours.execute("SET SESSION innodb_lock_wait_timeout = DEFAULT")


def test_the_server_here_passes_the_checks(mysql):
    assert check_mysql(databases=["default"]) == []


def test_the_checks_read_the_real_server(mysql):
    facts = store_mysql.server_facts(connection)
    assert facts["indexes"][store_mysql.CLAIM_INDEX] == "status,id"
    assert store_mysql.IDEMPOTENCY_INDEX in facts["indexes"] and facts["key_lock"]
    assert facts["isolation"] in ("READ-COMMITTED", "REPEATABLE-READ")


def _facts(**changes):
    facts = {
        "version": "10.11.19-MariaDB",
        "mariadb": True,
        "version_tuple": (10, 11, 19),
        "log_bin": False,
        "binlog_format": "MIXED",
        "isolation": "READ-COMMITTED",
        "indexes": {store_mysql.CLAIM_INDEX: "status,id", store_mysql.IDEMPOTENCY_INDEX: "idempotency_key"},
        "key_lock": True,
    }
    facts.update(changes)
    return facts


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, []),
        ({"version_tuple": (10, 5, 9), "version": "10.5.9-MariaDB"}, [MYSQL_TOO_OLD]),
        ({"mariadb": False, "version_tuple": (8, 0, 0), "version": "8.0.0"}, [MYSQL_TOO_OLD]),
        ({"mariadb": False, "version_tuple": (8, 0, 1), "version": "8.0.1"}, []),
        ({"log_bin": True, "binlog_format": "STATEMENT"}, [MYSQL_STATEMENT_BINLOG]),
        ({"log_bin": False, "binlog_format": "STATEMENT"}, []),
        ({"log_bin": True, "binlog_format": "ROW"}, []),
        ({"isolation": "SERIALIZABLE"}, [MYSQL_ISOLATION]),
        ({"isolation": "READ-UNCOMMITTED"}, [MYSQL_ISOLATION]),
        ({"isolation": "REPEATABLE-READ"}, []),
        ({"indexes": {store_mysql.IDEMPOTENCY_INDEX: "idempotency_key"}}, [MYSQL_CLAIM_INDEX]),
        (
            {"indexes": {store_mysql.CLAIM_INDEX: "status", store_mysql.IDEMPOTENCY_INDEX: "idempotency_key"}},
            [MYSQL_CLAIM_INDEX],
        ),
        ({"indexes": {store_mysql.CLAIM_INDEX: "status,id"}}, [MYSQL_SHAPES_MISSING]),
        ({"key_lock": False}, [MYSQL_SHAPES_MISSING]),
    ],
)
def test_each_server_fact_has_its_check(changes, expected):
    found = mysql_messages("default", _facts(**changes))
    assert [m.id for m in found] == expected
    assert all(isinstance(m, Error) and m.hint for m in found)


def test_a_mariadb_project_gets_no_warning_about_the_outbox_indexes_conditions(mysql):
    """Django warns that MariaDB ignores the conditions of partial indexes and constraints (W036, W037);
    the initial migration gives the outbox's their MariaDB shapes, so a new project must not get eight warnings
    on every command."""
    from django.db import models

    unfiltered = {e.id for e in models.Model.check.__func__(Message, databases=["default"])}
    assert {"models.W036", "models.W037"} <= unfiltered, "the scenario no longer makes Django warn"
    assert not {e.id for e in Message.check(databases=["default"])} & {"models.W036", "models.W037"}


def test_a_batch_of_deliveries_is_recorded_in_a_few_statements_and_stays_fenced(mysql):
    """MariaDB has no ``UPDATE ... RETURNING``: one ``UPDATE`` per delivered message made the record three
    quarters of a drain. The batch's deliveries are two statements (the rows still held, locked; one
    ``UPDATE`` by id) and one insert of the attempts, and each message is still fenced on its lease and
    attempt number: a stale attempt and a lease taken away are lost, the rest delivered."""
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from tests.support.factories import MessageFactory

    for _ in range(100):
        MessageFactory()
    claimed = store.claim("default", worker="w1", limit=100, lease_seconds=30)
    assert len(claimed) == 100
    stale, taken = claimed[0], claimed[1]
    Message.objects.filter(pk=taken.pk).update(locked_by="w2")  # as after a reap and another worker's claim
    now = timezone.now()
    outcomes = [
        store.Outcome(
            message_id=m.pk,
            number=m.attempts + (1 if m is stale else 0),
            status="delivered",
            started_at=now,
            finished_at=now,
        )
        for m in claimed
    ]
    with CaptureQueriesContext(connection) as queries:
        lost = store.record("default", worker="w1", outcomes=outcomes)
    assert lost == {stale.pk, taken.pk}
    statements = [q["sql"].split(" ")[0] for q in queries.captured_queries]
    # the server's clock, BEGIN, SELECT ... FOR UPDATE, UPDATE, the attempts' one INSERT, the lost ids'
    # look-up, COMMIT: one UPDATE per message made it 104 for a batch of 100
    assert len(statements) <= 8, statements
    assert Message.objects.filter(status=Message.Status.DELIVERED).count() == 98
    assert set(Message.objects.exclude(status=Message.Status.DELIVERED).values_list("pk", flat=True)) == lost
    assert Message.objects.get(pk=taken.pk).locked_by == "w2"
    assert store.models.Attempt.objects.count() == 100
    assert store.models.Attempt.objects.filter(error__contains="lease lost").count() == 2
