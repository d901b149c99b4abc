from __future__ import annotations

import datetime as dt
import uuid

from django.utils import timezone
from factory.declarations import LazyFunction, Sequence, SubFactory
from factory.django import DjangoModelFactory

from django_outbox.models import Attempt, Message


class MessageFactory(DjangoModelFactory[Message]):
    class Meta:
        model = Message

    uuid = LazyFunction(uuid.uuid4)
    topic = "probe.created"
    payload = Sequence(lambda n: {"n": n})
    headers = LazyFunction(dict)
    status = Message.Status.PENDING
    max_attempts = 5
    available_at = LazyFunction(timezone.now)
    created_at = LazyFunction(timezone.now)


class AttemptFactory(DjangoModelFactory[Attempt]):
    class Meta:
        model = Attempt

    message = SubFactory(MessageFactory)
    number = 1
    started_at = LazyFunction(timezone.now)
    finished_at = LazyFunction(timezone.now)
    worker = "test-host:1:abc"
    outcome = Attempt.Outcome.DELIVERED


def finished(status: str, age: dt.timedelta, **kwargs) -> Message:
    """A message that finished (or not) ``age`` ago with one attempt: what housekeeping and the archive see."""
    when = timezone.now() - age
    message = MessageFactory.create(
        status=status,
        created_at=when,
        available_at=when,
        delivered_at=when if status == "delivered" else None,
        attempts=1,
        key=kwargs.pop("key", None),
        **kwargs,
    )
    AttemptFactory(message=message, started_at=when, finished_at=when, outcome="delivered")
    return message
