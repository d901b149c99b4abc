"""The consumer as an outbox handler: records the raw delivery, then applies the effect (effects.py).

Payload keys, beside ``account``, ``amount`` and ``fault`` (effects.py): ``sleep`` seconds first,
``always_fail``, ``fail_rate`` (a failure at random, before the delivery reaches the consumer), as the
probe handler of tests/probe takes them.
"""

import os
import random
import time

from django_outbox import outbox
from django_outbox.models import Message
from tests.probe.models import Delivery

from .effects import ConsumerFailure, consume, faults_struck

TOPIC = "chaos.consumer"


@outbox.handler(TOPIC)
def handle(message: Message) -> None:
    payload = message.payload
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]))
    if payload.get("always_fail"):
        raise ConsumerFailure("chaos consumer: failure requested")
    if payload.get("fail_rate") and random.random() < float(payload["fail_rate"]):
        raise ConsumerFailure("chaos consumer: random failure")
    # The fault strikes once, the first time a delivery reaches its point, whatever attempt that is: a
    # delivery cut short before (the run killed this worker) leaves it armed for the next one.
    armed = "fault" in payload and str(message.uuid) not in faults_struck()
    Delivery.objects.create(  # the raw delivery, committed on its own: what a consumer without dedupe sees
        message_id=message.id,
        message_uuid=message.uuid,
        topic=message.topic,
        key=message.key or "",
        attempt=message.attempts,
        pid=os.getpid(),
    )
    consume(message.uuid, payload, attempt=message.attempts, armed=armed)
