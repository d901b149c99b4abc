"""The handler of ``tasks.*`` topics: runs one task in the worker and keeps its outcome in the payload.

It runs like any handler, with no transaction open, so the two writes it makes (the attempt under way,
then the return value or the error) are each committed at once, and only while this worker still holds
the message's lease (the same fence the worker's own record uses) and only for this very claim (a
token in the payload's running entry): a worker whose lease was taken over cannot overwrite the outcome
of the one that took it, nor can a call the worker abandoned past ``HANDLER_TIMEOUT_SECONDS`` overwrite
a later claim of the same worker at the same attempt number (a dead task retried with its attempts
reset). Returning is delivered (SUCCESSFUL); raising is a failed attempt, retried with the outbox's
backoff until ``OPTIONS["MAX_ATTEMPTS"]`` is used up (FAILED).
"""

from __future__ import annotations

import logging
import secrets
import traceback
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS
from django.tasks.base import TaskContext, TaskResult, TaskResultStatus
from django.tasks.signals import task_finished, task_started
from django.utils import timezone

from ..conf import get_settings
from ..exceptions import PermanentDeliveryError, TransientDeliveryError
from ..models import Attempt, Message
from ..routing import registry
from . import payload as p
from .results import AttemptRow, build, is_task_payload, load_task

if TYPE_CHECKING:
    from django.db.models import QuerySet

logger = logging.getLogger("django_outbox.tasks")


#: The class the task signals name as their sender (Django's own backends send ``type(self)``); set by
#: :func:`register_handler`, so this module needs no import of the backend that imports it.
_signal_sender: type = object


def register_handler(backend: type) -> None:
    """Serve ``tasks.*`` with :func:`run_task`, sending the task signals as ``backend``; again is a no-op.

    Django builds a backend per thread: registering again would clear the routing caches each time.
    """
    global _signal_sender
    _signal_sender = backend
    if registry.find(p.TOPIC_PATTERN) is not run_task:
        registry.register(p.TOPIC_PATTERN, run_task)


def run_task(message: Message) -> None:
    data = message.payload
    if not is_task_payload(data):
        raise PermanentDeliveryError(
            f"message {message.uuid} on {message.topic!r} is not a task (tasks.* topics are reserved for "
            "django_outbox.tasks.OutboxBackend; send other messages on other topics)"
        )
    data = dict(data)
    started = timezone.now()
    # The lease (locked_by, attempts) does not tell two claims apart when the same worker claims the
    # message again at the same attempt number: a dead task retried with its attempts reset while the
    # call the worker abandoned (past HANDLER_TIMEOUT_SECONDS) still hangs. This claim's own token, in
    # the running entry written first, fences the later writes: a later claim writes its own over it.
    claim = secrets.token_hex(16)
    data[p.RUNNING] = {
        "attempt": message.attempts,
        "started_at": started.isoformat(),
        "worker": message.locked_by,
        "claim": claim,
    }
    if not _fence(message).update(payload=data):
        raise TransientDeliveryError(
            f"task message {message.uuid} is no longer held by this worker (its lease was taken over); not run"
        )
    fence = _fence(message).filter(**{f"payload__{p.RUNNING}__claim": claim})
    final = message.attempts >= message.max_attempts
    result: TaskResult[Any, Any] | None = None
    try:
        task = load_task(data)
        result = build(
            message_uuid=str(message.uuid),
            status="processing",
            created_at=message.created_at,
            attempts_used=message.attempts,
            locked_by=message.locked_by,
            delivered_at=None,
            data=data,
            attempts=_previous_attempts(message),
            task=task,
        )
        task_started.send_robust(_signal_sender, task_result=result)
        args, kwargs = data[p.ARGS], data[p.KWARGS]
        if task.takes_context:
            raw = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            raw = task.call(*args, **kwargs)
        value = p.faithful(f"The return value of task {task.module_path}", raw)
        _check_size(value)
    except KeyboardInterrupt:
        raise  # Ctrl-C stops relay_all(), which records no attempt: no error to record either
    except BaseException as exc:
        # SystemExit (a task calling sys.exit()), CancelledError...: the worker records a failed attempt
        # for them as for any error, so the result keeps the error too, and the last one finishes the task.
        data.pop(p.RUNNING, None)
        data[p.ERRORS] = [*(data.get(p.ERRORS) or []), _error(exc)]
        if not fence.update(payload=data):
            _stale(message)
        elif result is not None and final:
            _finish(result, TaskResultStatus.FAILED, data)  # inside the except: the log receiver shows exc_info
        raise
    if value is not None:
        # None is what a result without a return value reads as: a task returning it (most do) costs
        # one write, the one above; the stale running entry is ignored once the message is delivered.
        data.pop(p.RUNNING, None)
        data[p.RETURN_VALUE] = value
        if not fence.update(payload=data):
            _stale(message)
            return
    _finish(result, TaskResultStatus.SUCCESSFUL, data, value=value)


def _stale(message: Message) -> None:
    """A call that outlived its claim (abandoned past the handler timeout, or its lease taken over): its
    outcome is not the message's any more, and neither stored nor announced (``task_finished``)."""
    logger.warning(
        "task message %s: attempt %s ended after its claim did (timed out, or its lease was taken over); "
        "its outcome was not stored",
        message.uuid,
        message.attempts,
    )


def _fence(message: Message) -> QuerySet[Message]:
    return Message.objects.using(message._state.db or DEFAULT_DB_ALIAS).filter(
        pk=message.pk, status=Message.Status.PROCESSING, locked_by=message.locked_by, attempts=message.attempts
    )


def _previous_attempts(message: Message) -> list[AttemptRow]:
    if message.attempts <= 1:
        return []  # the first attempt: no row yet, no query
    rows = (
        Attempt.objects.using(message._state.db or DEFAULT_DB_ALIAS)
        .filter(message_id=message.pk, number__lt=message.attempts)
        .values_list("number", "started_at", "finished_at", "worker")
    )
    return [AttemptRow(number=n, started_at=s, finished_at=f, worker=w) for n, s, f, w in rows]


def _error(exc: BaseException) -> dict[str, str]:
    kind = type(exc)
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:  # an exception whose formatting raises must still be recorded
        text = f"{kind.__qualname__} (the traceback could not be formatted)"
    return {"exception_class_path": f"{kind.__module__}.{kind.__qualname__}", "traceback": p.bounded_traceback(text)}


def _check_size(value: Any) -> None:
    import json

    size = len(json.dumps(value).encode())
    limit = get_settings().MAX_PAYLOAD_BYTES
    if size > limit:
        raise ValueError(
            f"the task's return value is {size} bytes as JSON, more than OUTBOX['MAX_PAYLOAD_BYTES'] ({limit}); "
            "store large results elsewhere (a file, a model) and return a reference to them"
        )


def _finish(
    result: TaskResult[Any, Any], status: TaskResultStatus, data: Mapping[str, Any], *, value: Any = None
) -> None:
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "_return_value", value)
    errors = build(
        message_uuid=result.id,
        status="dead",
        created_at=result.enqueued_at or timezone.now(),
        attempts_used=0,
        locked_by=None,
        delivered_at=None,
        data=data,
        attempts=[],
        task=result.task,
    ).errors
    object.__setattr__(result, "errors", errors)
    for receiver, response in task_finished.send_robust(_signal_sender, task_result=result):
        if isinstance(response, Exception):
            logger.error("task_finished receiver %r raised: %r", receiver, response)
