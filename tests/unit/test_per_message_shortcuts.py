"""The worker's per-message shortcuts answer exactly what the long way did."""

from __future__ import annotations

from django_outbox.routing import HandlerRegistry
from django_outbox.store.rows import _from_json
from django_outbox.transports.deadlines import time_left, time_limit


def first(message: object) -> None:
    pass


def second(message: object) -> None:
    pass


def test_the_remembered_handler_follows_registrations():
    registry = HandlerRegistry()
    assert registry.find("orders.created") is None
    registry.register("orders.*", first)
    assert registry.find("orders.created") is first, "a topic once unserved is served after a registration"
    registry.register("orders.created", second)
    assert registry.find("orders.created") is second, "an exact topic beats the pattern found before"
    registry.unregister("orders.created")
    assert registry.find("orders.created") is first
    registry.unregister("orders.*")
    assert registry.find("orders.created") is None


def test_the_remembered_handlers_stay_bounded():
    registry = HandlerRegistry()
    registry.register("t.*", first)
    for i in range(HandlerRegistry.FOUND_MAX + 10):
        assert registry.find(f"t.{i}") is first
    assert len(registry._found) <= HandlerRegistry.FOUND_MAX


def test_no_limit_inside_a_limit_still_lifts_it():
    """The shared no-op block is only for "no limit where there is none": nested under a limit, None
    must still clear it for the inner call."""
    assert time_left() is None
    with time_limit(None):
        assert time_left() is None
    with time_limit(5.0):
        outer = time_left()
        assert outer is not None and outer[1] == 5.0
        with time_limit(None):
            assert time_left() is None
        assert time_left() is not None
    assert time_left() is None


def test_json_columns_decode_as_django_does():
    a, b = _from_json("{}", None, None), _from_json("{}", None, None)
    assert a == {} and a is not b, "each message gets headers of its own to change"
    assert _from_json('{"n": [1, 2.5, null]}', None, None) == {"n": [1, 2.5, None]}
    assert _from_json("not json", None, None) == "not json"  # as JSONField returns it
    assert _from_json({"already": "decoded"}, None, None) == {"already": "decoded"}
