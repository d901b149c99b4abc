"""The observability settings (E100-E102), the bounded ``topic`` label and the metrics address."""

from __future__ import annotations

import math

import pytest
from django.core import checks
from django.test import override_settings

from django_outbox.conf import get_settings
from django_outbox.exceptions import OutboxImproperlyConfigured
from django_outbox.observability.labels import MAX_TOPIC_LABELS, OTHER, TopicLabels, check_address, topic_label
from tests.support.checks import outbox_errors

TOKEN = "t" * 32


def test_defaults():
    s = get_settings()
    assert s.METRICS_TOPIC_LABELS is None
    assert (s.HEALTH_LAG_SECONDS, s.HEALTH_STALLED_SECONDS, s.HEALTH_TOKEN) == (60.0, 600.0, "")


def test_by_default_every_topic_is_its_own_label():
    assert topic_label("orders.created") == "orders.created"


def test_patterns_bound_the_topic_label():
    with override_settings(OUTBOX={"METRICS_TOPIC_LABELS": ["orders.*", "emails.*", "orders.created"]}):
        assert topic_label("orders.created") == "orders.*"  # the first pattern that matches
        assert topic_label("emails.welcome") == "emails.*"
        assert topic_label("customer-4711.events") == OTHER
        assert {topic_label(f"tenant-{n}.x") for n in range(1000)} == {OTHER}
    with override_settings(OUTBOX={"METRICS_TOPIC_LABELS": []}):
        assert topic_label("orders.created") == OTHER  # an empty list: one series per transport


def test_without_patterns_a_registrys_topic_labels_are_bounded(caplog):
    """One label value per topic, up to ``MAX_TOPIC_LABELS`` per registry: the topics after them count as
    ``"other"``, the ones already counted keep their name, and the warning comes once."""
    labels = TopicLabels()
    with caplog.at_level("WARNING", logger="django_outbox"):
        values = {labels(f"tenant-{n}.x") for n in range(10_000)}
    assert len(values) == MAX_TOPIC_LABELS + 1 and OTHER in values
    assert labels("tenant-0.x") == "tenant-0.x"
    assert len(caplog.records) == 1 and "METRICS_TOPIC_LABELS" in caplog.records[0].getMessage()
    assert TopicLabels()("tenant-9999.x") == "tenant-9999.x"  # another registry, its own bound
    with override_settings(OUTBOX={"METRICS_TOPIC_LABELS": ["tenant-*"]}):
        assert {labels(f"tenant-{n}.x") for n in range(10_000)} == {"tenant-*"}


@pytest.mark.parametrize(
    ("outbox", "expected"),
    [
        ({"METRICS_TOPIC_LABELS": "orders.*"}, "django_outbox.E100"),
        ({"METRICS_TOPIC_LABELS": ["orders.*", ""]}, "django_outbox.E100"),
        ({"METRICS_TOPIC_LABELS": [3]}, "django_outbox.E100"),
        ({"HEALTH_LAG_SECONDS": math.nan}, "django_outbox.E101"),
        ({"HEALTH_LAG_SECONDS": math.inf}, "django_outbox.E101"),
        ({"HEALTH_LAG_SECONDS": 0}, "django_outbox.E101"),
        ({"HEALTH_STALLED_SECONDS": -1}, "django_outbox.E101"),
        ({"HEALTH_STALLED_SECONDS": 2**63}, "django_outbox.E101"),
        ({"HEALTH_TOKEN": "short-secret"}, "django_outbox.E102"),
        ({"HEALTH_TOKEN": "x" * 31}, "django_outbox.E102"),
        ({"HEALTH_TOKEN": "x" * 31 + " "}, "django_outbox.E102"),
        ({"HEALTH_TOKEN": "x" * 40 + "\n"}, "django_outbox.E102"),
        ({"HEALTH_TOKEN": b"b" * 40}, "django_outbox.E102"),
        ({"HEALTH_TOKEN": None}, "django_outbox.E102"),
    ],
)
def test_bad_values_are_reported(outbox, expected):
    with override_settings(OUTBOX=outbox):
        assert outbox_errors() == [expected]
        with pytest.raises(OutboxImproperlyConfigured, match=expected):
            get_settings()


@pytest.mark.parametrize("secret", ["s3cr3t-that-is-far-too-short", "b" * 40 + "\n", "c" * 31 + " "])
def test_a_bad_token_is_never_shown(secret):
    with override_settings(OUTBOX={"HEALTH_TOKEN": secret}):
        shown = " ".join(f"{m.msg} {m.hint}" for m in checks.run_checks())
        assert secret.strip() not in shown
        assert "not shown" in shown
        with pytest.raises(OutboxImproperlyConfigured) as raised:
            get_settings()
        assert secret.strip() not in str(raised.value)


def test_a_good_token_is_accepted():
    with override_settings(OUTBOX={"HEALTH_TOKEN": TOKEN}):
        assert outbox_errors() == []
        assert get_settings().HEALTH_TOKEN == TOKEN


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1", "127.0.0.1"), ("::1", "::1"), ("0.0.0.0", "0.0.0.0"), ("localhost", "localhost")],
)
def test_addresses_the_metrics_server_accepts(text, expected):
    assert check_address(text) == expected


@pytest.mark.parametrize("text", ["", "example.com", "127.0.0.1:9100", "300.0.0.1", "127.0.0.1\x00"])
def test_addresses_the_metrics_server_refuses(text):
    with pytest.raises(ValueError, match="is not an IP address"):
        check_address(text)
