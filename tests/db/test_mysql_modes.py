"""MariaDB/MySQL under the ``sql_mode`` values and the isolation level managed services ship.

Each mode is set the way a project (or its provider's parameter group) sets it: per connection, through
``DATABASES[...]["OPTIONS"]["init_command"]``, and ``"isolation_level"`` (read committed, repeatable read). Under each,
the whole life of a message works (send, send_many, idempotency, claim, retry, dead, the overview, the
status command, a real worker process), or ``manage.py check`` refuses the configuration by name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.checks import CheckMessage, run_checks
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.urls import reverse

from django_outbox import outbox, store
from django_outbox.admin import overview
from django_outbox.checks import MYSQL_SQL_MODE
from django_outbox.models import Attempt, Message
from django_outbox.testing import relay_all
from tests.probe.models import Delivery
from tests.support.processes import WorkerProcess

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("mysql")]

MYSQL_8_DEFAULT = (
    "ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,"
    "NO_ENGINE_SUBSTITUTION"
)
MODES = {
    "rds-aurora": "NO_ENGINE_SUBSTITUTION",  # Amazon RDS / Aurora MySQL parameter groups
    "empty": "",
    "mariadb-default": "STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_AUTO_CREATE_USER,NO_ENGINE_SUBSTITUTION",
    "mysql8-azure-gcp": MYSQL_8_DEFAULT,  # Azure Database for MySQL, Cloud SQL: the server's default
    "ansi-quotes": "ANSI_QUOTES",
    "ansi": "ANSI",  # REAL_AS_FLOAT, PIPES_AS_CONCAT, ANSI_QUOTES, IGNORE_SPACE, ONLY_FULL_GROUP_BY
    "only-full-group-by": "ONLY_FULL_GROUP_BY,STRICT_ALL_TABLES",
    "no-backslash-escapes": "NO_BACKSLASH_ESCAPES",
    "pad-char": "PAD_CHAR_TO_FULL_LENGTH",
    "traditional": "TRADITIONAL",
    "oracle": "ORACLE",  # MariaDB's: PIPES_AS_CONCAT, ANSI_QUOTES, ..., and PL/SQL syntax
    "mssql": "MSSQL",
    "time-round": "TIME_ROUND_FRACTIONAL,SIMULTANEOUS_ASSIGNMENT",
    "odd-arithmetic": "HIGH_NOT_PRECEDENCE,NO_UNSIGNED_SUBTRACTION,PIPES_AS_CONCAT,IGNORE_SPACE",
}
#: Text a mode could mangle on its way in or out: backslashes, quotes of both kinds, a NUL-free control.
AWKWARD = "back\\slash \\n \"double\" 'single' `tick` %s %% ; -- #"


@contextmanager
def in_mode(mode: str, isolation: str = "read committed") -> Iterator[dict[str, Any]]:
    """The test's connections in the mode, at the isolation level; the test database's own settings after."""
    options = {"init_command": f"SET sql_mode='{mode}'", "isolation_level": isolation}
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict["OPTIONS"] = {**saved.get("OPTIONS", {}), **options}
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@SESSION.sql_mode, @@SESSION.tx_isolation")
        seen_mode, isolation = cursor.fetchone()
    assert isolation == options["isolation_level"].upper().replace(" ", "-")
    assert set(filter(None, seen_mode.split(","))) >= set(filter(None, mode.split(","))) - {"ANSI"}, seen_mode
    try:
        yield options
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)


#: Each mode at READ COMMITTED (Django's default); the providers' commonest two at REPEATABLE READ too
#: (InnoDB's default, which a project may ask for).
CASES = [(name, "read committed") for name in MODES] + [
    (name, "repeatable read") for name in ("rds-aurora", "mysql8-azure-gcp")
]


@pytest.fixture(params=CASES, ids=[f"{name}-{isolation.replace(' ', '-')}" for name, isolation in CASES])
def sql_mode(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    name, isolation = request.param
    with in_mode(MODES[name], isolation) as options:
        yield options


def _outbox_errors() -> list[CheckMessage]:
    return [e for e in run_checks(databases=["default"]) if (e.id or "").startswith("django_outbox") and e.is_serious()]


def test_the_life_of_a_message_under_each_mode(sql_mode, client):
    assert _outbox_errors() == []
    plain = outbox.send("probe.mode", {"text": AWKWARD, "n": 1.5, "big": 2**62})
    keyed = [outbox.send("probe.mode", {"n": n}, key=f"k{AWKWARD}") for n in range(3)]
    again = outbox.send("probe.mode", {"n": 9}, idempotency_key=f"idem-{AWKWARD}")
    assert outbox.send("probe.mode", {"n": 9}, idempotency_key=f"idem-{AWKWARD}").pk == again.pk
    many = outbox.send_many(
        [{"topic": "probe.mode", "payload": {"n": n, "text": AWKWARD}, "key": f"m{n % 2}"} for n in range(6)]
    )
    retried = outbox.send("probe.mode", {"fail_until": 1})
    dead = outbox.send("probe.mode", {"always_fail": True}, max_attempts=2)
    stored = Message.objects.get(pk=plain.pk)
    assert stored.payload == {"text": AWKWARD, "n": 1.5, "big": 2**62}
    assert stored.key is None and Message.objects.get(pk=keyed[0].pk).key == f"k{AWKWARD}"

    with transaction.atomic():  # the claim's statements under the mode, undone: the relay below claims for real
        claimed = store.claim("default", worker="w-mode", limit=100, lease_seconds=60)
        transaction.set_rollback(True)
    # every due message: the unkeyed ones and each key's run, in id order
    assert {m.pk for m in claimed} >= {plain.pk, retried.pk, dead.pk, *(m.pk for m in keyed + many)}
    assert [m.pk for m in claimed if m.key == f"k{AWKWARD}"] == [m.pk for m in keyed]

    relay_all(until_settled=True, ignore_backoff=True)
    statuses = dict(Message.objects.values_list("pk", "status"))
    assert statuses.pop(dead.pk) == "dead"
    assert set(statuses.values()) == {"delivered"}, statuses
    assert Attempt.objects.filter(message_id=retried.pk).count() == 2
    assert Attempt.objects.filter(message_id=dead.pk).count() == 2
    delivered_keys = list(
        Delivery.objects.filter(key=f"k{AWKWARD}").order_by("id").values_list("message_id", flat=True)
    )
    assert delivered_keys == [m.pk for m in keyed]  # in send order

    figures = overview.collect("default")
    assert figures.counts["dead"].value == 1 and figures.counts["delivered"].value == len(statuses)
    assert figures.dead_by_topic == [("probe.mode", 1)]
    out = StringIO()
    call_command("outbox_status", "--json", stdout=out)
    assert json.loads(out.getvalue())["counts"]["dead"] == 1
    admin = User.objects.create_superuser("ops", "ops@example.com", "pw")
    client.force_login(admin)
    page = client.get(reverse("admin:django_outbox_message_overview"))
    assert page.status_code == 200 and b"probe.mode" in page.content
    health = client.get("/outbox/health/").json()  # the probes' bounded reads, under the mode too
    assert "error" not in health and health["lag_seconds"] == 0, health
    metrics = client.get("/outbox/metrics/")
    assert metrics.status_code == 200 and b'outbox_backlog_messages{status="dead"} 1.0' in metrics.content


def test_a_real_worker_relays_under_each_mode(sql_mode):
    sent = [outbox.send("probe.mode", {"n": n, "text": AWKWARD}, key=f"k{n % 2}") for n in range(4)]
    retried = outbox.send("probe.mode", {"fail_until": 1})
    dead = outbox.send("probe.mode", {"permanent": True})
    worker = WorkerProcess("--until-empty", env={"TEST_DB_SETTINGS": json.dumps({"OPTIONS": sql_mode})})
    code, out = worker.wait(timeout=120)
    assert code == 0, out
    for _ in range(3):  # the retry waits for its backoff (0.05 s); a second worker takes it
        if Message.objects.get(pk=retried.pk).status == "delivered":
            break
        code, out = WorkerProcess("--until-empty", env={"TEST_DB_SETTINGS": json.dumps({"OPTIONS": sql_mode})}).wait(
            timeout=120
        )
        assert code == 0, out
    assert set(Delivery.objects.values_list("message_id", flat=True)) == {m.pk for m in [*sent, retried]}
    assert Message.objects.get(pk=dead.pk).status == "dead"


@pytest.mark.parametrize("mode", ["EMPTY_STRING_IS_NULL", "EMPTY_STRING_IS_NULL,NO_ENGINE_SUBSTITUTION"])
def test_empty_string_is_null_is_refused_by_check_and_send_writes_nothing(mode):
    """MariaDB's ``EMPTY_STRING_IS_NULL`` stores every ``''`` as NULL: the outbox writes ``''`` to columns
    that are NOT NULL (an attempt's error, a message's last error), so each send failed with an
    ``IntegrityError`` naming a column. ``check`` (and the worker, before it starts) names the mode."""
    with in_mode(mode):
        errors = _outbox_errors()
        assert [e.id for e in errors] == [MYSQL_SQL_MODE], errors
        assert "EMPTY_STRING_IS_NULL" in errors[0].msg and "sql_mode" in errors[0].hint
        with pytest.raises(IntegrityError):
            outbox.send("probe.mode", {})
        assert not Message.objects.exists()
    sent = outbox.send("probe.mode", {})  # sent before the mode came (a parameter group changed later)
    settings = json.dumps({"OPTIONS": {"init_command": f"SET sql_mode='{mode}'"}})
    code, out = WorkerProcess("--until-empty", env={"TEST_DB_SETTINGS": settings}).wait(timeout=60)
    # Under the mode a worker delivered without ever showing up alive: its heartbeat could not be written.
    assert code != 0 and MYSQL_SQL_MODE in out and "EMPTY_STRING_IS_NULL" in out, out
    assert Message.objects.get(pk=sent.pk).status == "pending"  # untouched, for a worker that can record
