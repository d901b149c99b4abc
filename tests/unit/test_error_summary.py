"""The admin's one-line summary of an attempt's error: the exception's own line.

Each case raises a real exception and stores it as the worker does (``describe_error``), so the summary
is read from the text an operator's admin really holds.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from django_outbox.admin.display import error_summary
from django_outbox.worker.errors import ERROR_MAX_CHARS, describe_error


def stored(fail: Callable[[], object]) -> str:
    try:
        fail()
    except BaseException as exc:  # ExceptionGroup and the like, as the worker catches them
        return describe_error(exc)
    raise AssertionError("it did not raise")


def raise_(exc: BaseException) -> Callable[[], object]:
    def fail() -> object:
        raise exc

    return fail


def with_note() -> object:
    exc = RuntimeError("warehouse is down")
    exc.add_note("while shipping order 7")
    raise exc


def chained() -> object:
    try:
        raise KeyError("order_id")
    except KeyError as exc:
        raise RuntimeError("bad payload") from exc


def during_handling() -> object:
    try:
        raise KeyError("order_id")
    except KeyError:
        raise RuntimeError("the fallback failed too") from None


def handled_badly() -> object:
    try:
        raise KeyError("order_id")
    except KeyError:
        raise RuntimeError("the fallback failed too")  # noqa: B904 - the implicit context is the point


def group_from_a_cause() -> object:
    try:
        raise KeyError("order_id")
    except KeyError as exc:
        raise ExceptionGroup("2 webhooks failed", [ValueError("a"), OSError("b")]) from exc


def wrapping_a_group() -> object:
    try:
        raise ExceptionGroup("2 webhooks failed", [ValueError("a"), OSError("b")])
    except ExceptionGroup as exc:
        raise RuntimeError("retry later:\n  two of three receivers refused") from exc


def syntax_error() -> object:
    return compile("x = (", "shop/outbox.py", "exec")


@pytest.mark.parametrize(
    "fail, summary",
    [
        (raise_(RuntimeError("warehouse is down")), "RuntimeError: warehouse is down"),
        (raise_(ValueError("two\nlines")), "ValueError: two"),
        # a message whose later lines are indented (a validation error's fields): still its first line
        (
            raise_(ValueError("bad payload:\n  order_id: required\n  total: not a number")),
            "ValueError: bad payload:",
        ),
        (with_note, "RuntimeError: warehouse is down"),
        (chained, "RuntimeError: bad payload"),
        (during_handling, "RuntimeError: the fallback failed too"),
        (handled_badly, "RuntimeError: the fallback failed too"),
        (raise_(ExceptionGroup("2 webhooks failed", [ValueError("a"), OSError("b")])), None),
        (group_from_a_cause, None),
        (wrapping_a_group, "RuntimeError: retry later:"),
        (syntax_error, "SyntaxError: '(' was never closed"),
    ],
)
def test_the_summary_is_the_exceptions_own_line(fail: Callable[[], object], summary: str | None) -> None:
    text = stored(fail)
    expected = summary or "ExceptionGroup: 2 webhooks failed (2 sub-exceptions)"
    assert error_summary(text) == expected, text


def test_an_error_without_a_traceback_is_summed_up_by_its_last_line() -> None:
    assert error_summary("cancelled: customer asked") == "cancelled: customer asked"
    assert error_summary("lease expired\nworker web-1:12:ab stopped answering") == (
        "worker web-1:12:ab stopped answering"
    )
    assert error_summary("") == ""


def test_a_traceback_cut_to_its_tail_still_gives_the_exceptions_line() -> None:
    def deep(n: int) -> object:
        if n:
            return deep(n - 1)
        raise RuntimeError("x" * 200 + " warehouse is down")

    text = stored(lambda: deep(50))
    cut = "...\n" + text[-(len(text) // 3) :]
    assert error_summary(cut).endswith("warehouse is down")
    assert len(describe_error(RuntimeError("y" * (2 * ERROR_MAX_CHARS)))) <= ERROR_MAX_CHARS + 4
