"""A DBA's timeouts: workers on a role with short statement, lock and idle-in-transaction timeouts."""

from __future__ import annotations

import collections
import datetime as dt
import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from django.db import connection
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

ROLE = "outbox_dba_timeouts"
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


def test_the_overview_stays_within_the_timeouts_with_200000_messages_behind_one_dead_key(strict_role):
    """The lag used to walk every held message before the first claimable one: 2.3 s at this shape."""
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
