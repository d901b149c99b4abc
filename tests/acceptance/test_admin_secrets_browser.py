"""The account takeover, tried for real: a view-only helpdesk user, a real Chromium, a live
server, Django's own ``PasswordResetView``, a real worker sending to a real SMTP server.

The helpdesk user walks every outbox admin page and must find the reset token nowhere, neither in the
HTML nor in the text of any page or frame. Then the test shows the token was real: it is in the email
the SMTP server received, it is valid for the superuser, and a user with the content permission does
see it in the same console (so a walk that finds nothing proves something).
"""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import re
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.auth.tokens import default_token_generator
from django.utils import timezone

from django_outbox.conf import EMAIL_TOPIC
from django_outbox.mail.models import OutboxEmail
from django_outbox.models import Message
from django_outbox.retention import housekeeping
from django_outbox.retention.models import ArchivedMessage
from tests.support.browser import Browser
from tests.support.mail import relay

pytestmark = [
    pytest.mark.database_independent,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("empty_archive"),
]

VIEW_ONLY = ("view_message", "view_outboxemail", "view_archivedmessage", "view_archivedattempt")
RESET_LINK = re.compile(r"/accounts/reset/(?P<uid>[\w-]+)/(?P<token>[\w-]+)/")


def log_in(chromium: Browser, base: str, username: str, password: str) -> None:
    def run(page: Any) -> None:
        page.context.clear_cookies()
        page.goto(f"{base}/admin/login/?next=/admin/")
        page.fill("#id_username", username)
        page.fill("#id_password", password)
        page.click("input[type=submit]")
        page.wait_for_selector("#site-name")

    chromium(run)


def visit(chromium: Browser, url: str) -> dict[str, Any]:
    """Everything a page shows or holds: its HTML, its text, and the same for each of its frames."""

    def run(page: Any) -> dict[str, Any]:
        response = page.goto(url)
        page.wait_for_load_state("load")
        return {
            "status": response.status if response is not None else None,
            "html": page.content(),
            "text": page.inner_text("body"),
            "frames": [(frame.url, frame.content()) for frame in page.frames if frame is not page.main_frame],
        }

    return chromium(run)


def test_a_view_only_helpdesk_user_finds_no_reset_token_anywhere_in_the_console(browser, live_server, smtp):
    root = User.objects.create_superuser("root", "root@example.com", "root-password")
    helpdesk = User.objects.create_user("helpdesk", "helpdesk@example.com", "helpdesk-password", is_staff=True)
    helpdesk.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_outbox", codename__in=VIEW_ONLY)
    )
    base = live_server.url

    def ask_for_a_reset(page: Any) -> str:
        page.context.clear_cookies()  # anonymous
        page.goto(f"{base}/accounts/password_reset/")
        page.fill("#id_email", root.email)
        page.click("input[type=submit]")
        page.wait_for_url(re.compile(r"/accounts/password_reset/done/$"))
        return str(page.inner_text("body"))

    # Two resets: one email stays in the message table, the other is delivered and moved to the archive.
    assert "emailed you instructions" in browser(ask_for_a_reset)
    assert "emailed you instructions" in browser(ask_for_a_reset)
    emails = list(OutboxEmail.objects.order_by("id"))
    assert len(emails) == 2
    relay()
    assert len(smtp.received) == 2
    archived_email, live_email = emails
    long_ago = timezone.now() - dt.timedelta(hours=3)
    Message.objects.filter(pk=archived_email.pk).update(created_at=long_ago, delivered_at=long_ago)
    assert housekeeping.run("default").archived == 1
    assert ArchivedMessage.objects.get().pk == archived_email.pk

    log_in(browser, base, "helpdesk", "helpdesk-password")
    admin = f"{base}/admin/django_outbox"
    urls = {
        "message list": f"{admin}/message/",
        "message list, emails": f"{admin}/message/?topic={EMAIL_TOPIC}",
        "message detail": f"{admin}/message/{live_email.pk}/change/",
        "message history": f"{admin}/message/{live_email.pk}/history/",
        "email log": f"{admin}/outboxemail/",
        "email detail": f"{admin}/outboxemail/{live_email.pk}/change/",
        "email preview": f"{admin}/outboxemail/{live_email.pk}/preview/",
        "archive": f"{admin}/archivedmessage/",
        "archive detail": f"{admin}/archivedmessage/{archived_email.pk}/change/",
        "overview": f"{admin}/message/overview/",
    }
    seen = {name: visit(browser, url) for name, url in urls.items()}
    for name, found in seen.items():
        expected = 403 if name == "email preview" else 200
        assert found["status"] == expected, (name, found["status"])
    # The pages are the real ones: each shows what the operator needs about the reset emails.
    assert "Password reset on" in seen["email log"]["text"] and "root@example.com" in seen["email detail"]["text"]
    assert "root@example.com" in seen["archive detail"]["text"]
    assert "delivered" in seen["message detail"]["text"]

    # The tokens as the superuser received them, over SMTP.
    tokens = []
    for received in smtp.received:
        parsed = email.message_from_bytes(received.data, policy=email.policy.default)
        text = parsed.get_body(preferencelist=("plain",)).get_content()
        link = RESET_LINK.search(text)
        assert link is not None, text
        assert default_token_generator.check_token(root, link["token"])
        tokens.append(link["token"])
    assert len(tokens) == 2  # the same token twice when both resets fall in one second: it hashes the user's state

    for name, found in seen.items():
        everything = "\n".join([found["html"], found["text"], *(html for _, html in found["frames"])])
        for token in tokens:
            assert token not in everything, f"the reset token is on the {name} page"
        assert RESET_LINK.search(everything) is None, name

    # Control: with the content permission the same walk does find the tokens, so the check above can fail.
    log_in(browser, base, "root", "root-password")
    assert tokens[1] in visit(browser, urls["message detail"])["html"]
    assert tokens[1] in visit(browser, urls["email preview"])["html"]
    assert tokens[0] in visit(browser, urls["archive detail"])["html"]
    assert browser.dialogs == []
