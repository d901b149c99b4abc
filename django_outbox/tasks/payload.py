"""What a task message's payload holds, and the JSON rules its values must survive.

The payload is the task's one record: ``enqueue()`` writes the call (``task``, ``args``, ``kwargs`` and
the task's options), and the worker adds to it what the result needs (``running``: the attempt under way;
``return_value``; ``errors``). Keeping the result in the message's own JSON means it lives exactly as long
as the message and its archive, with no table of its own to clean up.
"""

from __future__ import annotations

import json
from typing import Any

from ..conf import TASKS_TOPIC_PREFIX

#: The topic prefix of task messages; queue ``q`` is topic ``tasks.q``.
TOPIC_PREFIX = TASKS_TOPIC_PREFIX

#: The handler pattern the backend registers.
TOPIC_PATTERN = "tasks.*"

TASK = "task"
ARGS = "args"
KWARGS = "kwargs"
BACKEND = "backend"
QUEUE_NAME = "queue_name"
TAKES_CONTEXT = "takes_context"
RUN_AFTER = "run_after"
RUNNING = "running"
RETURN_VALUE = "return_value"
ERRORS = "errors"

#: A traceback longer than this keeps its tail (where the exception is), so a task raising a 10 MB
#: message cannot grow its message row without bound on every retry.
TRACEBACK_MAX_CHARS = 16_000


def topic(queue_name: str) -> str:
    return f"{TOPIC_PREFIX}{queue_name}"


def faithful(what: str, value: Any) -> Any:
    """``value`` as JSON gives it back, or ``TypeError`` if JSON would change it.

    Django's ``normalize_json`` turns tuples into lists and bytes into text; what it lets through may
    still not survive a round trip (NaN, infinity, a dict with int keys that come back as strings, a NUL
    character no database stores in JSON). A task must receive exactly what was enqueued, and its caller
    exactly what it returned, so anything JSON would alter is refused.
    """
    from django.utils.json import normalize_json

    try:
        normal = normalize_json(value)
        text = json.dumps(normal, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON-serialisable: {exc}") from exc
    except RecursionError as exc:
        raise TypeError(f"{what} is nested too deeply to be stored as JSON") from exc
    if "\\u0000" in text:
        raise TypeError(f"{what} contains a NUL character (\\u0000), which databases cannot store in JSON")
    try:
        text.encode()
        json.dumps(normal, ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:
        raise TypeError(f"{what} contains a lone UTF-16 surrogate, which is not valid Unicode") from exc
    if json.loads(text) != normal:
        raise TypeError(f"{what} would not survive JSON unchanged (a dict key that is not a string?)")
    return normal


def bounded_traceback(text: str) -> str:
    if len(text) <= TRACEBACK_MAX_CHARS:
        return text
    return "...\n" + text[-TRACEBACK_MAX_CHARS:]
