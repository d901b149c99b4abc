"""How a failed attempt is described in its attempt row and the message's ``last_error``."""

from __future__ import annotations

import traceback

ERROR_MAX_CHARS = 4000


def _type_name(obj: object) -> str:
    try:
        return str(type(obj).__qualname__)
    except Exception:  # a metaclass may hide even this
        return "an exception"


def describe_error(exc: BaseException) -> str:
    """The error and the tail of its traceback: what an operator needs, bounded in size.

    The text stays as the exception wrote it; ``store.record()`` escapes what the database cannot store.
    It never raises: an exception whose ``__notes__`` (or anything else formatting reads) raises is
    described by its type, since a failure to describe one attempt must not stop the worker.
    """
    try:
        text = "".join(traceback.format_exception(exc, limit=-8)).strip()
    except Exception as problem:
        text = f"{_type_name(exc)} (the exception could not be formatted: {_type_name(problem)})"
    if len(text) > ERROR_MAX_CHARS:
        text = "...\n" + text[-ERROR_MAX_CHARS:]
    return text
