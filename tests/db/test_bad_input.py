"""Bad input to ``send()`` and to ``OUTBOX``: a clear error at the earliest point, and nothing written.

tests/test_send.py and tests/test_checks.py hold the first cases; these are the ones the fault-injection
work added (docs/reliability.md lists them all). Each send case runs inside a transaction that must stay
usable afterwards: an error the database raised instead would have poisoned it on PostgreSQL.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import transaction
from django.test import override_settings

from django_outbox import PayloadTooLargeError, UnknownTopicError, outbox
from django_outbox.conf import get_settings
from django_outbox.exceptions import OutboxImproperlyConfigured
from django_outbox.models import Message
from testproject.shop.models import Order

from .test_checks import outbox_errors

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (("probe.created", {1, 2}), {}, TypeError, "JSON-serialisable.*set"),
        (("probe.created", b"bytes"), {}, TypeError, "JSON-serialisable.*bytes"),
        (("probe.created", {(1, 2): "tuple key"}), {}, TypeError, "keys must be"),
        (("probe.created", {"text": "half \ud800 an emoji"}), {}, ValueError, "lone UTF-16 surrogate"),
        (("probe.created", {"text": "\udc00 low half first"}), {}, ValueError, "lone UTF-16 surrogate"),
        (("probe.created", {}), {"headers": {"h": "\ud83d"}}, ValueError, "headers contains a lone"),
        ((None, {}), {}, TypeError, "topic must be a string"),
        ((" probe.created", {}), {}, ValueError, "surrounding spaces"),
        (("nobody.listens", {}), {}, UnknownTopicError, "No route or handler serves topic 'nobody.listens'"),
        (("probe.created", {}), {"key": 5}, TypeError, "key must be a string or None"),
        (("probe.created", {}), {"idempotency_key": ""}, ValueError, "idempotency_key must be a non-empty"),
        (("probe.created", {}), {"delay": float("nan")}, ValueError, "finite, non-negative"),
        (("probe.created", {}), {"delay": float("inf")}, ValueError, "finite, non-negative"),
        (("probe.created", {}), {"delay": 10**12}, ValueError, "past the year 9999"),
        (("probe.created", {}), {"delay": dt.timedelta.max}, ValueError, "past the year 9999"),
        (
            ("probe.created", {}),
            {"delay": dt.timedelta(seconds=-1)},
            ValueError,
            "finite, non-negative number of seconds",
        ),
        (("probe.created", {}), {"available_at": dt.date(2030, 1, 1)}, TypeError, "available_at must be a datetime"),
        (("probe.created", {}), {"max_attempts": 2**31}, ValueError, "max_attempts must be a positive integer"),
        (("probe.created", {}), {"max_attempts": True}, ValueError, "max_attempts must be a positive integer"),
    ],
)
def test_bad_send_raises_before_writing_and_leaves_the_transaction_usable(args, kwargs, error, match):
    with transaction.atomic():
        with pytest.raises(error, match=match):
            outbox.send(*args, **kwargs)
        Order.objects.create(customer_email="a@example.com", item="mug")  # the transaction goes on
    assert Message.objects.count() == 0
    assert Order.objects.count() == 1


@pytest.mark.parametrize(
    "payload",
    [
        {"emoji": "\U0001f600 fine"},
        {"text": "a literal backslash-u0000: \\u0000"},
        {"text": "a literal backslash-ud800: \\ud800"},
    ],
)
def test_valid_text_that_looks_like_the_refused_escapes_is_stored(payload):
    message = outbox.send("probe.created", payload)
    assert Message.objects.get(pk=message.pk).payload == payload


def test_payload_limit_counts_utf8_bytes_not_characters():
    one_kb = "\u00e9" * 500  # 500 characters, 1,000 bytes in UTF-8 (JSON keeps them escaped: 3,000 bytes)
    with override_settings(OUTBOX={"MAX_PAYLOAD_BYTES": 2000}):
        with pytest.raises(PayloadTooLargeError, match=r"3002 bytes as JSON; OUTBOX\['MAX_PAYLOAD_BYTES'\] is 2000"):
            outbox.send("probe.created", one_kb)
    assert Message.objects.count() == 0


@pytest.mark.parametrize(
    ("outbox_setting", "expected"),
    [
        ({"HANDLER_TIMEOUT_SECONDS": 0}, "django_outbox.E090"),
        ({"HANDLER_TIMEOUT_SECONDS": -5}, "django_outbox.E090"),
        ({"HANDLER_TIMEOUT_SECONDS": "30"}, "django_outbox.E090"),
        ({"HANDLER_TIMEOUT_SECONDS": True}, "django_outbox.E090"),
        ({"HANDLER_TIMEOUT_SECONDS": float("inf")}, "django_outbox.E090"),
        ({"HANDLER_TIMEOUT_SECONDS": float("nan")}, "django_outbox.E090"),
        ({"MAX_PAYLOAD_BYTES": 0}, "django_outbox.E003"),
        ({"MAX_PAYLOAD_BYTES": 1.5}, "django_outbox.E003"),
        ({"TRANSPORTS": ["hooks"]}, "django_outbox.E010"),
        ({"ROUTES": {"": "handler"}}, "django_outbox.E020"),
    ],
)
def test_more_malformed_settings_are_reported_with_stable_ids(outbox_setting, expected):
    with override_settings(OUTBOX=outbox_setting):
        assert expected in outbox_errors()
        with pytest.raises(OutboxImproperlyConfigured, match=expected):
            outbox.send("probe.created", {})
    assert Message.objects.count() == 0


def test_handler_timeout_setting_is_read():
    assert get_settings().HANDLER_TIMEOUT_SECONDS is None
    with override_settings(OUTBOX={"HANDLER_TIMEOUT_SECONDS": 2}):
        assert get_settings().HANDLER_TIMEOUT_SECONDS == 2.0
        assert outbox_errors() == []
