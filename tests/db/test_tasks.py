"""The Django tasks backend: Django's own task API through the outbox, on Django 6.x.

The behaviours Django's own tests/tasks/ check of its dummy and immediate backends (enqueueing,
arguments, results, errors, signals, validation), here against ``OutboxBackend``, with the worker's
pipeline running the tasks (``relay_all()``, on the test's connection), plus what only an outbox gives:
the caller's transaction decides, retries, the archive.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("django.tasks", reason="django.tasks is new in Django 6.0")

from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.tasks import TaskResultStatus, task, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_outbox import PayloadTooLargeError, outbox
from django_outbox.models import ArchivedMessage, Attempt, Message
from django_outbox.retention import housekeeping
from django_outbox.tasks import OutboxBackend
from django_outbox.tasks.backend import QUEUE_ROUTED_AWAY, UNKNOWN_TASK_OPTION
from django_outbox.testing import relay_all
from tests.probe import tasks as t
from tests.probe.models import Delivery

pytestmark = pytest.mark.django_db


@pytest.fixture
def signals() -> Iterator[list[tuple[str, Any]]]:
    seen: list[tuple[str, Any]] = []

    def on(name: str) -> Any:
        def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((name, (sender, task_result.id, task_result.status)))

        return receiver

    receivers = {task_enqueued: on("enqueued"), task_started: on("started"), task_finished: on("finished")}
    for signal, receiver in receivers.items():
        signal.connect(receiver)
    yield seen
    for signal, receiver in receivers.items():
        signal.disconnect(receiver)


def run_all() -> None:
    relay_all(until_settled=True, ignore_backoff=True)


# --- the backend -----------------------------------------------------------------------------------


def test_the_configured_backend_is_the_outbox_and_says_what_it_supports():
    backend = task_backends["default"]
    assert isinstance(backend, OutboxBackend)
    assert (backend.supports_defer, backend.supports_get_result, backend.supports_async_task) == (True, True, True)
    assert backend.supports_priority is False
    assert backend.max_attempts == 1
    assert task_backends["retrying"].max_attempts == 3


def test_a_priority_other_than_the_default_is_refused():
    with pytest.raises(InvalidTask, match="priority"):
        t.noop.using(priority=10)


@pytest.mark.parametrize("priority", [10, -1, 100])
def test_a_priority_is_refused_where_the_task_is_declared(priority):
    """``@task(priority=...)`` fails as its module is imported, not when a worker would run it: the
    earliest point, and the error names what is not supported."""
    with pytest.raises(InvalidTask, match="priority"):
        task(priority=priority)(t.add.func)
    assert not Message.objects.exists()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS"),
        ({"MAX_ATTEMPTS": "3"}, "MAX_ATTEMPTS"),
        ({"MAX_ATTEMPTS": True}, "MAX_ATTEMPTS"),
        ({"MAX_ATTEMPTS": 2**31}, "MAX_ATTEMPTS"),
        ({"max_attempts": 3}, UNKNOWN_TASK_OPTION),
    ],
)
def test_bad_options_are_refused_when_the_backend_is_built(options, match):
    with pytest.raises(ImproperlyConfigured, match=match):
        OutboxBackend("broken", {"OPTIONS": options})


def test_a_route_that_takes_the_task_topics_elsewhere_is_a_check_error(settings):
    settings.OUTBOX = {**settings.OUTBOX, "ROUTES": {"*": "shop-webhooks"}}
    problems = task_backends["default"].check()
    assert {p.id for p in problems} == {QUEUE_ROUTED_AWAY}
    assert "tasks.emails" in " ".join(p.msg for p in problems)
    settings.OUTBOX = {**settings.OUTBOX, "ROUTES": {"orders.*": "shop-webhooks"}}
    assert task_backends["default"].check() == []


# --- enqueue ---------------------------------------------------------------------------------------


def test_enqueue_writes_one_message_on_the_queue_topic_and_returns_a_ready_result(signals):
    result = t.add.enqueue(1, b=2)
    message = Message.objects.get()
    assert result.id == str(message.uuid)
    assert (message.topic, message.status, message.max_attempts) == ("tasks.default", "pending", 1)
    assert message.payload["task"] == "tests.probe.tasks.add"
    assert (message.payload["args"], message.payload["kwargs"]) == ([1], {"b": 2})
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at == message.created_at
    assert (result.started_at, result.finished_at, result.last_attempted_at) == (None, None, None)
    assert (result.args, result.kwargs, result.backend, result.errors, result.worker_ids) == (
        [1],
        {"b": 2},
        "default",
        [],
        [],
    )
    assert result.task is t.add
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value
    assert signals == [("enqueued", (OutboxBackend, result.id, TaskResultStatus.READY))]


def test_the_queue_name_is_the_topic_so_a_worker_can_run_one_queue():
    email = t.send_email.enqueue("a@example.com")
    other = t.add.enqueue(1, 2)
    assert Message.objects.get(uuid=email.id).topic == "tasks.emails"
    relay_all(topics=["tasks.emails"])
    assert t.send_email.get_result(email.id).return_value == "sent to a@example.com"
    assert t.add.get_result(other.id).status == TaskResultStatus.READY


def test_using_another_queue_and_backend():
    result = t.add.using(queue_name="emails").enqueue(2, 3)
    assert Message.objects.get().topic == "tasks.emails"
    retried = t.add.using(backend="retrying").enqueue(2, 3)
    assert Message.objects.get(uuid=retried.id).max_attempts == 3
    run_all()
    assert t.add.get_result(result.id).return_value == 5
    assert task_backends["retrying"].get_result(retried.id).return_value == 5
    # a result is its backend's: the other alias does not know it
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(retried.id)


def test_a_queue_not_in_queues_is_refused():
    with pytest.raises(InvalidTask, match="Queue 'nope'"):
        t.add.using(queue_name="nope")
    assert not Message.objects.exists()


def test_a_function_not_at_module_level_is_refused():
    def inner() -> None:
        pass

    with pytest.raises(InvalidTask, match="module level"):
        task()(inner)


def test_a_naive_run_after_is_refused():
    with pytest.raises(InvalidTask, match="aware"):
        t.add.using(run_after=dt.datetime(2030, 1, 1))


@pytest.mark.parametrize(
    "args",
    [
        (object(),),
        (float("nan"),),
        (float("inf"),),
        ({1: "int key"},),
        (dt.datetime(2030, 1, 1, tzinfo=dt.UTC),),
        ({1, 2},),
        ("nul\x00",),
        ("\ud800",),
    ],
    ids=["object", "nan", "inf", "int-key", "datetime", "set", "nul", "surrogate"],
)
def test_an_argument_json_would_not_give_back_fails_at_enqueue_and_writes_nothing(args, signals):
    with pytest.raises(TypeError, match="arguments"):
        t.echo.enqueue(*args)
    with pytest.raises(TypeError, match="arguments"):
        t.echo.enqueue(value=args[0])
    assert not Message.objects.exists()
    assert signals == []


def test_arguments_reach_the_task_as_json_gives_them_back():
    result = t.echo.enqueue((1, 2), b"bytes", nested={"a": [1, {"b": None}]}, flag=True, text="é🙂")
    assert result.args == [[1, 2], "bytes"]
    run_all()
    done = t.echo.get_result(result.id)
    assert done.return_value == {
        "args": [[1, 2], "bytes"],
        "kwargs": {"nested": {"a": [1, {"b": None}]}, "flag": True, "text": "é🙂"},
    }
    assert (done.args, done.kwargs["text"]) == ([[1, 2], "bytes"], "é🙂")


def test_an_oversized_call_is_refused_by_send_and_writes_nothing(settings):
    settings.OUTBOX = {**settings.OUTBOX, "MAX_PAYLOAD_BYTES": 1000}
    with pytest.raises(PayloadTooLargeError, match="MAX_PAYLOAD_BYTES"):
        t.echo.enqueue("x" * 2000)
    assert not Message.objects.exists()


# --- the caller's transaction ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_enqueue_leaves_nothing_to_run():
    with pytest.raises(RuntimeError), transaction.atomic():
        result = t.record.enqueue("rolled back")
        assert Message.objects.filter(uuid=result.id).exists()  # written in the transaction...
        raise RuntimeError("the view failed")
    assert not Message.objects.exists()  # ...and gone with it
    run_all()
    assert not Delivery.objects.exists()
    with pytest.raises(TaskResultDoesNotExist):
        t.record.get_result(result.id)


@pytest.mark.django_db(transaction=True)
def test_a_committed_enqueue_runs_once():
    with transaction.atomic():
        Delivery.objects.create(message_id=1, message_uuid=uuid.uuid4(), topic="business row", attempt=0, pid=0)
        result = t.record.enqueue("committed")
    run_all()
    run_all()
    runs = Delivery.objects.filter(topic="committed")
    assert [(str(r.message_uuid), r.attempt) for r in runs] == [(result.id, 1)]
    done = t.record.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value["id"] == result.id  # the result id is the idempotency key the task sees


# --- results -------------------------------------------------------------------------------------


def test_a_returning_task_is_successful_with_its_value_times_and_worker(signals):
    before = timezone.now()
    result = t.add.enqueue(20, 22)
    run_all()
    done = t.add.get_result(result.id)
    attempt = Attempt.objects.get()
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.is_finished
    assert done.return_value == 42
    assert done.errors == []
    assert before <= done.enqueued_at <= done.started_at <= done.finished_at <= timezone.now()
    assert done.started_at == done.last_attempted_at == attempt.started_at
    assert done.worker_ids == [attempt.worker] and attempt.worker
    assert done.attempts == 1
    assert (done.args, done.kwargs) == ([20, 22], {})
    # refresh() reloads a stale result in place
    result.refresh()
    assert (result.status, result.return_value, result.worker_ids) == (TaskResultStatus.SUCCESSFUL, 42, done.worker_ids)
    assert [name for name, _ in signals] == ["enqueued", "started", "finished"]
    assert signals[1][1] == (OutboxBackend, result.id, TaskResultStatus.RUNNING)
    assert signals[2][1] == (OutboxBackend, result.id, TaskResultStatus.SUCCESSFUL)


def test_a_task_sees_itself_running():
    result = t.inspect_self.enqueue()
    run_all()
    seen = t.inspect_self.get_result(result.id).return_value
    worker = Attempt.objects.get().worker
    assert seen == {
        "status": "RUNNING",
        "started": True,
        "last_attempted": True,
        "worker_ids": [worker],
        "finished": False,
    }


def test_a_task_returning_none_is_successful_with_none_for_one_write():
    result = t.noop.enqueue()
    with CaptureQueriesContext(connection) as queries:
        run_all()
    done = t.noop.get_result(result.id)
    assert (done.status, done.return_value) == (TaskResultStatus.SUCCESSFUL, None)
    assert len(payload_writes(queries)) == 1  # the attempt under way; nothing to add at the end
    valued = t.add.enqueue(1, 2)
    with CaptureQueriesContext(connection) as queries:
        run_all()
    assert t.add.get_result(valued.id).return_value == 3
    assert len(payload_writes(queries)) == 2


def payload_writes(queries: CaptureQueriesContext) -> list[str]:
    quoted = f"SET {connection.ops.quote_name('payload')}"  # "payload" on PostgreSQL and SQLite, `payload` on MySQL
    return [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE") and quoted in q["sql"]]


def test_an_async_task_is_awaited():
    ok = t.async_add.enqueue(1, 2)
    bad = t.async_failing.enqueue()
    run_all()
    assert t.async_add.get_result(ok.id).return_value == 3
    failed = t.async_failing.get_result(bad.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class is t.TaskFailure


def test_the_context_carries_the_result_id_and_the_attempt():
    result = t.record.enqueue("context")
    run_all()
    value = t.record.get_result(result.id).return_value
    assert (value["id"], value["attempt"]) == (result.id, 1)


def test_unknown_ids_do_not_exist():
    for bad in (str(uuid.uuid4()), "not-a-uuid", "", "x" * 10_000):
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result(bad)
    # a message that is not a task is not a task result
    message = outbox.send("probe.plain", {"task": "tests.probe.tasks.add"})
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(str(message.uuid))


def test_the_result_of_another_task_is_a_mismatch():
    result = t.add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        t.noop.get_result(result.id)


@pytest.mark.django_db(transaction=True)
def test_aget_result_from_async_code():
    result = t.add.enqueue(1, 1)
    run_all()

    async def read() -> Any:
        return await t.add.aget_result(result.id)

    assert async_to_sync(read)().return_value == 2

    async def missing() -> None:
        await t.add.aget_result(str(uuid.uuid4()))

    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(missing)()


@pytest.mark.django_db(transaction=True)
def test_aenqueue_from_async_code():
    async def enqueue() -> Any:
        return await t.add.aenqueue(3, 4)

    result = async_to_sync(enqueue)()
    run_all()
    assert t.add.get_result(result.id).return_value == 7


# --- errors and retries ----------------------------------------------------------------------------


def test_a_raising_task_fails_with_its_error(signals):
    result = t.failing.enqueue("the warehouse is on fire")
    run_all()
    failed = t.failing.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.is_finished and failed.finished_at is not None
    (error,) = failed.errors
    assert error.exception_class_path == "tests.probe.tasks.TaskFailure"
    assert error.exception_class is t.TaskFailure
    assert error.traceback.startswith("Traceback (most recent call last):")
    assert error.traceback.rstrip().endswith("tests.probe.tasks.TaskFailure: the warehouse is on fire")
    with pytest.raises(ValueError, match="failed"):
        _ = failed.return_value
    assert Message.objects.get().status == "dead"  # MAX_ATTEMPTS 1: Django's semantics, no retry
    assert [name for name, _ in signals] == ["enqueued", "started", "finished"]
    assert signals[2][1][2] == TaskResultStatus.FAILED


def test_a_failing_task_is_retried_up_to_max_attempts_with_every_error_kept(signals):
    retrying = t.failing.using(backend="retrying")
    result = retrying.enqueue("again")
    relay_all()  # one attempt; the retry waits for its backoff
    between = retrying.get_result(result.id)
    assert between.status == TaskResultStatus.READY
    assert len(between.errors) == 1 and len(between.worker_ids) == 1
    assert between.finished_at is None
    run_all()
    failed = retrying.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in failed.errors] == ["tests.probe.tasks.TaskFailure"] * 3
    assert len(failed.worker_ids) == 3
    attempts = list(Attempt.objects.order_by("number"))
    assert failed.started_at == attempts[0].started_at
    assert failed.last_attempted_at == attempts[-1].started_at
    assert failed.finished_at == attempts[-1].finished_at
    # task_finished only once the task is finished, not after each failed attempt
    assert [name for name, _ in signals].count("finished") == 1


def test_a_task_that_succeeds_on_a_retry_is_successful_with_the_earlier_errors():
    retrying = t.fail_until.using(backend="retrying")
    result = retrying.enqueue(3)
    run_all()
    done = retrying.get_result(result.id)
    assert (done.status, done.return_value) == (TaskResultStatus.SUCCESSFUL, 3)
    assert ["attempt 1 fails" in done.errors[0].traceback, "attempt 2 fails" in done.errors[1].traceback] == [
        True,
        True,
    ]
    assert len(done.worker_ids) == 3


@pytest.mark.parametrize("kind", ["nan", "set", "int-keys", "huge", "nul"])
def test_a_return_value_json_would_not_give_back_fails_the_task(kind):
    result = t.returns.enqueue(kind)
    run_all()
    failed = t.returns.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class_path in ("builtins.TypeError", "builtins.ValueError")
    assert Message.objects.get().status == "dead"


def test_a_tuple_return_value_comes_back_as_a_list():
    result = t.returns.enqueue("tuple")
    run_all()
    assert t.returns.get_result(result.id).return_value == [1, 2]


def test_a_huge_error_is_kept_bounded():
    result = t.huge_error.enqueue()
    run_all()
    (error,) = t.huge_error.get_result(result.id).errors
    assert len(error.traceback) < 20_000
    assert error.traceback.startswith("...\n")


def test_a_task_topic_message_that_is_not_a_task_goes_dead_at_once():
    message = outbox.send("tasks.default", {"not": "a task"}, max_attempts=5)
    run_all()
    message.refresh_from_db()
    assert (message.status, message.attempts) == ("dead", 1)
    assert "not a task" in message.last_error


def test_a_task_whose_function_is_gone_fails_with_the_reason():
    result = t.add.enqueue(1, 2)
    message = Message.objects.get()
    message.payload = {**message.payload, "task": "tests.probe.tasks.renamed"}
    message.save(update_fields=["payload"])
    run_all()
    message.refresh_from_db()
    assert message.status == "dead"
    assert "renamed" in message.last_error
    assert message.payload["errors"][0]["exception_class_path"] == "builtins.ValueError"
    with pytest.raises(ValueError, match="renamed"):
        task_backends["default"].get_result(result.id)


# --- run_after -------------------------------------------------------------------------------------


def test_run_after_defers_the_task():
    later = timezone.now() + dt.timedelta(hours=1)
    result = t.add.using(run_after=later).enqueue(1, 2)
    message = Message.objects.get()
    assert message.available_at == later
    assert result.task.run_after == later
    run_all()
    assert t.add.get_result(result.id).status == TaskResultStatus.READY
    assert t.add.get_result(result.id).task.run_after == later
    Message.objects.update(available_at=timezone.now() - dt.timedelta(seconds=1))
    run_all()
    assert t.add.get_result(result.id).return_value == 3


# --- the archive ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("empty_archive")
def test_a_result_outlives_the_hot_table_in_the_archive():
    retrying = t.fail_until.using(backend="retrying")
    result = retrying.enqueue(2)
    run_all()
    live = retrying.get_result(result.id)
    report = housekeeping.run("default", now=timezone.now() + dt.timedelta(days=30))
    assert report.archived == 1
    assert not Message.objects.exists()
    assert ArchivedMessage.objects.filter(uuid=result.id).exists()
    archived = retrying.get_result(result.id)
    assert (archived.status, archived.return_value) == (TaskResultStatus.SUCCESSFUL, 2)
    assert (archived.started_at, archived.finished_at, archived.last_attempted_at) == (
        live.started_at,
        live.finished_at,
        live.last_attempted_at,
    )
    assert archived.worker_ids == live.worker_ids and len(archived.errors) == 1


# --- settings ------------------------------------------------------------------------------------


def test_a_tasks_setting_override_makes_a_fresh_backend():
    with override_settings(
        TASKS={"default": {"BACKEND": "django_outbox.tasks.OutboxBackend", "OPTIONS": {"MAX_ATTEMPTS": 2}}}
    ):
        assert task_backends["default"].max_attempts == 2
        result = t.add.enqueue(1, 2)
        assert Message.objects.get(uuid=result.id).max_attempts == 2


@pytest.mark.django_db(transaction=True)
def test_with_eager_tasks_run_at_commit(settings):
    settings.OUTBOX = {**settings.OUTBOX, "EAGER": True}
    with transaction.atomic():
        result = t.add.enqueue(5, 6)
        assert t.add.get_result(result.id).status == TaskResultStatus.READY  # not before the commit
    assert t.add.get_result(result.id).return_value == 11


def test_a_cancelled_task_is_failed_and_a_retried_dead_one_ready_again():
    from django_outbox import store

    cancelled = t.add.enqueue(1, 2)
    store.cancel("default", [Message.objects.get(uuid=cancelled.id).pk], reason="not needed")
    result = t.add.get_result(cancelled.id)
    assert (result.status, result.errors, result.worker_ids) == (TaskResultStatus.FAILED, [], [])
    run_all()
    assert t.add.get_result(cancelled.id).status == TaskResultStatus.FAILED  # never run
    dead = t.failing.enqueue()
    run_all()
    assert t.failing.get_result(dead.id).status == TaskResultStatus.FAILED
    store.retry("default", [Message.objects.get(uuid=dead.id).pk], reset_attempts=True)
    again = t.failing.get_result(dead.id)
    assert (again.status, len(again.errors)) == (TaskResultStatus.READY, 1)  # the earlier error is kept


def test_building_a_backend_again_keeps_the_routing_caches(monkeypatch):
    from django_outbox import routing

    cleared: list[bool] = []
    monkeypatch.setattr(routing, "_clear_caches", lambda: cleared.append(True))
    OutboxBackend("another", {})
    assert cleared == []  # the handler was registered once, at startup


# --- a result read while housekeeping moves or deletes its message --------------------------------


def _housekeeping_after_the_first_read(table: str, now: dt.datetime) -> Any:
    """A query wrapper that runs housekeeping, on a connection of its own, right after the caller's first
    query of ``table`` returned: the interleaving of a result read racing housekeeping, made certain."""
    import threading

    from django.db import connections

    state = {"ran": False}

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if not state["ran"] and table in sql:
            state["ran"] = True

            def other() -> None:
                try:
                    housekeeping.run("default", now=now)
                finally:
                    connections.close_all()

            thread = threading.Thread(target=other)
            thread.start()
            thread.join(60)
        return result

    return wrapper, state


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("empty_archive")
def test_a_result_read_while_housekeeping_archives_its_message_is_whole():
    """The message is read from the hot table, then housekeeping moves it and its attempts to the archive,
    then the attempts are read: from the hot table they are gone. The result must still have them."""
    retrying = t.fail_until.using(backend="retrying")
    result = retrying.enqueue(2)
    run_all()
    live = retrying.get_result(result.id)
    assert len(live.worker_ids) == 2 and live.started_at is not None
    wrapper, state = _housekeeping_after_the_first_read(Message._meta.db_table, timezone.now() + dt.timedelta(days=1))
    with connection.execute_wrapper(wrapper):
        read = retrying.get_result(result.id)
    assert state["ran"] and ArchivedMessage.objects.filter(uuid=result.id).exists()
    assert not Message.objects.filter(uuid=result.id).exists()
    assert (read.status, read.return_value) == (TaskResultStatus.SUCCESSFUL, 2)
    assert read.worker_ids == live.worker_ids
    assert (read.started_at, read.last_attempted_at) == (live.started_at, live.last_attempted_at)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("empty_archive")
def test_a_result_read_while_housekeeping_deletes_its_message_does_not_exist(settings):
    """Retention deletes the message (mode "delete") between the read of the message and that of its
    attempts: the result is gone, not a successful task that never ran anywhere."""
    retrying = t.fail_until.using(backend="retrying")
    result = retrying.enqueue(2)
    run_all()
    wrapper, state = _housekeeping_after_the_first_read(Message._meta.db_table, timezone.now() + dt.timedelta(days=30))
    settings.OUTBOX = {**settings.OUTBOX, "RETENTION_MODE": "delete"}
    with connection.execute_wrapper(wrapper), pytest.raises(TaskResultDoesNotExist):
        retrying.get_result(result.id)
    assert state["ran"] and not Message.objects.filter(uuid=result.id).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("empty_archive")
def test_a_result_read_while_retention_prunes_its_archive_does_not_exist():
    """The archived message is read, then retention drops it and its attempts from the archive, then the
    attempts are read: the result is gone, not a successful task without a single attempt."""
    retrying = t.fail_until.using(backend="retrying")
    result = retrying.enqueue(2)
    run_all()
    housekeeping.run("default", now=timezone.now() + dt.timedelta(days=1))
    assert ArchivedMessage.objects.filter(uuid=result.id).exists()
    wrapper, state = _housekeeping_after_the_first_read(
        ArchivedMessage._meta.db_table, timezone.now() + dt.timedelta(days=60)
    )
    with connection.execute_wrapper(wrapper), pytest.raises(TaskResultDoesNotExist):
        retrying.get_result(result.id)
    assert state["ran"] and not ArchivedMessage.objects.filter(uuid=result.id).exists()


# --- a task that no longer imports, or exits ------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("tests.probe.broken.raises_at_import.job", "broken at import"),
        ("tests.probe.broken.exits_at_import.job", "called sys.exit() at import"),
        ("tests.probe.gone_module.job", "No module named 'tests.probe.gone_module'"),
    ],
    ids=["raises", "exits", "gone"],
)
def test_a_task_whose_module_no_longer_imports_fails_with_the_reason_and_its_result_says_so(signals, path, reason):
    """A deploy between enqueue and run broke or removed the task's module. The attempt fails with the
    reason (the worker goes on), the error is in the result's errors, and reading the result raises a
    ``ValueError`` naming the task: never the module's own exception (a ``SystemExit`` out of a web view
    ends the process serving it)."""
    result = t.add.enqueue(1, 2)
    message = Message.objects.get()
    message.payload = {**message.payload, "task": path}
    message.save(update_fields=["payload"])
    run_all()
    message.refresh_from_db()
    assert (message.status, message.attempts) == ("dead", 1)
    assert reason in message.last_error and path in message.last_error
    (attempt,) = Attempt.objects.filter(message=message)
    assert attempt.outcome == Attempt.Outcome.FAILED and reason in attempt.error
    (error,) = message.payload["errors"]
    assert error["exception_class_path"] == "builtins.ValueError" and reason in error["traceback"]
    with pytest.raises(ValueError, match=f"task '{path}' cannot be imported"):
        task_backends["default"].get_result(result.id)
    assert [name for name, _ in signals] == ["enqueued"]  # never started, so never finished


def test_a_task_that_calls_sys_exit_is_failed_with_its_error_and_finished(signals):
    result = t.exits.enqueue()
    run_all()
    message = Message.objects.get()
    assert (message.status, message.attempts) == ("dead", 1)
    assert "a task called sys.exit()" in message.last_error
    read = t.exits.get_result(result.id)
    assert read.status == TaskResultStatus.FAILED
    (error,) = read.errors
    assert error.exception_class_path == "builtins.SystemExit"
    assert "a task called sys.exit()" in error.traceback
    assert [(name, status) for name, (_, _, status) in signals] == [
        ("enqueued", TaskResultStatus.READY),
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.FAILED),
    ]


# --- many tasks in one transaction ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_ten_thousand_tasks_enqueued_in_one_transaction_take_bounded_time_and_memory():
    """A data migration or a bulk action that enqueues a task per row: 10,000 in one transaction.

    Timed without tracing, then again under tracemalloc: the memory still allocated while the transaction
    is open (what send() would keep per message until the commit: hooks, caches) must not grow with the
    count beyond a few hundred bytes a task.
    """
    import gc
    import time
    import tracemalloc

    count = 10_000
    started = time.perf_counter()
    with transaction.atomic():
        for n in range(count):
            t.add.enqueue(n, 1)  # the result is dropped, as a loop over rows does
    took = time.perf_counter() - started
    gc.collect()
    tracemalloc.start()
    try:
        with transaction.atomic():
            for n in range(count):
                t.add.enqueue(n, 2)
            held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"\n{count} tasks in one transaction: {took:.2f} s; held {held / 1e6:.2f} MB, peak {peak / 1e6:.2f} MB")
    assert Message.objects.filter(topic="tasks.default").count() == 2 * count
    assert held < 200 * count, f"{held / 1e6:.1f} MB held for {count} tasks in the open transaction"
    assert peak < 400 * count, f"peak {peak / 1e6:.1f} MB"
    assert took < 60, f"{took:.1f} s to enqueue {count} tasks"
