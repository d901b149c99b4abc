"""The admin on a million-message PostgreSQL table: page times, queries per page, and no sequential scans.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/outbox_bench python bench/admin_scale.py [--rows 1000000]

It creates the database if needed, migrates it, fills it once with ``generate_series`` (97% delivered,
2% pending, 0.5% dead, 0.5% cancelled, 20 topics, one attempt per message), then loads each admin page a
few times through Django's test client. It fails (exit 1) when a page runs more than ``MAX_QUERIES``
(``MAX_QUERIES_OVERVIEW``) queries or when PostgreSQL plans a sequential scan of the message table for any of them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.tables import ensure_database  # noqa: E402  (needs ROOT on the path)

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/outbox_bench")
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
os.environ["DEBUG"] = "false"

MAX_QUERIES = 10  # per list or detail page; the overview gathers more figures
MAX_QUERIES_OVERVIEW = 13  # its figures, plus two for the blocked-keys panel
TABLE = "django_outbox_message"

FILL = """
INSERT INTO django_outbox_message (uuid, topic, key, payload, headers, idempotency_key, status, attempts,
    max_attempts, available_at, created_at, delivered_at, last_error)
SELECT md5(i::text || clock_timestamp()::text)::uuid,
       'topic.' || (i %% 20),
       'key-' || (i %% 100000),
       jsonb_build_object('order_id', i, 'lines', jsonb_build_array(i, i + 1)),
       '{}'::jsonb,
       'idem-' || i,
       s.status,
       CASE WHEN s.status = 'dead' THEN 5 ELSE 1 END,
       5,
       now() - make_interval(secs => %(rows)s - i),
       now() - make_interval(secs => %(rows)s - i),
       CASE WHEN s.status = 'delivered' THEN now() - make_interval(secs => %(rows)s - i) END,
       CASE WHEN s.status = 'dead' THEN E'Traceback (most recent call last):\\nConnectionError: refused' ELSE '' END
FROM generate_series(1, %(rows)s) AS i,
     LATERAL (SELECT CASE WHEN i %% 200 = 0 THEN 'dead' WHEN i %% 200 = 1 THEN 'cancelled'
                          WHEN i %% 50 = 2 THEN 'pending' ELSE 'delivered' END AS status) AS s
"""
ATTEMPTS = """
INSERT INTO django_outbox_attempt (message_id, number, started_at, finished_at, worker, outcome, error)
SELECT id, 1, created_at, created_at + interval '20 milliseconds', 'bench:1:abc',
       CASE WHEN status = 'dead' THEN 'failed' ELSE 'delivered' END, ''
FROM django_outbox_message WHERE status IN ('delivered', 'dead')
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    ensure_database(os.environ["DATABASE_URL"])

    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from django_outbox.models import Message

    call_command("migrate", database="default", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {TABLE}")  # once, to decide whether to fill
        have = cursor.fetchone()[0]
        if have != args.rows:
            print(f"filling {args.rows:,} messages (had {have:,}) ...", flush=True)
            started = time.monotonic()
            cursor.execute(f"TRUNCATE {TABLE} CASCADE")
            cursor.execute(FILL, {"rows": args.rows})
            cursor.execute(ATTEMPTS)
            cursor.execute(f"VACUUM ANALYZE {TABLE}")
            cursor.execute("VACUUM ANALYZE django_outbox_attempt")
            print(f"filled in {time.monotonic() - started:.0f}s", flush=True)
    user = User.objects.filter(username="bench").first() or User.objects.create_superuser("bench", "", "bench")
    client = Client()
    client.force_login(user)
    sample = Message.objects.filter(status="dead").order_by("-id").first()
    assert sample is not None
    base = "/admin/django_outbox/message/"
    day_ago = (timezone.now() - dt.timedelta(days=1)).replace(microsecond=0).isoformat()
    pages = {
        "list, newest first": base,
        "list, page 500": base + "?p=500",
        "filter status=dead": base + "?status__exact=dead",
        "filter status=delivered": base + "?status__exact=delivered",
        "filter status=pending": base + "?status__exact=pending",
        "filter topic": base + "?topic=topic.7",
        "filter created today": base + "?" + urlencode({"created_at__gte": day_ago}),
        "search uuid": base + "?" + urlencode({"q": str(sample.uuid)}),
        "search key": base + "?q=key-4242",
        "detail (dead message)": f"{base}{sample.pk}/change/",
        "overview": base + "overview/",
    }
    failures = []
    print(f"\n{'page':<28}{'median ms':>10}{'max ms':>10}{'queries':>9}  plan")
    for label, url in pages.items():
        times, queries = [], []
        for _ in range(args.repeat):
            with CaptureQueriesContext(connection) as captured:
                started = time.perf_counter()
                response = client.get(url)
                times.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                failures.append(f"{label}: HTTP {response.status_code}")
            queries = [q["sql"] for q in captured.captured_queries if not q["sql"].startswith("EXPLAIN")]
        seq_scans = []
        with connection.cursor() as cursor:
            for sql in queries:
                if TABLE not in sql or sql.lstrip().upper().startswith(("SAVEPOINT", "RELEASE")):
                    continue
                cursor.execute("EXPLAIN " + sql)
                plan = "\n".join(row[0] for row in cursor.fetchall())
                if f"Seq Scan on {TABLE}" in plan:
                    seq_scans.append(sql[:120])
        plan_note = "no seq scan" if not seq_scans else f"SEQ SCAN x{len(seq_scans)}"
        print(f"{label:<28}{statistics.median(times):>10.1f}{max(times):>10.1f}{len(queries):>9}  {plan_note}")
        budget = MAX_QUERIES_OVERVIEW if label == "overview" else MAX_QUERIES
        if len(queries) > budget:
            failures.append(f"{label}: {len(queries)} queries > {budget}")
        failures += [f"{label}: sequential scan in {sql}" for sql in seq_scans]
    print()
    for failure in failures:
        print("FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
