"""How many delivery threads a worker runs when nobody says: two on PostgreSQL and MariaDB, one on SQLite."""

from __future__ import annotations

import threading
import time

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from django_outbox import outbox
from django_outbox.conf import get_settings
from django_outbox.models import Message
from django_outbox.worker import Relay, RelayConfig

pytestmark = pytest.mark.django_db(transaction=True)


def default_threads() -> int:
    """A database server: two (its waits are a thread's to fill); SQLite: one (one writer at a time)."""
    return 2 if connection.vendor in ("postgresql", "mysql") else 1


def test_default_is_two_threads_on_a_database_server_and_one_on_sqlite():
    assert get_settings().CONCURRENCY is None
    assert RelayConfig.from_settings().concurrency == default_threads()


@override_settings(OUTBOX={"CONCURRENCY": 3})
def test_the_setting_and_the_option_override_the_default():
    assert RelayConfig.from_settings().concurrency == 3
    assert RelayConfig.from_settings(concurrency=5).concurrency == 5


def test_default_threads_all_deliver(handler):
    """The default is what really runs: each delivery thread claims and delivers batches of its own."""
    threads: set[str] = set()

    def slow(message: Message) -> None:
        threads.add(threading.current_thread().name)
        time.sleep(0.002)  # long enough that one thread cannot drain every batch before the other claims

    handler("t.threads", slow)
    for i in range(300):
        outbox.send("t.threads", {"i": i})
    relay = Relay(RelayConfig.from_settings(until_empty=True, batch_size=20, poll_interval=0.05, notify=False))
    relay.run()
    assert Message.objects.filter(status=Message.Status.DELIVERED).count() == 300
    expected = {f"outbox-delivery-{i}" for i in range(default_threads())}
    assert threads == expected


def test_worker_command_logs_the_concurrency_it_runs(handler, caplog):
    handler("t.cmd", lambda m: None)
    outbox.send("t.cmd", {})
    with caplog.at_level("INFO", logger="django_outbox.relay"):
        call_command("outbox_worker", "--until-empty", "--poll-interval", "0.05")
    started = [r.getMessage() for r in caplog.records if "starting" in r.getMessage()]
    assert len(started) == 1
    assert f"concurrency={default_threads()} " in started[0]
    assert Message.objects.get().status == Message.Status.DELIVERED


def test_until_empty_with_several_threads_delivers_every_keyed_message_in_order(handler):
    """A thread that finds nothing to claim must not end the worker while a peer's record can make a
    key's next message claimable (the worker used to stop after a few dozen of these)."""
    seen: dict[str, list[int]] = {}
    lock = threading.Lock()

    def record(message: Message) -> None:
        with lock:
            seen.setdefault(message.key or "", []).append(message.payload["n"])

    handler("t.keyed", record)
    keys = ["a", "b", "c", "d", "e"]
    for n in range(300):
        outbox.send("t.keyed", {"n": n}, key=keys[n % len(keys)])
    relay = Relay(RelayConfig.from_settings(until_empty=True, concurrency=3, poll_interval=0.05, notify=False))
    relay.run()
    assert relay.stats.delivered == 300
    assert seen == {k: list(range(i, 300, len(keys))) for i, k in enumerate(keys)}


def test_until_empty_with_several_threads_makes_one_attempt_at_a_failing_message(handler, settings):
    """The run ends once the failure is recorded, its retry left for the next run, as with one thread: the
    idle threads waited for the attempt in progress, and do not take the retry for work of this run.

    The retry is a minute away: with the suite's 25-50 ms, a loaded machine's next claim came after it
    was due, and claiming a due message is what a run is for."""
    settings.OUTBOX = {**settings.OUTBOX, "BACKOFF_BASE_SECONDS": 60, "BACKOFF_MAX_SECONDS": 120}
    handler("t.failing", lambda m: 1 / 0)
    message = outbox.send("t.failing", {})
    Relay(RelayConfig.from_settings(until_empty=True, concurrency=3, poll_interval=0.05, notify=False)).run()
    message.refresh_from_db()
    assert (message.status, message.attempts) == (Message.Status.PENDING, 1)
