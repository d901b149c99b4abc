from __future__ import annotations

import email
import email.policy
import re
import time

import django
import pytest
from django.core import mail, signing
from django.core.mail import EmailMessage, EmailMultiAlternatives
from django.db import transaction
from django.template import Context, Template
from django.test import override_settings
from django.urls import reverse

from django_outbox import outbox
from django_outbox.checks import check_settings
from django_outbox.conf import EMAIL_TOPIC
from django_outbox.mail import ReusedBrowserLinkError, browser_link
from django_outbox.mail.links import view_url
from django_outbox.mail.models import OutboxEmail
from django_outbox.mail.payload import header
from django_outbox.models import Message
from tests.support.mail import relay
from tests.support.servers import SMTPServer, free_port

pytestmark = pytest.mark.django_db(transaction=True)

BINARY = bytes(range(256)) * 8 + b"\x00\xff\r\n.\r\n"


def full_email() -> EmailMultiAlternatives:
    message = EmailMultiAlternatives(
        subject="Ihre Bestellung #42 ist bestätigt ✓",
        body="Plain text body\nwith two lines.\n",
        from_email="Shop <shop@example.com>",
        to=["Ann <ann@example.com>", "bob@example.com"],
        cc=["carol@example.com"],
        bcc=["dave@example.com"],
        reply_to=["support@example.com"],
        headers={"X-Campaign": "spring", "List-Unsubscribe": "<https://example.com/u/1>"},
    )
    message.attach_alternative("<p>Hello <b>Ann</b> ✓</p>", "text/html")
    message.attach("data.bin", BINARY, "application/octet-stream")
    message.attach("notes.txt", "some notes\n", "text/plain")
    return message


def canonical(data: bytes) -> bytes:
    """The bytes with the random MIME boundaries replaced, so two renderings can be compared exactly."""
    parsed = email.message_from_bytes(data)
    for index, part in enumerate(p for p in parsed.walk() if p.is_multipart()):
        boundary = part.get_boundary()
        assert boundary
        data = data.replace(boundary.encode(), f"BOUNDARY-{index}".encode())
    return data.replace(b"\r\n", b"\n")


def text_of(part) -> str:
    return str(part.get_content()).replace("\r\n", "\n")


def smtp_bytes(message: EmailMessage) -> bytes:
    """What Django's SMTP backend would put on the wire for ``message``."""
    if django.VERSION >= (6, 0):
        return message.message(policy=email.policy.SMTP).as_bytes()
    return message.message().as_bytes(linesep="\r\n")  # type: ignore[call-arg]


def test_emails_are_written_in_the_callers_transaction(smtp):
    with pytest.raises(RuntimeError), transaction.atomic():
        mail.send_mail("rolled back", "body", "shop@example.com", ["ann@example.com"])
        assert Message.objects.filter(topic=EMAIL_TOPIC).count() == 1
        raise RuntimeError("the business transaction fails")
    assert not Message.objects.filter(topic=EMAIL_TOPIC).exists()
    assert mail.send_mail("kept", "body", "shop@example.com", ["ann@example.com"]) == 1
    assert smtp.received == []  # nothing is sent by the web process
    (message,) = Message.objects.filter(topic=EMAIL_TOPIC)
    assert message.payload["subject"] == "kept"
    assert message.payload["to"] == ["ann@example.com"]
    relay()
    assert [r.rcpt_tos for r in smtp.received] == [["ann@example.com"]]


def test_full_message_round_trips_to_a_real_smtp_server(smtp):
    original = full_email()
    assert original.send() == 1
    stored = Message.objects.get(topic=EMAIL_TOPIC)
    worker = relay()
    assert worker.stats.delivered == 1
    stored.refresh_from_db()
    assert stored.status == Message.Status.DELIVERED
    (received,) = smtp.received
    assert received.mail_from == "shop@example.com"
    assert received.rcpt_tos == ["ann@example.com", "bob@example.com", "carol@example.com", "dave@example.com"]

    # Byte for byte what Django would have sent from the caller's process (same Date and Message-ID).
    original.extra_headers.update({k: v for k, v in stored.payload["headers"] if k.lower() in ("date", "message-id")})
    assert canonical(received.data) == canonical(smtp_bytes(original))

    parsed = email.message_from_bytes(received.data, policy=email.policy.default)
    assert parsed["Subject"] == "Ihre Bestellung #42 ist bestätigt ✓"
    assert parsed["To"] == "Ann <ann@example.com>, bob@example.com"
    assert parsed["Cc"] == "carol@example.com"
    assert parsed["Bcc"] is None
    assert parsed["Reply-To"] == "support@example.com"
    assert parsed["X-Campaign"] == "spring"
    assert parsed["Message-ID"] == header(stored.payload, "Message-ID")
    assert text_of(parsed.get_body(("plain",))) == "Plain text body\nwith two lines.\n"
    assert text_of(parsed.get_body(("html",))).strip() == "<p>Hello <b>Ann</b> ✓</p>"
    attachments = {part.get_filename(): part for part in parsed.iter_attachments()}
    assert attachments["data.bin"].get_content() == BINARY
    assert text_of(attachments["notes.txt"]) == "some notes\n"


def test_mime_attachments_round_trip(smtp):
    from email.mime.image import MIMEImage

    image = MIMEImage(b"GIF89a\x01\x00\x01\x00\x00\xff\x00,binary", "gif")
    image.add_header("Content-ID", "<logo>")
    message = EmailMultiAlternatives("inline", "text", "shop@example.com", ["ann@example.com"])
    message.attach_alternative('<img src="cid:logo">', "text/html")
    if django.VERSION >= (6, 0):
        part = email.message.MIMEPart()
        part.set_content(b"GIF89a\x01\x00\x01\x00\x00\xff\x00,binary", "image", "gif", cid="<logo>")
        message.attach(part)
    else:
        message.attach(image)
    message.send()
    relay()
    (received,) = smtp.received
    parsed = email.message_from_bytes(received.data, policy=email.policy.default)
    (logo,) = [p for p in parsed.walk() if p["Content-ID"] == "<logo>"]
    assert logo.get_content_type() == "image/gif"
    assert logo.get_content() == b"GIF89a\x01\x00\x01\x00\x00\xff\x00,binary"


def test_send_mass_mail_writes_one_message_per_email(smtp):
    sent = mail.send_mass_mail(
        [
            ("first", "one", "shop@example.com", ["ann@example.com"]),
            ("second", "two", "shop@example.com", ["bob@example.com"]),
            ("nobody", "skipped like Django's SMTP backend does", "shop@example.com", []),
        ]
    )
    assert sent == 2
    assert Message.objects.filter(topic=EMAIL_TOPIC).count() == 2
    relay()
    subjects = sorted(email.message_from_bytes(r.data)["Subject"] for r in smtp.received)
    assert subjects == ["first", "second"]


def test_server_down_is_retried_later_then_delivered(mail_via_outbox, settings):
    port = free_port()
    mail_via_outbox(port)  # nothing listens there yet
    # a retry a minute away (it is made due by hand below): the suite's 50 ms let a loaded machine retry
    settings.OUTBOX = {**settings.OUTBOX, "BACKOFF_BASE_SECONDS": 60, "BACKOFF_MAX_SECONDS": 120}
    mail.send_mail("patience", "body", "shop@example.com", ["ann@example.com"])
    before = time.time()
    relay()
    message = Message.objects.get(topic=EMAIL_TOPIC)
    assert message.status == Message.Status.PENDING
    assert message.attempts == 1
    assert message.available_at.timestamp() > before
    assert "could not talk to the mail server" in message.last_error
    assert "ConnectionRefusedError" in message.last_error

    server = SMTPServer(port)
    try:
        Message.objects.filter(pk=message.pk).update(available_at=message.created_at)  # due now
        relay()
        message.refresh_from_db()
        assert message.status == Message.Status.DELIVERED
        assert message.attempts == 2
        assert len(server.received) == 1
    finally:
        server.stop()


def test_permanent_refusal_of_every_recipient_is_dead_with_the_reply(smtp):
    smtp.handler.refuse = {
        "ghost@example.com": "550 5.1.1 <ghost@example.com>: Recipient address rejected: no such user",
        "gone@example.com": "551 5.1.6 user has moved",
    }
    mail.send_mail("lost", "body", "shop@example.com", ["ghost@example.com", "gone@example.com"])
    relay()
    message = Message.objects.get(topic=EMAIL_TOPIC)
    assert message.status == Message.Status.DEAD
    assert message.attempts == 1
    assert "refused every recipient" in message.last_error
    assert "550 5.1.1 <ghost@example.com>: Recipient address rejected: no such user" in message.last_error
    assert "551 5.1.6 user has moved" in message.last_error
    assert smtp.received == []


def test_temporary_refusal_is_retried(smtp):
    smtp.handler.refuse = {"busy@example.com": "450 4.2.1 mailbox busy, try later"}
    mail.send_mail("later", "body", "shop@example.com", ["busy@example.com"])
    relay()
    message = Message.objects.get(topic=EMAIL_TOPIC)
    assert message.status == Message.Status.PENDING
    assert "450 4.2.1 mailbox busy" in message.last_error


def test_partial_refusal_delivers_to_the_others(smtp):
    smtp.handler.refuse = {"ghost@example.com": "550 no such user"}
    mail.send_mail("some", "body", "shop@example.com", ["ann@example.com", "ghost@example.com"])
    relay()
    assert Message.objects.get(topic=EMAIL_TOPIC).status == Message.Status.DELIVERED
    assert [r.rcpt_tos for r in smtp.received] == [["ann@example.com"]]


def test_view_in_browser_link_rendered_into_the_email(smtp, client):
    link = browser_link()
    html = Template('<p>Hi {{ name }}</p><a href="{{ view_url }}">View in browser</a>').render(
        Context({"name": "Ann <3", "view_url": link})
    )
    message = EmailMultiAlternatives("news", "text", "shop@example.com", ["ann@example.com"])
    message.attach_alternative(html, "text/html")
    message.send()
    stored = Message.objects.get(topic=EMAIL_TOPIC)
    assert stored.payload["view_id"] and stored.payload["view_id"] in signing.TimestampSigner(
        salt="django_outbox.mail.view"
    ).unsign(link.rsplit("/", 2)[1])

    response = client.get(link)
    assert response.status_code == 200
    assert response.content.decode() == html
    assert "sandbox" in response["Content-Security-Policy"]
    assert response["Referrer-Policy"] == "no-referrer"

    relay()  # the link in the delivered email is the same one
    assert link.encode() in smtp.received[0].data.replace(b"=\r\n", b"")


def test_every_html_email_gets_a_link_and_bad_tokens_are_404(smtp, client, monkeypatch):
    mail.send_mail("html", "text", "shop@example.com", ["ann@example.com"], html_message="<h1>Sale</h1>")
    mail.send_mail("plain", "text only", "shop@example.com", ["ann@example.com"])
    html_message = Message.objects.get(topic=EMAIL_TOPIC, payload__subject="html")
    plain = Message.objects.get(topic=EMAIL_TOPIC, payload__subject="plain")
    assert plain.payload["view_id"] is None and plain.idempotency_key is None
    url = view_url(html_message.payload["view_id"])
    assert client.get(url).content == b"<h1>Sale</h1>"

    token = url.rstrip("/").rsplit("/", 1)[1]
    tampered = url.replace(token, token[:-1] + ("A" if token[-1] != "A" else "B"))
    assert client.get(tampered).status_code == 404
    forged = url.replace(token, html_message.payload["view_id"])
    assert client.get(forged).status_code == 404

    real_time = time.time
    monkeypatch.setattr("django.core.signing.time.time", lambda: real_time() - 31 * 24 * 3600)
    old_url = view_url(html_message.payload["view_id"])
    monkeypatch.undo()
    assert client.get(old_url).status_code == 404
    with override_settings(OUTBOX={"EMAIL_VIEW_MAX_AGE_SECONDS": 40 * 24 * 3600}):
        assert client.get(old_url).status_code == 200


def test_absolute_links_use_the_base_url(settings):
    settings.OUTBOX = {**settings.OUTBOX, "EMAIL_VIEW_BASE_URL": "https://shop.example.com/"}
    assert re.fullmatch(r"https://shop\.example\.com/outbox/email/[\w:-]+/", browser_link())


def test_reusing_a_link_for_another_email_is_refused(smtp):
    link = browser_link()
    mail.send_mail("a", "text", "shop@example.com", ["ann@example.com"], html_message=f'<a href="{link}">v</a>')
    with pytest.raises(ReusedBrowserLinkError, match="call browser_link\\(\\) once for each email"):
        mail.send_mail("b", "text", "shop@example.com", ["bob@example.com"], html_message=f'<a href="{link}">v</a>')
    assert Message.objects.filter(topic=EMAIL_TOPIC).count() == 1


def test_email_topic_is_served_even_with_a_catch_all_route(smtp, settings):
    settings.OUTBOX = {
        **settings.OUTBOX,
        "TRANSPORTS": {"elsewhere": {"BACKEND": "django_outbox.transports.handler.HandlerTransport"}},
        "ROUTES": {"*": "elsewhere"},
    }
    mail.send_mail("routed", "body", "shop@example.com", ["ann@example.com"])
    relay()
    assert len(smtp.received) == 1


def test_checks_catch_a_worker_backend_that_loops_or_is_missing(settings):
    def ids() -> set[str]:
        return {m.id or "" for m in check_settings() if (m.id or "").startswith("django_outbox.E04")}

    settings.OUTBOX = {**settings.OUTBOX, "EMAIL_BACKEND": "django_outbox.mail.EmailBackend"}
    assert ids() == {"django_outbox.E040"}
    settings.OUTBOX = {**settings.OUTBOX, "EMAIL_BACKEND": "no.such.Backend"}
    assert ids() == {"django_outbox.E040"}
    settings.OUTBOX = {**settings.OUTBOX, "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend"}
    assert ids() == set()


def test_check_warns_when_links_cannot_be_built(smtp, settings):
    settings.ROOT_URLCONF = "tests.urls_without_outbox"
    assert "django_outbox.W040" in {m.id for m in check_settings()}
    settings.ROOT_URLCONF = "testproject.urls"
    assert "django_outbox.W040" not in {m.id for m in check_settings()}


@pytest.fixture
def emails(smtp):
    mail.send_mail("Welcome <b>", "plain body", "shop@example.com", ["ann@example.com"], html_message=SCRIPTED)
    mail.send_mail("Text only", "just <text>", "shop@example.com", ["bob@example.com"])
    return {m.subject: m for m in OutboxEmail.objects.all()}


SCRIPTED = '<h1>Hi</h1><script>document.title="pwned"</script><img src="https://tracker.example.com/p.gif">'


def test_email_log_lists_only_emails(emails, admin_client, handler):
    handler("probe.other", lambda m: None)
    outbox.send("probe.other", {"subject": "not an email"})
    response = admin_client.get(reverse("admin:django_outbox_outboxemail_changelist"))
    assert response.status_code == 200
    page = response.content.decode()
    assert "Welcome &lt;b&gt;" in page and "Text only" in page
    assert "ann@example.com" in page and "bob@example.com" in page
    assert "not an email" not in page
    assert OutboxEmail.objects.count() == 2


def test_email_detail_has_a_sandboxed_preview(emails, admin_client):
    email_row = emails["Welcome <b>"]
    page = admin_client.get(reverse("admin:django_outbox_outboxemail_change", args=[email_row.pk])).content.decode()
    (iframe,) = re.findall(r"<iframe[^>]*>", page)
    assert re.search(r"\ssandbox[\s>]", iframe) and "allow-" not in iframe
    src = re.search(r'src="([^"]+)"', iframe)
    assert src is not None
    preview_url = src.group(1)
    assert "pending" in page and "ann@example.com" in page
    assert "/outbox/email/" in page  # the public view-in-browser link

    preview = admin_client.get(preview_url)
    assert preview.status_code == 200
    assert preview.content.decode() == SCRIPTED
    policy = preview["Content-Security-Policy"]
    assert policy.startswith("sandbox;") and "script-src" not in policy and "img-src data:" in policy
    assert preview["X-Frame-Options"] == "SAMEORIGIN"

    text = admin_client.get(
        reverse("admin:django_outbox_outboxemail_preview", args=[emails["Text only"].pk])
    ).content.decode()
    assert text == '<pre style="white-space:pre-wrap">just &lt;text&gt;</pre>'


def test_email_log_is_read_only_and_staff_only(emails, admin_client, client):
    url = reverse("admin:django_outbox_outboxemail_preview", args=[emails["Welcome <b>"].pk])
    response = client.get(url)
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert admin_client.get(reverse("admin:django_outbox_outboxemail_add")).status_code == 403
    change = admin_client.post(reverse("admin:django_outbox_outboxemail_change", args=[emails["Text only"].pk]), {})
    assert change.status_code == 403
