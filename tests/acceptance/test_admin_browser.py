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

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from django_outbox.models import Message
from tests.support import ROOT
from tests.support.factories import AttemptFactory, MessageFactory

pytestmark = pytest.mark.slow


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
        page.click("#toggle-nav-sidebar")  # more room for the columns
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(screenshots / "admin-list.png"), full_page=False)

    browser(log_in)

    def filter_dead(page: Any) -> list[str]:
        page.locator("#changelist-filter a", has_text=re.compile(r"^dead$")).click()
        page.wait_for_url(re.compile(r"status__exact=dead"))
        return [str(t) for t in page.locator("#result_list tbody th a").all_inner_texts()]

    assert browser(filter_dead) == [str(dead.pk)]

    def open_and_retry(page: Any) -> str:
        page.locator("#result_list tbody th a").first.click()
        page.wait_for_selector("#outbox-attempts")
        page.screenshot(path=str(screenshots / "admin-detail.png"), full_page=True)
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
        page.screenshot(path=str(screenshots / "admin-overview.png"), full_page=True)
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
    for name in ("admin-list.png", "admin-detail.png", "admin-overview.png"):
        assert (screenshots / name).stat().st_size > 10_000
