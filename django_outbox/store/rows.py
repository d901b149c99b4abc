"""Rows as ``Message`` instances, built straight from the cursor (no per-row queries), with Django's
own converters applied."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import JSONField
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

from .db import MESSAGE
from .models import Message

FIELDS = Message._meta.concrete_fields
COLUMN_NAMES = [str(f.column) for f in FIELDS]
ATTNAMES = [f.attname for f in FIELDS]  # the same names today; from_db() and instances go by these
COLUMNS = ", ".join(COLUMN_NAMES)


@functools.cache
def _decoders(alias: str, vendor: str) -> list[tuple[int, Any, tuple[Callable[..., Any], ...]]]:
    """For each column of ``COLUMNS`` that needs it, the converters Django's compiler would apply."""
    conn = connections[alias]
    decoders = []
    for i, field in enumerate(FIELDS):
        col = field.get_col(MESSAGE)
        converters = tuple(conn.ops.get_db_converters(col) + field.get_db_converters(conn))
        if isinstance(field, JSONField) and field.decoder is None and converters == (field.from_db_value,):
            converters = (_from_json,)
        if converters:
            decoders.append((i, col, converters))
    return decoders


def _from_json(value: Any, expression: Any, connection: BaseDatabaseWrapper) -> Any:
    """``JSONField.from_db_value()`` for a column read whole, without a decoding for the empty object
    that most messages' headers are (a claim reads two JSON columns per message)."""
    if value == "{}":
        return {}
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def to_message(alias: str, conn: BaseDatabaseWrapper, row: Sequence[Any]) -> Message:
    return to_messages(alias, conn, [row])[0]


def to_messages(alias: str, conn: BaseDatabaseWrapper, rows: Iterable[Sequence[Any]]) -> list[Message]:
    decoders = _decoders(alias, conn.vendor)
    build = instance_builder(alias)
    messages = []
    for row in rows:
        values = list(row)
        for i, col, converters in decoders:
            value = values[i]
            for convert in converters:
                value = convert(value, col, conn)
            values[i] = value
        messages.append(build(values))
    return messages


def instance_builder(alias: str) -> Callable[[Sequence[Any]], Message]:
    """What ``Message.from_db()`` returns, without running ``Model.__init__`` over every field.

    A claim builds one per message and ``send()`` one per call; ``__init__`` cost about 30 µs of each
    when it ran cold after a round trip (docs/performance.md). Django's own ``from_db()`` is used
    whenever something listens for the model's init signals, so they keep firing. Asked once per batch.
    """
    # Most projects connect no init receiver at all: the empty lists answer without the signals' lookups.
    if (pre_init.receivers or post_init.receivers) and (
        pre_init.has_listeners(Message) or post_init.has_listeners(Message)
    ):
        return functools.partial(Message.from_db, alias, ATTNAMES)
    return _builder(alias)


@functools.cache  # one builder per alias: a closure made per call cost a little of every send()
def _builder(alias: str) -> Callable[[Sequence[Any]], Message]:
    def build(values: Sequence[Any]) -> Message:
        message = Message.__new__(Message)
        state = ModelState()
        state.adding = False
        state.db = alias
        attributes = message.__dict__
        attributes.update(zip(ATTNAMES, values, strict=True))
        attributes["_state"] = state
        return message

    return build
