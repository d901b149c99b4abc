"""The email log in the admin: read-only, with a preview that cannot run the email's scripts.

The preview is a staff-only page shown in an ``<iframe sandbox>`` (no ``allow-scripts``, no
``allow-same-origin``) and served with a CSP ``sandbox`` that also blocks remote images, so looking at
an email neither runs its code nor fires its tracking pixels.

``view_outboxemail`` shows who got which email and what became of it; the body, HTML, Bcc, the preview
and the view-in-browser link (which opens the HTML for anyone) need ``view_message_content``, and each
page that shows them is audited (``django_outbox.admin.redaction``).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..admin.display import ContentProtectedAdmin, disclosure, error_block, when_column
from ..admin.redaction import HIDDEN, Disclosure, email_recipients, log_reveal
from ..conf import EMAIL_TRANSPORT, EMAIL_TRANSPORT_BACKEND, get_settings
from .links import view_url
from .models import OutboxEmail
from .views import PREVIEW_POLICY, html_response

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[OutboxEmail]
else:  # ModelAdmin is generic only in the type stubs
    _ModelAdmin = admin.ModelAdmin

#: The dotted paths of the outbox's email backend (the package exports it; the module defines it).
OUTBOX_EMAIL_BACKENDS = frozenset({"django_outbox.mail.EmailBackend", "django_outbox.mail.backend.EmailBackend"})


def sends_email() -> bool:
    """Whether the project's settings send email through the outbox: Django's email backend (or one
    of Django 6's ``MAILERS``) is the outbox's, or a route or transport is the email transport."""
    if hasattr(settings, "MAILERS"):  # Django 6.1+, where EMAIL_BACKEND must not be read any more
        mailers = getattr(settings, "MAILERS", None) or {}
        backends = {str(m.get("BACKEND", "")) for m in mailers.values() if isinstance(m, dict)}
    else:
        with warnings.catch_warnings():  # deprecated on Django 6.1; reading it is still right before
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", PendingDeprecationWarning)
            backends = {str(getattr(settings, "EMAIL_BACKEND", ""))}
    if backends & OUTBOX_EMAIL_BACKENDS:
        return True
    conf = get_settings()
    if EMAIL_TRANSPORT in conf.ROUTES.values():
        return True
    # TRANSPORTS always holds the built-in email transport, the one the email topic goes to: only a
    # transport of the project's own on the email backend says the project sends email.
    return any(t.backend == EMAIL_TRANSPORT_BACKEND for name, t in conf.TRANSPORTS.items() if name != EMAIL_TRANSPORT)


@admin.register(OutboxEmail)
class EmailLogAdmin(ContentProtectedAdmin, _ModelAdmin):
    audit_view = "email"
    list_display = ("created_at_when", "subject", "recipient_list", "status", "attempts")
    list_filter = ("status",)
    date_hierarchy = "created_at"
    fields = (
        "subject",
        "sender",
        "recipient_list",
        "bcc",
        "status",
        "attempts",
        "max_attempts",
        "created_at_when",
        "delivered_at_when",
        "available_at_when",
        "last_error_display",
        "uuid",
        "browser_link",
        "preview",
    )
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: OutboxEmail | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: OutboxEmail | None = None) -> bool:
        return False

    def get_model_perms(self, request: HttpRequest) -> dict[str, bool]:
        """Listed in the admin (index, sidebar) only where the project sends email through the outbox,
        or once it holds emails; unlisted, the page is still there by URL. Read per request, so a
        change of settings shows at once."""
        perms: dict[str, Any] = super().get_model_perms(request)
        if not any(perms.values()):
            return perms
        if sends_email() or self.get_queryset(request).exists():
            return perms
        return dict.fromkeys(perms, False)

    # the moments as every outbox page writes them
    created_at_when = when_column("created_at", OutboxEmail)
    delivered_at_when = when_column("delivered_at", OutboxEmail)
    available_at_when = when_column("available_at", OutboxEmail)

    @admin.display(description="subject")
    def subject(self, obj: OutboxEmail) -> str:
        return obj.subject

    @admin.display(description="from")
    def sender(self, obj: OutboxEmail) -> str:
        return str(obj.email.get("from_email", ""))

    @admin.display(description="recipients")
    def recipient_list(self, obj: OutboxEmail) -> str:
        return ", ".join(email_recipients(obj.email, bcc=False))  # Bcc only on the email's page, with the permission

    @admin.display(description="bcc")
    def bcc(self, obj: OutboxEmail) -> str:
        addresses = [str(a) for a in obj.email.get("bcc") or []]
        if not addresses:
            return "-"
        return ", ".join(addresses) if disclosure(obj).allowed else f"{len(addresses)} {HIDDEN}"

    @admin.display(description="last error")
    def last_error_display(self, obj: OutboxEmail) -> SafeString | str:
        return error_block(disclosure(obj).shown_error(obj.last_error))

    @admin.display(description="view in browser")
    def browser_link(self, obj: OutboxEmail) -> SafeString | str:
        if not disclosure(obj).allowed:
            return HIDDEN  # the link opens the email's HTML for whoever holds it
        view_id = obj.email.get("view_id")
        if not view_id:
            return "-"
        try:
            url = view_url(str(view_id))
        except NoReverseMatch:
            return "include django_outbox.urls in your URLconf to get links"
        return format_html('<a href="{}" rel="noreferrer" target="_blank">{}</a>', url, url)

    @admin.display(description="preview")
    def preview(self, obj: OutboxEmail) -> SafeString:
        attachments = format_html_join(
            ", ",
            "{} ({})",
            ((a.get("filename") or "-", a.get("mimetype", "MIME part")) for a in obj.email.get("attachments", [])),
        )
        if not disclosure(obj).allowed:
            return format_html("<p>{}</p><p>attachments: {}</p>", HIDDEN, attachments or "none")
        url = reverse(f"{self.admin_site.name}:django_outbox_outboxemail_preview", args=[obj.pk])
        return format_html(
            '<iframe sandbox src="{}" title="email preview" referrerpolicy="no-referrer" '
            'style="width:100%;min-width:40em;height:32em;border:1px solid #ccc;background:#fff"></iframe>'
            "<p>attachments: {}</p>",
            url,
            attachments or "none",
        )

    def get_urls(self) -> list[URLPattern]:
        preview = path(
            "<path:object_id>/preview/",
            self.admin_site.admin_view(self.preview_view),
            name="django_outbox_outboxemail_preview",
        )
        return [preview, *super().get_urls()]

    def preview_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        obj = get_object_or_404(self.get_queryset(request), pk=object_id)
        shown = Disclosure.of(obj, request.user)
        if not shown.allowed:
            raise PermissionDenied  # the preview is nothing but content
        log_reveal(request, obj, shown, view="email_preview")
        html = obj.html
        if html is None:
            html = format_html('<pre style="white-space:pre-wrap">{}</pre>', obj.email.get("body", ""))
        response = html_response(html, policy=PREVIEW_POLICY + "; frame-ancestors 'self'")
        response["X-Frame-Options"] = "SAMEORIGIN"  # the admin frames it; the middleware keeps a set value
        return response
