"""Every worker log line about a message carries its id, uuid, topic, attempt and worker as ``extra`` fields."""

from __future__ import annotations

import json
import logging

import pytest

from django_outbox import outbox
from django_outbox.worker import Relay, RelayConfig

pytestmark = pytest.mark.django_db

FIELDS = ("message_id", "message_uuid", "topic", "attempt", "worker")


def test_the_lines_about_a_message_carry_its_fields(handler, caplog, settings):
    # One attempt each: the retry must not come due while the drain still runs (the suite's 0.05 s
    # backoff can run out on a busy machine, and the drain would then make a second attempt).
    settings.OUTBOX = {**settings.OUTBOX, "BACKOFF_BASE_SECONDS": 60, "BACKOFF_MAX_SECONDS": 60}

    def flaky(message):
        if message.payload.get("fail"):
            raise RuntimeError("receiver says no")

    handler("logs.*", flaky)
    delivered = outbox.send("logs.ok", {})
    retried = outbox.send("logs.retry", {"fail": True}, max_attempts=3)
    dead = outbox.send("logs.dead", {"fail": True}, max_attempts=1)
    config = RelayConfig.from_settings(until_empty=True, notify=False)
    caplog.set_level(logging.DEBUG, logger="django_outbox.relay")
    Relay(config).drain()

    about = {r.getMessage(): r for r in caplog.records if hasattr(r, "message_id")}
    lines = {r.message_id: r for r in about.values()}
    assert set(lines) == {delivered.id, retried.id, dead.id}
    for message, level in ((delivered, logging.DEBUG), (retried, logging.WARNING), (dead, logging.ERROR)):
        record = lines[message.id]
        assert record.levelno == level
        assert (record.message_uuid, record.topic, record.attempt, record.worker) == (
            str(message.uuid),
            message.topic,
            1,
            config.worker_id,
        )
        # What a JSON formatter writes: every field serialisable as it is.
        assert json.loads(json.dumps({f: getattr(record, f) for f in FIELDS}))["message_uuid"] == str(message.uuid)
    assert "receiver says no" in lines[dead.id].getMessage()
