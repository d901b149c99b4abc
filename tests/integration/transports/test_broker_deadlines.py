"""Every broker transport has a bounded time per delivery call, against real misbehaving peers.

Three peers: a TCP server that accepts and never says a word (a hung broker), one that drips an
endless banner one byte at a time, and the real broker behind a proxy that stops forwarding in the
middle of a session (a broker, or a network, that hangs once the connection is up). Each runs through
the real relay with a local handler message in the same batch: the broker's message gets a failed
attempt within the transport's documented bound, the handler message is delivered.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings

from django_outbox import outbox
from django_outbox.checks import check_settings
from django_outbox.models import Attempt, Message
from tests.support.brokers import running_relay, unique_prefix
from tests.support.proxy import FlakyProxy
from tests.support.servers import SlowServer
from tests.support.services import require_service
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.database_independent, pytest.mark.django_db(transaction=True)]

#: Generous on a loaded machine; without a bound the dripping peer holds a call for 30 s.
MARGIN = 4.0


@dataclass(frozen=True)
class Broker:
    name: str
    backend: str
    port: int  # of the real broker, behind the proxy
    options: Callable[[int, str], dict[str, Any]]  # (port to use, unique prefix) -> OPTIONS
    bound: float  # the documented bound of one delivery call with those options, in seconds


BROKERS = [
    Broker(
        "rabbitmq",
        "django_outbox.transports.amqp.AMQPTransport",
        5672,
        lambda port, prefix: {
            "URL": f"amqp://guest:guest@127.0.0.1:{port}/%2F",
            "EXCHANGE": "amq.topic",
            "MANDATORY": False,
            "CONNECT_TIMEOUT": 1,
            "CONFIRM_TIMEOUT": 1,
        },
        1 + 1 + 2,  # CONNECT_TIMEOUT + CONFIRM_TIMEOUT + 2 s to close
    ),
    Broker(
        "redis",
        "django_outbox.transports.redis.RedisStreamsTransport",
        6379,
        lambda port, prefix: {
            "URL": f"redis://127.0.0.1:{port}/0",
            "STREAM": f"{prefix}:{{topic}}",
            "SOCKET_TIMEOUT": 1,
            "TIMEOUT": 1.5,
        },
        1.5,  # TIMEOUT
    ),
    Broker(
        "nats",
        "django_outbox.transports.nats.NATSTransport",
        4222,
        lambda port, prefix: {
            "SERVERS": f"nats://127.0.0.1:{port}",
            "STREAM": f"OUTBOX_DEADLINE_{prefix.upper()}",
            "CREATE_STREAM": True,
            "STREAM_SUBJECTS": [f"{prefix}.>"],
            "CONNECT_TIMEOUT": 1,
            "ACK_TIMEOUT": 1,
        },
        1 + 1 + 2,  # CONNECT_TIMEOUT + ACK_TIMEOUT + 2 s to close
    ),
]


def configure(broker: Broker, port: int, prefix: str) -> override_settings:
    return override_settings(
        OUTBOX={
            "MAX_ATTEMPTS": 100,
            "BACKOFF_BASE_SECONDS": 60,  # no retry within the test
            "BACKOFF_MAX_SECONDS": 60,
            "POLL_INTERVAL_SECONDS": 0.05,
            "TRANSPORTS": {broker.name: {"BACKEND": broker.backend, "OPTIONS": broker.options(port, prefix)}},
            "ROUTES": {f"{prefix}.*": broker.name},
        }
    )


def send_batch(prefix: str) -> tuple[Message, Message]:
    """A broker message and a handler message in one transaction, so one claim takes both."""
    with transaction.atomic():
        return outbox.send(f"{prefix}.orders", {"id": 1}), outbox.send("audit.logged", {"id": 2})


def assert_bounded(broker: Broker, remote: Message, local: Message, handled: list[str]) -> None:
    wait_for(lambda: Attempt.objects.filter(message=remote).exists(), timeout=broker.bound + MARGIN + 30)
    (attempt,) = Attempt.objects.filter(message=remote)
    assert attempt.finished_at is not None
    took = (attempt.finished_at - attempt.started_at).total_seconds()
    assert attempt.outcome == Attempt.Outcome.FAILED
    assert took < broker.bound + MARGIN, f"{broker.name}: the call took {took:.1f} s, bound {broker.bound} s"
    wait_for(lambda: handled == [str(local.uuid)], timeout=10)
    # the handler returns before the relay records its outcome: wait for the record, not the call
    wait_for(lambda: Message.objects.get(pk=local.pk).status == Message.Status.DELIVERED, timeout=10)
    remote.refresh_from_db()
    assert remote.status == Message.Status.PENDING  # retried later
    assert remote.last_error


@pytest.fixture(params=BROKERS, ids=[b.name for b in BROKERS])
def broker(request: pytest.FixtureRequest) -> Broker:
    chosen: Broker = request.param
    return chosen


@pytest.fixture
def audit(handler) -> list[str]:
    handled: list[str] = []
    handler("audit.*", lambda m: handled.append(str(m.uuid)))
    return handled


@pytest.fixture(params=["silent", "drip-greeting"])
def slow(request: pytest.FixtureRequest) -> Iterator[SlowServer]:
    server = SlowServer(request.param, interval=0.2, limit=30)
    yield server
    server.stop()


def test_a_hung_or_dripping_peer_fails_the_call_within_its_bound(broker, slow, audit):
    prefix = unique_prefix()
    with configure(broker, slow.port, prefix), running_relay(concurrency=1):
        remote, local = send_batch(prefix)
        assert_bounded(broker, remote, local, audit)
    assert slow.accepted >= 1


def test_a_broker_that_hangs_mid_session_fails_the_call_within_its_bound(broker, audit):
    require_service(broker.name, "127.0.0.1", broker.port)
    proxy = FlakyProxy("127.0.0.1", broker.port)
    prefix = unique_prefix()
    try:
        with configure(broker, proxy.port, prefix), running_relay(concurrency=1):
            warm = outbox.send(f"{prefix}.orders", {"id": 0})  # opens the connection the broker then hangs on
            wait_for(lambda: Message.objects.filter(pk=warm.pk, status=Message.Status.DELIVERED).exists(), timeout=20)
            proxy.freeze()
            started = time.monotonic()
            remote, local = send_batch(prefix)
            assert_bounded(broker, remote, local, audit)
            assert time.monotonic() - started < broker.bound + MARGIN + 2
            proxy.thaw()
    finally:
        proxy.thaw()
        proxy.close()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e12])
def test_redis_timeout_must_be_finite(value):
    with override_settings(
        OUTBOX={
            "TRANSPORTS": {
                "r": {
                    "BACKEND": "django_outbox.transports.redis.RedisStreamsTransport",
                    "OPTIONS": {"URL": "redis://127.0.0.1:6379/0", "TIMEOUT": value},
                }
            },
        }
    ):
        assert [m.id for m in check_settings() if "TIMEOUT" in m.msg] == ["django_outbox.E051"]
