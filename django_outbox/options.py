"""The one mechanism for options and checks: declare each option once, validate it with one function.

A setting of ``OUTBOX`` and an option of a transport's ``OPTIONS`` are the same thing: a name, a type,
bounds, a default, the check id of a bad value and a hint. Each is declared once, as a field of a frozen
dataclass (``OutboxSettings``, ``AMQPOptions``, ``WebhookOptions``...) made with :func:`option`; the
code reads the dataclass, and :func:`validate` turns what the user wrote into its values and every
problem with it. ``manage.py check`` reports the problems; code that needs the values raises on the
first. Checks themselves register through :func:`register_check`, so each feature registers its own.

A leaf module: it imports nothing of the package, so any module may declare options or checks.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import math
import reprlib
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, register

logger = logging.getLogger("django_outbox.checks")

#: A check that raised instead of reporting (any check of ours, or a transport's own ``check()``).
CHECK_FAILED = "django_outbox.E007"
#: A name template (stream, subject, routing key) that is malformed or uses more than a plain ``{topic}``.
BAD_TEMPLATE = "django_outbox.E052"

#: The placeholders a name template may use.
TEMPLATE_FIELDS = frozenset({"topic"})
_NONE = type(None)


@dataclasses.dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a setting or an option; ``id`` is the system check id."""

    id: str
    msg: str
    hint: str

    def error(self, obj: object = None) -> Error:
        return Error(self.msg, hint=self.hint, id=self.id, obj=obj)


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """A further test of a value that already has the option's type and bounds.

    ``why(value)`` says why the value is refused, as the rest of a sentence that starts with the
    option's place (``OUTBOX['NOTIFY_CHANNEL'] = 'x' cannot be...``), or returns None to accept it.
    """

    id: str
    why: Callable[[Any], str | None]
    hint: str


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Option:
    """The declaration of one option; made by :func:`option`, named by :func:`declared`."""

    #: As spelt in the dict (``MAX_ATTEMPTS``, ``URL``), and the dataclass attribute it fills.
    name: str = ""
    attr: str = ""
    kind: type | tuple[type, ...]
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    #: The minimum is excluded (durations and timeouts must be more than 0).
    above: bool = False
    choices: tuple[Any, ...] = ()
    #: For a list (or tuple) option: the type of each item.
    items: type | None = None
    #: The value (a string or a list) may not be empty; ``nonempty_items``: nor may any item.
    nonempty: bool = False
    nonempty_items: bool = False
    max_bytes: int | None = None
    #: A ``str.format`` template that may use only ``{topic}`` (E052).
    template: bool = False
    #: A ``timedelta`` or a number of seconds, read as a ``timedelta``.
    duration: bool = False
    #: The check id of a value of the wrong type or range; None: the id the caller gives.
    id: str | None = None
    #: What the message says a value must be; empty: said from the declaration.
    expected: str = ""
    #: How to fix a bad value; empty: "Fix the value, or remove the option to use its default."
    hint: str = ""
    rules: tuple[Rule, ...] = ()

    def describe(self) -> str:
        """What a value must be, for the message: "an integer from 1 to 2147483647", "True or False"."""
        if self.expected:
            return self.expected
        if self.choices:
            return f"one of {', '.join(map(repr, self.choices))}"
        kinds = self.kind if isinstance(self.kind, tuple) else (self.kind,)
        if self.duration:
            text = "a timedelta or number of seconds"
        else:
            text = " or ".join(dict.fromkeys(self._noun(k) for k in kinds))  # list and tuple read alike
        if self.minimum is not None:
            low, high = _g(self.minimum), _g(self.maximum) if self.maximum is not None else "any"
            above = self.above or self.duration  # a duration is always more than 0
            text += f" above {low} and at most {high}" if above else f" from {low} to {high}"
        if self.max_bytes is not None:
            text += f" of at most {self.max_bytes} bytes in UTF-8"
        return text

    def _noun(self, kind: type) -> str:
        if kind in (list, tuple) and self.items is not None:
            item = "string" if self.items is str else self.items.__name__
            return (
                f"a {'non-empty ' if self.nonempty else ''}list of {'non-empty ' if self.nonempty_items else ''}{item}s"
            )
        names = {str: "a non-empty string" if self.nonempty else "a string", int: "an integer", float: "a number"}
        names |= {bool: "True or False", list: "a list", tuple: "a list", _NONE: "None", object: "anything"}
        return names.get(kind, kind.__name__)

    def parse(self, value: object, where: str, default_id: str, noun: str = "option") -> tuple[Any, Problem | None]:
        """``value`` as the code reads it, or the problem with it (the first one found)."""
        if value is None and self._takes(_NONE):
            return None, None
        parsed = self._typed(value)
        if parsed is _REFUSED:
            text = f"{where}[{self.name!r}] must be {self.describe()}, not {shown(value)}."
            hint = self.hint or f"Fix the value, or remove the {noun} to use its default."
            return None, Problem(self.id or default_id, text, hint)
        if self.template:
            problem = template_problem(parsed)
            if problem:
                return None, Problem(
                    BAD_TEMPLATE, f"{where}[{self.name!r}] = {shown(value)} {problem}.", "Example: 'outbox.{topic}'."
                )
        for rule in self.rules:
            why = rule.why(parsed)
            if why:
                return None, Problem(rule.id, f"{where}[{self.name!r}] {why}", rule.hint)
        return parsed, None

    def _takes(self, kind: type) -> bool:
        return kind in (self.kind if isinstance(self.kind, tuple) else (self.kind,))

    def _typed(self, value: object) -> Any:
        """The value converted to what the code reads (float, tuple, timedelta), or ``_REFUSED``."""
        if self.duration:
            return _duration(value, self.maximum)
        if self._takes(object):
            return value
        if isinstance(value, bool):
            return value if self._takes(bool) else _REFUSED
        if isinstance(value, int | float):
            if isinstance(value, float) and not (self._takes(float) and math.isfinite(value)):
                return _REFUSED
            if not (self._takes(int) or self._takes(float)) or not self._in_bounds(value):
                return _REFUSED
            return float(value) if self._takes(float) and not self._takes(int) else value
        if isinstance(value, str):
            if not self._takes(str) or (self.nonempty and not value):
                return _REFUSED
            length = _utf8_length(value)
            if self.max_bytes is not None and (length is None or length > self.max_bytes):
                return _REFUSED
            return value if not self.choices or value in self.choices else _REFUSED
        if isinstance(value, list | tuple) and (self._takes(list) or self._takes(tuple)):
            if self.nonempty and not value:
                return _REFUSED
            if self.items is not None and not all(
                isinstance(item, self.items) and not isinstance(item, bool) and (item or not self.nonempty_items)
                for item in value
            ):
                return _REFUSED
            return tuple(value)
        if isinstance(value, dt.timedelta) and self._takes(dt.timedelta):
            return value
        return _REFUSED

    def _in_bounds(self, value: float) -> bool:
        """Within the bounds; an int of any size compares exactly, NaN never gets here."""
        if self.minimum is None:
            return True
        low = value > self.minimum if self.above else value >= self.minimum
        return low and (self.maximum is None or value <= self.maximum)


_REFUSED: Any = object()


def option(
    default: Any = dataclasses.MISSING,
    *,
    kind: type | tuple[type, ...],
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    minimum: float | None = None,
    maximum: float | None = None,
    above: bool = False,
    choices: tuple[Any, ...] = (),
    items: type | None = None,
    nonempty: bool = False,
    nonempty_items: bool = False,
    max_bytes: int | None = None,
    template: bool = False,
    duration: bool = False,
    id: str | None = None,
    expected: str = "",
    hint: str = "",
    rules: tuple[Rule, ...] = (),
) -> Any:
    """A dataclass field declaring one option; with no default (nor factory) it is required.

    A numeric option needs both bounds (NaN, infinity and absurd values must not reach a socket, a
    ``timedelta`` or an integer column); ``max_bytes`` bounds a string's UTF-8 length.
    """
    kinds = set(kind) if isinstance(kind, tuple) else {kind}
    if (kinds & {int, float} or duration) and (minimum is None or maximum is None):
        raise TypeError("a numeric option needs a minimum and a maximum")
    if isinstance(default, list | dict):
        raise TypeError("use a tuple, None or a default_factory as an option default")
    declaration = Option(
        kind=kind,
        required=default is dataclasses.MISSING and default_factory is dataclasses.MISSING,
        minimum=minimum,
        maximum=maximum,
        above=above,
        choices=choices,
        items=items,
        nonempty=nonempty,
        nonempty_items=nonempty_items,
        max_bytes=max_bytes,
        template=template,
        duration=duration,
        id=id,
        expected=expected,
        hint=hint,
        rules=rules,
    )
    # The declaration's attributes are also in the metadata, so introspection needs no import of this module.
    metadata = {"option": declaration, **{f.name: getattr(declaration, f.name) for f in dataclasses.fields(Option)}}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@functools.cache
def declared(cls: type) -> tuple[Option, ...]:
    """The options a dataclass of :func:`option` fields declares, named as spelt in the dict (capitals)."""
    return tuple(
        dataclasses.replace(f.metadata["option"], name=f.name.upper(), attr=f.name)
        for f in dataclasses.fields(cls)
        if "option" in f.metadata
    )


def validate(
    declarations: Sequence[Option],
    given: Mapping[Any, Any],
    *,
    where: str,
    unknown_id: str,
    invalid_id: str,
    missing_id: str | None = None,
    owner: str = "",
    noun: str = "option",
) -> tuple[dict[str, Any], list[Problem]]:
    """The values of the options in ``given`` (by attribute name), and every problem with ``given``.

    Unknown names (``unknown_id``), missing required options (``missing_id``, naming ``owner``), then
    each given value in declaration order (its option's own id, else ``invalid_id``). An option left
    out gets no value: the dataclass default applies.
    """
    by_name = {o.name: o for o in declarations}
    problems = [
        Problem(
            unknown_id, f"{where} has an unknown {noun} {shown(key)}.", f"Known {noun}s: {', '.join(sorted(by_name))}."
        )
        for key in sorted(set(given) - set(by_name), key=str)
    ]
    if missing_id is not None:
        problems += [
            Problem(missing_id, f"{owner} needs OPTIONS[{o.name!r}].", f"Add {o.name!r} to {where}.")
            for o in declarations
            if o.required and o.name not in given
        ]
    values: dict[str, Any] = {}
    for declaration in declarations:
        if declaration.name in given:
            value, problem = declaration.parse(given[declaration.name], where, invalid_id, noun)
            if problem is None:
                values[declaration.attr] = value
            else:
                problems.append(problem)
    return values, problems


def raise_first(problems: Sequence[Problem | CheckMessage]) -> None:
    """Refuse to go on with a bad configuration (a worker started without ``manage.py check``)."""
    from .exceptions import OutboxImproperlyConfigured

    if problems:
        first = problems[0]
        raise OutboxImproperlyConfigured(f"{first.msg} {first.hint or ''} ({first.id}; run 'manage.py check')")


# --- how values are shown and read ------------------------------------------------------------------------


def shown(value: object, limit: int = 100) -> str:
    """``repr(value)`` cut to ``limit`` characters, for check messages about values of any size or kind.

    A setting may hold a 10 MB string or an integer too long for ``repr()`` (Python refuses more than
    4300 digits); a check message must still be short, and building it must not raise.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = _SHORT_REPR.repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = 100


def _g(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else repr(bound)


def _duration(value: object, maximum: float | None) -> Any:
    """A duration of at least a microsecond and at most ``maximum`` seconds, from a timedelta or seconds."""
    top = dt.timedelta(seconds=maximum or 0)
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not (isinstance(value, int) or math.isfinite(value)) or not 0 < value <= (maximum or 0):
            return _REFUSED
        value = dt.timedelta(seconds=value)
    if isinstance(value, dt.timedelta) and dt.timedelta(0) < value <= top:
        return value
    return _REFUSED


def _utf8_length(text: str) -> int | None:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def template_problem(template: str) -> str | None:
    """Why ``template`` cannot name a stream, subject or routing key, or None if it can.

    Only a bare ``{topic}``: a conversion or format spec (``{topic:>99999999999}``) would pass here and
    then fail, or fill memory, at every delivery.
    """
    try:
        parsed = [(f, conversion, spec) for _, f, spec, conversion in string.Formatter().parse(template)]
    except ValueError as exc:
        return f"is not a valid template ({exc})"
    fields = {f for f, _, _ in parsed if f is not None}
    unknown = sorted(fields - TEMPLATE_FIELDS)
    if unknown:
        return f"uses {', '.join('{' + f + '}' for f in unknown)}; only {{topic}} is available"
    if any(f is not None and (conversion or spec) for f, conversion, spec in parsed):
        return "formats {topic} (a conversion or format spec); write plain {topic}"
    if "\x00" in template or _utf8_length(template) is None:
        return "contains a NUL character or a lone surrogate"
    return None


# --- registering checks -------------------------------------------------------------------------------------

Check = Callable[..., list[CheckMessage]]


def check_failed(what: str, exc: Exception, *, obj: object = None) -> Error:
    """E007: ``what`` raised instead of reporting; the problem it looked for may still be there."""
    detail = f"{type(exc).__name__}: {str(exc).strip()[:500]}".rstrip(": ")
    logger.error("the check %s failed to run", what, exc_info=exc)
    return Error(
        f"The check {what} failed to run: {detail}",
        hint="What it checks is unverified; the other checks still ran. The traceback is logged to the "
        "'django_outbox.checks' logger; fix the setting it names, or report the bug with that traceback.",
        id=CHECK_FAILED,
        obj=obj,
    )


def register_check(*tags: str) -> Callable[[Check], Check]:
    """``django.core.checks.register``, but a check that raises reports E007 instead of aborting ``check``.

    A traceback out of ``run_checks()`` stops ``manage.py check``, ``migrate`` and the worker's start
    without saying which setting is wrong, and hides every other check's findings.
    """

    def decorate(check: Check) -> Check:
        @functools.wraps(check)
        def guarded(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
            try:
                return list(check(app_configs, **kwargs))
            except Exception as exc:
                return [check_failed(f"{check.__module__}.{check.__qualname__}", exc)]

        guarded.outbox_guarded = True  # type: ignore[attr-defined]
        register(*tags)(guarded)
        return guarded

    return decorate
