"""A task message, live or archived, read back as Django's ``TaskResult``.

The statuses map one to one: pending is READY (also between retries), processing RUNNING, delivered
SUCCESSFUL, dead and cancelled FAILED. The times and the workers come from the attempt rows the worker
writes anyway; the attempt under way, which has no row yet, from the payload's ``running`` entry.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from django.tasks.base import Task, TaskError, TaskResult, TaskResultStatus
from django.tasks.exceptions import InvalidTask
from django.utils.dateparse import parse_datetime
from django.utils.module_loading import import_string

from . import payload as p

STATUSES = {
    "pending": TaskResultStatus.READY,
    "processing": TaskResultStatus.RUNNING,
    "delivered": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AttemptRow:
    """What a result needs of one attempt row, hot or archived."""

    number: int
    started_at: dt.datetime
    finished_at: dt.datetime | None
    worker: str


def is_task_payload(data: object) -> bool:
    return (
        isinstance(data, Mapping)
        and isinstance(data.get(p.TASK), str)
        and isinstance(data.get(p.ARGS), list)
        and isinstance(data.get(p.KWARGS), dict)
        and isinstance(data.get(p.BACKEND), str)
    )


def load_task(data: Mapping[str, Any]) -> Task[Any, Any]:
    """The ``Task`` the payload names, with the queue and schedule it was enqueued with.

    The path points at the module attribute ``@task`` made (a ``Task``), as Django's own pickling of a
    task does. ``ValueError`` if it no longer does (the function was renamed or removed since, or its
    module no longer imports).
    """
    path = data[p.TASK]
    try:
        task = import_string(path)
    except ImportError as exc:
        raise ValueError(f"task {path!r} cannot be imported: {exc}") from exc
    except (Exception, SystemExit) as exc:
        # The module itself is broken (it raises, or calls sys.exit(), as it is imported): the error says
        # which task, and a SystemExit must not end the worker, nor the web process reading a result.
        raise ValueError(f"task {path!r} cannot be imported: {type(exc).__name__}: {exc}") from exc
    if not isinstance(task, Task):
        raise ValueError(f"{path!r} is not a task (decorate the function with @task)")
    run_after = parse_datetime(data[p.RUN_AFTER]) if data.get(p.RUN_AFTER) else None
    try:
        return dataclasses.replace(
            task, backend=data[p.BACKEND], queue_name=data.get(p.QUEUE_NAME, task.queue_name), run_after=run_after
        )
    except InvalidTask:  # the settings changed since (a queue removed): the task as its module defines it
        return task


def build(
    *,
    message_uuid: str,
    status: str,
    created_at: dt.datetime,
    attempts_used: int,
    locked_by: str | None,
    delivered_at: dt.datetime | None,
    data: Mapping[str, Any],
    attempts: Sequence[AttemptRow],
    task: Task[Any, Any] | None = None,
) -> TaskResult[Any, Any]:
    attempts = sorted(attempts, key=lambda a: a.number)
    started_at = attempts[0].started_at if attempts else None
    last_attempted_at = attempts[-1].started_at if attempts else None
    worker_ids = [a.worker for a in attempts]
    running = data.get(p.RUNNING)
    if status == "processing" and isinstance(running, Mapping) and running.get("attempt") == attempts_used:
        # the attempt under way: its row is written when it ends
        now_started = parse_datetime(str(running.get("started_at", "")))
        if now_started is not None:
            started_at = started_at or now_started
            last_attempted_at = now_started
        worker_ids.append(str(running.get("worker") or locked_by or ""))
    finished_at = None
    if status == "delivered":
        finished_at = delivered_at or (attempts[-1].finished_at if attempts else None)
    elif status in ("dead", "cancelled") and attempts:
        finished_at = attempts[-1].finished_at
    errors = [
        TaskError(exception_class_path=str(e.get("exception_class_path", "")), traceback=str(e.get("traceback", "")))
        for e in data.get(p.ERRORS) or []
        if isinstance(e, Mapping)
    ]
    result: TaskResult[Any, Any] = TaskResult(
        task=task if task is not None else load_task(data),
        id=message_uuid,
        status=STATUSES[status],
        enqueued_at=created_at,
        started_at=started_at,
        finished_at=finished_at,
        last_attempted_at=last_attempted_at,
        args=list(data[p.ARGS]),
        kwargs=dict(data[p.KWARGS]),
        backend=data[p.BACKEND],
        errors=errors,
        worker_ids=worker_ids,
    )
    if status == "delivered":
        object.__setattr__(result, "_return_value", data.get(p.RETURN_VALUE))
    return result
