"""MariaDB/MySQL: the message table keeps no copy of another index (the initial migration), and the queries of
the hot path, housekeeping, the admin and the overview each use an index (skipped on the other databases).

Django's ``mysql`` backend makes the model's partial indexes without their conditions: a copy of the
primary key and ``(key, id)`` twice, each one more entry per ``send()``.
"""

from __future__ import annotations

import datetime as dt
import importlib
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_outbox import store
from django_outbox.admin import overview
from django_outbox.checks import MYSQL_CLAIM_INDEX, check_mysql
from django_outbox.models import Message
from django_outbox.retention import housekeeping
from django_outbox.store import mysql as store_mysql
from tests.support import schema

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("mysql")]

#: Every index of the message table on MariaDB/MySQL, with its columns in order.
EXPECTED = {
    "PRIMARY": "id",
    "uuid": "uuid",
    "outbox_msg_idem_key_uniq": "idempotency_key",
    "outbox_msg_status_id_idx": "status,id",
    "outbox_msg_due_idx": "available_at",
    "outbox_msg_lease_idx": "locked_by",
    "outbox_msg_key_idx": "key,id",
    "outbox_msg_topic_id_idx": "topic,id",
    "outbox_msg_created_idx": "created_at",
    "outbox_msg_settled_idx": "status,id,topic",
    "outbox_msg_finished_idx": "created_at",
    "outbox_msg_claim_key_idx": "claim_key",
}

#: 30,000 messages: mostly delivered history, 1% pending (a few scheduled an hour ahead), some dead and
#: cancelled, half of them on 500 keys.
FILL = """
INSERT INTO django_outbox_message (uuid, topic, `key`, payload, headers, status, attempts, max_attempts,
    available_at, created_at, delivered_at, last_error)
SELECT UUID(), CONCAT('probe.t', seq MOD 3), IF(seq MOD 2, CONCAT('key-', seq MOD 500), NULL), '{}', '{}',
       CASE WHEN seq MOD 100 = 0 THEN 'pending' WHEN seq MOD 997 = 0 THEN 'dead'
            WHEN seq MOD 1999 = 0 THEN 'cancelled' ELSE 'delivered' END,
       1, 5, UTC_TIMESTAMP(6) - INTERVAL (60000 - seq) SECOND + INTERVAL IF(seq MOD 300 = 0, 3600, 0) SECOND,
       UTC_TIMESTAMP(6) - INTERVAL (60000 - seq) SECOND, UTC_TIMESTAMP(6) - INTERVAL (60000 - seq) SECOND, ''
FROM seq_1_to_30000
"""

#: Five keys (a key per tenant, say) behind 20,000 delivered messages, 500 pending.
FEW_KEYS = """
INSERT INTO django_outbox_message (uuid, topic, `key`, payload, headers, status, attempts, max_attempts,
    available_at, created_at, delivered_at, last_error)
SELECT UUID(), 'probe.t', CONCAT('tenant-', seq MOD 5), '{}', '{}', IF(seq <= 20000, 'delivered', 'pending'),
       0, 5, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), NULL, ''
FROM seq_1_to_20500
"""


def indexes() -> dict[str, str]:
    found: dict[str, str] = store_mysql.server_facts(connection)["indexes"]
    return found


def fill(sql: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        cursor.execute("ANALYZE TABLE django_outbox_message")
        cursor.fetchall()


def plans(run: Any) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Each statement on the message table that ``run`` makes (rolled back), with its ``EXPLAIN``."""
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        run()
        transaction.set_rollback(True)
    for query in queries.captured_queries:
        sql = query["sql"]
        if "django_outbox_message" not in sql or not sql.startswith(("SELECT", "UPDATE", "DELETE")):
            continue
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + sql)  # captured with its values in place
            names = [d[0] for d in cursor.description]
            yield sql, [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def plan_of(run: Any, starts: str) -> list[dict[str, Any]]:
    found = [rows for sql, rows in plans(run) if sql.startswith(starts)]
    assert found, f"no statement starting {starts!r}"
    return found[0]


def handler_reads(run: Any) -> int:
    """Index entries and rows the server read for ``run`` (this session's handler counters)."""

    def reads() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SHOW SESSION STATUS LIKE 'Handler_read%'")
            return sum(int(value) for _, value in cursor.fetchall())

    before = reads()
    with transaction.atomic():
        run()
        transaction.set_rollback(True)
    return reads() - before


def test_the_message_table_has_each_index_its_queries_need_and_no_copy():
    assert indexes() == EXPECTED
    assert check_mysql(databases=["default"]) == []


def test_the_check_still_reports_a_missing_claim_index():
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX {store_mysql.CLAIM_INDEX} ON django_outbox_message")
    try:
        assert [m.id for m in check_mysql(databases=["default"])] == [MYSQL_CLAIM_INDEX]
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE INDEX {store_mysql.CLAIM_INDEX} ON django_outbox_message (status, id)")
    assert indexes() == EXPECTED


def test_the_hot_path_housekeeping_the_admin_and_the_overview_use_an_index():
    fill(FILL)
    found = {name for name in EXPECTED}

    def uses_an_index(rows: list[dict[str, Any]]) -> None:
        for row in rows:
            if row["table"] in ("c", "b", "U0", "django_outbox_message"):
                assert set(str(row["key"]).split("|")) <= found and row["type"] != "ALL", rows

    claim = plan_of(lambda: store.claim("default", worker="w", limit=100, lease_seconds=30), "SELECT")
    assert claim[0]["key"] == store_mysql.CLAIM_INDEX
    uses_an_index(claim)
    uses_an_index(plan_of(lambda: store_mysql.due_head_exists(connection, None, store.blocking_statuses()), "SELECT"))
    due = plan_of(lambda: store_mysql.next_due_seconds(connection, "", []), "SELECT")
    assert "outbox_msg_due_idx" in str(due[0]["key"]) or "No matching min/max row" in str(due[0]["Extra"]), due

    cutoff = timezone.now() - dt.timedelta(hours=10)
    uses_an_index(plan_of(lambda: housekeeping._batch_mysql(connection, cutoff, 500, None), "SELECT"))
    uses_an_index(plan_of(lambda: overview.gauges("default"), "SELECT COUNT(`__col1`)"))

    heartbeat = plan_of(lambda: store.extend_leases("default", worker="w", lease_seconds=30), "UPDATE")
    assert heartbeat[0]["key"] == "outbox_msg_lease_idx", heartbeat  # this worker's rows only

    # The admin's search by key stays newest first on (key, id), without a sort.
    by_key = plan_of(lambda: list(Message.objects.filter(key="key-7").order_by("-id")[:100]), "SELECT")
    assert by_key[0]["key"] == "outbox_msg_key_idx" and "filesort" not in (by_key[0]["Extra"] or ""), by_key


def test_few_keys_behind_a_long_history_the_claim_and_the_lag_read_only_open_rows():
    """Five keys behind 20,000 delivered messages: the claim reads open rows, not the keys' history (about
    900 reads a claim here: the keys off the open keys' index, a run of each, the unkeyed walk up to the
    runs' last message, the lock and the lease; walking a key's history on ``(key, id)`` took 2 million)."""
    fill(FEW_KEYS)
    claim_reads = handler_reads(lambda: store.claim("default", worker="w", limit=100, lease_seconds=30))
    assert claim_reads < 5_000, claim_reads
    claimed = store.claim("default", worker="w", limit=100, lease_seconds=30)
    assert len(claimed) == 100 and len({m.key for m in claimed}) == 1, "a whole run of the next key"
    assert [m.id for m in claimed] == sorted(m.id for m in claimed)
    lag_reads = handler_reads(lambda: overview.gauges("default"))
    assert lag_reads < 100_000, lag_reads  # the status counts read up to 10,001 entries each


def test_the_claim_index_migration_warns_on_a_large_table(caplog, monkeypatch):
    """On a large table the copy that adds the column keeps every ``send()`` waiting: the migration says so,
    and what to do (the threshold is lowered here instead of writing the rows)."""
    migration = importlib.import_module("django_outbox.migrations.0003_mysql_claim_key_index")
    monkeypatch.setattr(migration, "LARGE", -1)
    call_command("migrate", "django_outbox", "0002_pending_unkeyed_index", verbosity=0)
    try:
        assert "outbox_msg_claim_key_idx" not in indexes()
        with caplog.at_level(logging.WARNING, logger="django_outbox.migrations"):
            call_command("migrate", "django_outbox", "0003_mysql_claim_key_index", verbosity=0)
    finally:
        call_command("migrate", "django_outbox", schema.package_latest(), verbosity=0)
    assert "every send() waits for the copy to end" in caplog.text and "docs/upgrading.md" in caplog.text
    assert indexes() == EXPECTED


def test_a_later_column_is_added_and_dropped_instantly_beside_the_claim_index():
    """A later release's expand step adds a column while ``send()`` and the claims go on: MariaDB must do it
    without rebuilding the table. Beside an indexed *virtual* column it cannot (it copies the table under a
    lock that blocks writes: a hundred seconds at 10,000,000 messages), so the claim's column is stored."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE django_outbox_message ADD COLUMN probe_later int NULL, ALGORITHM=INSTANT")
        try:
            described = connection.introspection.get_table_description(cursor, Message._meta.db_table)
            assert "probe_later" in {column.name for column in described}
        finally:
            cursor.execute("ALTER TABLE django_outbox_message DROP COLUMN probe_later, ALGORITHM=INSTANT")
    assert indexes() == EXPECTED
