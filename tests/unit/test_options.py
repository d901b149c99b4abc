"""``options.option()`` and ``options.validate()``: the one declaration and validator of settings and options."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

import pytest
from django.test import override_settings

from django_outbox.checks import check_settings
from django_outbox.exceptions import OutboxImproperlyConfigured
from django_outbox.options import declared, option, validate
from django_outbox.transports.base import BaseTransport


@dataclasses.dataclass(frozen=True, kw_only=True)
class ThirdPartyOptions:
    endpoint: str = option(kind=str, nonempty=True)
    retries: int = option(3, kind=int, minimum=0, maximum=10)
    window: dt.timedelta = option(dt.timedelta(seconds=5), kind=dt.timedelta, duration=True, minimum=0, maximum=60)
    tags: tuple[str, ...] = option((), kind=(list, tuple), items=str, nonempty_items=True)


class ThirdPartyTransport(BaseTransport):
    """A transport outside the package declaring its options as the built-in ones do."""

    options_class = ThirdPartyOptions


def problems(given: Mapping[str, Any]) -> list[tuple[str, str]]:
    _, found = validate(
        declared(ThirdPartyOptions), given, where="X", unknown_id="u", invalid_id="i", missing_id="m", owner="T"
    )
    return [(p.id, p.msg) for p in found]


def test_values_are_read_as_the_code_uses_them():
    values, found = validate(
        declared(ThirdPartyOptions),
        {"ENDPOINT": "e", "RETRIES": 0, "WINDOW": 2, "TAGS": ["a"]},
        where="X",
        unknown_id="u",
        invalid_id="i",
    )
    assert found == []
    assert values == {"endpoint": "e", "retries": 0, "window": dt.timedelta(seconds=2), "tags": ("a",)}
    assert ThirdPartyOptions(**values).window == dt.timedelta(seconds=2)


def test_unknown_missing_and_bad_values_each_get_their_id():
    assert problems({"RETRIES": 11, "TAGS": [""], "WINDOW": 0, "EXTRA": 1}) == [
        ("u", "X has an unknown option 'EXTRA'."),
        ("m", "T needs OPTIONS['ENDPOINT']."),
        ("i", "X['RETRIES'] must be an integer from 0 to 10, not 11."),
        ("i", "X['WINDOW'] must be a timedelta or number of seconds above 0 and at most 60, not 0."),
        ("i", "X['TAGS'] must be a list of non-empty strings, not ['']."),
    ]


@pytest.mark.parametrize("value", [True, 1.0, float("nan"), "3", None, -1, 2**70])
def test_an_integer_option_takes_integers_in_its_bounds_only(value):
    assert [i for i, _ in problems({"ENDPOINT": "e", "RETRIES": value})] == ["i"]


def test_a_numeric_option_without_bounds_is_refused_at_declaration():
    with pytest.raises(TypeError, match="minimum and a maximum"):
        option(kind=int)
    with pytest.raises(TypeError, match="default_factory"):
        option([], kind=list)


def test_a_third_party_transport_is_checked_and_built_from_its_declaration():
    backend = f"{__name__}.ThirdPartyTransport"
    with override_settings(OUTBOX={"TRANSPORTS": {"t": {"BACKEND": backend, "OPTIONS": {"RETRIES": "x"}}}}):
        assert [e.id for e in check_settings()] == ["django_outbox.E013", "django_outbox.E051"]
    with pytest.raises(OutboxImproperlyConfigured, match="E013"):
        ThirdPartyTransport(name="t", options={})
    built = ThirdPartyTransport(name="t", options={"ENDPOINT": "e"})
    assert built.settings == ThirdPartyOptions(endpoint="e")


def test_the_handler_transport_takes_no_options():
    with override_settings(
        OUTBOX={
            "TRANSPORTS": {
                "handler": {"BACKEND": "django_outbox.transports.handler.HandlerTransport", "OPTIONS": {"X": 1}}
            }
        }
    ):
        assert [e.id for e in check_settings()] == ["django_outbox.E050"]
