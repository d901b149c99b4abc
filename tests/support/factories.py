from __future__ import annotations

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
