"""The archive and the email log write a moment as the message pages do: ``2026-01-05
06:41:55`` in the current time zone, not Django's "Jan. 5, 2026, 6:41 a.m." beside it.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import strip_tags

from django_outbox.conf import EMAIL_TOPIC
from django_outbox.retention import housekeeping
from django_outbox.retention.models import ArchivedMessage
from tests.support.factories import MessageFactory, finished

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_archive")]

#: Django's default DATETIME_FORMAT in English: a second way of writing a moment on the page.
DJANGO_WHEN = re.compile(r"\b(Jan|Feb|March|April|May|June|July|Aug|Sept|Oct|Nov|Dec)\.? \d{1,2}, \d{4}")


def text_of(admin_client, url: str) -> str:
    response = admin_client.get(url)
    assert response.status_code == 200
    return " ".join(strip_tags(response.content.decode()).split())


def written(moment: dt.datetime) -> str:
    shown = timezone.localtime(moment) if timezone.is_aware(moment) else moment
    return shown.strftime("%Y-%m-%d %H:%M:%S")


def test_the_archive_list_and_page_write_moments_as_the_message_pages(admin_client):
    message = finished("delivered", dt.timedelta(hours=2))
    housekeeping.run("default")
    archived = ArchivedMessage.objects.get(id=message.id)
    assert archived.delivered_at is not None

    listing = text_of(admin_client, reverse("admin:django_outbox_archivedmessage_changelist"))
    page = text_of(admin_client, reverse("admin:django_outbox_archivedmessage_change", args=[archived.pk]))
    for name, text in (("list", listing), ("page", page)):
        assert written(archived.created_at) in text, name
        assert written(archived.delivered_at) in text, name
        assert written(archived.archived_at) in text, name
        assert not DJANGO_WHEN.search(text), (name, DJANGO_WHEN.findall(text))
    attempt = archived.attempt_log.get()  # the attempts' inline too
    assert written(attempt.started_at) in page


def test_the_email_log_list_and_page_write_moments_as_the_message_pages(admin_client):
    sent = timezone.now() - dt.timedelta(days=3, minutes=7)
    email = MessageFactory.create(
        topic=EMAIL_TOPIC,
        payload={"subject": "Your order", "to": ["a@example.com"]},
        created_at=sent,
        available_at=sent,
        status="delivered",
        delivered_at=sent + dt.timedelta(seconds=2),
    )

    listing = text_of(admin_client, reverse("admin:django_outbox_outboxemail_changelist"))
    page = text_of(admin_client, reverse("admin:django_outbox_outboxemail_change", args=[email.pk]))
    assert written(sent) in listing
    assert not DJANGO_WHEN.search(listing), DJANGO_WHEN.findall(listing)
    assert written(sent) in page and written(email.delivered_at) in page
    assert not DJANGO_WHEN.search(page), DJANGO_WHEN.findall(page)


def test_the_message_lists_when_names_its_moment_and_sorts_by_it(admin_client):
    """One "when" column instead of "available at" and "delivered at", so the list fits 1280 px beside
    Django's sidebar: each row names the moment it shows, and sorting goes by that moment."""
    now = timezone.now()
    due = MessageFactory.create(available_at=now + dt.timedelta(hours=1))
    delivered = MessageFactory.create(
        status="delivered", available_at=now - dt.timedelta(days=2), delivered_at=now - dt.timedelta(hours=1)
    )
    dead = MessageFactory.create(status="dead", available_at=now - dt.timedelta(days=1))
    listing = reverse("admin:django_outbox_message_changelist")
    html = admin_client.get(listing).content.decode()
    text = " ".join(strip_tags(html).split())
    assert f"due {written(due.available_at)}" in text
    assert f"delivered {written(delivered.delivered_at)}" in text
    assert f"last due {written(dead.available_at)}" in text
    assert "available at" not in text.lower() and "delivered at" not in text.lower()

    header = html[html.index("column-when_display") :]
    sort = re.search(r'href="(\?o=[^"]+)"', header[: header.index("</th>")])
    assert sort, "the when column sorts"
    ordered = admin_client.get(listing + sort.group(1).replace("&amp;", "&")).content.decode()
    shown = [int(i) for i in re.findall(r'<th class="field-id"><a href="[^"]+/(\d+)/change/', ordered)]
    assert shown == [dead.pk, delivered.pk, due.pk]  # by the moment shown, not by available_at
