"""Task functions for the Django tasks backend's tests (Django 6.x only: this module needs django.tasks)."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from django.tasks import TaskContext, task

from .models import Delivery


class TaskFailure(Exception):
    pass


@task
def noop() -> None:
    return None


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="emails")
def send_email(to: str) -> str:
    return f"sent to {to}"


@task
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task
async def async_failing() -> None:
    await asyncio.sleep(0)
    raise TaskFailure("async task failed")


@task
def failing(text: str = "task failed") -> None:
    raise TaskFailure(text)


@task(takes_context=True)
def record(context: TaskContext[Any, Any], label: str) -> dict[str, Any]:
    """One Delivery row per run, so a test counts how often the task ran, and in which process."""
    Delivery.objects.create(
        message_id=0,
        message_uuid=context.task_result.id,
        topic=label,
        attempt=context.attempt,
        pid=os.getpid(),
    )
    return {"id": context.task_result.id, "attempt": context.attempt, "pid": os.getpid()}


@task(takes_context=True)
def fail_until(context: TaskContext[Any, Any], succeed_on: int) -> int:
    if context.attempt < succeed_on:
        raise TaskFailure(f"attempt {context.attempt} fails")
    return context.attempt


@task
def returns(value_kind: str) -> Any:
    values: dict[str, Any] = {
        "nan": float("nan"),
        "set": {1, 2},
        "int-keys": {1: "one"},
        "tuple": (1, 2),
        "huge": "x" * 2_000_000,
        "nul": "a\x00b",
    }
    return values[value_kind]


@task
def huge_error() -> None:
    raise TaskFailure("x" * 10_000_000)


@task(takes_context=True)
def inspect_self(context: TaskContext[Any, Any]) -> dict[str, Any]:
    """What get_result() says of this task while it runs."""
    seen = inspect_self.get_result(context.task_result.id)
    return {
        "status": seen.status,
        "started": seen.started_at is not None,
        "last_attempted": seen.last_attempted_at is not None,
        "worker_ids": seen.worker_ids,
        "finished": seen.finished_at is not None,
    }


#: Each call of ``hang_then_return`` per label: its thread, and the gate the test opens to let it return.
HANGING: dict[str, list[tuple[threading.Thread, threading.Event]]] = {}


@task
def hang_then_return(label: str) -> str | None:
    """Hangs until the test opens this call's gate; the first call then returns a value, later ones None
    (one write: a stale value left in the payload would show as the result)."""
    gate = threading.Event()
    calls = HANGING.setdefault(label, [])
    calls.append((threading.current_thread(), gate))
    first = len(calls) == 1
    if not gate.wait(120):
        raise TimeoutError("the test never opened the gate")
    return "from the abandoned first call" if first else None


@task
def exits() -> None:
    """A task that calls ``sys.exit()``: a failed attempt like any other, with its error kept."""
    import sys

    sys.exit("a task called sys.exit()")
