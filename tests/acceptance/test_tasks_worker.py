"""Django tasks run by real ``outbox_worker`` processes: enqueued in a committed transaction
here, run there, results read back here. Django 6.x only, and deliberately not marked slow: the slow
suites run only in the Django 5.2 cells, where the backend cannot exist."""

from __future__ import annotations

import pytest

pytest.importorskip("django.tasks", reason="django.tasks is new in Django 6.0")

from django.db import transaction
from django.tasks import TaskResultStatus

from django_outbox.models import Message
from tests.probe import tasks as t
from tests.probe.models import Delivery
from tests.support.waiting import wait_for

# databases: the worker process checks every alias (Django 6 asks each MariaDB server), so "other" must exist
pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])


def test_a_worker_process_runs_one_queue_and_each_task_once(worker_process):
    with transaction.atomic():
        recorded = [t.record.enqueue(f"run-{i}") for i in range(20)]
        failed = t.failing.enqueue("in the worker")
        added = t.async_add.enqueue(2, 3)
        email = t.send_email.enqueue("b@example.com")
    worker = worker_process("--until-empty", "--topics", "tasks.default")
    code, out = worker.wait()
    assert code == 0, out
    runs = list(Delivery.objects.values_list("message_uuid", "attempt", "pid"))
    assert sorted(str(u) for u, _, _ in runs) == sorted(r.id for r in recorded)  # each ran, once
    assert {(attempt, pid) for _, attempt, pid in runs} == {(1, worker.pid)}
    for result in recorded:
        done = t.record.get_result(result.id)
        assert done.status == TaskResultStatus.SUCCESSFUL
        assert done.return_value == {"id": result.id, "attempt": 1, "pid": worker.pid}
        assert len(done.worker_ids) == 1 and f":{worker.pid}:" in done.worker_ids[0]
    assert t.async_add.get_result(added.id).return_value == 5
    error = t.failing.get_result(failed.id)
    assert error.status == TaskResultStatus.FAILED
    assert error.errors[0].exception_class is t.TaskFailure
    assert "in the worker" in error.errors[0].traceback
    assert t.send_email.get_result(email.id).status == TaskResultStatus.READY  # not this worker's queue

    code, out = worker_process("--until-empty", "--topics", "tasks.emails").wait()
    assert code == 0, out
    assert t.send_email.get_result(email.id).return_value == "sent to b@example.com"


def test_a_worker_process_retries_a_failing_task_with_backoff(worker_process):
    retrying = t.fail_until.using(backend="retrying")
    with transaction.atomic():
        result = retrying.enqueue(3)
    worker = worker_process()
    wait_for(lambda: Message.objects.filter(uuid=result.id, status="delivered").exists(), timeout=60)
    worker.stop()
    done = retrying.get_result(result.id)
    assert (done.status, done.return_value) == (TaskResultStatus.SUCCESSFUL, 3)
    assert len(done.errors) == 2 and len(done.worker_ids) == 3
    assert done.started_at < done.last_attempted_at < done.finished_at
