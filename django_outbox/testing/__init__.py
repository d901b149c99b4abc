"""Helpers for users' own tests: see what a test sent, and relay it in the test's own process.

Nothing here is imported by the outbox itself, and this module imports no model at import time: the
pytest plugin (``django_outbox.testing.pytest_plugin``) loads it before Django is set up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS

if TYPE_CHECKING:
    from ..models import Message
    from ..worker import Stats

__all__ = ["NotSettledError", "OutboxMessages", "OutboxTestMixin", "relay_all"]

#: A message that fails for ever (``max_attempts`` in the millions) must not hang a test: after this many
#: rounds ``relay_all(until_settled=True)`` gives up and says which messages are still waiting.
SETTLE_ROUNDS = 1000


class NotSettledError(AssertionError):
    """``relay_all(until_settled=True)`` could not bring every message to delivered or dead."""


def relay_all(
    *,
    database: str | None = None,
    topics: Sequence[str] = (),
    batch_size: int = 100,
    ignore_backoff: bool = False,
    until_settled: bool = False,
    timeout: float = 10.0,
) -> Stats:
    """Deliver every message that is due now, in this thread, and return the counts.

    It runs on the caller's database connection, so inside a ``TestCase`` it sees the test's own
    uncommitted messages. Handlers run synchronously, here; an ``async def`` handler is awaited here too,
    its async ORM calls on this connection (so it sees the test's transaction), and cancelled after
    ``HANDLER_TIMEOUT_SECONDS`` when that is set (a sync handler is not bounded here: it cannot be
    stopped, and must run on this thread).

    By default a failure is recorded and its retry waits for its backoff, as in a worker. With
    ``until_settled=True`` it goes on until no message waits for a retry: each has been delivered or is
    dead (or cancelled). With ``ignore_backoff=True`` as well, a retry is due at once, so a failing
    handler reaches ``dead`` after ``max_attempts`` attempts without the test sleeping; without it, the
    backoff is waited for, for at most ``timeout`` seconds in all. Messages sent with a ``delay`` or
    ``available_at`` keep their schedule (they are not retries), and messages held behind a dead
    message of their key stay pending, as in production. :class:`NotSettledError` says when it cannot
    settle (the timeout, or :data:`SETTLE_ROUNDS` rounds of a message that keeps failing).
    """
    from .. import store
    from ..observability import delivery
    from ..worker import Relay, RelayConfig

    alias = database or DEFAULT_DB_ALIAS
    config = RelayConfig.from_settings(database=alias, topics=tuple(topics), batch_size=batch_size, notify=False)
    relay = Relay(config, observers=delivery.observers())  # the spans and counters a worker records
    stats = relay.drain()
    if not until_settled:
        return stats
    deadline = time.monotonic() + timeout
    for _ in range(SETTLE_ROUNDS):
        waiting = _waiting_for_a_retry(alias, topics)
        if not waiting:
            return stats
        if ignore_backoff:
            store.retry(alias, waiting)
        else:
            due_in = store.next_due(alias, topics=tuple(topics) or None)
            left = deadline - time.monotonic()
            if left <= 0:
                raise NotSettledError(
                    f"relay_all(until_settled=True) waited {timeout:g}s and messages {waiting[:20]} still wait for"
                    " a retry; pass ignore_backoff=True to retry at once, or a longer timeout"
                )
            time.sleep(min(left, max(due_in or 0.0, 0.001)))
        stats = relay.drain()
    raise NotSettledError(
        f"relay_all(until_settled=True) gave up after {SETTLE_ROUNDS} rounds: messages"
        f" {_waiting_for_a_retry(alias, topics)[:20]} keep failing (is their max_attempts that high?)"
    )


def _waiting_for_a_retry(alias: str, topics: Sequence[str]) -> list[int]:
    """Pending messages that have been attempted: each waits for its backoff (or is due again now)."""
    from ..models import Message
    from ..routing import matches

    rows = Message.objects.using(alias).filter(status=Message.Status.PENDING, attempts__gt=0)
    return [
        mid for mid, topic in rows.values_list("id", "topic") if not topics or any(matches(p, topic) for p in topics)
    ]


class OutboxMessages(Sequence["Message"]):
    """The messages sent since it was made, oldest first, read afresh at each look.

    Read from the database, not caught at ``send()``: a message whose transaction rolled back does not
    exist, and is not here either; one the test relayed shows its new status. Messages that leave the
    table (housekeeping archived or deleted them) leave this view too.
    """

    def __init__(self, *, using: str = DEFAULT_DB_ALIAS) -> None:
        self.using = using
        self._after = self._last_id()

    def _last_id(self) -> int:
        from ..models import Message

        last = Message.objects.using(self.using).order_by("-id").values_list("id", flat=True).first()
        return last or 0

    def _messages(self) -> list[Message]:
        from ..models import Message

        return list(Message.objects.using(self.using).filter(id__gt=self._after).order_by("id"))

    def __getitem__(self, index: Any) -> Any:
        return self._messages()[index]

    def __len__(self) -> int:
        from ..models import Message

        return Message.objects.using(self.using).filter(id__gt=self._after).count()

    def __iter__(self) -> Iterator[Message]:
        return iter(self._messages())

    def __repr__(self) -> str:
        return f"<OutboxMessages {[(m.topic, m.payload) for m in self._messages()]!r}>"

    def topics(self) -> list[str]:
        """The topics sent, in order: ``assert outbox_messages.topics() == ["orders.created"]``."""
        return [m.topic for m in self._messages()]

    def filter(self, topic: str | None = None, **fields: Any) -> list[Message]:
        """The messages of one topic (a pattern such as ``"orders.*"`` works) whose fields equal those given."""
        from ..routing import matches

        return [
            m
            for m in self._messages()
            if (topic is None or matches(topic, m.topic))
            and all(getattr(m, name) == value for name, value in fields.items())
        ]

    def clear(self) -> None:
        """Forget what was sent so far: later looks show only what is sent from now on."""
        self._after = self._last_id()


class OutboxTestMixin:
    """For ``TestCase`` classes: ``self.outbox_messages`` holds what the test sent.

    ::

        class OrderTests(OutboxTestMixin, TestCase):
            def test_order_announces_itself(self):
                place_order()
                self.assertOutboxSent("orders.created", payload={"order": 1})
    """

    outbox_messages: OutboxMessages
    outbox_database: str = DEFAULT_DB_ALIAS

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        self.outbox_messages = OutboxMessages(using=self.outbox_database)

    def assertOutboxSent(
        self, topic: str, *, payload: Any = None, key: str | None = None, headers: Mapping[str, str] | None = None
    ) -> Message:
        """The one message sent on ``topic`` (a pattern works) matching what is given; fails otherwise."""
        fields: dict[str, Any] = {}
        if payload is not None:
            fields["payload"] = payload
        if key is not None:
            fields["key"] = key
        found = self.outbox_messages.filter(topic, **fields)
        if headers is not None:
            found = [m for m in found if all(m.headers.get(k) == v for k, v in headers.items())]
        if len(found) != 1:
            sent = [(m.topic, m.payload, m.key) for m in self.outbox_messages]
            raise AssertionError(
                f"expected one message on {topic!r} matching {fields or headers or 'anything'}, found {len(found)};"
                f" sent: {sent}"
            )
        return found[0]
