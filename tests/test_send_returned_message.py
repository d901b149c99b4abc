"""send() builds the returned Message from what it wrote; it must equal the row read back."""

from __future__ import annotations

import contextlib
import datetime as dt
import zoneinfo

import pytest
from django.db import transaction

from django_outbox import outbox
from django_outbox.models import Message

pytestmark = pytest.mark.django_db


FIELDS = [f.attname for f in Message._meta.concrete_fields]


@pytest.mark.parametrize("headers", [None, {"h": "v"}])
@pytest.mark.parametrize("in_transaction", [False, True])
def test_returned_message_equals_the_stored_row(handler, in_transaction, headers):
    handler("t.back", lambda m: None)
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    payload = {"z": 1, "a": [1.5, "x", None], "when": dt.datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)}
    with transaction.atomic() if in_transaction else contextlib.nullcontext():
        sent = outbox.send(
            "t.back",
            payload,
            key="k-1",
            headers=headers,
            idempotency_key=f"back-{in_transaction}-{headers is None}",
            available_at=dt.datetime(2031, 6, 1, 12, 0, 0, 123456, tzinfo=paris),
            max_attempts=3,
        )
    stored = Message.objects.get(pk=sent.pk)
    assert {f: getattr(sent, f) for f in FIELDS} == {f: getattr(stored, f) for f in FIELDS}
    assert sent.available_at.utcoffset() == dt.timedelta(0)
    assert sent.status == Message.Status.PENDING
    assert sent._state.adding is False and sent._state.db == "default"
