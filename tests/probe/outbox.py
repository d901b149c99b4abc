"""Handlers driven by their payload, so tests running real worker processes can script behaviour.

Payload keys (all optional): ``sleep`` seconds before answering; ``fail_until`` fail every attempt up to
and including this number; ``fail_rate`` fail at random with this probability; ``permanent`` raise a
PermanentDeliveryError; ``always_fail`` raise every time.
"""

import asyncio
import json
import os
import random
import time

from django_outbox import PermanentDeliveryError, outbox
from django_outbox.models import Message

from .models import Delivery


class ProbeFailure(Exception):
    pass


@outbox.handler("probe.*")
def probe(message: Message) -> None:
    payload = message.payload if isinstance(message.payload, dict) else {}
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]))
    if payload.get("permanent"):
        raise PermanentDeliveryError("probe: permanent failure requested")
    if payload.get("always_fail"):
        raise ProbeFailure("probe: failure requested")
    if message.attempts <= int(payload.get("fail_until", 0)):
        raise ProbeFailure(f"probe: failing attempt {message.attempts} as requested")
    if payload.get("fail_rate") and random.random() < float(payload["fail_rate"]):
        raise ProbeFailure("probe: random failure")
    Delivery.objects.create(
        message_id=message.id,
        message_uuid=message.uuid,
        topic=message.topic,
        key=message.key or "",
        attempt=message.attempts,
        pid=os.getpid(),
    )


@outbox.handler("echo.*")
def echo(message: Message) -> None:
    """Append what the handler received to the file named by ``OUTBOX_TEST_ECHO`` (one JSON line each)."""
    with open(os.environ["OUTBOX_TEST_ECHO"], "a", encoding="utf-8") as out:
        out.write(json.dumps({"id": message.id, "payload": message.payload}) + "\n")


@outbox.handler("asyncprobe.*")
async def async_probe(message: Message) -> None:
    """The same script for an ``async def`` handler, which writes through the async ORM."""
    payload = message.payload if isinstance(message.payload, dict) else {}
    if payload.get("sleep"):
        await asyncio.sleep(float(payload["sleep"]))
    if payload.get("always_fail"):
        raise ProbeFailure("async probe: failure requested")
    await Delivery.objects.acreate(
        message_id=message.id,
        message_uuid=message.uuid,
        topic=message.topic,
        key=message.key or "",
        attempt=message.attempts,
        pid=os.getpid(),
    )
