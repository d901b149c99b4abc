"""A task call the worker abandoned (past ``HANDLER_TIMEOUT_SECONDS``) that returns later must not write its
outcome over a later claim of its message, even one by the same worker at the same attempt number
(a dead task retried with its attempts reset). Real delivery threads and helper threads, a real database."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("django.tasks", reason="django.tasks is new in Django 6.0")

from django.tasks import TaskResultStatus

from django_outbox import store
from django_outbox.models import Message
from django_outbox.tasks import payload as p
from django_outbox.worker import Relay, RelayConfig
from tests.probe import tasks as t
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def relay(worker_id: str, handler_timeout: float) -> Relay:
    return Relay(
        RelayConfig.from_settings(
            until_empty=True,
            notify=False,
            poll_interval=0.05,
            concurrency=1,
            worker_id=worker_id,
            handler_timeout=handler_timeout,
            housekeeping_interval=0,
        )
    )


def test_an_abandoned_call_returning_late_cannot_overwrite_the_same_workers_next_claim():
    label = "stale-writer"
    result = t.hang_then_return.enqueue(label)  # MAX_ATTEMPTS 1: the timed-out attempt ends dead
    relay("w-same", handler_timeout=1).run()  # the first call hangs past the timeout and is abandoned
    message = Message.objects.get(uuid=result.id)
    assert (message.status, message.attempts) == ("dead", 1)
    ((first_thread, first_gate),) = t.HANGING[label]
    assert first_thread.is_alive()

    store.retry("default", [message.pk], reset_attempts=True)  # attempts back to 0: claimed again as attempt 1
    second = threading.Thread(target=relay("w-same", handler_timeout=120).run, name="second-relay")
    second.start()
    try:
        wait_for(lambda: len(t.HANGING[label]) == 2)  # the second call is running
        running = Message.objects.get(pk=message.pk)
        assert (running.status, running.attempts, running.locked_by) == ("processing", 1, "w-same")

        first_gate.set()  # the abandoned call returns now, in the middle of the second claim
        first_thread.join(30)
        assert not first_thread.is_alive()
        during = Message.objects.get(pk=message.pk)
        assert p.RETURN_VALUE not in during.payload, "the abandoned call wrote its result over the new claim"
        assert during.payload[p.RUNNING]["attempt"] == 1  # the second call's entry is still there
        assert t.hang_then_return.get_result(result.id).status == TaskResultStatus.RUNNING
    finally:
        for _, gate in t.HANGING[label]:
            gate.set()
        second.join(60)
    assert not second.is_alive()
    done = t.hang_then_return.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value is None  # the second call's, not the abandoned first call's
    assert Message.objects.get(pk=message.pk).status == "delivered"
