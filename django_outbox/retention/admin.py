"""The archive in the admin: finished messages kept for audit, read-only, with their attempts.

Content is protected here as in the message admin (``django_outbox.admin.redaction``): an archived email
keeps its reset link for the whole retention period.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..admin.counting import EstimatingPaginator
from ..admin.display import (
    ContentProtectedAdmin,
    disclosure,
    error_block,
    exact_match,
    pretty_json,
    status_badge,
    when_column,
)
from ..conf import get_settings
from .models import ArchivedAttempt, ArchivedMessage


class ReadOnly:
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ArchivedAttemptInline(ReadOnly, admin.TabularInline):  # type: ignore[type-arg]
    model = ArchivedAttempt
    fields = ("number", "outcome", "started_at_when", "finished_at_when", "worker", "error_display")
    readonly_fields = fields
    extra = 0
    can_delete = False
    #: The archived message whose page this inline is on, with its disclosure (inlines are made per request).
    parent: ArchivedMessage | None = None

    started_at_when = when_column("started_at", ArchivedAttempt)
    finished_at_when = when_column("finished_at", ArchivedAttempt)

    @admin.display(description=_("error"))
    def error_display(self, obj: ArchivedAttempt) -> str:
        if self.parent is None:
            return "-" if not obj.error else str(_("(open the message)"))
        return disclosure(self.parent).shown_error(obj.error)


@admin.register(ArchivedMessage)
class ArchivedMessageAdmin(ContentProtectedAdmin, ReadOnly, admin.ModelAdmin):  # type: ignore[type-arg]
    audit_view = "archive"
    list_display = (
        "id",
        "topic",
        "key",
        "status_display",
        "attempts",
        "created_at_when",
        "delivered_at_when",
        "archived_at_when",
    )
    list_filter = ("status",)
    search_fields = ("uuid", "idempotency_key", "key", "topic")
    search_help_text = _("Exact uuid, idempotency key, key, topic or message id.")
    ordering = ("-id",)
    list_per_page = 50
    paginator = EstimatingPaginator
    show_full_result_count = False
    inlines = (ArchivedAttemptInline,)
    fields = (
        "uuid",
        "topic",
        "key",
        "idempotency_key",
        "status_display",
        "attempts",
        "max_attempts",
        "created_at_when",
        "available_at_when",
        "delivered_at_when",
        "archived_at_when",
        "payload_display",
        "headers_display",
        "last_error_display",
    )
    readonly_fields = fields

    class Media:
        css = {"all": ["django_outbox/admin.css"]}

    def get_model_perms(self, request: HttpRequest) -> dict[str, bool]:
        """Listed in the admin (index, sidebar) only where retention archives (``RETENTION_MODE =
        "archive"``) or the archive holds rows (from an earlier archive mode); unlisted, the page is
        still there by URL. Read per request, so a change of settings shows at once."""
        perms: dict[str, bool] = super().get_model_perms(request)
        if not any(perms.values()):
            return perms
        if get_settings().RETENTION_MODE == "archive" or self.get_queryset(request).exists():
            return perms
        return dict.fromkeys(perms, False)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[ArchivedMessage], search_term: str
    ) -> tuple[QuerySet[ArchivedMessage], bool]:
        """Exact matches only, each served by an index of every partition."""
        match = exact_match(search_term)
        return (queryset, False) if match is None else (queryset.filter(match), False)

    @admin.display(description=_("status"), ordering="status")
    def status_display(self, obj: ArchivedMessage) -> SafeString:
        return status_badge(obj.status)

    # the moments as every outbox page writes them
    created_at_when = when_column("created_at", ArchivedMessage)
    available_at_when = when_column("available_at", ArchivedMessage)
    delivered_at_when = when_column("delivered_at", ArchivedMessage)
    archived_at_when = when_column("archived_at", ArchivedMessage)

    def get_inline_instances(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        inlines = super().get_inline_instances(request, obj)
        for inline in inlines:
            if isinstance(inline, ArchivedAttemptInline):
                inline.parent = obj
        return inlines

    @admin.display(description=_("payload"))
    def payload_display(self, obj: ArchivedMessage) -> SafeString:
        return pretty_json(disclosure(obj).shown_payload())

    @admin.display(description=_("headers"))
    def headers_display(self, obj: ArchivedMessage) -> SafeString:
        return pretty_json(disclosure(obj).shown_headers())

    @admin.display(description=_("last error"))
    def last_error_display(self, obj: ArchivedMessage) -> SafeString | str:
        return error_block(disclosure(obj).shown_error(obj.last_error))
