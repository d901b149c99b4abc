"""Signed "view in browser" links.

A link carries a random view id signed with ``SECRET_KEY`` and a timestamp, so it can neither be
guessed nor altered, and it expires after ``OUTBOX["EMAIL_VIEW_MAX_AGE_SECONDS"]``. The id is made
before the email exists, so the link can be rendered into the email itself: the backend finds it in
the HTML and stores the email under that id.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid

from django.core import signing
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse

from ..conf import get_settings

_SALT = "django_outbox.mail.view"
_PLACEHOLDER = "TOKEN"
#: Prefix of the idempotency key of an email with a view id: the indexed way from a link to its row.
IDEMPOTENCY_PREFIX = "django_outbox.email:"


def new_view_id() -> str:
    return uuid.uuid4().hex


def make_token(view_id: str) -> str:
    return signing.TimestampSigner(salt=_SALT).sign(view_id)


def read_token(token: str) -> str | None:
    """The view id of a valid token, or None when it was altered, is malformed or has expired."""
    try:
        max_age = dt.timedelta(seconds=get_settings().EMAIL_VIEW_MAX_AGE_SECONDS)
        return signing.TimestampSigner(salt=_SALT).unsign(token, max_age=max_age)
    except signing.BadSignature:  # SignatureExpired is a subclass
        return None


def _path(token: str) -> str:
    return reverse("django_outbox:email-view", kwargs={"token": token})


def view_url(view_id: str, *, request: HttpRequest | None = None) -> str:
    """The link for ``view_id``: absolute with ``OUTBOX["EMAIL_VIEW_BASE_URL"]`` or a request."""
    path = _path(make_token(view_id))
    base = get_settings().EMAIL_VIEW_BASE_URL
    if base:
        return base.rstrip("/") + path
    if request is not None:
        return request.build_absolute_uri(path)
    return path


def browser_link(*, request: HttpRequest | None = None) -> str:
    """A new "view in browser" URL to render into one HTML email (one link per email).

    Needs ``path("outbox/", include("django_outbox.urls"))`` in the URLconf.
    """
    return view_url(new_view_id(), request=request)


def find_view_id(html: str) -> str | None:
    """The view id of the first valid link of ours in ``html``, if the email contains one."""
    try:
        prefix, suffix = _path(_PLACEHOLDER).split(_PLACEHOLDER)
    except NoReverseMatch:
        return None
    for match in re.finditer(re.escape(prefix) + r"([A-Za-z0-9_\-:]+)" + re.escape(suffix), html):
        view_id = read_token(match.group(1))
        if view_id is not None:
            return view_id
    return None
