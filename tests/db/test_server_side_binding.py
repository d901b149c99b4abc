"""The store's statements under ``OPTIONS["server_side_binding"] = True`` (PostgreSQL).

With server-side binding PostgreSQL must infer every parameter's type from the statement itself, which
client-side interpolation never asks of it: an untyped parameter in a function call fails there only.
Each test runs twice, on a ``default`` connection built from the same settings with the option off and on.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connections
from django.utils import timezone

from django_outbox import outbox, store
from django_outbox.models import Message
from tests.support.factories import MessageFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True, params=[False, True], ids=["client-side", "server-side"])
def binding(request, postgres):
    original = connections["default"]
    options = {**original.settings_dict["OPTIONS"], "server_side_binding": request.param}
    settings = {**original.settings_dict, "OPTIONS": options}
    bound = type(original)(settings, alias="default")
    connections["default"] = bound
    try:
        with bound.cursor() as cursor:
            assert type(cursor.cursor).__name__ == ("ServerBindingCursor" if request.param else "Cursor")
        yield
    finally:
        bound.close()
        connections["default"] = original


def _outcome(message: Message, status: str, **extra) -> store.Outcome:
    now = timezone.now()
    return store.Outcome(
        message_id=message.pk, number=message.attempts, status=status, started_at=now, finished_at=now, **extra
    )


def test_send_claim_and_record_every_outcome():
    keyed = outbox.send("probe.created", {"n": 1}, key="k", idempotency_key="once", headers={"h": "v"})
    assert outbox.send("probe.created", {"n": 1}, key="k", idempotency_key="once").pk == keyed.pk
    retried = outbox.send("probe.created", {"n": 3})
    dead = outbox.send("probe.created", {"n": 4}, max_attempts=1)
    claimed: dict[int, Message] = {}

    claimed.update((m.pk, m) for m in store.claim("default", worker="w1", limit=10, lease_seconds=30))
    assert set(claimed) == {keyed.pk, retried.pk, dead.pk}
    lost = store.record(
        "default",
        worker="w1",
        outcomes=[
            _outcome(claimed[keyed.pk], "delivered"),
            _outcome(claimed[retried.pk], "pending", error="boom", retry_delay=60.0),
            _outcome(claimed[dead.pk], "dead", error="gone"),
        ],
    )
    assert lost == set()
    statuses = dict(Message.objects.values_list("pk", "status"))
    assert statuses == {keyed.pk: "delivered", retried.pk: "pending", dead.pk: "dead"}


def test_record_after_the_lease_was_lost_notes_it():
    message = MessageFactory()
    (claimed,) = store.claim("default", worker="w1", limit=1, lease_seconds=30)
    assert store.record("default", worker="someone-else", outcomes=[_outcome(claimed, "delivered")]) == {message.pk}
    assert "lease lost" in Message.objects.get(pk=message.pk).attempt_log.get().error


def test_release_renew_reap_and_the_idle_queries():
    first, second = MessageFactory(), MessageFactory()
    store.claim("default", worker="w1", limit=2, lease_seconds=30)
    assert store.extend_leases("default", worker="w1", lease_seconds=60) == 2
    assert store.release("default", worker="w1", message_ids=[first.pk]) == 1
    Message.objects.filter(pk=second.pk).update(locked_until=timezone.now() - dt.timedelta(seconds=1))
    assert [r.message_id for r in store.reap("default")] == [second.pk]
    assert store.work_in_progress("default") is False  # both are pending again, nothing is in flight
    later = MessageFactory(available_at=timezone.now() + dt.timedelta(hours=1))
    due_in = store.next_due("default")
    assert due_in is not None
    assert abs(due_in - (later.available_at - store.database_now("default")).total_seconds()) < 1
    assert len(store.claim("default", worker="w2", limit=2, lease_seconds=30)) == 2
    assert store.work_in_progress("default") is True


def test_send_many_with_keys_schedules_and_idempotency_keys():
    """Arrays of every column, NULLs among them (an array of only NULLs too), and the keys' locks."""
    at = timezone.now() + dt.timedelta(hours=1)
    items = [
        {"topic": "probe.created", "payload": {"n": 1}, "key": "K", "idempotency_key": "i-1"},
        {"topic": "probe.created", "payload": [1, 2], "delay": 30, "headers": {"h": "v"}},
        {"topic": "probe.created", "payload": "x", "available_at": at, "key": "L"},
    ]
    sent = outbox.send_many(items)
    assert outbox.send_many(items[:1])[0].pk == sent[0].pk
    assert [m.payload for m in sent] == [{"n": 1}, [1, 2], "x"]
    assert Message.objects.get(pk=sent[2].pk).available_at == at
    unkeyed = outbox.send_many([{"topic": "probe.created", "payload": n} for n in range(3)])
    assert len(unkeyed) == 3 and Message.objects.count() == 6
