"""The admin in a real headless Chromium: an operator finds a dead message, retries it, a real worker
delivers it, and the overview draws its chart.

Set ``OUTBOX_UPDATE_SCREENSHOTS=1`` to refresh the screenshots in docs/img/ from this test.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path
from typing import Any

import django
import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from django_outbox.models import Message
from tests.support import ROOT
from tests.support.factories import AttemptFactory, MessageFactory

pytestmark = [pytest.mark.database_independent, pytest.mark.slow]

#: The screenshots name the Django version they were taken on: the admin looks different on 5.2 and 6.x.
SHOT = "-django{}.{}.png".format(*django.VERSION[:2])


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    if os.environ.get("OUTBOX_UPDATE_SCREENSHOTS") == "1":
        return ROOT / "docs" / "img"
    return tmp_path


def history() -> Message:
    """An hour of traffic for the chart and the list, and one message that died."""
    now = timezone.now()
    for minute in range(0, 60, 2):
        for i in range(minute % 7 + 1):
            done = MessageFactory.create(
                topic=("orders.created", "orders.paid", "mail.send")[i % 3],
                key=f"order-{100 + minute}",
                status=Message.Status.DELIVERED,
                attempts=1,
                created_at=now - dt.timedelta(minutes=minute, seconds=5),
                delivered_at=now - dt.timedelta(minutes=minute),
            )
            AttemptFactory.create(
                message=done,
                started_at=now - dt.timedelta(minutes=minute, seconds=1),
                finished_at=now - dt.timedelta(minutes=minute),
            )
        if minute % 10 == 4:
            AttemptFactory.create(
                message=done, number=2, outcome="failed", finished_at=now - dt.timedelta(minutes=minute)
            )
    error = (
        "Traceback (most recent call last):\n"
        '  File "shop/outbox.py", line 12, in notify_warehouse\n'
        "ConnectionError: warehouse API refused the connection"
    )
    dead = MessageFactory.create(
        topic="probe.orders",
        key="order-17",
        payload={"order": 17, "total": "42.50", "note": "<script>alert('xss')</script>"},
        headers={"trace_id": "4bf92f3577b34da6"},
        idempotency_key="order-17-created",
        status=Message.Status.DEAD,
        attempts=3,
        max_attempts=3,
        last_error=error,
        created_at=now - dt.timedelta(minutes=20),
    )
    for n in (1, 2, 3):
        started = now - dt.timedelta(minutes=20 - 3 * n)
        AttemptFactory.create(
            message=dead,
            number=n,
            worker=f"web-{n % 2 + 1}:41{n}:a1b2c3",
            outcome="failed",
            started_at=started,
            finished_at=started + dt.timedelta(milliseconds=250 * n),
            error=error,
        )
    MessageFactory.create(topic="probe.orders", key="order-17", status=Message.Status.DELIVERED)
    return dead


@pytest.mark.django_db(transaction=True)
def test_operator_retries_a_dead_message_and_a_worker_delivers_it(browser, live_server, worker_process, screenshots):
    User.objects.create_superuser("ops", "ops@example.com", "correct-horse")
    dead = history()
    base = live_server.url

    def log_in(page: Any) -> None:
        page.goto(f"{base}/admin/django_outbox/message/")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "correct-horse")
        page.click("input[type=submit]")
        page.wait_for_selector("#result_list")
        page.evaluate("window.scrollTo(0, 0)")  # the sidebar open, as Django opens it
        page.screenshot(path=str(screenshots / f"admin-list{SHOT}"), full_page=False)

    browser(log_in)

    def filter_dead(page: Any) -> list[str]:
        page.locator("#changelist-filter a", has_text=re.compile(r"^dead$")).click()
        page.wait_for_url(re.compile(r"status__exact=dead"))
        return [str(t) for t in page.locator("#result_list tbody th a").all_inner_texts()]

    assert browser(filter_dead) == [str(dead.pk)]

    def open_and_retry(page: Any) -> str:
        page.locator("#result_list tbody th a").first.click()
        page.wait_for_selector("#outbox-attempts")
        page.screenshot(path=str(screenshots / f"admin-detail{SHOT}"), full_page=True)
        page.click("#outbox-retry")
        page.wait_for_selector("#outbox-confirm")
        page.click("#outbox-confirm")
        page.wait_for_selector("ul.messagelist li.success")
        return str(page.locator("ul.messagelist").inner_text())

    assert "1 message retried" in browser(open_and_retry)
    dead.refresh_from_db()
    assert dead.status == Message.Status.PENDING

    code, output = worker_process("--until-empty").wait(timeout=60)
    assert code == 0, output
    dead.refresh_from_db()
    assert dead.status == Message.Status.DELIVERED

    def see_delivered(page: Any) -> tuple[str, str]:
        page.reload()
        page.wait_for_selector("#outbox-attempts")
        return (
            str(page.locator(".field-status_display .readonly").inner_text()),
            str(page.locator("#outbox-attempts li").last.inner_text()),
        )

    status, last_attempt = browser(see_delivered)
    assert status == "delivered"
    assert "#4" in last_attempt and "delivered" in last_attempt

    def overview(page: Any) -> dict[str, Any]:
        page.goto(f"{base}/admin/django_outbox/message/")
        page.locator(".object-tools a", has_text="Overview").click()
        page.wait_for_url(re.compile(r"/overview/$"))
        chart = page.locator("svg.outbox-chart")
        chart.wait_for()
        page.screenshot(path=str(screenshots / f"admin-overview{SHOT}"), full_page=True)
        return {
            "bars": chart.locator("rect").count(),
            "box": chart.bounding_box(),
            "title": chart.locator("title").first.text_content(),
            "workers": page.locator("#outbox-workers tbody tr").count(),
        }

    seen = browser(overview)
    assert seen["bars"] == 120
    assert seen["box"]["width"] > 300 and seen["box"]["height"] > 100
    assert re.search(r"\(\d+ delivered, \d+ failed\)", seen["title"])
    assert seen["workers"] == 1  # the worker that just ran, now stopped
    assert browser.dialogs == []  # the payload's <script> never ran
    for name in (f"admin-list{SHOT}", f"admin-detail{SHOT}", f"admin-overview{SHOT}"):
        assert (screenshots / name).stat().st_size > 10_000


# --- the console reads as Django's own, on 5.2 and 6.x -----------------------------------

ISO_WHEN = re.compile(r"\b\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\b")
#: Django's default DATETIME_FORMAT in English ("Jan. 5, 2026, 6:41 a.m."): a second format on the page.
DJANGO_WHEN = re.compile(r"\b(Jan|Feb|March|April|May|June|July|Aug|Sept|Oct|Nov|Dec)\.? \d{1,2}, \d{4}")
#: The style of a breadcrumb trail: what makes a custom page's look like Django's own.
BREADCRUMBS_STYLE = """() => {
    const trail = document.querySelector('.breadcrumbs');
    const style = getComputedStyle(trail);
    const link = trail.querySelector('a');
    const item = trail.querySelectorAll('li')[1];
    return {
        tag: trail.tagName,
        parent: trail.parentElement.tagName,
        label: trail.parentElement.getAttribute('aria-label'),
        display: style.display,
        background: style.backgroundColor,
        color: style.color,
        padding: style.padding,
        font: style.fontSize,
        listStyle: style.listStyleType,
        link: getComputedStyle(link).color,
        separator: item ? getComputedStyle(item, '::before').content : null,
        height: Math.round(trail.getBoundingClientRect().height),
    };
}"""


def failure_text() -> str:
    """A traceback as the worker stores it: library frames first, the exception's own line last."""
    from django_outbox.worker.errors import describe_error

    def call_warehouse() -> None:
        raise RuntimeError("warehouse is down")

    try:
        call_warehouse()
    except RuntimeError as exc:
        return describe_error(exc)
    raise AssertionError("unreachable")


def dead_message(error: str, *, attempts: int = 3) -> Message:
    now = timezone.now()
    dead = MessageFactory.create(
        topic="probe.orders",
        key="order-18",
        status=Message.Status.DEAD,
        attempts=attempts,
        max_attempts=attempts,
        last_error=error,
        created_at=now - dt.timedelta(minutes=30),
    )
    for n in range(1, attempts + 1):
        started = now - dt.timedelta(minutes=30 - 3 * n)
        AttemptFactory.create(
            message=dead,
            number=n,
            outcome="failed",
            started_at=started,
            finished_at=started + dt.timedelta(milliseconds=200),
            error=error,
        )
    return dead


def logged_in(base: str, path: str) -> Any:
    User.objects.get_or_create(username="ops", defaults={"is_staff": True, "is_superuser": True})
    user = User.objects.get(username="ops")
    user.set_password("correct-horse")
    user.save()

    def log_in(page: Any) -> None:
        page.goto(f"{base}{path}")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "correct-horse")
        page.click("input[type=submit]")
        page.wait_for_load_state()

    return log_in


@pytest.mark.django_db(transaction=True)
def test_custom_pages_breadcrumbs_look_like_djangos_own(browser, live_server):
    dead = dead_message(failure_text())
    base = live_server.url
    browser(logged_in(base, "/admin/django_outbox/message/"))

    def trails(page: Any) -> dict[str, Any]:
        seen = {"changelist": page.evaluate(BREADCRUMBS_STYLE)}
        page.goto(f"{base}/admin/django_outbox/message/overview/")
        seen["overview"] = page.evaluate(BREADCRUMBS_STYLE)
        for action in ("retry", "cancel"):
            page.goto(f"{base}/admin/django_outbox/message/{dead.pk}/change/")
            page.click(f"#outbox-{action}")
            page.wait_for_selector("#outbox-confirm")
            seen[action] = page.evaluate(BREADCRUMBS_STYLE)
        return seen

    seen = browser(trails)
    stock = seen.pop("changelist")
    for page_name, trail in seen.items():
        assert trail == stock, page_name


@pytest.mark.django_db(transaction=True)
def test_attempts_read_in_time_order_and_show_where_a_reset_restarted_the_count(browser, live_server, worker_process):
    dead = dead_message(failure_text())
    base = live_server.url
    browser(logged_in(base, f"/admin/django_outbox/message/{dead.pk}/change/"))

    def retry_with_reset(page: Any) -> str:
        page.click("#outbox-retry")
        page.check("#id_reset_attempts")
        page.click("#outbox-confirm")
        page.wait_for_selector("ul.messagelist li.success")
        return str(page.locator("ul.messagelist").inner_text())

    assert "1 message retried" in browser(retry_with_reset)
    code, output = worker_process("--until-empty").wait(timeout=60)
    assert code == 0, output
    dead.refresh_from_db()
    assert dead.status == Message.Status.DELIVERED and dead.attempts == 1

    def timeline(page: Any) -> list[str]:
        page.reload()
        page.wait_for_selector("#outbox-attempts")
        return [str(t) for t in page.locator("#outbox-attempts ol > li").all_inner_texts()]

    steps = browser(timeline)
    assert [s.split()[0] for s in steps] == ["#1", "#2", "#3", "↻", "#1"], steps
    assert "attempt counter reset" in steps[3] and "ops" in steps[3], steps[3]
    assert "delivered" in steps[4]
    stamps = [ISO_WHEN.search(s) for s in (steps[0], steps[1], steps[2], steps[4])]
    assert all(stamps) and [m.group() for m in stamps if m] == sorted(m.group() for m in stamps if m)


@pytest.mark.django_db(transaction=True)
def test_an_attempt_reads_as_the_exceptions_last_line_with_the_traceback_one_click_away(browser, live_server):
    error = failure_text()
    assert error.startswith("Traceback") and error.splitlines()[-1] == "RuntimeError: warehouse is down"
    dead = dead_message(error)
    fine = MessageFactory.create(topic="probe.orders", status=Message.Status.DELIVERED, last_error="")
    base = live_server.url
    browser(logged_in(base, "/admin/django_outbox/message/"))

    def list_cells(page: Any) -> dict[str, str]:
        return {
            "dead": str(
                page.locator(f"#result_list tr:has(a[href$='/{dead.pk}/change/']) td.field-error_excerpt").inner_text()
            ),
            "fine": str(
                page.locator(f"#result_list tr:has(a[href$='/{fine.pk}/change/']) td.field-error_excerpt").inner_text()
            ),
        }

    cells = browser(list_cells)
    assert cells["dead"].strip() == "RuntimeError: warehouse is down"
    assert cells["fine"].strip() == ""  # nothing, not a red "-"

    def attempts(page: Any) -> dict[str, Any]:
        page.goto(f"{base}/admin/django_outbox/message/{dead.pk}/change/")
        first = page.locator("#outbox-attempts details").first
        summaries = [str(s).strip() for s in page.locator("#outbox-attempts details > summary").all_inner_texts()]
        hidden = not first.locator("pre").is_visible()
        first.locator("summary").click()
        return {"summaries": summaries, "hidden": hidden, "shown": str(first.locator("pre").inner_text())}

    seen = browser(attempts)
    assert seen["summaries"] == ["RuntimeError: warehouse is down"] * 3
    assert seen["hidden"]
    assert seen["shown"].startswith("Traceback (most recent call last):") and "call_warehouse" in seen["shown"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("sidebar", ["open", "collapsed"])
def test_the_message_list_fits_1280_px(browser, live_server, sidebar):
    history()
    MessageFactory.create(topic="orders.created", key="order-99", available_at=timezone.now() + dt.timedelta(hours=1))
    base = live_server.url
    browser(logged_in(base, "/admin/django_outbox/message/"))

    def measure(page: Any) -> dict[str, Any]:
        page.set_viewport_size({"width": 1280, "height": 860})
        # Django keeps the sidebar's state in localStorage; open is its default, and a new user's view
        page.evaluate(f"localStorage.setItem('django.admin.navSidebarIsOpen', '{str(sidebar == 'open').lower()}')")
        page.reload()
        page.wait_for_selector("#result_list")
        found: dict[str, Any] = page.evaluate("""() => {
            const widths = [...document.querySelectorAll('#result_list thead th')].map(
                th => th.className.replace(/.*column-/, '') + ' ' + Math.round(th.getBoundingClientRect().width)
            ).join(', ');
            const results = document.querySelector('.results');
            const rows = [...document.querySelectorAll('#result_list tbody tr')];
            const error = document.querySelector('#result_list td.field-error_excerpt span[title]');
            const sidebar = document.querySelector('#nav-sidebar');
            return {
                sidebar: sidebar ? getComputedStyle(sidebar).visibility : null,
                page: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
                results: [results.scrollWidth, results.clientWidth],
                heights: rows.map(r => Math.round(r.getBoundingClientRect().height)),
                ellipsis: error ? getComputedStyle(error.parentElement).textOverflow : null,
                title: error ? error.getAttribute('title') : null,
                when: [...document.querySelectorAll('#result_list td.field-when_display')].map(td => td.innerText),
                widths: widths,
            };
        }""")
        return found

    seen = browser(measure)
    assert seen["sidebar"] == ("visible" if sidebar == "open" else "hidden")  # the state asked for
    assert seen["page"][0] <= seen["page"][1], seen
    # the widths of the columns, to read in a failure: which one no longer fits
    assert seen["results"][0] <= seen["results"][1], (seen["results"], seen["widths"])
    assert max(seen["heights"]) <= min(seen["heights"]) + 4, seen["heights"]  # no tall rows
    assert seen["ellipsis"] == "ellipsis"
    assert seen["title"] == "ConnectionError: warehouse API refused the connection"
    # one column says when, and what happened then: nothing is lost by merging due and delivered
    kinds = {re.sub(r"\s+", " ", w).rsplit(" ", 2)[0] for w in seen["when"]}
    assert kinds == {"due", "delivered", "last due"}, seen["when"]
    dated = [re.sub(r"\s+", " ", w) for w in seen["when"] if re.search(r"\d", w)]
    assert dated and all(ISO_WHEN.search(w) for w in dated), seen["when"]


@pytest.mark.django_db(transaction=True)
def test_one_date_format_on_the_list_the_detail_and_the_overview(browser, live_server, worker_process):
    dead = history()
    code, output = worker_process("--until-empty").wait(timeout=60)  # a worker row for the overview
    assert code == 0, output
    base = live_server.url
    browser(logged_in(base, "/admin/django_outbox/message/"))

    def texts(page: Any) -> dict[str, str]:
        # the list writes a moment's day above its time: one line of text, as the other pages have it
        seen = {"list": " ".join(str(page.locator("#content").inner_text()).split())}
        page.goto(f"{base}/admin/django_outbox/message/{dead.pk}/change/")
        seen["detail"] = str(page.locator("#content").inner_text())
        page.goto(f"{base}/admin/django_outbox/message/overview/")
        seen["overview"] = str(page.locator("#content").inner_text())
        return seen

    for name, text in browser(texts).items():
        assert ISO_WHEN.search(text), name
        assert not DJANGO_WHEN.search(text), (name, DJANGO_WHEN.findall(text))


@pytest.mark.django_db(transaction=True)
def test_the_email_log_and_the_archive_appear_only_where_they_are_used(browser, live_server, settings):
    """In the browser, as an operator sees it: the sidebar and the index list the pages a project uses."""
    from django_outbox.conf import EMAIL_TRANSPORT
    from django_outbox.retention.models import ArchivedAttempt, ArchivedMessage
    from tests.db.admin.test_visibility import mail_elsewhere

    # The archive's tables are not Django's (managed = False), so the flush between tests leaves what an
    # earlier test archived, and an archive that holds rows is listed whatever RETENTION_MODE says.
    ArchivedAttempt.objects.all().delete()
    ArchivedMessage.objects.all().delete()
    mail_elsewhere(settings)
    settings.OUTBOX = {**settings.OUTBOX, "RETENTION_MODE": "delete"}
    base = live_server.url
    browser(logged_in(base, "/admin/"))

    def pages(page: Any) -> list[str]:
        page.goto(f"{base}/admin/")
        return sorted(page.locator("#content-main .app-django_outbox th[scope=row] a").all_inner_texts())

    assert browser(pages) == ["Outbox messages"]
    settings.OUTBOX = {**settings.OUTBOX, "RETENTION_MODE": "archive", "ROUTES": {"notify.*": EMAIL_TRANSPORT}}
    assert browser(pages) == ["Archived messages", "Email log", "Outbox messages"]
