"""``send()`` refuses a topic routed to a transport that cannot be loaded, as ``check`` (E011) and the
worker do, instead of writing messages that no worker will start to deliver."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import override_settings

from django_outbox import OutboxImproperlyConfigured, outbox, routing
from django_outbox.checks import check_settings
from django_outbox.models import Message
from testproject.shop.models import Order

pytestmark = pytest.mark.django_db(transaction=True)

HANDLER = "django_outbox.transports.handler.HandlerTransport"


def routed_to(backend: str) -> override_settings:
    return override_settings(
        OUTBOX={"TRANSPORTS": {"billing": {"BACKEND": backend}}, "ROUTES": {"billing.*": "billing"}}
    )


@pytest.mark.parametrize(
    ("backend", "reason"),
    [
        ("no.such.Transport", "Cannot import transport backend 'no.such.Transport'"),
        ("django_outbox.transports.kafka.KafkaTransport", "Cannot import transport backend"),
        ("django_outbox.api.Outbox", "is not a subclass of django_outbox.transports.BaseTransport"),
        ("django_outbox.api.MAX_ATTEMPTS_LIMIT", "is not a subclass"),
    ],
)
def test_a_topic_routed_to_a_transport_that_cannot_be_loaded_is_refused(backend, reason):
    with routed_to(backend):
        assert [e.id for e in check_settings()] == ["django_outbox.E011"]
        with transaction.atomic():
            with pytest.raises(OutboxImproperlyConfigured, match="routed to transport 'billing'") as raised:
                outbox.send("billing.charged", {"n": 1})
            Order.objects.create(customer_email="a@example.com", item="mug")  # the transaction goes on
        assert reason in str(raised.value) and "E011" in str(raised.value)
        outbox.send("probe.created", {"n": 2})  # topics routed elsewhere are not affected
    assert list(Message.objects.values_list("topic", flat=True)) == ["probe.created"]
    assert Order.objects.count() == 1


def test_the_import_is_tried_once_per_setting_and_again_when_the_setting_changes():
    with routed_to("no.such.Transport"):
        for _ in range(3):
            with pytest.raises(OutboxImproperlyConfigured):
                outbox.send("billing.charged", {})
        assert routing._load_error.cache_info().misses == 1
    with routed_to(HANDLER):  # fixed: setting_changed clears what was cached
        routing.registry.register("billing.*", lambda message: None)
        try:
            outbox.send("billing.charged", {})
            for _ in range(3):
                outbox.send("billing.charged", {})
            assert routing.sending_transport.cache_info().hits >= 3
        finally:
            routing.registry.unregister("billing.*")
    assert Message.objects.count() == 4


def test_a_transport_whose_optional_package_is_missing_may_still_be_sent_to():
    """A web process need not install a broker's client; its workers refuse to start instead (E012)."""
    with routed_to("tests.transport_needing_extra.ImaginaryTransport"):
        assert [e.id for e in check_settings()] == ["django_outbox.E012"]
        outbox.send("billing.charged", {"n": 1})
    assert Message.objects.count() == 1
