"""The helpers users test their own code with: outbox_messages, the mixin, relay_all()."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from django.test import TestCase

from django_outbox import outbox, testing
from django_outbox.models import Message
from django_outbox.testing import NotSettledError, OutboxMessages, OutboxTestMixin, relay_all
from tests.support import ROOT

Register = Callable[[str, Callable[..., object]], None]


def failing(calls: list[int]) -> Callable[[Message], None]:
    def handle(message: Message) -> None:
        calls.append(message.attempts)
        raise RuntimeError("warehouse is down")

    return handle


# --- the pytest fixture -------------------------------------------------------------------------------


def test_the_plugin_is_registered_through_the_pytest11_entry_point() -> None:
    """What makes the fixture appear in a user's project with nothing in its conftest.py."""
    found = [ep for ep in importlib.metadata.entry_points(group="pytest11") if ep.name == "django_outbox"]
    assert [ep.value for ep in found] == ["django_outbox.testing.pytest_plugin"], (
        "reinstall the package (pip install -e .): its pytest11 entry point is missing"
    )


def test_outbox_messages_holds_what_the_test_sent(outbox_messages: OutboxMessages) -> None:
    """This test uses the fixture as a user would: through the entry point, with no conftest of ours."""
    outbox.send("probe.one", {"n": 1}, key="k-1", headers={"X-Tenant": "acme"})
    outbox.send("probe.two", {"n": 2})
    assert outbox_messages.topics() == ["probe.one", "probe.two"]
    first, second = outbox_messages
    assert (first.topic, first.payload, first.key, first.headers) == (
        "probe.one",
        {"n": 1},
        "k-1",
        {"X-Tenant": "acme"},
    )
    assert (second.key, second.headers) == (None, {})
    assert len(outbox_messages) == 2
    assert outbox_messages[-1].payload == {"n": 2}
    assert [m.payload for m in outbox_messages.filter("probe.*", key="k-1")] == [{"n": 1}]
    assert "probe.one" in repr(outbox_messages)


def test_outbox_messages_leaves_out_what_rolled_back_and_what_came_before(outbox_messages: OutboxMessages) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox.send("probe.rolled-back", {})
        raise RuntimeError("the order failed")
    assert list(outbox_messages) == []
    outbox.send("probe.kept", {})
    outbox_messages.clear()
    assert len(outbox_messages) == 0
    outbox.send("probe.after", {})
    assert outbox_messages.topics() == ["probe.after"]


def test_outbox_messages_shows_what_relay_all_did(outbox_messages: OutboxMessages, handler: Register) -> None:
    handler("probe.done", lambda message: None)
    outbox.send("probe.done", {})
    relay_all()
    assert [m.status for m in outbox_messages] == [Message.Status.DELIVERED]


@pytest.mark.django_db(transaction=True)
def test_outbox_messages_in_a_transactional_test(outbox_messages: OutboxMessages) -> None:
    """The fixture must not force the plain ``db`` fixture onto a test that asked for real commits."""
    with transaction.atomic():
        outbox.send("probe.committed", {"n": 1})
    assert outbox_messages.topics() == ["probe.committed"]


@pytest.mark.django_db(databases=["default", "other"])
def test_outbox_messages_reads_the_database_it_was_made_for() -> None:
    default, other = OutboxMessages(), OutboxMessages(using="other")
    outbox.send("probe.default", {})
    assert default.topics() == ["probe.default"]
    assert other.topics() == []


# --- the TestCase mixin ---------------------------------------------------------------------------------


class MixinTests(OutboxTestMixin, TestCase):
    def test_assert_outbox_sent_returns_the_one_match(self) -> None:
        outbox.send("orders.created", {"order": 7}, key="order-7", headers={"X-Tenant": "acme"})
        outbox.send("orders.created", {"order": 8})
        message = self.assertOutboxSent("orders.*", payload={"order": 7}, headers={"X-Tenant": "acme"})
        self.assertEqual(message.key, "order-7")
        self.assertEqual(len(self.outbox_messages), 2)

    def test_assert_outbox_sent_fails_on_none_and_on_two(self) -> None:
        with self.assertRaisesMessage(AssertionError, "found 0"):
            self.assertOutboxSent("orders.created")
        outbox.send("orders.created", {"order": 1})
        outbox.send("orders.created", {"order": 2})
        with self.assertRaisesMessage(AssertionError, "found 2; sent: [('orders.created', {'order': 1}, None)"):
            self.assertOutboxSent("orders.created")
        with self.assertRaisesMessage(AssertionError, "found 0"):
            self.assertOutboxSent("orders.created", key="nope")

    def test_each_test_starts_empty(self) -> None:
        self.assertEqual(list(self.outbox_messages), [])


# --- relay_all(ignore_backoff=..., until_settled=...) -----------------------------------------------------


@pytest.mark.django_db
def test_by_default_a_failure_waits_for_its_backoff(handler: Register, settings: Any) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "BACKOFF_BASE_SECONDS": 60, "BACKOFF_MAX_SECONDS": 60}
    calls: list[int] = []
    handler("probe.fails", failing(calls))
    outbox.send("probe.fails", {}, max_attempts=3)
    stats = relay_all()
    message = Message.objects.get()
    assert (message.status, message.attempts, calls, stats.failed) == (Message.Status.PENDING, 1, [1], 1)


@pytest.mark.django_db
def test_ignore_backoff_until_settled_drives_a_failing_message_to_dead(handler: Register, settings: Any) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "BACKOFF_BASE_SECONDS": 3600, "BACKOFF_MAX_SECONDS": 3600}
    calls: list[int] = []
    handler("probe.fails", failing(calls))
    outbox.send("probe.fails", {}, max_attempts=4)
    started = time.monotonic()
    stats = relay_all(ignore_backoff=True, until_settled=True)
    assert time.monotonic() - started < 5, "the hour-long backoff was waited for"
    message = Message.objects.get()
    assert (message.status, message.attempts, calls) == (Message.Status.DEAD, 4, [1, 2, 3, 4])
    assert (stats.failed, stats.dead) == (3, 1)
    assert list(message.attempt_log.order_by("number").values_list("outcome", flat=True)) == ["failed"] * 4


@pytest.mark.django_db
def test_until_settled_delivers_what_succeeds_on_a_later_attempt(handler: Register) -> None:
    """Without ignore_backoff it waits for the (test settings') short backoff, then delivers."""
    calls: list[int] = []

    def flaky(message: Message) -> None:
        calls.append(message.attempts)
        if message.attempts < 3:
            raise RuntimeError("not yet")

    handler("probe.flaky", flaky)
    outbox.send("probe.flaky", {})
    stats = relay_all(until_settled=True)
    assert Message.objects.get().status == Message.Status.DELIVERED
    assert (calls, stats.delivered, stats.failed) == ([1, 2, 3], 1, 2)


@pytest.mark.django_db
def test_until_settled_leaves_scheduled_and_held_messages_as_they_are(handler: Register) -> None:
    handler("probe.later", lambda message: None)
    handler("probe.fails", failing([]))
    handler("probe.held", lambda message: None)
    later = outbox.send("probe.later", {}, delay=3600)
    dead_head = outbox.send("probe.fails", {}, key="k", max_attempts=2)
    held = outbox.send("probe.held", {}, key="k")
    relay_all(ignore_backoff=True, until_settled=True)
    statuses = dict(Message.objects.values_list("id", "status"))
    assert statuses == {
        later.id: Message.Status.PENDING,  # a schedule is not a backoff
        dead_head.id: Message.Status.DEAD,
        held.id: Message.Status.PENDING,  # behind its key's dead message, as in production
    }
    assert Message.objects.get(id=later.id).attempts == 0


@pytest.mark.django_db
def test_until_settled_honours_the_topics(handler: Register) -> None:
    handler("helpers.*", failing([]))
    mine = outbox.send("helpers.mine", {}, max_attempts=2)
    other = outbox.send("helpers.other", {}, max_attempts=2)
    relay_all(topics=["helpers.mine"], ignore_backoff=True, until_settled=True)
    assert Message.objects.get(id=mine.id).status == Message.Status.DEAD
    assert Message.objects.get(id=other.id).attempts == 0


@pytest.mark.django_db
def test_a_message_that_fails_for_ever_raises_not_settled(handler: Register, monkeypatch: Any) -> None:
    monkeypatch.setattr(testing, "SETTLE_ROUNDS", 5)
    handler("probe.fails", failing([]))
    message = outbox.send("probe.fails", {}, max_attempts=2**31 - 1)
    with pytest.raises(NotSettledError, match=rf"gave up after 5 rounds: messages \[{message.id}\] keep failing"):
        relay_all(ignore_backoff=True, until_settled=True)
    assert Message.objects.get().attempts == 6


@pytest.mark.django_db
def test_a_backoff_longer_than_the_timeout_raises_not_settled(handler: Register, settings: Any) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "BACKOFF_BASE_SECONDS": 60, "BACKOFF_MAX_SECONDS": 60}
    handler("probe.fails", failing([]))
    outbox.send("probe.fails", {}, max_attempts=3)
    started = time.monotonic()
    with pytest.raises(NotSettledError, match=r"waited 0\.3s"):
        relay_all(until_settled=True, timeout=0.3)
    assert time.monotonic() - started < 5


# --- the page's examples run as a user's own test suite ---------------------------------------------------

DOC = ROOT / "docs" / "testing.md"


def _examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.slow
def test_the_testing_pages_examples_pass_as_a_users_tests(tmp_path: Path) -> None:
    examples = _examples()
    assert len(examples) == 4
    for number, code in enumerate(examples):
        (tmp_path / f"test_example_{number}.py").write_text(code, encoding="utf-8")
    database = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "db")}
    settings_text = f"from tests.settings import *  # noqa: F403\nDATABASES = {{'default': {database!r}}}\n"
    (tmp_path / "example_settings.py").write_text(settings_text, encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "DJANGO_SETTINGS_MODULE": "example_settings",
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert re.search(r"^7 passed in ", run.stdout, re.M), run.stdout[-2000:]  # and no "7 passed, 1 warning"


def test_the_module_imports_no_model_before_django_is_set_up() -> None:
    """pytest loads the plugin before pytest-django sets Django up: importing it must not touch the models."""
    code = "import django_outbox.testing.pytest_plugin, sys; print('django_outbox.models' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout.strip()) == (0, "False"), run.stderr[-2000:]
