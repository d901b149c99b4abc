from __future__ import annotations

import datetime as dt
import io
import itertools
import json
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_outbox.admin import overview
from django_outbox.models import Message, Worker
from tests.support import ROOT
from tests.support.factories import AttemptFactory, MessageFactory
from tests.support.processes import worker_env

pytestmark = pytest.mark.django_db


def status(*args: str) -> str:
    out = io.StringIO()
    call_command("outbox_status", *args, stdout=out)
    return out.getvalue()


def beat(worker_id: str, *, seconds_ago: float, stopped: bool = False) -> Worker:
    now = timezone.now()
    return Worker.objects.create(
        worker_id=worker_id,
        hostname=worker_id.split(":")[0],
        pid=1,
        started_at=now - dt.timedelta(hours=1),
        last_seen=now - dt.timedelta(seconds=seconds_ago),
        stopped_at=now if stopped else None,
        delivered=5,
    )


def test_json_has_the_overview_figures():
    now = timezone.now()
    MessageFactory.create(available_at=now - dt.timedelta(seconds=120))
    MessageFactory.create(available_at=now + dt.timedelta(hours=1))  # scheduled: not lag
    MessageFactory.create_batch(2, topic="mail.send", status=Message.Status.DEAD)
    done = MessageFactory.create(status=Message.Status.DELIVERED)
    AttemptFactory.create(message=done, outcome="delivered", finished_at=now - dt.timedelta(minutes=2))
    AttemptFactory.create(message=done, outcome="failed", finished_at=now - dt.timedelta(minutes=2))
    AttemptFactory.create(message=done, outcome="delivered", finished_at=now - dt.timedelta(hours=2))  # too old
    beat("a:1:x", seconds_ago=1)
    beat("b:2:y", seconds_ago=600)
    beat("c:3:z", seconds_ago=5, stopped=True)
    data = json.loads(status("--json"))
    assert data["counts"] == {"pending": 2, "processing": 0, "delivered": 1, "dead": 2, "cancelled": 0}
    assert all(data["counts_exact"].values())
    assert 119 <= data["lag_seconds"] < 180
    assert (data["delivered_last_hour"], data["failed_last_hour"]) == (1, 1)
    assert len(data["per_minute"]) == 60
    assert data["dead_by_topic"] == [{"topic": "mail.send", "dead": 2}]
    assert data["workers_alive"] == 1
    assert {w["worker_id"]: w["state"] for w in data["workers"]} == {
        "a:1:x": "alive",
        "b:2:y": "gone",
        "c:3:z": "stopped",
    }
    assert data["healthy"] is True and data["problems"] == []


def test_text_output_is_readable():
    MessageFactory.create(status=Message.Status.DEAD, topic="hooks.order")
    beat("a:1:x", seconds_ago=1)
    text = status()
    assert "dead 1" in text and "hooks.order" in text
    assert "workers: 1 alive" in text and "alive    a:1:x" in text
    assert "lag: 0.0s" in text


def test_health_check_options_fail_with_a_reason():
    MessageFactory.create(available_at=timezone.now() - dt.timedelta(minutes=10))
    MessageFactory.create_batch(3, status=Message.Status.DEAD)
    with pytest.raises(CommandError, match=r"no worker has sent a heartbeat") as failed:
        status("--fail-if-no-worker")
    assert failed.value.returncode == 1
    with pytest.raises(CommandError, match=r"lag \d+\.\ds is over 60s"):
        status("--fail-if-lag-over", "60")
    with pytest.raises(CommandError, match="3 dead messages, more than 2"):
        status("--fail-if-dead-over", "2")
    beat("a:1:x", seconds_ago=1)
    assert "workers: 1 alive" in status("--fail-if-no-worker", "--fail-if-lag-over", "3600", "--fail-if-dead-over", "3")


@pytest.mark.django_db(transaction=True)
def test_exit_status_from_the_command_line():
    """What a container health check sees: JSON on stdout, the reason on stderr, exit status 1."""
    beat("old:1:x", seconds_ago=3600)
    command = [sys.executable, str(ROOT / "manage.py"), "outbox_status", "--json", "--fail-if-no-worker"]
    done = subprocess.run(command, cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["healthy"] is False
    assert "no worker has sent a heartbeat" in done.stderr
    beat("new:2:y", seconds_ago=0)
    done = subprocess.run(command, cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


#: Run without ``django.contrib.admin``: an email through the outbox backend, then ``outbox_status``, rolled back.
_WITHOUT_ADMIN = """
import django
django.setup()
from django.core import mail
from django.core.management import call_command
from django.db import transaction

class Rollback(Exception):
    pass

try:
    with transaction.atomic():
        email = mail.EmailMessage("Hello", "Body", "shop@example.org", ["ann@example.org"])
        assert mail.get_connection("django_outbox.mail.EmailBackend").send_messages([email]) == 1
        call_command("outbox_status", "--json")
        raise Rollback
except Rollback:
    pass
"""


@pytest.mark.django_db(transaction=True)
def test_the_status_command_and_the_email_backend_need_no_django_admin(tmp_path):
    """``django.contrib.admin`` is optional: the figures (``django_outbox.admin.overview``) and the email
    backend must work where it is not installed, although the console's pages then cannot register."""
    (tmp_path / "settings_without_admin.py").write_text(
        "from tests.settings import *  # noqa: F403\n"
        'INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "django.contrib.admin"]  # noqa: F405\n'
    )
    env = {**worker_env(), "DJANGO_SETTINGS_MODULE": "settings_without_admin", "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    command = [sys.executable, "-c", _WITHOUT_ADMIN]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["counts"]["pending"] == 1


def test_minutes_cover_the_last_hour_without_gaps():
    now = timezone.now()
    figures = overview.collect(now=now)
    starts = [m.start for m in figures.minutes]
    assert len(starts) == 60
    assert all(b - a == dt.timedelta(minutes=1) for a, b in itertools.pairwise(starts))
    assert starts[-1] <= now < starts[-1] + dt.timedelta(minutes=1)


def test_lag_counts_only_what_could_be_claimed_now_and_held_messages_are_reported_apart():
    """A message waiting by design (behind its key's scheduled or dead head) is not lag."""
    now = timezone.now()
    ago = now - dt.timedelta(seconds=600)
    MessageFactory.create(key="k1", available_at=now + dt.timedelta(hours=1), created_at=ago)  # scheduled head
    MessageFactory.create(key="k1", available_at=ago, created_at=ago)  # due, held behind it
    MessageFactory.create(key="k2", status=Message.Status.DEAD, created_at=ago, available_at=ago)
    MessageFactory.create(key="k2", available_at=ago, created_at=ago)  # due, held behind a dead head
    data = json.loads(status("--json", "--fail-if-lag-over", "60"))
    assert data["healthy"] and data["lag_seconds"] == 0
    assert data["held_by_schedule"] == 1 and data["held_by_key"] == 2
    text = status()
    assert "lag: 0.0s" in text and "held: 1 scheduled, 2 behind an earlier message of their key" in text
    claimable = MessageFactory.create(key="k3", available_at=now - dt.timedelta(seconds=120), created_at=ago)
    data = json.loads(status("--json"))
    assert 119 <= data["lag_seconds"] < 180, "a due head of its key is lag"
    assert data["oldest_deliverable_at"] == claimable.available_at.isoformat()
    with pytest.raises(CommandError, match="lag"):
        status("--fail-if-lag-over", "60")


@pytest.mark.parametrize("ordering, lag", [("block", False), ("skip_dead", True)])
def test_a_key_behind_a_dead_message_is_lag_only_when_dead_messages_do_not_block(ordering, lag, settings):
    settings.OUTBOX = {**settings.OUTBOX, "ORDERING": ordering}
    ago = timezone.now() - dt.timedelta(seconds=600)
    MessageFactory.create(key="k", status=Message.Status.DEAD, created_at=ago, available_at=ago)
    MessageFactory.create(key="k", available_at=ago, created_at=ago)
    data = json.loads(status("--json"))
    assert (data["lag_seconds"] > 500) is lag
    assert data["held_by_key"] == (0 if lag else 1)


def test_held_by_key_is_counted_within_a_bounded_window():
    ago = timezone.now() - dt.timedelta(seconds=60)
    MessageFactory.create(key="k", status=Message.Status.DEAD, created_at=ago, available_at=ago)
    for _ in range(4):
        MessageFactory.create(key="k", available_at=ago, created_at=ago)
    due = Message.objects.filter(status=Message.Status.PENDING, available_at__lte=timezone.now())
    assert overview._held_by_key(due) == overview.Tally(4, exact=True)
    assert overview._held_by_key(due, cap=2) == overview.Tally(3, exact=False), "a lower bound past it"


def test_the_walk_for_the_lag_stops_at_its_window_and_says_the_lag_is_then_a_bound():
    """Messages held behind a dead key at the head of the due index cost at most ``cap + 1`` probes."""
    now = timezone.now()
    MessageFactory.create(key="stuck", status=Message.Status.DEAD, available_at=now - dt.timedelta(hours=2))
    held = [
        MessageFactory.create(key="stuck", available_at=now - dt.timedelta(minutes=60 - i)).available_at
        for i in range(5)
    ]
    claimable = MessageFactory.create(available_at=now - dt.timedelta(minutes=10))
    due = Message.objects.filter(status=Message.Status.PENDING, available_at__lte=now)
    whole = overview._due_head(due)
    assert whole == overview.DueHead(
        oldest=claimable.available_at, oldest_exact=True, held=overview.Tally(5, exact=True)
    )
    bounded = overview._due_head(due, cap=3)  # the window holds only held messages
    assert bounded == overview.DueHead(oldest=held[3], oldest_exact=False, held=overview.Tally(4, exact=False))
    assert overview._due_head(due, cap=5).oldest == claimable.available_at, "the window reaches it"


def test_status_json_says_when_the_lag_is_a_bound(monkeypatch):
    now = timezone.now()
    MessageFactory.create(key="stuck", status=Message.Status.DEAD, available_at=now - dt.timedelta(hours=2))
    for i in range(3):
        MessageFactory.create(key="stuck", available_at=now - dt.timedelta(minutes=60 - i))
    assert json.loads(status("--json"))["lag_exact"] is True
    monkeypatch.setattr(overview, "DUE_WINDOW", 1)
    data = json.loads(status("--json"))
    assert data["lag_exact"] is False and 58 * 60 < data["lag_seconds"] < 60 * 60


def test_waiting_behind_blocked_keys_is_counted_up_to_the_cap(monkeypatch):
    ago = timezone.now() - dt.timedelta(minutes=5)
    MessageFactory.create(key="stuck", status=Message.Status.DEAD, available_at=ago)
    for _ in range(4):
        MessageFactory.create(key="stuck", available_at=ago)
    [blocked] = overview.blocked_keys()
    assert (blocked.waiting, blocked.waiting_exact) == (4, True)
    monkeypatch.setattr(overview, "EXACT_COUNT_CAP", 2)
    [blocked] = overview.blocked_keys()
    assert (blocked.waiting, blocked.waiting_exact) == (3, False), "a lower bound past the cap"


def test_blocked_keys_have_their_own_line_and_health_check_apart_from_the_lag():
    """A key stopped at a dead message is not lag (the lag check stays quiet) but has its own exit code."""
    ago = timezone.now() - dt.timedelta(seconds=600)
    dead = MessageFactory.create(key="order-7", status=Message.Status.DEAD, created_at=ago, available_at=ago)
    MessageFactory.create(key="order-7", available_at=ago, created_at=ago)
    text = status()
    assert f"blocked keys: 1 (order-7 at dead message {dead.id})" in text
    data = json.loads(status("--json", "--fail-if-lag-over", "60", "--fail-if-blocked-keys-over", "1"))
    assert data["healthy"] and data["lag_seconds"] == 0 and len(data["blocked_keys"]) == 1
    with pytest.raises(CommandError, match=r"1 keys blocked behind a dead message, more than 0"):
        status("--fail-if-lag-over", "60", "--fail-if-blocked-keys-over", "0")
    MessageFactory.create(key="order-7", status=Message.Status.DEAD, created_at=ago)  # a second dead: one key
    assert status().count("blocked keys: 1 ") == 1


@pytest.mark.parametrize(
    "option, value",
    [
        ("--fail-if-lag-over", "nan"),  # lag > nan is never true: a health check that cannot fail
        ("--fail-if-lag-over", "inf"),
        ("--fail-if-lag-over", "-1"),  # always true: a health check that cannot pass
        ("--stale-after", "nan"),
        ("--fail-if-dead-over", "-1"),
        ("--fail-if-blocked-keys-over", "-1"),
        ("--fail-if-blocked-keys-over", "1e3"),
    ],
)
def test_a_health_check_bound_that_could_never_or_always_fire_is_refused(option, value):
    with pytest.raises(CommandError, match=option.lstrip("-").replace("-", "[-_]")):
        status(option, value)


def _housekeeping_traceback() -> str:
    """A failed housekeeping round as the worker stores it: frames first, then the exception and a note."""
    from django_outbox.worker.errors import describe_error

    def archive() -> None:
        exc = RuntimeError("archive table is missing")
        exc.add_note("while archiving 500 delivered messages")
        raise exc

    try:
        archive()
    except RuntimeError as exc:
        return describe_error(exc)
    raise AssertionError("unreachable")


def test_a_failing_housekeeping_round_reads_as_its_exceptions_line():
    """Not the note the traceback ends with, nor its first frames (the admin's rule, in a terminal)."""
    worker = beat("a:1:x", seconds_ago=1)
    Worker.objects.filter(pk=worker.pk).update(housekeeping_error=_housekeeping_traceback(), housekeeping_failures=3)
    text = status()
    assert "housekeeping failing (3 failed rounds): RuntimeError: archive table is missing\n" in text, text
