from __future__ import annotations

import datetime as dt
import re
from urllib.parse import urlencode

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_outbox.admin.counting import EstimatingPaginator
from django_outbox.models import Message
from tests.support.factories import AttemptFactory, MessageFactory

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_outbox_message_changelist")
OVERVIEW = reverse("admin:django_outbox_message_overview")


def change_url(message: Message) -> str:
    return reverse("admin:django_outbox_message_change", args=[message.pk])


def staff(client: Client, *codenames: str, username: str = "operator") -> User:
    """A staff user (not superuser) with exactly the given django_outbox permissions, logged in."""
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_outbox", codename__in=codenames)
    )
    client.force_login(user)
    return user


def run_action(client: Client, action: str, messages: list[Message], **fields: str) -> str:
    data = {"action": action, "_selected_action": [m.pk for m in messages], "apply": "1", **fields}
    response = client.post(CHANGELIST, data, follow=True)
    assert response.status_code == 200
    return response.content.decode()


# --- the list -----------------------------------------------------------------------------------


def test_changelist_shows_the_columns_newest_first(admin_client):
    old = MessageFactory.create(
        topic="orders.created", key="order-1", attempts=2, last_error="Traceback...\nValueError: boom"
    )
    new = MessageFactory.create(topic="orders.paid", status=Message.Status.DEAD)
    html = admin_client.get(CHANGELIST).content.decode()
    assert html.index(f">{new.pk}<") < html.index(f">{old.pk}<")
    for text in ("orders.created", "order-1", "2 / 5", "ValueError: boom", 'class="outbox-badge outbox-dead"'):
        assert text in html
    assert "Traceback..." not in html  # the excerpt is the error's last line


def test_changelist_filters_by_status_topic_and_created_date(admin_client):
    dead = MessageFactory.create(topic="a.dead", status=Message.Status.DEAD)
    pending = MessageFactory.create(topic="b.pending")
    old = MessageFactory.create(topic="b.pending", created_at=timezone.now() - dt.timedelta(days=30))

    def ids(query: str) -> set[int]:
        response = admin_client.get(CHANGELIST + query)
        return {obj.pk for obj in response.context["cl"].result_list}

    assert ids("?status__exact=dead") == {dead.pk}
    assert ids("?topic=b.pending") == {pending.pk, old.pk}
    week_ago = (timezone.now() - dt.timedelta(days=7)).replace(microsecond=0)
    assert ids("?" + urlencode({"created_at__gte": week_ago.isoformat()})) == {dead.pk, pending.pk}
    html = admin_client.get(CHANGELIST).content.decode()
    assert "?topic=a.dead" in html and "?topic=b.pending" in html  # the topic filter lists the topics


def test_search_matches_uuid_idempotency_key_key_topic_and_id_exactly(admin_client):
    target = MessageFactory.create(topic="search.me", key="k-42", idempotency_key="idem-42")
    MessageFactory.create(topic="search.me.not", key="k-420", idempotency_key="idem-420")

    def found(term: str) -> list[int]:
        return [m.pk for m in admin_client.get(CHANGELIST, {"q": term}).context["cl"].result_list]

    assert found(str(target.uuid)) == [target.pk]
    assert found("idem-42") == [target.pk]
    assert found("k-42") == [target.pk]
    assert found(str(target.pk)) == [target.pk]
    assert found("search.me") == [target.pk]


def test_changelist_queries_are_bounded_and_do_not_grow_with_rows(admin_client, django_assert_max_num_queries):
    for i in range(3):
        AttemptFactory.create(message=MessageFactory.create(key=f"k{i}"))
    admin_client.get(CHANGELIST)  # warm the content-type and permission caches
    with CaptureQueriesContext(connection) as few:
        assert admin_client.get(CHANGELIST).status_code == 200
    MessageFactory.create_batch(60)
    with django_assert_max_num_queries(8), CaptureQueriesContext(connection) as many:
        assert admin_client.get(CHANGELIST + "?p=2").status_code == 200
    assert len(many) == len(few)


def _message_counts(queries: list[dict[str, str]]) -> list[str]:
    table = Message._meta.db_table
    return [q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and table in q["sql"]]


def test_changelist_never_counts_the_whole_table(admin_client):
    MessageFactory.create_batch(12)
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(CHANGELIST)
    counts = _message_counts(queries.captured_queries)
    assert counts, "the paginator counts (bounded) at least once"
    assert all(re.search(r"LIMIT \d+", sql) for sql in counts), counts
    assert response.context["cl"].result_count == 12
    assert "12 outbox messages" in " ".join(response.content.decode().split())


def test_past_the_cap_postgres_estimates_and_sqlite_counts(admin_client, monkeypatch):
    monkeypatch.setattr(EstimatingPaginator, "cap", 5)
    MessageFactory.create_batch(12)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"ANALYZE {Message._meta.db_table}")
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(CHANGELIST)
    cl = response.context["cl"]
    text = " ".join(response.content.decode().split())
    if connection.vendor == "postgresql":
        assert not cl.paginator.tally.exact
        assert cl.result_count > 5
        assert any(q["sql"].startswith("EXPLAIN") for q in queries.captured_queries)
        assert f"about {cl.result_count} outbox messages" in text
        assert all(re.search(r"LIMIT \d+", sql) for sql in _message_counts(queries.captured_queries))
    else:
        assert cl.paginator.tally.exact and cl.result_count == 12
        assert "12 outbox messages" in text


# --- the detail page ----------------------------------------------------------------------------


def test_detail_escapes_payload_and_headers(admin_client):
    message = MessageFactory.create(
        payload={"note": "<script>alert('payload')</script>", "n": 1},
        headers={"x-evil": "<img src=x onerror=alert(1)>"},
        last_error="<script>alert('error')</script>",
    )
    AttemptFactory.create(message=message, outcome="failed", error="<script>alert('attempt')</script>")
    html = admin_client.get(change_url(message)).content.decode()
    assert "<script>alert(" not in html
    assert "<img src=x" not in html
    assert "&lt;script&gt;alert(&#x27;payload&#x27;)&lt;/script&gt;" in html
    assert "&lt;script&gt;alert(&#x27;attempt&#x27;)&lt;/script&gt;" in html
    assert "&quot;n&quot;: 1" in html  # pretty-printed JSON


def test_detail_shows_the_attempt_timeline_and_messages_sharing_the_key(admin_client):
    earlier = MessageFactory.create(key="order-7", topic="orders.created", status=Message.Status.DELIVERED)
    message = MessageFactory.create(key="order-7", topic="orders.paid", status=Message.Status.DEAD, attempts=2)
    MessageFactory.create(key="order-8")
    start = timezone.now() - dt.timedelta(minutes=5)
    AttemptFactory.create(
        message=message,
        number=1,
        worker="host-a:11:aa",
        outcome="failed",
        started_at=start,
        finished_at=start + dt.timedelta(seconds=1.5),
        error="Traceback (most recent call last):\nConnectionError: refused",
    )
    AttemptFactory.create(message=message, number=2, worker="host-b:22:bb", outcome="abandoned", error="lease expired")
    html = admin_client.get(change_url(message)).content.decode()
    timeline = html[html.index('id="outbox-attempts"') :]
    assert "2 attempts" in timeline
    assert timeline.index("host-a:11:aa") < timeline.index("host-b:22:bb")
    assert "1.500 s" in timeline and "ConnectionError: refused" in timeline and "Traceback" in timeline
    related = html[html.index('id="outbox-related"') :]
    assert change_url(earlier) in related and "(earlier)" in related
    assert "order-8" not in related


def test_detail_is_read_only_even_for_a_superuser(admin_client):
    message = MessageFactory.create()
    assert admin_client.post(change_url(message), {"topic": "changed"}).status_code == 403
    assert admin_client.get(reverse("admin:django_outbox_message_add")).status_code == 403
    assert admin_client.post(reverse("admin:django_outbox_message_delete", args=[message.pk])).status_code == 403
    message.refresh_from_db()
    assert message.topic == "probe.created"


def test_detail_query_count_is_bounded(admin_client, django_assert_max_num_queries):
    message = MessageFactory.create(key="k")
    for n in range(1, 6):
        AttemptFactory.create(message=message, number=n)
    MessageFactory.create_batch(3, key="k")
    admin_client.get(change_url(message))
    with django_assert_max_num_queries(8):
        admin_client.get(change_url(message))


# --- security -----------------------------------------------------------------------------------


def test_only_staff_get_in(client):
    User.objects.create_user("visitor", password="pw", is_staff=False)
    client.login(username="visitor", password="pw")
    message = MessageFactory.create()
    for url in (CHANGELIST, change_url(message), OVERVIEW):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"], url


def test_staff_without_view_permission_is_refused(client):
    staff(client)
    assert client.get(CHANGELIST).status_code == 403
    assert client.get(OVERVIEW).status_code == 403


def test_viewer_sees_no_actions_and_cannot_run_them(client):
    staff(client, "view_message")
    dead = MessageFactory.create(status=Message.Status.DEAD)
    html = client.get(CHANGELIST).content.decode()
    assert "retry_messages" not in html and "cancel_messages" not in html
    detail = client.get(change_url(dead)).content.decode()
    assert 'id="outbox-retry"' not in detail and 'id="outbox-cancel"' not in detail
    page = run_action(client, "retry_messages", [dead])
    page += run_action(client, "cancel_messages", [dead], reason="x")
    assert 'class="success"' not in page
    dead.refresh_from_db()
    assert dead.status == Message.Status.DEAD
    assert client.post(reverse("admin:django_outbox_message_requeue_topic"), {"topic": dead.topic}).status_code == 403
    assert not LogEntry.objects.exists()


def test_each_action_needs_its_own_permission(client):
    staff(client, "view_message", "retry_message")
    dead = MessageFactory.create(status=Message.Status.DEAD)
    html = client.get(CHANGELIST).content.decode()
    assert "retry_messages" in html and "cancel_messages" not in html
    detail = client.get(change_url(dead)).content.decode()
    assert 'id="outbox-retry"' in detail and 'id="outbox-cancel"' not in detail
    assert "No action selected" in run_action(client, "cancel_messages", [dead], reason="x")
    dead.refresh_from_db()
    assert dead.status == Message.Status.DEAD


# --- actions ------------------------------------------------------------------------------------


def test_retry_asks_first_then_requeues_dead_and_pending_and_refuses_the_rest(client):
    user = staff(client, "view_message", "retry_message")
    later = timezone.now() + dt.timedelta(hours=1)
    dead = MessageFactory.create(status=Message.Status.DEAD, attempts=5, last_error="boom")
    waiting = MessageFactory.create(status=Message.Status.PENDING, attempts=2, available_at=later)
    leased = MessageFactory.create(status=Message.Status.PROCESSING, attempts=1, locked_by="w1", locked_until=later)
    delivered = MessageFactory.create(status=Message.Status.DELIVERED, attempts=1)

    confirm = client.post(
        CHANGELIST, {"action": "retry_messages", "_selected_action": [dead.pk, waiting.pk, leased.pk, delivered.pk]}
    )
    assert confirm.status_code == 200 and b"Reset the attempt counter" in confirm.content
    dead.refresh_from_db()
    assert dead.status == Message.Status.DEAD  # nothing happens before the confirmation

    page = run_action(client, "retry_messages", [dead, waiting, leased, delivered], reset_attempts="on")
    assert "2 messages retried" in page and 'class="success"' in page
    assert f"#{leased.pk} is being processed by a worker (leased)" in page
    assert f"#{delivered.pk} is already delivered" in page
    for m in (dead, waiting, leased, delivered):
        m.refresh_from_db()
    assert (dead.status, dead.attempts) == (Message.Status.PENDING, 0)
    assert waiting.status == Message.Status.PENDING and waiting.available_at <= timezone.now()
    assert leased.status == Message.Status.PROCESSING and leased.locked_by == "w1"
    assert delivered.status == Message.Status.DELIVERED
    entries = LogEntry.objects.order_by("object_id")
    assert sorted(int(e.object_id or 0) for e in entries) == sorted([dead.pk, waiting.pk])
    assert all(e.user_id == user.pk and "Retried from the admin, attempts reset" in e.change_message for e in entries)


def test_retry_from_the_detail_page_returns_there(admin_client):
    dead = MessageFactory.create(status=Message.Status.DEAD)
    response = admin_client.post(
        CHANGELIST,
        {"action": "retry_messages", "_selected_action": [dead.pk], "_from_detail": str(dead.pk), "apply": "1"},
    )
    assert response.status_code == 302 and response["Location"] == change_url(dead)
    dead.refresh_from_db()
    assert dead.status == Message.Status.PENDING


def test_cancel_needs_a_reason_and_keeps_it(client):
    user = staff(client, "view_message", "cancel_message")
    dead = MessageFactory.create(status=Message.Status.DEAD)
    delivered = MessageFactory.create(status=Message.Status.DELIVERED)
    page = client.post(CHANGELIST, {"action": "cancel_messages", "_selected_action": [dead.pk], "apply": "1"})
    assert page.status_code == 200 and b"This field is required" in page.content
    dead.refresh_from_db()
    assert dead.status == Message.Status.DEAD
    html = run_action(client, "cancel_messages", [dead, delivered], reason="customer <b>deleted</b> the order")
    assert "1 message cancelled" in html and f"#{delivered.pk} is already delivered" in html
    dead.refresh_from_db()
    assert dead.status == Message.Status.CANCELLED
    assert dead.last_error == "cancelled: customer <b>deleted</b> the order"
    entry = LogEntry.objects.get()
    assert entry.user_id == user.pk and entry.object_id == str(dead.pk)
    assert "customer <b>deleted</b> the order" in entry.change_message
    assert "<b>deleted</b>" not in html  # the reason is echoed escaped, if at all


def test_requeue_dead_of_a_topic_from_the_list_and_from_the_overview(admin_client):
    dead_a = MessageFactory.create_batch(3, topic="a", status=Message.Status.DEAD, attempts=5)
    dead_b = MessageFactory.create(topic="b", status=Message.Status.DEAD, attempts=5)
    pending_a = MessageFactory.create(topic="a")
    page = run_action(admin_client, "requeue_dead_topics", [pending_a], reset_attempts="on")
    assert "3 messages requeued" in page
    assert set(Message.objects.filter(topic="a").values_list("status", flat=True)) == {"pending"}
    assert all(m.attempts == 0 for m in Message.objects.filter(pk__in=[m.pk for m in dead_a]))
    assert Message.objects.get(pk=dead_b.pk).status == Message.Status.DEAD
    response = admin_client.post(reverse("admin:django_outbox_message_requeue_topic"), {"topic": "b"}, follow=True)
    assert "1 message requeued" in response.content.decode()
    assert Message.objects.get(pk=dead_b.pk).status == Message.Status.PENDING
    assert LogEntry.objects.count() == 4


# --- overview -----------------------------------------------------------------------------------


def test_overview_page_shows_counts_lag_chart_dead_topics_and_workers(admin_client):
    from django_outbox.models import Worker

    now = timezone.now()
    MessageFactory.create(available_at=now - dt.timedelta(seconds=90))
    MessageFactory.create_batch(2, topic="mail.send", status=Message.Status.DEAD)
    for i in range(4):
        AttemptFactory.create(finished_at=now - dt.timedelta(minutes=i), outcome="delivered" if i else "failed")
    Worker.objects.create(
        worker_id="web-1:10:aa", hostname="web-1", pid=10, started_at=now, last_seen=now, in_flight=3, delivered=7
    )
    Worker.objects.create(
        worker_id="web-2:20:bb", hostname="web-2", pid=20, started_at=now, last_seen=now - dt.timedelta(minutes=5)
    )
    response = admin_client.get(OVERVIEW)
    html = response.content.decode()
    assert response.status_code == 200
    chart = html[html.index('<svg class="outbox-chart"') :]
    chart = chart[: chart.index("</svg>")]
    assert "<script" not in chart and "http://" not in chart.replace("http://www.w3.org/2000/svg", "")
    assert "3 delivered, 1 failed" in html  # the chart's accessible title
    assert chart.count("<rect") == 2 * 60
    assert "mail.send" in html and "Requeue all" in html
    alive = html[html.index("web-1:10:aa") - 200 : html.index("web-1:10:aa")]
    gone = html[html.index("web-2:20:bb") - 200 : html.index("web-2:20:bb")]
    assert "outbox-alive" in alive and "outbox-gone" in gone
    lag = html[html.index('id="outbox-lag"') :]
    assert re.search(r"(8|9)\d\.\d s", lag[:300])


def test_overview_sums_up_a_failing_housekeeping_round_by_its_exceptions_line(admin_client):
    """The collapsed line is the exception's own, as an attempt's; the traceback is one click away."""
    from django_outbox.models import Worker
    from tests.db.test_status_command import _housekeeping_traceback

    now = timezone.now()
    error = _housekeeping_traceback()
    Worker.objects.create(
        worker_id="web-1:10:aa",
        hostname="web-1",
        pid=10,
        started_at=now,
        last_seen=now,
        housekeeping_error=error,
        housekeeping_failures=2,
    )
    html = admin_client.get(OVERVIEW).content.decode()
    summary = re.search(r"<summary>(.*?)</summary>\s*<pre>(.*?)</pre>", html, re.S)
    assert summary, html
    assert summary.group(1).strip() == "RuntimeError: archive table is missing"
    assert summary.group(2).startswith("Traceback (most recent call last):")


def test_changelist_names_the_function_of_a_task_message(admin_client):
    """A django.tasks message (topic tasks.<queue>) shows its function's path under the topic; another
    message's payload stays unread, even with a "task" key."""
    MessageFactory(topic="tasks.emails", payload={"task": "shop.tasks.send_welcome", "args": [], "kwargs": {}})
    MessageFactory(topic="orders.created", payload={"task": "not.a.task.path"})
    MessageFactory(topic="tasks.default", key="customer-7", payload={"task": "shop.tasks.keyed"})
    html = admin_client.get(CHANGELIST).content.decode()
    assert '<span class="outbox-sub">shop.tasks.send_welcome</span>' in html
    assert "not.a.task.path" not in html
    assert '<span class="outbox-sub">customer-7</span>' in html  # a key, where set, keeps its place
