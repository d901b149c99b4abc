"""send() builds the returned Message from what it wrote; it must equal the row read back."""

from __future__ import annotations

import contextlib
import datetime as dt
import zoneinfo

import pytest
from django.db import transaction
from django.db.models.signals import post_init, pre_init

from django_outbox import outbox, store
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
    assert vars(sent).keys() == vars(stored).keys()  # nothing more or less than a loaded instance


def test_init_signal_listeners_still_see_every_message_the_outbox_builds(handler):
    """send() and the claim skip Model.__init__ for speed, except when something listens to it."""
    handler("t.signal", lambda m: None)
    seen: list[tuple[str, Message]] = []

    def on_pre_init(sender, args, kwargs, **extra):
        seen.append(("pre", sender))

    def on_post_init(sender, instance, **extra):
        seen.append(("post", instance))

    for signal, receiver in ((pre_init, on_pre_init), (post_init, on_post_init)):
        signal.connect(receiver, sender=Message)
        try:
            seen.clear()
            sent = outbox.send("t.signal", {"n": 1})
            (claimed,) = store.claim("default", worker="w1", limit=10, lease_seconds=30)
        finally:
            signal.disconnect(receiver, sender=Message)
        assert claimed.pk == sent.pk
        if signal is post_init:
            assert [instance for _, instance in seen] == [sent, claimed]
            assert seen[0][1] is sent and seen[1][1] is claimed
        else:
            assert seen == [("pre", Message), ("pre", Message)]
        Message.objects.filter(pk=sent.pk).delete()
