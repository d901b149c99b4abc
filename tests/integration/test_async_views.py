"""``await outbox.asend()`` in ``async def`` views, served by a real uvicorn process.

The server runs the tests' own ASGI application (``tests.asgi``) on the test database, on a free loopback
port; the requests come concurrently from ``httpx.AsyncClient``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from django_outbox.models import Message
from testproject.shop.models import Order
from tests.support.processes import web_process, worker_env
from tests.support.servers import free_port

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def asgi_server() -> Iterator[str]:
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "tests.asgi:application", "--host", "127.0.0.1", "--port", str(port)]
    with web_process([*command, "--log-level", "warning", "--no-access-log"], port, worker_env()) as url:
        yield url


def post_all(base: str, bodies: list[dict[str, Any]], path: str = "/probe/async-send/") -> list[httpx.Response]:
    """Every body POSTed at once, each on a connection of its own."""

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=len(bodies))
        async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
            return await asyncio.gather(*(client.post(path, json=body) for body in bodies))

    return asyncio.run(run())


def test_fifty_concurrent_asends_write_each_message_exactly_once(asgi_server: str):
    bodies = [{"n": n, "how": "asend"} for n in range(50)]
    first = post_all(asgi_server, bodies)
    assert [r.status_code for r in first] == [201] * 50, [r.text for r in first if r.status_code != 201][:3]
    stored = {str(key): uuid for key, uuid in Message.objects.values_list("idempotency_key", "uuid")}
    assert sorted(stored) == sorted(f"order-{n}" for n in range(50))
    assert [r.json()["uuids"] for r in first] == [[str(stored[f"order-{n}"])] for n in range(50)]
    again = post_all(asgi_server, bodies)  # the same requests again, all at once: idempotent
    assert [r.json()["uuids"] for r in again] == [r.json()["uuids"] for r in first]
    assert Message.objects.count() == 50


def test_the_recommended_pattern_commits_or_rolls_back_the_order_and_its_message_together(asgi_server: str):
    """A sync function under atomic() run through sync_to_async: half of the requests fail after both writes."""
    responses = post_all(asgi_server, [{"n": n, "how": "atomic", "fail": n % 2 == 1} for n in range(50)])
    assert [r.status_code for r in responses] == [409 if n % 2 else 201 for n in range(50)]
    keys = set(Message.objects.values_list("idempotency_key", flat=True))
    assert keys == {f"order-{n}" for n in range(0, 50, 2)}, "a failed request left its message"
    assert set(Order.objects.values_list("customer_email", flat=True)) == {
        f"buyer-{n}@example.com" for n in range(0, 50, 2)
    }


def test_asend_called_from_sync_code_under_atomic_joins_that_transaction(asgi_server: str):
    ok, failed = post_all(asgi_server, [{"n": 1, "how": "nested"}, {"n": 2, "how": "nested", "fail": True}])
    assert (ok.status_code, failed.status_code) == (201, 409)
    assert list(Message.objects.values_list("idempotency_key", flat=True)) == ["order-1"]
    assert Order.objects.count() == 1
    assert ok.json()["uuids"] == [str(Message.objects.get().uuid)]


def test_asend_in_a_plain_async_view_commits_at_once(asgi_server: str):
    """No transaction is open in an async view: the message is committed before the view goes on, so a
    failure after it does not take it back (docs/async.md says to use the pattern above instead)."""
    (response,) = post_all(asgi_server, [{"n": 7, "how": "asend", "fail": True}])
    assert response.status_code == 409
    assert list(Message.objects.values_list("idempotency_key", flat=True)) == ["order-7"]


def test_asend_many_writes_a_batch_in_order(asgi_server: str):
    responses = post_all(asgi_server, [{"n": n, "how": "asend_many"} for n in range(10)])
    assert [r.status_code for r in responses] == [201] * 10
    for n, response in enumerate(responses):
        messages = list(Message.objects.filter(key=f"k-{n}").order_by("id"))
        assert [m.payload["i"] for m in messages] == [0, 1, 2]
        assert response.json()["uuids"] == [str(m.uuid) for m in messages]


def test_asend_validates_as_send_does(asgi_server: str):
    (response,) = post_all(asgi_server, [{}], path="/probe/async-send-invalid/")
    assert response.status_code == 422
    assert response.json()["error"].startswith("outbox.send(): payload must be JSON-serialisable")
    assert Message.objects.count() == 0
