"""The admin shows blocked keys on the overview and lets operators browse the archive, read-only."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from django_outbox.admin import overview
from django_outbox.retention import housekeeping
from django_outbox.retention.models import ArchivedMessage
from tests.support.factories import MessageFactory, finished

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_archive")]

OVERVIEW = reverse("admin:django_outbox_message_overview")


def blocked_key() -> tuple[int, int]:
    dead = MessageFactory.create(key="order-7", status="dead", attempts=5, last_error="refused")
    MessageFactory.create(key="order-7", status="pending")
    MessageFactory.create(key="order-7", status="pending")
    MessageFactory.create(key="order-8", status="pending")  # not blocked
    MessageFactory.create(key=None, status="dead")  # keyless dead messages block nothing
    return dead.pk, 2


def test_overview_lists_keys_blocked_by_a_dead_message(admin_client):
    dead_id, waiting = blocked_key()
    assert overview.blocked_keys() == [
        overview.BlockedKey(key="order-7", dead_message_id=dead_id, dead=1, waiting=waiting)
    ]
    html = admin_client.get(OVERVIEW).content.decode()
    section = html[html.index('id="outbox-blocked-keys"') :]
    section = section[: section.index("</div>")]
    assert "order-7" in section and f"#{dead_id}" in section and "order-8" not in section
    assert reverse("admin:django_outbox_message_change", args=[dead_id]) in section


def test_the_overviews_lag_leaves_out_a_key_blocked_by_a_dead_message(admin_client):
    """A message waiting ten minutes behind its key's dead head is the blocked keys' section's, not lag;
    a claimable message's wait is lag, and the page shows both apart."""
    ago = timezone.now() - dt.timedelta(minutes=10)
    dead = MessageFactory.create(key="order-7", status="dead", created_at=ago, available_at=ago)
    MessageFactory.create(key="order-7", status="pending", created_at=ago, available_at=ago)

    def sections() -> tuple[str, str, str]:
        html = admin_client.get(OVERVIEW).content.decode()
        lag = html[html.rindex("<li", 0, html.index('id="outbox-lag"')) :]
        held = html[html.index('id="outbox-held"') :]
        blocked = html[html.index('id="outbox-blocked-keys"') :]
        return lag[: lag.index("</li>")], held[: held.index("</li>")], blocked[: blocked.index("</div>")]

    lag, held, blocked = sections()
    assert "0.0 s" in lag and "outbox-warning" not in html_tag(lag)
    assert "0 + 1" in held
    assert "order-7" in blocked and f"#{dead.pk}" in blocked
    MessageFactory.create(key="order-8", status="pending", created_at=ago, available_at=ago)  # claimable
    lag, held, blocked = sections()
    assert re.search(r"(599|6\d\d)\.\d s", lag), lag
    assert "outbox-warning" in html_tag(lag)
    assert "0 + 1" in held and "order-8" not in blocked


def html_tag(section: str) -> str:
    """The section's opening tag (its class says whether the card warns)."""
    return section[: section.index(">")]


@override_settings(OUTBOX={"ORDERING": "skip_dead"})
def test_no_key_is_blocked_when_dead_messages_are_skipped(admin_client):
    blocked_key()
    assert overview.blocked_keys() == []
    assert "No key is blocked" in admin_client.get(OVERVIEW).content.decode()


def test_the_archive_is_browsable_and_read_only(admin_client):
    message = finished("delivered", dt.timedelta(hours=2), key="order-1", payload={"order_id": 41})
    housekeeping.run("default")
    archived = ArchivedMessage.objects.get()
    changelist = reverse("admin:django_outbox_archivedmessage_changelist")
    page = admin_client.get(changelist)
    assert page.status_code == 200 and "order-1" in page.content.decode()
    found = admin_client.get(changelist, {"q": str(message.uuid)}).content.decode()
    assert reverse("admin:django_outbox_archivedmessage_change", args=[archived.pk]) in found
    detail = admin_client.get(reverse("admin:django_outbox_archivedmessage_change", args=[archived.pk]))
    text = detail.content.decode()
    assert detail.status_code == 200
    assert "order_id" in text and "41" in text, "the payload is shown"
    assert "test-host:1:abc" in text, "the archived attempts are shown"
    assert 'type="submit" value="Save' not in text, "nothing can be edited"
    assert admin_client.get(reverse("admin:django_outbox_archivedmessage_add")).status_code == 403
    delete = reverse("admin:django_outbox_archivedmessage_delete", args=[archived.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert ArchivedMessage.objects.filter(pk=archived.pk).exists()


def test_archive_search_matches_exactly_and_only_exactly(admin_client):
    target = finished("delivered", dt.timedelta(hours=2), key="k-42", idempotency_key="idem-42", topic="search.me")
    finished("delivered", dt.timedelta(hours=2), key="k-420", idempotency_key="idem-420", topic="search.me.not")
    housekeeping.run("default")
    assert ArchivedMessage.objects.count() == 2
    changelist = reverse("admin:django_outbox_archivedmessage_changelist")

    def found(term: str) -> list[int]:
        return [m.pk for m in admin_client.get(changelist, {"q": term}).context["cl"].result_list]

    for term in (str(target.uuid), "idem-42", "k-42", "search.me", str(target.pk)):
        assert found(term) == [target.pk], term
    assert found("idem-4") == []  # a prefix is not a match: each term is an index probe
    assert found("no such thing") == []
