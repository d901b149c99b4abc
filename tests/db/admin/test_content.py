"""Who may read what in the admin: ``view_*`` shows the log, ``view_message_content`` shows the content.

The attack these tests stand for: a view-only "helpdesk" staff user asks for a
password reset of the superuser, reads the reset link in the outbox admin and takes the account over.
Every page that can show a message is read here twice, once as a view-only user (no email body, HTML,
Bcc, attachment content, secret header or sensitive payload anywhere in the HTML) and once with the
content permission (all of it, and one audit record per reveal).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from typing import Any

import pytest
from django.contrib.auth.forms import PasswordResetForm
from django.contrib.auth.models import Permission, User
from django.contrib.auth.tokens import default_token_generator
from django.core import mail
from django.core.mail import EmailMultiAlternatives
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from django_outbox import outbox
from django_outbox.admin.redaction import AUDIT_LOGGER, CONTENT_PERMISSION
from django_outbox.conf import EMAIL_TOPIC, _parse
from django_outbox.mail.models import OutboxEmail
from django_outbox.mail.password_reset import PASSWORD_RESET
from django_outbox.models import Attempt, Message
from django_outbox.retention import housekeeping
from django_outbox.retention.models import ArchivedMessage
from tests.support.factories import AttemptFactory, MessageFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_archive")]

VIEW_ONLY = ("view_message", "view_outboxemail", "view_archivedmessage", "view_archivedattempt")
RESET_LINK = re.compile(r"/accounts/reset/(?P<uid>[\w-]+)/(?P<token>[\w-]+)/")
BODY_SECRET = "body-secret-7f3a9c2e"
HTML_SECRET = "html-secret-51d0be44"
BCC = "hidden-auditor@example.org"
ATTACHMENT_SECRET = "attachment-secret-90ab12"
HEADER_SECRET = "header-secret-c0ffee11"
CARD = "4242424242424242"


def staff(username: str, *codenames: str) -> Client:
    user = User.objects.create_user(username, f"{username}@example.com", "pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_outbox", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def outbox_mail(mail_via_outbox):
    mail_via_outbox(1)  # nothing is delivered in these tests; emails stay in the outbox


@pytest.fixture
def superuser() -> User:
    return User.objects.create_superuser("root", "root@example.com", "old-password")


def reset_email(superuser: User) -> tuple[OutboxEmail, str]:
    """A password reset of the superuser, asked for anonymously through Django's own view."""
    response = Client().post(reverse("password_reset"), {"email": superuser.email})
    assert response.status_code == 302
    (stored,) = [m for m in OutboxEmail.objects.order_by("-id") if superuser.email in m.payload["to"]][:1]
    found = RESET_LINK.search(stored.payload["body"])
    assert found is not None, stored.payload["body"]
    assert default_token_generator.check_token(superuser, found["token"])
    return stored, found["token"]


def full_email() -> OutboxEmail:
    message = EmailMultiAlternatives(
        subject="Your invoice",
        body=f"Plain {BODY_SECRET}",
        from_email="shop@example.com",
        to=["ann@example.com"],
        cc=["carol@example.com"],
        bcc=[BCC],
        headers={"X-Campaign": "spring", "X-Api-Token": HEADER_SECRET},
    )
    message.attach_alternative(f"<p>{HTML_SECRET}</p>", "text/html")
    message.attach("invoice.txt", f"{ATTACHMENT_SECRET}\n", "text/plain")
    message.send()
    return OutboxEmail.objects.get(payload__subject="Your invoice")


def pages(email: Message) -> dict[str, str]:
    return {
        "message list": reverse("admin:django_outbox_message_changelist"),
        "message list, emails": reverse("admin:django_outbox_message_changelist") + f"?topic={EMAIL_TOPIC}",
        "message": reverse("admin:django_outbox_message_change", args=[email.pk]),
        "email log": reverse("admin:django_outbox_outboxemail_changelist"),
        "email": reverse("admin:django_outbox_outboxemail_change", args=[email.pk]),
        "overview": reverse("admin:django_outbox_message_overview"),
        "history": reverse("admin:django_outbox_message_history", args=[email.pk]),
    }


def html_of(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def audit_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == AUDIT_LOGGER]


# --- view-only -------------------------------------------------------------------------------------


def test_a_view_only_user_finds_no_reset_token_and_no_email_content(outbox_mail, superuser, caplog):
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    reset, token = reset_email(superuser)
    invoice = full_email()
    helpdesk = staff("helpdesk", *VIEW_ONLY)
    secrets = (token, BODY_SECRET, HTML_SECRET, BCC, ATTACHMENT_SECRET, HEADER_SECRET)
    for email in (reset, invoice):
        for name, url in pages(email).items():
            page = html_of(helpdesk, url)
            for secret in secrets:
                assert secret not in page, (name, secret)
    page = html_of(helpdesk, pages(invoice)["email"])
    # What the operator needs stays visible: subject, sender, To and Cc, status, attachment names.
    for shown in ("Your invoice", "shop@example.com", "ann@example.com", "carol@example.com", "pending", "invoice.txt"):
        assert shown in page, shown
    assert "view_message_content" in page  # says why the rest is hidden
    message_page = html_of(helpdesk, pages(invoice)["message"])
    assert "X-Campaign" in message_page and "spring" in message_page and "X-Api-Token" in message_page
    # The preview and its iframe are content: refused outright.
    preview = reverse("admin:django_outbox_outboxemail_preview", args=[reset.pk])
    assert helpdesk.get(preview).status_code == 403
    assert "<iframe" not in page
    assert audit_records(caplog) == []


def test_the_reset_token_never_reaches_a_view_only_user_through_a_lookup(outbox_mail, superuser):
    """Filtering the list on the payload would be an oracle: one request per guessed character."""
    reset, token = reset_email(superuser)
    helpdesk = staff("helpdesk", *VIEW_ONLY)
    for base in (
        reverse("admin:django_outbox_message_changelist"),
        reverse("admin:django_outbox_outboxemail_changelist"),
        reverse("admin:django_outbox_archivedmessage_changelist"),
    ):
        for lookup in ("payload__body__icontains", "payload__icontains", "headers__icontains", "last_error__contains"):
            response = helpdesk.get(base, {lookup: token[:3]})
            assert response.status_code == 400, (base, lookup, response.status_code)
    for term in (token, token[:6], reset.payload["body"][:40]):  # search: exact columns only, never the payload
        response = helpdesk.get(reverse("admin:django_outbox_message_changelist"), {"q": term})
        assert list(response.context["cl"].result_list) == []


def test_a_view_only_user_cannot_take_over_the_superuser(outbox_mail, superuser):
    """The reproduction of the report, end to end, now fails at the step of reading the token."""
    reset, _token = reset_email(superuser)
    helpdesk = staff("helpdesk", *VIEW_ONLY)
    seen = "".join(html_of(helpdesk, url) for url in pages(reset).values())
    assert RESET_LINK.search(seen) is None
    superuser.refresh_from_db()
    assert superuser.check_password("old-password")


# --- the content permission --------------------------------------------------------------------------


def test_the_content_permission_shows_everything_and_each_reveal_is_audited(outbox_mail, superuser, caplog):
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    reset, token = reset_email(superuser)
    invoice = full_email()
    reader = staff("auditor", *VIEW_ONLY, "view_message_content")
    assert User.objects.get(username="auditor").has_perm(CONTENT_PERMISSION)

    before = timezone.now()
    message_page = html_of(reader, pages(reset)["message"])
    assert token in message_page
    records = audit_records(caplog)
    assert len(records) == 1
    (record,) = records
    assert record.levelno == logging.INFO
    assert record.user == "auditor" and record.user_id == User.objects.get(username="auditor").pk
    assert record.message_id == reset.pk and record.message_uuid == str(reset.uuid)
    assert record.topic == EMAIL_TOPIC and record.reason == PASSWORD_RESET and record.view == "message"
    assert before <= dt.datetime.fromisoformat(record.revealed_at) <= timezone.now()
    assert "auditor" in record.getMessage() and str(reset.pk) in record.getMessage()

    page = html_of(reader, pages(invoice)["email"])
    assert BCC in page and "<iframe" in page and "/outbox/email/" in page
    preview = reader.get(reverse("admin:django_outbox_outboxemail_preview", args=[invoice.pk]))
    assert preview.status_code == 200 and HTML_SECRET in preview.content.decode()
    message_page = html_of(reader, pages(invoice)["message"])
    for secret in (BODY_SECRET, HTML_SECRET, BCC, HEADER_SECRET, ATTACHMENT_SECRET):
        assert secret in message_page, secret
    views = [(r.view, r.message_id) for r in audit_records(caplog)]
    assert views == [
        ("message", reset.pk),
        ("email", invoice.pk),
        ("email_preview", invoice.pk),
        ("message", invoice.pk),
    ]

    # Lists show no content to anyone, so they reveal nothing and log nothing.
    caplog.clear()
    for name in ("message list", "email log", "overview"):
        page = html_of(reader, pages(invoice)[name])
        assert BODY_SECRET not in page and BCC not in page
    assert audit_records(caplog) == []


def test_a_superuser_has_the_content_permission(outbox_mail, superuser, caplog, admin_client):
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    invoice = full_email()
    assert BODY_SECRET in html_of(admin_client, pages(invoice)["message"])
    assert [r.user for r in audit_records(caplog)] == ["admin"]


# --- sensitive topics and secret headers ------------------------------------------------------------------


@override_settings(OUTBOX={"SENSITIVE_TOPICS": ["payments.*"], "ROUTES": {"*": "handler"}})
def test_sensitive_topics_hide_their_payloads_other_topics_stay_visible(caplog):
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    payment = outbox.send("payments.captured", {"card": CARD, "amount": 12})
    order = outbox.send("orders.created", {"order": "ord-7781"}, headers={"Authorization": f"Bearer {HEADER_SECRET}"})
    helpdesk = staff("helpdesk", *VIEW_ONLY)
    payment_page = html_of(helpdesk, reverse("admin:django_outbox_message_change", args=[payment.pk]))
    assert CARD not in payment_page and "payments.captured" in payment_page
    assert "view_message_content" in payment_page
    order_page = html_of(helpdesk, reverse("admin:django_outbox_message_change", args=[order.pk]))
    assert "ord-7781" in order_page  # not sensitive: the operator reads it
    assert HEADER_SECRET not in order_page and "Authorization" in order_page
    assert audit_records(caplog) == []

    reader = staff("auditor", *VIEW_ONLY, "view_message_content")
    assert CARD in html_of(reader, reverse("admin:django_outbox_message_change", args=[payment.pk]))
    assert HEADER_SECRET in html_of(reader, reverse("admin:django_outbox_message_change", args=[order.pk]))
    assert [(r.message_id, r.reason) for r in audit_records(caplog)] == [
        (payment.pk, "sensitive topic"),
        (order.pk, "secret header"),
    ]


@override_settings(OUTBOX={"SENSITIVE_TOPICS": ["payments.*"], "ROUTES": {"*": "handler"}})
def test_errors_of_protected_messages_do_not_echo_their_content():
    """A handler or a receiver that quotes the payload in its error must not leak it through the log."""
    payment = MessageFactory.create(
        topic="payments.captured",
        payload={"card": CARD},
        status=Message.Status.DEAD,
        last_error=f"Traceback ...\nValueError: card {CARD} declined",
    )
    AttemptFactory.create(message=payment, outcome=Attempt.Outcome.FAILED, error=f"ValueError: card {CARD} declined")
    helpdesk = staff("helpdesk", *VIEW_ONLY)
    for url in (
        reverse("admin:django_outbox_message_changelist"),
        reverse("admin:django_outbox_message_change", args=[payment.pk]),
    ):
        page = html_of(helpdesk, url)
        assert CARD not in page
        assert "declined" in page  # the rest of the error is still there for the operator
    reader = staff("auditor", *VIEW_ONLY, "view_message_content")
    assert CARD in html_of(reader, reverse("admin:django_outbox_message_change", args=[payment.pk]))


def test_an_smtp_refusal_of_a_bcc_address_does_not_show_it(outbox_mail):
    invoice = full_email()
    error = f"the SMTP server refused every recipient: {BCC}: 550 no such user"
    Message.objects.filter(pk=invoice.pk).update(status=Message.Status.DEAD, last_error=error)
    AttemptFactory.create(message=invoice, outcome=Attempt.Outcome.FAILED, error=error)
    helpdesk = staff("helpdesk", *VIEW_ONLY)
    for url in (
        reverse("admin:django_outbox_message_changelist"),
        reverse("admin:django_outbox_message_change", args=[invoice.pk]),
        reverse("admin:django_outbox_outboxemail_change", args=[invoice.pk]),
    ):
        page = html_of(helpdesk, url)
        assert BCC not in page and "550 no such user" in page, url
    # The list masks it for everyone (it audits nothing); the message's page shows it to the permission.
    reader = staff("auditor", *VIEW_ONLY, "view_message_content")
    page = html_of(reader, reverse("admin:django_outbox_message_changelist"))
    assert BCC not in page and "550 no such user" in page
    assert BCC in html_of(reader, reverse("admin:django_outbox_message_change", args=[invoice.pk]))


# --- the archive -------------------------------------------------------------------------------------------


def test_the_archive_hides_content_from_view_only_users(outbox_mail, superuser, caplog):
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    reset, token = reset_email(superuser)
    long_ago = timezone.now() - dt.timedelta(hours=3)
    Message.objects.filter(pk=reset.pk).update(
        status=Message.Status.DELIVERED, created_at=long_ago, delivered_at=long_ago, attempts=1
    )
    AttemptFactory.create(message=reset, started_at=long_ago, finished_at=long_ago, error=f"echo {token}")
    assert housekeeping.run("default").archived == 1
    archived = ArchivedMessage.objects.get()
    helpdesk = staff("helpdesk", *VIEW_ONLY)
    detail = reverse("admin:django_outbox_archivedmessage_change", args=[archived.pk])
    for url in (reverse("admin:django_outbox_archivedmessage_changelist"), detail):
        page = html_of(helpdesk, url)
        assert token not in page
    assert "root@example.com" in html_of(helpdesk, detail)
    assert audit_records(caplog) == []

    reader = staff("auditor", *VIEW_ONLY, "view_message_content")
    assert token in html_of(reader, detail)
    assert [(r.view, r.message_id, r.reason) for r in audit_records(caplog)] == [
        ("archive", archived.pk, PASSWORD_RESET)
    ]


# --- recognising password-reset mail -------------------------------------------------------------------------


class ResetForm(PasswordResetForm):
    """A project's own reset form: its own subject, its own wording."""


def test_password_reset_mail_is_recognised_by_the_form_not_by_its_subject(outbox_mail, superuser, settings):
    form = ResetForm({"email": superuser.email})
    assert form.is_valid()
    form.save(
        domain_override="testserver",
        subject_template_name="registration/password_change_done.html",  # any template: not the usual subject
        html_email_template_name="registration/password_reset_email.html",
    )
    stored = OutboxEmail.objects.get()
    assert stored.payload["protected"] == PASSWORD_RESET
    assert stored.html is not None and stored.payload["view_id"] is None  # no public view-in-browser link
    assert stored.idempotency_key is None

    # The same words sent by other code are an ordinary email.
    mail.send_mail("Password reset on testserver", "/accounts/reset/x/y/", "a@example.com", ["b@example.com"])
    ordinary = OutboxEmail.objects.exclude(pk=stored.pk).get()
    assert "protected" not in ordinary.payload


# --- the setting -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["payments.*", ["payments.*", ""], [None], {"payments.*": True}, [b"x"], 7, ("ok", 3)]
)
def test_sensitive_topics_must_be_a_list_of_patterns(value: Any):
    _, problems = _parse({"SENSITIVE_TOPICS": value})
    assert [p.id for p in problems] == ["django_outbox.E003"]
    assert "SENSITIVE_TOPICS" in problems[0].msg


@pytest.mark.parametrize("value", [[], ["payments.*"], ("payments.*", "*.secret")])
def test_sensitive_topics_accepts_lists_and_tuples(value: Any):
    parsed, problems = _parse({"SENSITIVE_TOPICS": value})
    assert problems == [] and parsed.SENSITIVE_TOPICS == tuple(value)


@override_settings(OUTBOX={"SENSITIVE_TOPICS": ["payments.*"], "ROUTES": {"*": "handler"}})
def test_a_field_shown_without_the_admin_deciding_hides_content():
    """Fields fail closed: an object that did not come through the admin's get_object() shows no content."""
    from django.contrib import admin as django_admin

    payment = MessageFactory.create(topic="payments.captured", payload={"card": CARD}, last_error=f"bad {CARD}")
    message_admin = django_admin.site._registry[Message]
    assert CARD not in message_admin.payload_display(payment)
    assert CARD not in message_admin.last_error_display(payment)
    assert CARD not in message_admin.error_excerpt(payment)
    email = MessageFactory.create(topic=EMAIL_TOPIC, payload={"body": BODY_SECRET, "bcc": [BCC], "to": ["a@b.c"]})
    assert BODY_SECRET not in message_admin.payload_display(email) and BCC not in message_admin.payload_display(email)


@override_settings(OUTBOX={"SENSITIVE_TOPICS": ["payments.*"]})
def test_masking_survives_hostile_payloads():
    """Deep nesting, a megabyte of values and short values: masked without recursion, in one pass each."""
    from django_outbox.admin.redaction import MASK, SENSITIVE_TOPIC, Disclosure

    deep: Any = {"pin": "4921"}
    for _ in range(50_000):
        deep = [deep]
    many = {"values": [f"v-{i:07d}-x" for i in range(100_000)], "deep": deep, "address": "4 Elm St", "n": 2**63}
    shown = Disclosure(topic="payments.x", payload=many, headers={}, reason=SENSITIVE_TOPIC, allowed=False)
    error = "pin 4921 at 4 Elm St refused v-0099999-x; card 149210 n=9223372036854775808 " + "\u0000\ud800" * 3
    masked = shown.shown_error(error + "v-0000001-x.")
    assert masked == f"pin {MASK} at {MASK} refused {MASK}; card 149210 n={MASK} " + "\u0000\ud800" * 3 + f"{MASK}."
    assert shown.shown_payload() != many and "4921" not in str(shown.shown_payload())


def test_the_content_permission_alone_opens_nothing(outbox_mail, superuser, caplog):
    """Content is an addition to a view permission, never a way in by itself."""
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    reset, _token = reset_email(superuser)
    content_only = staff("content-only", "view_message_content")
    for url in (
        *pages(reset).values(),
        reverse("admin:django_outbox_outboxemail_preview", args=[reset.pk]),
        reverse("admin:django_outbox_archivedmessage_changelist"),
    ):
        assert content_only.get(url).status_code == 403, url
    messages_only = staff("messages-only", "view_message", "view_message_content")
    assert messages_only.get(pages(reset)["email log"]).status_code == 403
    assert messages_only.get(reverse("admin:django_outbox_outboxemail_preview", args=[reset.pk])).status_code == 403
    assert messages_only.get(reverse("admin:django_outbox_archivedmessage_changelist")).status_code == 403
    assert [r.view for r in audit_records(caplog)] == []


class OwnMailResetForm(PasswordResetForm):
    """A form that writes its email itself instead of through Django's send_mail()."""

    def send_mail(self, subject_template_name, email_template_name, context, from_email, to_email, **kwargs):
        link = f"/accounts/reset/{context['uid']}/{context['token']}/"
        mail.send_mail("Your sign-in link", link, from_email, [to_email], html_message=f"<a href='{link}'>go</a>")


def test_a_form_that_sends_its_own_reset_mail_is_recognised_too(outbox_mail, superuser):
    form = OwnMailResetForm({"email": superuser.email})
    assert form.is_valid()
    form.save(domain_override="testserver")
    stored = OutboxEmail.objects.get()
    assert stored.payload["protected"] == PASSWORD_RESET and stored.payload["view_id"] is None
