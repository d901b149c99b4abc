"""``OutboxBackend``: ``Task.enqueue()`` writes an outbox message in the caller's transaction.

Django's docs tell users to wrap ``enqueue()`` in ``transaction.on_commit``, which loses the task when the
process dies between the commit and the hook. Here the task row is the outbox message, written by
``outbox.send()`` on the caller's connection: it exists if and only if the caller's transaction commits.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import Task, TaskResult, TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_enqueued

from ..api import MAX_ATTEMPTS_LIMIT, outbox
from ..conf import HANDLER_TRANSPORT, get_settings
from ..exceptions import OutboxError
from ..models import ArchivedAttempt, ArchivedMessage, Attempt, Message
from ..routing import resolve_transport
from . import payload as p
from .results import AttemptRow, build, is_task_payload
from .runner import register_handler

#: ``TASKS[alias]["OPTIONS"]`` names this backend takes.
OPTIONS = frozenset({"MAX_ATTEMPTS"})
#: A queue's topic is routed away from the task runner by ``OUTBOX["ROUTES"]``.
QUEUE_ROUTED_AWAY = "django_outbox.E150"
#: ``TASKS[alias]["OPTIONS"]`` holds a name this backend does not take.
UNKNOWN_TASK_OPTION = "django_outbox.E151"


class OutboxBackend(BaseTaskBackend):
    """Tasks as outbox messages, run by ``outbox_worker``.

    No priorities: the worker takes messages in id order (and per key, never concurrently), so a priority
    could not be honoured; Django's validation then refuses a task with a non-default priority.
    """

    supports_defer = True
    supports_get_result = True
    supports_async_task = True
    supports_priority = False

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - OPTIONS)
        if unknown:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS'] has {', '.join(map(repr, unknown))}, which "
                f"django_outbox.tasks.OutboxBackend does not take (it takes {', '.join(sorted(OPTIONS))}) "
                f"({UNKNOWN_TASK_OPTION})."
            )
        max_attempts = self.options.get("MAX_ATTEMPTS", 1)
        if (
            isinstance(max_attempts, bool)
            or not isinstance(max_attempts, int)
            or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT
        ):
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['MAX_ATTEMPTS'] must be a whole number from 1 to "
                f"{MAX_ATTEMPTS_LIMIT}, not {max_attempts!r}."
            )
        self.max_attempts: int = max_attempts
        # Workers and web processes alike: tasks.* topics are served (send() checks that a topic is).
        register_handler(type(self))

    # --- enqueue ---------------------------------------------------------------------------------

    def enqueue(self, task: Task[Any, Any], args: Sequence[Any], kwargs: dict[str, Any]) -> TaskResult[Any, Any]:
        """Write the task as a message in the current transaction of the outbox's database.

        Everything is checked before the write, so a bad argument raises here and writes nothing.
        ``task_enqueued`` is sent once the row is written, inside the caller's transaction: a rollback
        afterwards removes the task though the signal was sent.
        """
        self.validate_task(task)
        data = {
            p.TASK: task.module_path,
            p.ARGS: p.faithful("A task's positional arguments", list(args)),
            p.KWARGS: p.faithful("A task's keyword arguments", dict(kwargs)),
            p.BACKEND: self.alias,
            p.QUEUE_NAME: task.queue_name,
            p.TAKES_CONTEXT: task.takes_context,
            p.RUN_AFTER: task.run_after.isoformat() if task.run_after is not None else None,
        }
        message = outbox.send(
            p.topic(task.queue_name), data, available_at=task.run_after, max_attempts=self.max_attempts
        )
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=str(message.uuid),
            status=TaskResultStatus.READY,
            enqueued_at=message.created_at,
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=data[p.ARGS],
            kwargs=data[p.KWARGS],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    # --- results ---------------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        """The task's result from its message, or from the archive once housekeeping moved it there.

        The message and its attempts are two reads, and housekeeping may move or delete both in between
        (atomically, in one batch): the attempts then read as none, and the result would be a finished
        task that never ran anywhere. So the message is looked for again after its attempts: still there,
        the attempts read were whole; gone, the archive is read (or the result no longer exists).
        """
        try:
            message_uuid = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        alias = get_settings().DATABASE
        live = Message.objects.using(alias).filter(uuid=message_uuid).first()
        if live is not None:
            rows: list[tuple[Any, ...]] = list(
                Attempt.objects.using(alias)
                .filter(message_id=live.pk)
                .values_list("number", "started_at", "finished_at", "worker")
            )
            if Message.objects.using(alias).filter(pk=live.pk).exists():
                return self._result(result_id, live, rows)
        archived = ArchivedMessage.objects.using(alias).filter(uuid=message_uuid).first()
        if archived is not None:
            rows = list(
                ArchivedAttempt.objects.using(alias)
                .filter(message_id=archived.pk)
                .values_list("number", "started_at", "finished_at", "worker")
            )
            if ArchivedMessage.objects.using(alias).filter(uuid=message_uuid).exists():
                return self._result(result_id, archived, rows)
        raise TaskResultDoesNotExist(result_id)

    def _result(
        self, result_id: str, message: Message | ArchivedMessage, rows: Iterable[tuple[Any, ...]]
    ) -> TaskResult[Any, Any]:
        data = message.payload
        if not (message.topic.startswith(p.TOPIC_PREFIX) and is_task_payload(data)) or data[p.BACKEND] != self.alias:
            raise TaskResultDoesNotExist(result_id)  # a message, but not a task of this backend
        return build(
            message_uuid=str(message.uuid),
            status=message.status,
            created_at=message.created_at,
            attempts_used=message.attempts,
            locked_by=getattr(message, "locked_by", None),
            delivered_at=message.delivered_at,
            data=data,
            attempts=[AttemptRow(number=n, started_at=s, finished_at=f, worker=w) for n, s, f, w in rows],
        )

    # --- checks ----------------------------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """A queue whose topic ``OUTBOX["ROUTES"]`` sends elsewhere (a catch-all ``"*"``) would never run."""
        problems: list[checks.CheckMessage] = list(super().check(**kwargs))
        for queue in sorted(self.queues):
            topic = p.topic(queue)
            try:
                name = resolve_transport(topic)
            except OutboxError:
                continue
            if name != HANDLER_TRANSPORT:
                problems.append(
                    checks.Error(
                        f"Task queue {queue!r} of TASKS[{self.alias!r}] is topic {topic!r}, which OUTBOX['ROUTES'] "
                        f"sends to transport {name!r}: its tasks would never run.",
                        hint="Narrow the route's pattern so it does not match tasks.* topics.",
                        obj=f"TASKS[{self.alias!r}]",
                        id=QUEUE_ROUTED_AWAY,
                    )
                )
        return problems
