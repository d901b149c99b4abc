"""A DBA's timeouts: workers on a role with short statement, lock and idle-in-transaction timeouts."""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_outbox import outbox
from django_outbox.admin import overview
from django_outbox.models import Attempt, Message
from django_outbox.retention.models import ArchivedMessage
from tests.probe.models import Delivery
from tests.support import ROOT
from tests.support.factories import finished
from tests.support.processes import WorkerProcess, worker_env

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("postgres", "empty_archive"),
    pytest.mark.slow,
]

#: A role per test process: roles are the server's, not a database's, and another run's (another xdist
#: process, another checkout on the same server) would drop it at its teardown under this one's feet.
ROLE = f"outbox_dba_timeouts_{os.getpid()}"
TIMEOUTS = {"statement_timeout": "200ms", "lock_timeout": "200ms", "idle_in_transaction_session_timeout": "200ms"}


@pytest.fixture
def strict_role() -> Iterator[dict[str, str]]:
    """A login role whose sessions get the DBA's timeouts, set on the role as a DBA would."""
    with connection.cursor() as cursor:
        cursor.execute(f"DROP ROLE IF EXISTS {ROLE}")
        cursor.execute(f"CREATE ROLE {ROLE} LOGIN SUPERUSER")  # superuser: housekeeping owns partitions
        for name, value in TIMEOUTS.items():
            cursor.execute(f"ALTER ROLE {ROLE} SET {name} = '{value}'")
    settings = connection.settings_dict
    url = f"postgres://{ROLE}@{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}/{settings['NAME']}"
    yield {"DATABASE_URL": url, "OUTBOX_LOG_LEVEL": "WARNING", "DEBUG": "false"}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s AND pid <> pg_backend_pid()",
            [ROLE],
        )
        cursor.execute(f"REASSIGN OWNED BY {ROLE} TO CURRENT_USER")  # the archive partitions it made
        cursor.execute(f"DROP OWNED BY {ROLE}")
        cursor.execute(f"DROP ROLE IF EXISTS {ROLE}")


def test_the_role_really_has_the_timeouts(strict_role):
    code = (
        "from django.db import connection; c = connection.cursor(); "
        "c.execute('SHOW statement_timeout'); print(c.fetchone()[0])"
    )
    out = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", code],
        cwd=ROOT,
        env={**worker_env(), **strict_role},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip().splitlines()[-1] == "200ms"


def test_workers_under_short_timeouts_deliver_retry_and_give_up_as_usual(strict_role):
    plain = [outbox.send("probe.dba", {"n": n}, key=f"k{n % 5}" if n % 2 else None).pk for n in range(300)]
    retried = [outbox.send("probe.dba", {"fail_until": 1, "n": n}).pk for n in range(20)]
    slow = [outbox.send("probe.dba", {"sleep": 0.4, "n": n}).pk for n in range(4)]  # longer than any timeout
    dead = outbox.send("probe.dba", {"permanent": True}).pk
    log = ""
    # --until-empty stops while a retry waits for its backoff (scheduled for later): another wave of
    # workers picks it up once it is due, as a running worker would.
    for _ in range(5):
        workers = [WorkerProcess("--until-empty", env=strict_role) for _ in range(2)]
        for worker in workers:
            code, out = worker.wait(timeout=120)
            log += out
            assert code == 0, out
        if not Message.objects.filter(status__in=["pending", "processing"]).exists():
            break
        time.sleep(1.0)  # longer than the test settings' largest backoff (0.5 s)
    assert "canceling statement due to statement timeout" not in log, log
    assert "lock timeout" not in log and "idle-in-transaction" not in log, log
    per_message = collections.Counter(Delivery.objects.values_list("message_id", flat=True))
    assert set(per_message) == set(plain + retried + slow) and set(per_message.values()) == {1}
    assert Message.objects.get(pk=dead).status == "dead"
    assert not Message.objects.filter(status="processing").exists()
    assert all(Attempt.objects.filter(message_id=pk).count() == 2 for pk in retried)


def test_housekeeping_under_short_timeouts(strict_role):
    for _ in range(5):
        finished("delivered", dt.timedelta(hours=3))
    command = [sys.executable, str(ROOT / "manage.py"), "outbox_housekeeping"]
    result = subprocess.run(command, cwd=ROOT, env={**worker_env(), **strict_role}, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ArchivedMessage.objects.count() == 5
    assert not Message.objects.filter(created_at__lt=timezone.now() - dt.timedelta(hours=2)).exists()


HELD_BEHIND_ONE_KEY = 200_000


def test_the_overview_stays_within_the_timeouts_with_200000_messages_behind_one_dead_key(strict_role, admin_client):
    """The lag used to walk every held message before the first claimable one: 2.3 s at this shape. The
    command and the admin (its overview, the list, the pending and dead filters) answer within the timeouts."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_outbox_message (uuid, topic, key, payload, headers, status, attempts, max_attempts,"
            " available_at, created_at, last_error)"
            " SELECT gen_random_uuid(), 'probe.stuck', 'stuck', '{}'::jsonb, '{}'::jsonb,"
            " CASE WHEN i = 0 THEN 'dead' ELSE 'pending' END, 0, 5,"
            " now() - interval '1 day' + make_interval(secs => i), now() - interval '1 day', ''"
            " FROM generate_series(0, %s) AS i",
            [HELD_BEHIND_ONE_KEY],
        )
        cursor.execute("ANALYZE django_outbox_message")
    outbox.send("probe.dba", {"n": 1})  # claimable, behind all of them in the due index
    command = [sys.executable, str(ROOT / "manage.py"), "outbox_status", "--json"]
    result = subprocess.run(command, cwd=ROOT, env={**worker_env(), **strict_role}, capture_output=True, text=True)
    assert "statement timeout" not in result.stderr, result.stderr
    data = json.loads(result.stdout)
    assert data["counts"]["pending"] > 10_000 and data["counts_exact"]["pending"] is False
    assert data["held_by_key"] == overview.DUE_WINDOW + 1 and data["lag_exact"] is False, (
        "bounded: a lower bound, an upper bound"
    )
    assert data["blocked_keys"][0]["key"] == "stuck" and data["blocked_keys"][0]["waiting_exact"] is False
    _admin_pages_as_the_role(admin_client, ["overview/", "", "?status__exact=pending", "?status__exact=dead"])


MILLION = """
INSERT INTO django_outbox_message (uuid, topic, key, payload, headers, status, attempts, max_attempts,
    available_at, created_at, delivered_at, last_error)
SELECT gen_random_uuid(), 'probe.t' || (i % 50), CASE WHEN i % 2 = 0 THEN 'k' || (i % 1000) END, '{}'::jsonb,
       '{}'::jsonb, s.status, CASE WHEN s.status = 'pending' THEN 0 ELSE 1 END, 5,
       now() - make_interval(secs => (1000000 - i) / 100000.0), now() - interval '1 day',
       CASE WHEN s.status = 'delivered' THEN now() END, ''
FROM generate_series(1, 1000000) AS i,
     LATERAL (SELECT CASE WHEN i % 100 = 0 THEN 'pending' WHEN i % 997 = 0 THEN 'dead' ELSE 'delivered' END
              AS status) AS s
"""


def test_health_metrics_and_admin_answer_within_the_timeouts_on_a_million_rows(
    strict_role, client, admin_client, settings, caplog
):
    """A million rows (10,000 of them due, on a thousand keys, 1,000 dead), read by the health and metrics
    views over a session of the DBA's role: 200 ms per statement. Freshly analyzed, then with no statistics
    (a new table, or after ``pg_upgrade``): the views answer with their figures, never the timeout's 503.
    Freshly analyzed, every page of the admin answers too, and none plans a sequential scan of the table."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (filling,) = cursor.fetchone()
        # Due over the 10 s before the fill. Not moved after it: an UPDATE of the due rows leaves their old
        # index entries for the first read to step over, which no health check meets after a plain fill.
        cursor.execute(MILLION)
        # One bulk INSERT leaves every row without its hint bits and every page out of the visibility map:
        # the first count then writes each page it visits (10,000 pending rows, one every 100: 113 ms cold,
        # 19 ms warm, and past 200 ms on a loaded machine), where an index-only count of a vacuumed table
        # visits none. Autovacuum visits a table after such an insert (its insert threshold); so does this.
        cursor.execute("VACUUM django_outbox_message")
        cursor.execute("ANALYZE django_outbox_message")
        # The fill's dirty pages written out now, as a server's checkpointer has long since done when a probe
        # meets such a table: a checkpoint under way during the probes would time the fill's writes too.
        cursor.execute("CHECKPOINT")
    _assert_probes_answer(strict_role, client, settings, caplog, filling)
    _assert_admin_pages_answer(admin_client)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM pg_statistic WHERE starelid = 'django_outbox_message'::regclass")
    _assert_probes_answer(strict_role, client, settings, caplog, filling)


def _assert_probes_answer(
    strict_role: dict[str, str], client: Any, settings: Any, caplog: pytest.LogCaptureFixture, filling: Any
) -> None:
    from django_outbox import store
    from django_outbox.observability import views

    now = timezone.now()
    beat = store.WorkerBeat(
        worker_id="w-1", hostname="host", pid=1, started_at=now, in_flight=0, delivered=0, failed=0,
        stopped=False, housekeeping_failures=0, housekeeping_error="",
    )  # fmt: skip
    store.heartbeat("default", beat)
    # "ok" whatever the fill took: the lag's bound is asserted below, from the fill's own time
    lag_bounds = {"HEALTH_LAG_SECONDS": 3600, "HEALTH_STALLED_SECONDS": 7200}
    settings.OUTBOX = {**settings.OUTBOX, "HEALTH_TOKEN": "c3" * 20, "ORDERING": "block", **lag_bounds}
    auth = {"HTTP_AUTHORIZATION": "Bearer " + "c3" * 20}
    views._backlog = None
    caplog.clear()
    try:
        with _as_the_role():
            with caplog.at_level("WARNING", logger="django_outbox"):
                health = client.get("/outbox/health/", **auth)
                health_records = list(caplog.records)
                caplog.clear()
                metrics = client.get("/outbox/metrics/", **auth)  # a 503 logs why: kept for the assertion
            with connection.cursor() as cursor:
                cursor.execute("SHOW statement_timeout")
                assert cursor.fetchone() == ("200ms",)
    finally:
        views._backlog = None
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM clock_timestamp() - %s)", [filling])
        (since_filling,) = cursor.fetchone()
    body = health.json()
    assert "error" not in body, [r.exc_text or r.getMessage() for r in health_records]
    assert body["workers_alive"] == 1 and body["lag_seconds"] is not None, body
    # the oldest due message became due 10 s before the fill: the lag is that, whatever the fill took
    assert 10 <= body["lag_seconds"] <= float(since_filling) + 10, (body, since_filling)
    assert body["blocked_keys"] > 0  # the dead messages with a key: read, not skipped
    assert (health.status_code, body["status"]) == (200, "ok"), body
    assert metrics.status_code == 200, (metrics.content, [r.exc_text or r.getMessage() for r in caplog.records])
    assert b'outbox_backlog_messages{status="pending"}' in metrics.content


def _assert_admin_pages_answer(admin_client: Any) -> None:
    """Every list, filter, search, detail and the overview, loaded as the DBA's role; then each statement
    run again under ``EXPLAIN ANALYZE`` (as the test's own role): a sequential scan of the message table
    may read the heap's first rows for a capped count (``LIMIT 10001`` of the delivered ones, nearly all
    rows), never the table."""
    dead = Message.objects.filter(status="dead").order_by("-id").first()
    assert dead is not None
    day_ago = (timezone.now() - dt.timedelta(days=1)).replace(microsecond=0).isoformat()
    pages = [
        "",
        "?p=500",
        *(f"?status__exact={status}" for status in ("dead", "delivered", "pending")),
        "?topic=probe.t7",
        "?" + urlencode({"created_at__gte": day_ago}),
        "?" + urlencode({"q": str(dead.uuid)}),
        "?q=k42",
        f"{dead.pk}/change/",
        "overview/",
    ]
    statements = _admin_pages_as_the_role(admin_client, pages)
    table = Message._meta.db_table
    scans = []
    with connection.cursor() as cursor:
        for page, sqls in statements.items():
            for sql in sqls:
                if table in sql and sql.lstrip().upper().startswith("SELECT"):
                    read = _seq_scan_rows(_analyzed_plan(cursor, sql), table)
                    if read > SEQ_SCAN_ROWS:
                        scans.append((page, read, sql[:300]))
    assert not scans, scans


def _admin_pages_as_the_role(admin_client: Any, pages: list[str]) -> dict[str, list[str]]:
    """Each admin page (a path under the message list) loaded over a session of the DBA's role: it answers
    (a statement past the role's 200 ms would fail it); each page's statements."""
    statements: dict[str, list[str]] = {}
    with _as_the_role():
        for page in pages:
            with CaptureQueriesContext(connection) as captured:
                response = admin_client.get("/admin/django_outbox/message/" + page)
            assert response.status_code == 200, (page, response.status_code)
            statements[page] = [q["sql"] for q in captured.captured_queries]
    return statements


@contextlib.contextmanager
def _as_the_role() -> Iterator[None]:
    """Django's connection logs in again as the DBA's role for the block, then as the test's own."""
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict["USER"] = ROLE
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)


#: The most rows a sequential scan of the message table may read for an admin page: a capped count's.
SEQ_SCAN_ROWS = 20_000


def _seq_scan_rows(plan: dict[str, Any], table: str) -> int:
    """The rows sequential scans of ``table`` read in an ``EXPLAIN ANALYZE`` plan (kept and filtered out)."""
    own = 0
    if plan.get("Node Type") == "Seq Scan" and plan.get("Relation Name") == table:
        own = (int(plan["Actual Rows"]) + int(plan.get("Rows Removed by Filter", 0))) * int(plan["Actual Loops"])
    return own + sum(_seq_scan_rows(child, table) for child in plan.get("Plans", []))


@pytest.mark.parametrize("statistics", ["analyzed", "none"])
def test_the_blocked_keys_panel_reads_the_listed_keys_not_the_backlog(settings, statistics):
    """How many messages wait behind each blocked key was once read by filtering every pending row on the
    due index: one heap page per pending message of a backlog spread over the table (10,000 pages at a
    million rows, past a DBA's 200 ms on a loaded server). The panel's statements may read only a few
    pages per listed key: fewer than the backlog's own pending rows (2,000 at this size)."""
    settings.OUTBOX = {**settings.OUTBOX, "ORDERING": "block"}
    with connection.cursor() as cursor:
        cursor.execute(MILLION.replace("1000000", str(TABLE_ROWS)))
        cursor.execute("VACUUM django_outbox_message")
        if statistics == "analyzed":
            cursor.execute("ANALYZE django_outbox_message")
        else:
            cursor.execute("DELETE FROM pg_statistic WHERE starelid = 'django_outbox_message'::regclass")
    with CaptureQueriesContext(connection) as captured:
        listed = overview.blocked_keys("default")
    assert len(listed) == overview.MAX_BLOCKED_KEYS_SHOWN
    pages = []
    with connection.cursor() as cursor:
        for query in captured.captured_queries:
            plan = _analyzed_plan(cursor, query["sql"], "BUFFERS")
            pages.append((plan["Shared Hit Blocks"] + plan["Shared Read Blocks"], " ".join(query["sql"].split())[:160]))
    pending = Message.objects.filter(status="pending").count()
    assert max(pages)[0] < pending // 2, (pending, pages)


def _analyzed_plan(cursor: Any, sql: str, *options: str) -> dict[str, Any]:
    """The root node of ``sql``'s plan, run under ``EXPLAIN (ANALYZE, *options)``."""
    cursor.execute(f"EXPLAIN (ANALYZE, {', '.join((*options, 'FORMAT JSON'))}) " + sql)
    (plan,) = cursor.fetchone()
    root: dict[str, Any] = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    return root


def _rows_read(plan: dict[str, Any]) -> int:
    """The most rows one node of an ``EXPLAIN ANALYZE`` plan produced over all its loops."""
    own = int(plan.get("Actual Rows", 0)) * int(plan.get("Actual Loops", 1))
    return max([own, *(_rows_read(child) for child in plan.get("Plans", []))])


#: The table of the plan test: the million's shape at a fifth of its size.
TABLE_ROWS = 200_000


@pytest.mark.parametrize("statistics", ["analyzed", "none"])
def test_no_statement_of_the_probes_reads_the_whole_table(settings, statistics):
    """The probes' counts stop at 10,001 rows; a bitmap scan cannot stop early and reads every entry of the
    index first (all 989,007 delivered rows of a million, 50 ms, ten times that at ten million, past a
    DBA's 200 ms). PostgreSQL plans one when the table has no statistics (new, or restored, or after
    ``pg_upgrade``). No node of any of the probes' statements may produce a tenth of the table: 200,000
    rows tell a capped count (10,001) from a whole index (about 198,000) as well as a million do."""
    settings.OUTBOX = {**settings.OUTBOX, "ORDERING": "block"}
    with connection.cursor() as cursor:
        cursor.execute(MILLION.replace("1000000", str(TABLE_ROWS)))  # the same shape, a fifth of the size
        if statistics == "analyzed":
            cursor.execute("ANALYZE django_outbox_message")
        else:
            cursor.execute("DELETE FROM pg_statistic WHERE starelid = 'django_outbox_message'::regclass")
    with CaptureQueriesContext(connection) as captured:
        overview.gauges("default")
    statements = [
        q["sql"]
        for q in captured.captured_queries
        if "django_outbox_message" in q["sql"] and not q["sql"].startswith("EXPLAIN")  # estimates: nothing read
    ]
    assert len(statements) >= 5, statements
    worst = []
    for sql in statements:
        with overview.bounded_waits("default"), connection.cursor() as cursor:  # as the probes run them
            worst.append((_rows_read(_analyzed_plan(cursor, sql)), " ".join(sql.split())[:160]))
    assert max(worst)[0] < TABLE_ROWS // 10, max(worst)
