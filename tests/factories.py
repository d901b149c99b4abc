from __future__ import annotations

import uuid

import factory
from django.utils import timezone

from django_outbox.models import Attempt, Message


class MessageFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Message

    uuid = factory.LazyFunction(uuid.uuid4)
    topic = "probe.created"
    payload = factory.Sequence(lambda n: {"n": n})
    headers = factory.LazyFunction(dict)
    status = Message.Status.PENDING
    max_attempts = 5
    available_at = factory.LazyFunction(timezone.now)
    created_at = factory.LazyFunction(timezone.now)


class AttemptFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Attempt

    message = factory.SubFactory(MessageFactory)
    number = 1
    started_at = factory.LazyFunction(timezone.now)
    finished_at = factory.LazyFunction(timezone.now)
    worker = "test-host:1:abc"
    outcome = Attempt.Outcome.DELIVERED
