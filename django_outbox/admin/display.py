"""What every outbox page in the admin shows the same way: status badges, JSON, errors, the exact search,
and the per-request decision of what of a message's content may be shown.

The message, archive and email pages all build on this module, so it imports none of them: a page can
be added or moved without an import circle.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid as uuid_module
from typing import Any

import django
from django.contrib import admin
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.dateformat import format as date_format
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..models import Message
from .errors import error_summary as error_summary
from .redaction import Disclosure, log_reveal, protection


def status_badge(status: str) -> SafeString:
    label = Message.Status(status).label if status in Message.Status.values else status
    return format_html('<span class="outbox-badge outbox-{}">{}</span>', status, label)


def exact_match(search_term: str) -> Q | None:
    """The admin search of messages (live or archived): exact matches on indexed columns only, since
    ``icontains`` would scan the whole table. None for an empty term."""
    term = search_term.strip()
    if not term:
        return None
    match = Q(idempotency_key=term) | Q(key=term) | Q(topic=term)
    try:
        match |= Q(uuid=uuid_module.UUID(term))
    except ValueError:
        pass
    if term.isdigit() and int(term) < 2**63:
        match |= Q(id=int(term))
    return match


def error_block(text: str) -> SafeString | str:
    return format_html('<pre class="outbox-error">{}</pre>', text) if text else "-"


#: The one format of a moment on every outbox page: the list's columns must fit at 1280 px, and a page
#: that writes "Jan. 5, 2026, 6:41 a.m." beside "2026-01-05 06:41:55" makes its reader compare two.
WHEN_FORMAT = "Y-m-d H:i:s"


def when(value: dt.datetime | None) -> str:
    """``value`` in the current time zone, as every outbox page writes a moment; "" for none."""
    if value is None:
        return ""
    return date_format(timezone.localtime(value) if timezone.is_aware(value) else value, WHEN_FORMAT)


def when_cell(value: dt.datetime | None) -> SafeString | str:
    """``when(value)`` for a list cell: a narrow column breaks it between the day and the time, never
    inside the day at its hyphens."""
    day, _, time = when(value).partition(" ")
    if not time:
        return day
    return format_html('<span class="outbox-day">{}</span> {}', day, time)


def when_column(name: str, model: Any = Message) -> Any:
    """A list column (or read-only field) that writes ``model``'s datetime field ``name`` as ``when``."""

    @admin.display(description=model._meta.get_field(name).verbose_name, ordering=name, empty_value="")
    def column(model_admin: Any, obj: Any) -> SafeString | str:
        return when_cell(getattr(obj, name))

    column.__name__ = f"{name}_when"
    return column


#: Django 6 writes breadcrumbs as ``<ol class="breadcrumbs">`` of ``<li>`` (and styles only those), 5.2
#: as ``<div class="breadcrumbs">`` with "&rsaquo;" between links: the custom pages write the running version's.
BREADCRUMBS_AS_LIST = django.VERSION >= (6, 0)


def breadcrumbs(*crumbs: tuple[str, str]) -> dict[str, Any]:
    """The context of ``admin/django_outbox/breadcrumbs.html``: the trail's links, then the page's title."""
    return {"outbox_crumbs": list(crumbs), "outbox_crumbs_as_list": BREADCRUMBS_AS_LIST}


def pretty_json(value: object) -> SafeString:
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, cls=DjangoJSONEncoder)
    return format_html('<pre class="outbox-json">{}</pre>', text)


#: Fields no list may be filtered on from the URL (``?payload__body__contains=...``): one request per
#: guessed character would read what the page hides. Django allows any lookup on a model's own fields.
CONTENT_LOOKUPS = frozenset({"payload", "headers", "last_error", "error", "attempt_log"})
#: The attribute that carries, on each object a page shows, what the current request may see of it.
DISCLOSURE_ATTR = "_outbox_disclosure"


def disclosure(obj: Any) -> Disclosure:
    """What the current request may see of ``obj``; as for a view-only user unless the admin said otherwise."""
    found = getattr(obj, DISCLOSURE_ATTR, None)
    if isinstance(found, Disclosure):
        return found
    return Disclosure(
        topic=obj.topic,
        payload=obj.payload,
        headers=obj.headers,
        reason=protection(obj.topic, obj.payload, obj.headers),
        allowed=False,
    )


class ContentProtectedAdmin:
    """The part of a message admin that decides, per request, what of a message's content it shows.

    Each object the page shows carries a ``Disclosure`` for the user who asked; fields read it and fail
    closed when it is missing. Showing protected content writes one audit record per page.
    """

    #: The page name in audit records.
    audit_view = "message"

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        if lookup.split("__", 1)[0] in CONTENT_LOOKUPS:
            return False
        return bool(super().lookup_allowed(lookup, value, request))  # type: ignore[misc]

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        obj = super().get_object(request, object_id, from_field)  # type: ignore[misc]
        if obj is not None:
            setattr(obj, DISCLOSURE_ATTR, Disclosure.of(obj, request.user))
        return obj

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        response: HttpResponse = super().render_change_form(  # type: ignore[misc]
            request, context, add=add, change=change, form_url=form_url, obj=obj
        )
        if obj is not None and disclosure(obj).reveals:
            log_reveal(request, obj, disclosure(obj), view=self.audit_view)
        return response
