"""The admin on a million-message PostgreSQL table: page times, queries per page, and no sequential scans.

Fills the database once (97% delivered, 2% pending, 0.5% dead, 0.5% cancelled, 20 topics, one attempt
each) and loads each admin page a few times through Django's test client: its time, its queries against
a budget, and the sequential scans of the message table PostgreSQL plans for them. Then the overview, the
message list and ``outbox_status --json`` again as a role with a DBA's 200 ms timeouts (``ALTER ROLE ...
SET``), each page's slowest statement against them; last, the same with ``--held-behind-one-key`` pending
messages, due and oldest, held behind one dead message of their key. A figure past its bound is listed in
``failures``; the run fails (exit 1) only when a page did not load outside the strict role.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import common, tables  # noqa: E402
from bench.common import Json, median  # noqa: E402

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/outbox_bench")
os.environ["DEBUG"] = "false"

MAX_QUERIES = 10  # per list or detail page
# The overview: the session and the user, the clock, seven for the five status counts (two estimated past
# the cap), the lag with held-by-key, the dead topics, the chart, the workers, held-by-schedule, two for
# the blocked keys.
MAX_QUERIES_OVERVIEW = 16
TABLE = "django_outbox_message"
ROLE = "outbox_bench_timeouts"
TIMEOUT_MS = 200
STUCK_KEY = "bench-stuck-key"
FILL = """
INSERT INTO django_outbox_message (uuid, topic, key, payload, headers, idempotency_key, status, attempts,
    max_attempts, available_at, created_at, delivered_at, last_error)
SELECT md5(i::text || clock_timestamp()::text)::uuid, 'topic.' || (i %% 20), 'key-' || (i %% 100000),
       jsonb_build_object('order_id', i, 'lines', jsonb_build_array(i, i + 1)), '{}'::jsonb, 'idem-' || i, s.status,
       CASE WHEN s.status = 'dead' THEN 5 ELSE 1 END, 5, s.at, s.at, CASE WHEN s.status = 'delivered' THEN s.at END,
       CASE WHEN s.status = 'dead' THEN E'Traceback (most recent call last):\\nConnectionError: refused' ELSE '' END
FROM generate_series(1, %(rows)s) AS i, LATERAL (SELECT now() - make_interval(secs => %(rows)s - i) AS at,
    CASE WHEN i %% 200 = 0 THEN 'dead' WHEN i %% 200 = 1 THEN 'cancelled' WHEN i %% 50 = 2 THEN 'pending'
         ELSE 'delivered' END AS status) AS s
"""
ATTEMPTS = """
INSERT INTO django_outbox_attempt (message_id, number, started_at, finished_at, worker, outcome, error)
SELECT id, 1, created_at, created_at + interval '20 milliseconds', 'bench:1:abc',
       CASE WHEN status = 'dead' THEN 'failed' ELSE 'delivered' END, ''
FROM django_outbox_message WHERE status IN ('delivered', 'dead')
"""
# The pathological shape: one dead message, then ``n`` pending messages of its key, due long before any
# other, so they sit at the head of the due index and every one of them is held behind the dead one.
STUCK = """
INSERT INTO django_outbox_message (uuid, topic, key, payload, headers, idempotency_key, status, attempts,
    max_attempts, available_at, created_at, delivered_at, last_error)
SELECT gen_random_uuid(), 'topic.stuck', %(key)s, jsonb_build_object('n', i), '{}'::jsonb, NULL,
       CASE WHEN i = 0 THEN 'dead' ELSE 'pending' END, CASE WHEN i = 0 THEN 5 ELSE 0 END, 5,
       now() - interval '30 days' + make_interval(secs => i), now() - interval '30 days', NULL,
       CASE WHEN i = 0 THEN 'refused' ELSE '' END
FROM generate_series(0, %(n)s) AS i
"""


def main() -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--held-behind-one-key", type=int, default=200_000, help="pending messages (0: skip)")
    parser.add_argument("--json", type=Path, required=True, help="each page's figures")
    args = parser.parse_args()
    common.setup_django("default", settings="tests.settings")
    from django.contrib.auth.models import User
    from django.test import Client
    from django.utils import timezone

    from django_outbox.models import Message

    common.sql(f"DELETE FROM {TABLE} WHERE key = %s", [STUCK_KEY])  # left by an interrupted run
    have = common.sql(f"SELECT count(*) FROM {TABLE}")[0][0]
    if have != args.rows:
        print(f"filling {args.rows:,} messages (had {have:,}) ...", flush=True)
        common.sql(f"TRUNCATE {TABLE} CASCADE")
        common.sql(FILL, {"rows": args.rows})
        common.sql(ATTEMPTS)
        common.sql(f"VACUUM ANALYZE {TABLE}")
        common.sql("VACUUM ANALYZE django_outbox_attempt")
    client = Client()
    client.force_login(User.objects.filter(username="bench").first() or User.objects.create_superuser("bench"))
    sample = Message.objects.filter(status="dead").order_by("-id").first()
    assert sample is not None
    page = min(500, args.rows // 50)  # 50 a page: the last one of a small table
    day_ago = (timezone.now() - dt.timedelta(days=1)).replace(microsecond=0).isoformat()
    queries: dict[str, str] = {
        "list, newest first": "",
        f"list, page {page}": f"?p={page}",
        "filter status=dead": "?status__exact=dead",
        "filter status=delivered": "?status__exact=delivered",
        "filter status=pending": "?status__exact=pending",
        "filter topic": "?topic=topic.7",
        "filter created today": "?" + urlencode({"created_at__gte": day_ago}),
        "search uuid": "?" + urlencode({"q": str(sample.uuid)}),
        "search key": "?q=key-4242",
        "detail (dead message)": f"{sample.pk}/change/",
        "overview": "overview/",
    }
    pages: dict[str, str | None] = {label: "/admin/django_outbox/message/" + q for label, q in queries.items()}
    failures: list[str] = []  # figures past their bound, reported
    errors: list[str] = []  # pages that did not load: not measured
    figures: Json = {"rows": args.rows, "pages": {}}
    print(f"\n{'page':<28}{'median ms':>10}{'queries':>9}  sequential scans")
    for label, url in pages.items():
        ms, statements, _slowest, met = load(client, url, args.repeat)
        ran = [sql for sql in statements if not sql.startswith("EXPLAIN")]  # the estimates of counts
        scans = [sql[:120] for sql in ran if seq_scan(sql)]
        print(f"{label:<28}{ms:>10.1f}{len(ran):>9}  {len(scans)}")
        figures["pages"][label] = {"median_ms": ms, "queries": len(ran), "sequential_scans": len(scans)}
        budget = MAX_QUERIES_OVERVIEW if label == "overview" else MAX_QUERIES
        errors += [f"{label}: {e}" for e in met]
        failures += [f"{label}: sequential scan in {sql}" for sql in scans]
        failures += [f"{label}: {len(ran)} queries > {budget}"] if len(ran) > budget else []
    strict = {k: pages[k] for k in ("overview", "list, newest first", "filter status=pending", "filter status=dead")}
    strict["outbox_status --json"] = None
    timed = figures["under_timeouts"] = {}
    with strict_role():
        shape = f"{args.rows:,} rows"
        timed[shape] = under_timeouts(client, strict, args.repeat, shape, failures)
        if args.held_behind_one_key:
            shape += f" + {args.held_behind_one_key:,} held behind one dead key"
            with stuck_key(args.held_behind_one_key):
                timed[shape] = under_timeouts(client, strict, args.repeat, shape, failures)
    print("\n" + "\n".join(f"! {failure}" for failure in errors + failures))
    common.write_json(args.json, {**figures, "failures": errors + failures})
    return 1 if errors else 0


def seq_scan(sql: str) -> bool:
    """Whether PostgreSQL plans a sequential scan of the message table for ``sql`` (of the heap's first
    rows for an unfiltered, limited count: bounded, so not counted)."""
    if TABLE not in sql or sql.lstrip().upper().startswith(("SAVEPOINT", "RELEASE", "EXPLAIN")):
        return False
    plan = "\n".join(row[0] for row in common.sql("EXPLAIN " + sql))
    return f"Seq Scan on {TABLE}" in plan and not (" WHERE " not in sql and " LIMIT " in sql)


def load(client: Any, url: str | None, repeat: int) -> tuple[float, list[str], float, list[str]]:
    """``repeat`` loads of ``url`` (None: ``outbox_status --json``): the median ms, the last load's
    statements, the slowest statement of all loads (ms), and the errors met."""
    from django.core.management import call_command
    from django.db import DatabaseError, connection
    from django.test.utils import CaptureQueriesContext

    times: list[float] = []
    slowest = 0.0
    errors: list[str] = []
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            try:
                if url is None:
                    call_command("outbox_status", "--json", stdout=io.StringIO())
                elif (status := client.get(url).status_code) != 200:
                    errors.append(f"HTTP {status}")
            except DatabaseError as exc:  # a statement_timeout, typically: name the statement
                failed = connection.queries_log[-1]["sql"][:200] if connection.queries_log else "?"
                errors.append(f"{str(exc).strip().splitlines()[0]} in {failed}")
            except SystemExit as exc:  # outbox_status's health exit codes (no live worker here)
                if exc.code not in (0, 1, 2, None):
                    errors.append(f"exit {exc.code}")
            times.append((time.perf_counter() - started) * 1000)
        slowest = max([slowest, *(float(q["time"]) * 1000 for q in captured.captured_queries)])
    return median(times), [q["sql"] for q in captured.captured_queries], slowest, errors


def under_timeouts(client: Any, pages: dict[str, str | None], repeat: int, shape: str, failures: list[str]) -> Json:
    """Each page through the strict role: its time, and its slowest statement against the limit."""
    print(f"\nunder statement_timeout = {TIMEOUT_MS}ms, {shape}")
    print(f"{'page':<28}{'median ms':>10}{'slowest stmt':>14}{'statements':>12}  within {TIMEOUT_MS}ms")
    figures: Json = {}
    for label, url in pages.items():
        ms, queries, slowest, errors = load(client, url, repeat)
        verdict = "yes" if not errors and slowest < TIMEOUT_MS else ("ERROR " + errors[0] if errors else "NO")
        print(f"{label:<28}{ms:>10.1f}{slowest:>14.1f}{len(queries):>12}  {verdict}")
        if verdict != "yes":
            failures.append(f"{label} ({shape}): slowest statement {slowest:.0f} ms, errors {errors[:1]}")
        figures[label] = {"median_ms": ms, "slowest_statement_ms": slowest, "statements": len(queries)}
    return figures


@contextmanager
def strict_role() -> Iterator[None]:
    """Django's connection re-opened as a role that has the DBA's timeouts (``ALTER ROLE ... SET``)."""
    from django.db import connection

    common.sql(f"DROP ROLE IF EXISTS {ROLE}")
    common.sql(f"CREATE ROLE {ROLE} LOGIN SUPERUSER")
    for name in ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"):
        common.sql(f"ALTER ROLE {ROLE} SET {name} = '{TIMEOUT_MS}ms'")
    user = connection.settings_dict["USER"]
    connection.close()
    connection.settings_dict["USER"] = ROLE
    try:
        shown = common.sql("SHOW statement_timeout")[0][0]
        assert shown == f"{TIMEOUT_MS}ms", f"the role's statement_timeout is {shown}"
        yield
    finally:
        connection.close()
        connection.settings_dict["USER"] = user
        common.sql(f"DROP ROLE IF EXISTS {ROLE}")


@contextmanager
def stuck_key(n: int) -> Iterator[None]:
    """``n`` pending messages held behind one dead message of their key for the time of the block, written
    on a connection of its own, without the role's timeouts: the fill is not what is measured."""
    with tables.connect(os.environ["DATABASE_URL"]) as conn:
        conn.execute(STUCK, {"key": STUCK_KEY, "n": n})
        conn.execute(f"ANALYZE {TABLE}")
    try:
        yield
    finally:
        with tables.connect(os.environ["DATABASE_URL"]) as conn:
            conn.execute(f"DELETE FROM {TABLE} WHERE key = %s", [STUCK_KEY])
            conn.execute(f"VACUUM ANALYZE {TABLE}")


if __name__ == "__main__":
    sys.exit(main())
