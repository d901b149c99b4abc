"""Pages that show a stored email's HTML.

The HTML is the sender's, not ours to trust: every response forbids scripts, plugins and forms with a
CSP ``sandbox``, leaks no token through the Referer header, and is kept out of caches and indexes.
"""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse

from ..conf import EMAIL_TOPIC, get_settings
from ..models import Message
from .links import IDEMPOTENCY_PREFIX, read_token
from .payload import html_of

#: For the reader's own email: images and styles load as in a mail client.
PUBLIC_POLICY = "sandbox; default-src 'none'; img-src https: http: data: cid:; style-src 'unsafe-inline' https:"
#: For staff previews: nothing remote loads, so no tracking pixel reports an "open".
PREVIEW_POLICY = "sandbox; default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def html_response(html: str, *, policy: str) -> HttpResponse:
    response = HttpResponse(html, content_type="text/html; charset=utf-8")
    response["Content-Security-Policy"] = policy
    response["Referrer-Policy"] = "no-referrer"
    response["X-Content-Type-Options"] = "nosniff"
    response["X-Robots-Tag"] = "noindex, nofollow"
    response["Cache-Control"] = "private, no-store"
    return response


def view_in_browser(request: HttpRequest, token: str) -> HttpResponse:
    """The HTML of the email behind a signed link; 404 for a link that was altered or has expired."""
    view_id = read_token(token)
    if view_id is None:
        raise Http404("This link is not valid or has expired.")
    message = (
        Message.objects.using(get_settings().DATABASE)
        .filter(topic=EMAIL_TOPIC, idempotency_key=IDEMPOTENCY_PREFIX + view_id)
        .first()
    )
    html = html_of(message.payload) if message is not None else None
    if html is None:
        raise Http404("This email is no longer available.")
    return html_response(html, policy=PUBLIC_POLICY)
