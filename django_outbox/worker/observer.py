"""What the worker tells an observer (metrics, traces): a claim, each group's delivery call, each batch's end.

The worker knows nothing of Prometheus or OpenTelemetry: ``django_outbox.observability`` implements
``Observer``, and ``outbox_worker`` hands the ones it builds to the ``Relay``. Without any, the pipeline
calls the base class's no-ops, so a worker that observes nothing pays a few method calls per batch.
An observer that raises is logged and ignored: watching the worker must never stop it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .. import store
    from ..store.models import Message

logger = logging.getLogger("django_outbox.relay")

#: The delivery call of one group: what the transport said of each message (None: delivered).
Delivery = Callable[[], Sequence[BaseException | None]]


def log_fields(message: Message, attempt: int, worker: str) -> dict[str, object]:
    """The ``extra`` of every worker log line about one message, so a JSON formatter can index them.

    Prefixed where a bare name would be ambiguous in a shared log (``id``) or clash with a formatter's
    own fields; documented in docs/operating.md#structured-logs.
    """
    return {
        "message_id": message.id,
        "message_uuid": str(message.uuid),
        "topic": message.topic,
        "attempt": attempt,
        "worker": worker,
    }


class Observer:
    """The hooks, each a no-op here; override the ones you need."""

    def claimed(self, batch: Sequence[Message], seconds: float) -> None:
        """A claim returned ``batch`` (maybe empty) after ``seconds``."""

    def batch_started(self, batch: Sequence[Message]) -> None:
        """A delivery thread starts on ``batch``."""

    def wrap_delivery(self, group: Sequence[Message], transport: str, call: Delivery) -> Delivery:
        """The delivery call of ``group`` (one transport's messages), wrapped; runs on the delivering thread."""
        return call

    def batch_done(
        self,
        batch: Sequence[Message],
        outcomes: Sequence[store.Outcome],
        lost: set[int],
        transports: Mapping[int, str],
    ) -> None:
        """The outcomes of ``batch`` are recorded (``lost``: ids whose lease was lost).

        ``transports`` names the transport of each message id as the pipeline resolved it, once per
        message: an observer that labels by transport reads it here instead of resolving the topic again
        (a message whose topic nothing serves is absent)."""


class Observers(Observer):
    """Several observers as one; each hook of each is shielded from the others' errors."""

    def __init__(self, observers: Sequence[Observer] = ()) -> None:
        self.observers = tuple(observers)

    def __bool__(self) -> bool:
        return bool(self.observers)

    def claimed(self, batch: Sequence[Message], seconds: float) -> None:
        for o in self.observers:
            try:
                o.claimed(batch, seconds)
            except Exception:
                logger.exception("observer %r failed on a claim", o)

    def batch_started(self, batch: Sequence[Message]) -> None:
        for o in self.observers:
            try:
                o.batch_started(batch)
            except Exception:
                logger.exception("observer %r failed on a batch's start", o)

    def wrap_delivery(self, group: Sequence[Message], transport: str, call: Delivery) -> Delivery:
        for o in self.observers:
            try:
                call = o.wrap_delivery(group, transport, call)
            except Exception:
                logger.exception("observer %r failed to wrap a delivery", o)
        return call

    def batch_done(
        self,
        batch: Sequence[Message],
        outcomes: Sequence[store.Outcome],
        lost: set[int],
        transports: Mapping[int, str],
    ) -> None:
        for o in self.observers:
            try:
                o.batch_done(batch, outcomes, lost, transports)
            except Exception:
                logger.exception("observer %r failed on a batch's end", o)
