"""The messages in the admin: a read-only audit log, retry and cancel actions, and a live overview page.

Nothing here edits a message. State changes go through ``store.retry`` / ``store.cancel`` /
``store.requeue_dead``, the functions the relay's rules are written in, so a leased or delivered message
is refused here exactly as it would be anywhere else. Each action needs its own permission and lands
in Django's admin log under the user who ran it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db.models import Case, CharField, F, QuerySet, Value, When
from django.db.models.fields.json import KeyTextTransform
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator, capfirst
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from .. import store
from ..conf import TASKS_TOPIC_PREFIX
from ..models import Message
from . import overview
from .charts import throughput_svg
from .counting import EstimatingPaginator, distinct_values
from .display import (
    DISCLOSURE_ATTR,
    ContentProtectedAdmin,
    breadcrumbs,
    disclosure,
    error_block,
    error_summary,
    exact_match,
    pretty_json,
    status_badge,
    when,
    when_column,
)
from .redaction import Disclosure, protection, protects_topic

#: One action (or "select all") changes at most this many messages; beyond it, requeue by topic.
MAX_ACTION_MESSAGES = 100_000
#: Ids per store call: well under SQLite's limit on query parameters.
ACTION_CHUNK = 500
TOPICS_IN_FILTER = 100
RELATED_SHOWN = 20
ATTEMPTS_SHOWN = 200
ERROR_EXCERPT_CHARS = 80

_REFUSAL: dict[str, str] = {
    Message.Status.PROCESSING: "being processed by a worker (leased)",
    Message.Status.DELIVERED: "already delivered",
    Message.Status.CANCELLED: "cancelled",
    Message.Status.PENDING: "pending",
    Message.Status.DEAD: "dead",
}


class TopicFilter(admin.SimpleListFilter):
    """Topics found through the topic index, one probe each: ``DISTINCT`` would read every row."""

    title = _("topic")
    parameter_name = "topic"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        using = model_admin.get_queryset(request).db
        return [(t, t) for t in distinct_values(Message, "topic", using=using, limit=TOPICS_IN_FILTER)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(topic=value) if value else queryset


class RetryForm(forms.Form):
    reset_attempts = forms.BooleanField(
        required=False,
        label=_("Reset the attempt counter"),
        help_text=_("Give the messages their full number of attempts again (the history is kept)."),
    )


class CancelForm(forms.Form):
    reason = forms.CharField(
        max_length=500,
        label=_("Reason"),
        help_text=_("Stored on each message, so whoever looks later knows why it was not delivered."),
    )


class RequeueForm(RetryForm):
    reset_attempts = forms.BooleanField(required=False, initial=True, label=_("Reset the attempt counter"))


#: The list's "when" of each status: what the moment is, and the field that holds it. A cancel sets
#: ``available_at`` to its own time; a dead message keeps the time its last attempt was due.
_WHEN_OF: dict[str, tuple[Any, str]] = {
    Message.Status.PENDING: (_("due"), "available_at"),
    Message.Status.PROCESSING: (_("leased until"), "locked_until"),
    Message.Status.DELIVERED: (_("delivered"), "delivered_at"),
    Message.Status.DEAD: (_("last due"), "available_at"),
    Message.Status.CANCELLED: (_("cancelled"), "available_at"),
}
#: The "when" column sorts by the moment it shows.
WHEN_ORDER = Case(
    *(When(status=status, then=F(field)) for status, (_kind, field) in _WHEN_OF.items() if field != "available_at"),
    default=F("available_at"),
)


@admin.register(Message)
class MessageAdmin(ContentProtectedAdmin, admin.ModelAdmin):  # type: ignore[type-arg]  # generic only in the stubs
    list_display = [
        "id",
        "topic_and_key",
        "status_and_attempts",
        "created_at_when",
        "when_display",
        "error_excerpt",
    ]
    list_display_links = ["id"]
    list_filter = ["status", TopicFilter, "created_at"]
    search_fields = ["uuid", "idempotency_key", "key", "topic"]
    search_help_text = _("Exact uuid, idempotency key, key, topic or message id.")
    ordering = ["-id"]
    list_per_page = 50
    paginator = EstimatingPaginator
    show_full_result_count = False
    actions = ["retry_messages", "cancel_messages", "requeue_dead_topics"]
    change_form_template = "admin/django_outbox/message/change_form.html"
    change_list_template = "admin/django_outbox/message/change_list.html"
    fieldsets = [
        (None, {"fields": ["uuid", "topic", "key", "idempotency_key", "status_display", "attempts_display"]}),
        (
            _("Timing"),
            {"fields": ["created_at_when", "available_at_when", "delivered_at_when", "locked_by", "locked_until_when"]},
        ),
        (_("Content"), {"fields": ["payload_display", "headers_display", "last_error_display"]}),
    ]
    readonly_fields = [
        "uuid",
        "topic",
        "key",
        "idempotency_key",
        "status_display",
        "attempts_display",
        "created_at_when",
        "available_at_when",
        "delivered_at_when",
        "locked_by",
        "locked_until_when",
        "payload_display",
        "headers_display",
        "last_error_display",
    ]

    class Media:
        css = {"all": ["django_outbox/admin.css"]}

    # --- read-only -------------------------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Message | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Message | None = None) -> bool:
        return False

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("django_outbox.retry_message"))

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("django_outbox.cancel_message"))

    def get_queryset(self, request: HttpRequest) -> QuerySet[Message]:
        queryset = super().get_queryset(request)
        match = request.resolver_match
        if match is not None and match.url_name == "django_outbox_message_changelist":
            queryset = queryset.defer("payload", "headers")  # payloads may be large; the list never shows them
            # ... but a task's function path, which names what a tasks.* message runs (django_outbox.tasks)
            queryset = queryset.annotate(
                task_path=Case(
                    When(topic__startswith=TASKS_TOPIC_PREFIX, then=KeyTextTransform("task", "payload")),
                    default=Value(""),
                    output_field=CharField(),
                )
            )
        return queryset

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Message], search_term: str
    ) -> tuple[QuerySet[Message], bool]:
        """Exact matches only, each served by an index; ``icontains`` would scan the whole table."""
        match = exact_match(search_term)
        return (queryset, False) if match is None else (queryset.filter(match), False)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """The page's messages, each with what the list may show of its error.

        The list shows no content to anyone, so it reveals nothing and audits nothing: the errors of
        protected messages are masked for every user (the full text is on the message's page). Payloads
        are deferred here, so the few protected rows with an error have theirs loaded in one query.
        """
        changelist = super().get_changelist_instance(request)
        rows = list(changelist.result_list)
        masked = [m for m in rows if m.last_error and protects_topic(m.topic)]
        content: dict[int, tuple[Any, Any]] = {}
        if masked:
            found = Message.objects.using(changelist.queryset.db).filter(pk__in=[m.pk for m in masked])
            content = {pk: (payload, headers) for pk, payload, headers in found.values_list("pk", "payload", "headers")}
        for m in rows:
            payload, headers = content.get(m.pk, (None, None))
            reason = protection(m.topic, payload, headers) if m.pk in content else None
            setattr(
                m,
                DISCLOSURE_ATTR,
                Disclosure(topic=m.topic, payload=payload, headers=headers, reason=reason, allowed=False),
            )
        return changelist

    # --- list columns ----------------------------------------------------------------------------

    @admin.display(description=_("status"), ordering="status")
    def status_display(self, obj: Message) -> SafeString:
        return status_badge(obj.status)

    @admin.display(description=_("topic, key"), ordering="topic")
    def topic_and_key(self, obj: Message) -> SafeString:
        """The list's topic cell, with the message's key under it: the two name where the message goes
        and in which line it waits, and one column leaves the list room at 1280 px beside the sidebar."""
        task_path = getattr(obj, "task_path", None) or ""
        return format_html('{}<span class="outbox-sub">{}</span>', obj.topic, obj.key or task_path)

    @admin.display(description=_("status"), ordering="status")
    def status_and_attempts(self, obj: Message) -> SafeString:
        """The list's status cell: the badge, and under it how many of its attempts the message used
        (a column of its own would not leave the list room at 1280 px beside Django's sidebar)."""
        attempts = gettext("%(used)s attempts") % {"used": self.attempts_display(obj)}
        return format_html('{}<span class="outbox-sub">{}</span>', status_badge(obj.status), attempts)

    @admin.display(description=_("when"), ordering=WHEN_ORDER)
    def when_display(self, obj: Message) -> SafeString:
        """The moment that matters for the message's status, named: when a pending one is due, when a
        delivered one was delivered, until when a worker holds one, when a dead one was last due, when
        one was cancelled. One column instead of "available at" and "delivered at", which were never
        both of use for the same row; the message's page still shows each field."""
        kind, field = _WHEN_OF.get(obj.status, (_("due"), "available_at"))
        day, _space, time = when(getattr(obj, field)).partition(" ")
        # two lines, as the other cells: what and the day, then the time
        return format_html('<span class="outbox-day"><span class="outbox-kind">{}</span> {}</span> {}', kind, day, time)

    @admin.display(description=_("attempts"))
    def attempts_display(self, obj: Message) -> str:
        return f"{obj.attempts} / {obj.max_attempts}"

    created_at_when = when_column("created_at")
    available_at_when = when_column("available_at")
    delivered_at_when = when_column("delivered_at")
    locked_until_when = when_column("locked_until")

    @admin.display(description=_("last error"), empty_value="")
    def error_excerpt(self, obj: Message) -> SafeString | str:
        """The exception's own line, cut to the column by CSS (the whole line in its title): the
        traceback's frames are on the message's page. No error shows as nothing, not as a red "-"."""
        error = obj.last_error
        if error and not isinstance(getattr(obj, DISCLOSURE_ATTR, None), Disclosure) and protects_topic(obj.topic):
            return gettext("(open the message)")  # shown outside the list page: nothing here to mask it with
        summary = error_summary(disclosure(obj).shown_error(error))
        if not summary:
            return ""
        return format_html('<span title="{}">{}</span>', summary, Truncator(summary).chars(ERROR_EXCERPT_CHARS))

    # --- detail ----------------------------------------------------------------------------------

    @admin.display(description=_("payload"))
    def payload_display(self, obj: Message) -> SafeString:
        return pretty_json(disclosure(obj).shown_payload())

    @admin.display(description=_("headers"))
    def headers_display(self, obj: Message) -> SafeString:
        return pretty_json(disclosure(obj).shown_headers())

    @admin.display(description=_("last error"))
    def last_error_display(self, obj: Message) -> SafeString | str:
        return error_block(disclosure(obj).shown_error(obj.last_error))

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        obj = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if obj is not None:
            related: list[Message] = []
            if obj.key is not None:
                related = list(
                    self.get_queryset(request)
                    .filter(key=obj.key)
                    .exclude(pk=obj.pk)
                    .only("id", "topic", "status", "created_at", "delivered_at")
                    .order_by("-id")[:RELATED_SHOWN]
                )
            attempts = list(obj.attempt_log.order_by("started_at", "id")[:ATTEMPTS_SHOWN])
            for attempt in attempts:  # display copies: the admin never saves them
                attempt.error = disclosure(obj).shown_error(attempt.error)
                attempt.summary = error_summary(attempt.error)
                attempt.when = when(attempt.started_at)
            self._mark_restarts(obj, attempts)
            context.update(
                attempts=attempts,
                related=related,
                actionable=obj.status in (Message.Status.PENDING, Message.Status.DEAD),
                can_retry=self.has_retry_permission(request),
                can_cancel=self.has_cancel_permission(request),
                changelist_url=reverse("admin:django_outbox_message_changelist"),
            )
        return super().change_view(request, object_id, form_url, context)

    def _mark_restarts(self, obj: Message, attempts: list[Any]) -> None:
        """Mark each attempt whose number did not follow on from the one before: a retry with "reset
        the attempt counter" restarted the count there (``restart``: None, or who did it and when, from
        the retry's admin log entry between the two attempts; "" when none says)."""
        restarts = [i for i in range(1, len(attempts)) if attempts[i].number <= attempts[i - 1].number]
        for i in range(len(attempts)):
            attempts[i].restart = None
        if not restarts:
            return
        entries = list(
            LogEntry.objects.filter(
                content_type=ContentType.objects.get_for_model(Message),
                object_id=str(obj.pk),
                action_flag=CHANGE,
            )
            .select_related("user")
            .order_by("action_time")
        )
        for i in restarts:
            after, before = attempts[i - 1].started_at, attempts[i].started_at
            found = [e for e in entries if after <= e.action_time <= before]
            if found:
                entry = found[-1]
                attempts[i].restart = gettext("%(note)s by %(user)s at %(when)s") % {
                    "note": entry.change_message,
                    "user": entry.user.get_username() if entry.user else "?",
                    "when": when(entry.action_time),
                }
            else:
                attempts[i].restart = ""  # retried outside the admin (outbox_retry, the store's functions)

    def _trail(self) -> dict[str, Any]:
        """The breadcrumbs of the custom pages: Home, the app, the messages, then the page's title."""
        opts = self.model._meta
        return breadcrumbs(
            (reverse("admin:index"), gettext("Home")),
            (reverse("admin:app_list", kwargs={"app_label": opts.app_label}), str(opts.app_config.verbose_name)),
            (reverse("admin:django_outbox_message_changelist"), capfirst(str(opts.verbose_name_plural))),
        )

    # --- actions ---------------------------------------------------------------------------------

    @admin.action(description=_("Retry selected messages now"), permissions=["retry"])
    def retry_messages(self, request: HttpRequest, queryset: QuerySet[Message]) -> HttpResponse | None:
        form = RetryForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            return self._confirm(request, queryset, "retry_messages", form, gettext("Retry these messages now?"))
        ids = self._selected_ids(request, queryset)
        if ids is None:
            return None
        reset = form.cleaned_data["reset_attempts"]
        changed: list[int] = []
        refused: list[int] = []
        for chunk in _chunks(ids):
            result = store.retry(queryset.db, chunk, reset_attempts=reset)
            changed += result.changed
            refused += result.refused
        note = "Retried from the admin" + (", attempts reset" if reset else "")
        self._report(request, queryset.db, changed, refused, note, gettext("retried"))
        return self._back(request)

    @admin.action(description=_("Cancel selected messages"), permissions=["cancel"])
    def cancel_messages(self, request: HttpRequest, queryset: QuerySet[Message]) -> HttpResponse | None:
        form = CancelForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            return self._confirm(request, queryset, "cancel_messages", form, gettext("Cancel these messages?"))
        ids = self._selected_ids(request, queryset)
        if ids is None:
            return None
        reason = form.cleaned_data["reason"]
        changed: list[int] = []
        refused: list[int] = []
        for chunk in _chunks(ids):
            result = store.cancel(queryset.db, chunk, reason=reason)
            changed += result.changed
            refused += result.refused
        self._report(
            request, queryset.db, changed, refused, f"Cancelled from the admin: {reason}", gettext("cancelled")
        )
        return self._back(request)

    @admin.action(description=_("Requeue all dead messages of the selected messages' topics"), permissions=["retry"])
    def requeue_dead_topics(self, request: HttpRequest, queryset: QuerySet[Message]) -> HttpResponse | None:
        topics = sorted(set(queryset.order_by().values_list("topic", flat=True).distinct()[:TOPICS_IN_FILTER]))
        form = RequeueForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            dead = {
                t: Message.objects.using(queryset.db).filter(status=Message.Status.DEAD, topic=t).count()
                for t in topics
            }
            return self._confirm(
                request,
                queryset,
                "requeue_dead_topics",
                form,
                gettext("Requeue every dead message of these topics?"),
                dead,
            )
        self._requeue(request, queryset.db, topics, reset=form.cleaned_data["reset_attempts"])
        return None

    def _requeue(self, request: HttpRequest, using: str, topics: Iterable[str], *, reset: bool) -> None:
        changed: list[int] = []
        refused: list[int] = []
        for topic in topics:
            result = store.requeue_dead(using, topic=topic, reset_attempts=reset)
            changed += result.changed
            refused += result.refused
        note = f"Requeued with all dead messages of {', '.join(topics)} from the admin"
        self._report(request, using, changed, refused, note, gettext("requeued"))

    def _selected_ids(self, request: HttpRequest, queryset: QuerySet[Message]) -> list[int] | None:
        ids = list(queryset.order_by().values_list("id", flat=True)[: MAX_ACTION_MESSAGES + 1])
        if len(ids) > MAX_ACTION_MESSAGES:
            self.message_user(
                request,
                gettext("More than %(n)d messages selected: narrow the selection, or requeue dead messages by topic.")
                % {"n": MAX_ACTION_MESSAGES},
                messages.ERROR,
            )
            return None
        return ids

    def _confirm(
        self,
        request: HttpRequest,
        queryset: QuerySet[Message],
        action: str,
        form: forms.Form,
        question: str,
        dead_by_topic: dict[str, int] | None = None,
    ) -> TemplateResponse:
        preview = list(queryset.only("id", "topic", "key", "status").order_by("-id")[:20])
        context = {
            **self.admin_site.each_context(request),
            "title": question,
            "opts": self.model._meta,
            "action": action,
            "form": form,
            "preview": preview,
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "from_detail": request.POST.get("_from_detail", ""),
            "dead_by_topic": dead_by_topic,
            **self._trail(),
        }
        return TemplateResponse(request, "admin/django_outbox/message/action_confirm.html", context)

    def _report(
        self, request: HttpRequest, using: str, changed: Sequence[int], refused: Sequence[int], note: str, verb: str
    ) -> None:
        if changed:
            for chunk in _chunks(changed):
                LogEntry.objects.log_actions(
                    user_id=request.user.pk or 0,
                    queryset=Message.objects.using(using).filter(id__in=chunk).only("id", "topic", "status"),
                    action_flag=CHANGE,
                    change_message=note,
                )
            self.message_user(
                request,
                ngettext("%(n)d message %(verb)s.", "%(n)d messages %(verb)s.", len(changed))
                % {"n": len(changed), "verb": verb},
                messages.SUCCESS,
            )
        if refused:
            statuses = dict(
                Message.objects.using(using).filter(id__in=refused[:ACTION_CHUNK]).values_list("id", "status")
            )
            reasons = ", ".join(f"#{i} is {_REFUSAL.get(statuses.get(i, ''), 'gone')}" for i in refused[:10])
            more = f" and {len(refused) - 10} more" if len(refused) > 10 else ""
            self.message_user(
                request,
                gettext("%(n)d not %(verb)s: %(reasons)s%(more)s. Only pending or dead messages can be changed.")
                % {"n": len(refused), "verb": verb, "reasons": reasons, "more": more},
                messages.WARNING,
            )

    def _back(self, request: HttpRequest) -> HttpResponseRedirect | None:
        """After an action started from a message's page, return to that page."""
        from_detail = request.POST.get("_from_detail", "")
        if from_detail.isdigit():
            return HttpResponseRedirect(reverse("admin:django_outbox_message_change", args=[from_detail]))
        return None

    # --- overview --------------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("overview/", wrap(self.overview_view), name="django_outbox_message_overview"),
            path("overview/requeue/", wrap(self.requeue_topic_view), name="django_outbox_message_requeue_topic"),
            *super().get_urls(),
        ]

    def overview_view(self, request: HttpRequest) -> TemplateResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        using = self.get_queryset(request).db
        figures = overview.collect(using)
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Outbox overview"),
            "opts": self.model._meta,
            "overview": figures,
            "counts": [(Message.Status(s).label, s, t) for s, t in figures.counts.items()],
            "chart": throughput_svg(figures.minutes),
            "can_retry": self.has_retry_permission(request),
            "stale_after": int(overview.STALE_AFTER_SECONDS),
            **self._trail(),
        }
        return TemplateResponse(request, "admin/django_outbox/overview.html", context)

    def requeue_topic_view(self, request: HttpRequest) -> HttpResponseRedirect:
        if request.method != "POST" or not self.has_retry_permission(request):
            raise PermissionDenied
        topic = request.POST.get("topic", "")
        if topic:
            self._requeue(request, self.get_queryset(request).db, [topic], reset=True)
        return HttpResponseRedirect(reverse("admin:django_outbox_message_overview"))


def _chunks(ids: Sequence[int]) -> Iterable[list[int]]:
    for start in range(0, len(ids), ACTION_CHUNK):
        yield list(ids[start : start + ACTION_CHUNK])
