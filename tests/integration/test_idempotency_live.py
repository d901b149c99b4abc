"""``@idempotent`` over real HTTP: concurrent clients against a live server, and a server killed mid-request."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from django_outbox.models import IdempotencyRecord, Message
from testproject.shop.models import Order
from tests.probe.views import GATE
from tests.support import ROOT
from tests.support.database import is_postgres
from tests.support.processes import worker_env
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

CLIENTS = 20


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def replayed(self) -> bool:
        return self.headers.get("idempotent-replayed") == "true"


def post(url: str, body: object, key: str, timeout: float = 30) -> Reply:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Reply(response.status, {k.lower(): v for k, v in response.headers.items()}, response.read())
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read())


def concurrently(count: int, call) -> tuple[list[Reply], list[BaseException], list[threading.Thread]]:
    """Run ``call()`` from ``count`` threads released together; every thread's reply, in any order."""
    barrier = threading.Barrier(count)
    replies: list[Reply] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait(30)
            replies.append(call())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for t in threads:
        t.start()
    return replies, errors, threads


def join(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(60)
        assert not t.is_alive()


@pytest.fixture
def gate():
    GATE.reset()
    yield GATE
    GATE.release.set()


def test_concurrent_identical_requests_create_one_order_and_one_message(live_server, gate):
    url = f"{live_server.url}/probe/orders/"
    body = {"email": "race@example.com", "gate": True}
    replies, errors, threads = concurrently(CLIENTS, lambda: post(url, body, "race-1"))
    assert gate.entered.wait(30), "no request reached the view"
    if is_postgres():
        # The claim is committed before the view runs: every other client is told 409 at once.
        wait_for(lambda: len(replies) == CLIENTS - 1, timeout=30)
        assert Counter(r.status for r in replies) == {409: CLIENTS - 1}
        assert all(int(r.headers["retry-after"]) >= 1 for r in replies)
    gate.release.set()
    join(threads)
    assert errors == []
    created = [r for r in replies if r.status == 201 and not r.replayed]
    assert len(created) == 1
    # SQLite serialises writers, so there the others wait for the first and get its stored response.
    assert all(r.status == 409 or (r.replayed and r.body == created[0].body) for r in replies if r not in created)
    assert Order.objects.count() == 1
    assert Message.objects.count() == 1
    later = post(url, body, "race-1")
    assert (later.status, later.replayed, later.body) == (201, True, created[0].body)
    assert Order.objects.count() == 1


def test_concurrent_retries_of_the_demo_order_api_get_the_stored_response_or_409(live_server):
    url = f"{live_server.url}/api/orders/"
    body = {"email": "shop@example.com", "item": "teapot", "quantity": 2}
    replies, errors, threads = concurrently(CLIENTS, lambda: post(url, body, "shop-1"))
    join(threads)
    assert errors == []
    assert len(replies) == CLIENTS
    created = [r for r in replies if r.status == 201 and not r.replayed]
    assert len(created) == 1
    assert all(r.status == 409 or (r.replayed and r.body == created[0].body) for r in replies if r not in created)
    order = Order.objects.get()
    assert json.loads(created[0].body)["order_id"] == order.pk
    assert list(Message.objects.values_list("topic", flat=True)) == ["orders.created"]
    later = post(url, body, "shop-1")
    assert (later.status, later.replayed, later.headers["location"]) == (201, True, f"/api/orders/{order.pk}/")


def test_a_slow_request_is_not_run_twice_when_its_claim_lapses(live_server, gate):
    """The probe view's lock_timeout is 1 s; the first request outlives it, the retry must not run."""
    url = f"{live_server.url}/probe/orders/"
    body = {"email": "slow@example.com", "gate": True}
    first: list[Reply] = []
    thread = threading.Thread(target=lambda: first.append(post(url, body, "slow-1")))
    thread.start()
    assert gate.entered.wait(30)
    retry: list[Reply] = []
    retry_thread = threading.Thread(target=lambda: retry.append(post(url, body, "slow-1")))
    threading.Event().wait(1.5)  # past the claim's lock_timeout
    retry_thread.start()
    if is_postgres():
        # The running view holds its row: the retry cannot take the claim over.
        retry_thread.join(30)
        assert retry[0].status == 409
    gate.release.set()
    thread.join(30)
    retry_thread.join(30)
    assert first[0].status == 201 and not first[0].replayed
    assert retry[0].status == 409 or retry[0].replayed
    assert Order.objects.count() == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_retry_after_a_crash_mid_request_is_safe(live_server, tmp_path: Path):
    """A server process killed inside the view leaves only a lapsing claim; the retry runs the view once."""
    port = free_port()
    in_view = tmp_path / "in-view"
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runserver", f"127.0.0.1:{port}", "--noreload", "--skip-checks"],
        cwd=ROOT,
        env={**worker_env(), "PROBE_HANG_FILE": str(in_view)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    body = {"email": "crash@example.com"}
    lost: list[object] = []
    try:

        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        wait_for(listening, timeout=60)
        client = threading.Thread(
            target=lambda: lost.append(
                _swallow(lambda: post(f"http://127.0.0.1:{port}/probe/orders/", body, "crash-1"))
            )
        )
        client.start()
        wait_for(in_view.exists, timeout=30)  # the order and its message are written, not committed
    finally:
        server.kill()
        server.wait(30)
    client.join(30)
    assert isinstance(lost[0], Exception)  # the client never got an answer
    record = IdempotencyRecord.objects.get()
    assert record.state == IdempotencyRecord.State.IN_PROGRESS
    assert Order.objects.count() == 0
    assert Message.objects.count() == 0

    url = f"{live_server.url}/probe/orders/"
    replies: list[Reply] = []

    def retried() -> bool:
        replies.append(post(url, body, "crash-1"))
        return replies[-1].status != 409

    wait_for(retried, timeout=30, interval=0.3)  # 409 until the dead request's claim lapses
    assert replies[-1].status == 201 and not replies[-1].replayed
    assert Order.objects.count() == 1
    assert Message.objects.count() == 1
    again = post(url, body, "crash-1")
    assert (again.status, again.replayed, again.body) == (201, True, replies[-1].body)


def _swallow(call) -> object:
    try:
        return call()
    except Exception as exc:
        return exc
