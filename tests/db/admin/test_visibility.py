"""The email log and the archive appear in the admin only where the project uses them.

A project that sends no email through the outbox and deletes finished messages has no use for either
page; listing them anyway suggests a feature is on. Hidden pages stay reachable by URL, and showing
them is decided per request, so a change of settings (or the first archived row) shows them at once.
"""

from __future__ import annotations

import datetime as dt

import django
import pytest
from django.test import override_settings
from django.urls import reverse

from django_outbox.conf import EMAIL_TOPIC, EMAIL_TRANSPORT, EMAIL_TRANSPORT_BACKEND
from django_outbox.retention import housekeeping
from tests.support.factories import MessageFactory, finished

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_archive")]

EMAIL_LOG = reverse("admin:django_outbox_outboxemail_changelist")
ARCHIVE = reverse("admin:django_outbox_archivedmessage_changelist")
MESSAGES = reverse("admin:django_outbox_message_changelist")


LOCMEM = "django.core.mail.backends.locmem.EmailBackend"
#: Django 6.1 names its email backends in MAILERS and deprecates EMAIL_BACKEND (reading it warns).
HAS_MAILERS = django.VERSION >= (6, 1)


def mail_elsewhere(settings) -> None:
    """The project sends its email straight to a backend of Django's, not through the outbox."""
    if HAS_MAILERS:
        settings.MAILERS = {"default": {"BACKEND": LOCMEM}}
    else:
        settings.EMAIL_BACKEND = LOCMEM


def listed(admin_client) -> set[str]:
    html = admin_client.get(reverse("admin:index")).content.decode()
    return {name for name, url in (("email", EMAIL_LOG), ("archive", ARCHIVE), ("messages", MESSAGES)) if url in html}


def test_a_project_without_email_or_archive_sees_only_the_messages(admin_client, settings):
    mail_elsewhere(settings)
    settings.OUTBOX = {"RETENTION_MODE": "delete"}
    assert listed(admin_client) == {"messages"}
    assert admin_client.get(EMAIL_LOG).status_code == 200, "hidden, not gone"
    assert admin_client.get(ARCHIVE).status_code == 200


def test_the_archive_is_listed_when_retention_archives(admin_client):
    assert "archive" in listed(admin_client)  # RETENTION_MODE = "archive" is the default


def test_the_archive_is_listed_when_it_holds_rows_from_an_earlier_archive_mode(admin_client):
    finished("delivered", dt.timedelta(hours=2))
    housekeeping.run("default")
    with override_settings(OUTBOX={"RETENTION_MODE": "delete"}):
        assert "archive" in listed(admin_client)


@pytest.mark.parametrize(
    "setup",
    [
        pytest.param(
            {"EMAIL_BACKEND": "django_outbox.mail.EmailBackend"},
            marks=pytest.mark.skipif(HAS_MAILERS, reason="Django 6.1 reads MAILERS, not EMAIL_BACKEND"),
        ),
        {"MAILERS": {"default": {"BACKEND": "django_outbox.mail.EmailBackend"}}},
        {"OUTBOX": {"TRANSPORTS": {"mailer": {"BACKEND": EMAIL_TRANSPORT_BACKEND}}, "ROUTES": {"mail.*": "mailer"}}},
        {"OUTBOX": {"ROUTES": {"notify.*": EMAIL_TRANSPORT}}},
    ],
    ids=["email-backend", "mailers", "transport", "route"],
)
def test_the_email_log_is_listed_when_the_project_sends_email_through_the_outbox(admin_client, settings, setup):
    mail_elsewhere(settings)
    assert "email" not in listed(admin_client)
    with override_settings(**setup):
        assert "email" in listed(admin_client)


def test_the_email_log_is_listed_when_it_holds_emails(admin_client, settings):
    mail_elsewhere(settings)
    MessageFactory.create(topic=EMAIL_TOPIC, payload={"subject": "hi", "to": ["a@example.com"]})
    assert "email" in listed(admin_client)
