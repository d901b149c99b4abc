"""The one interface every destination implements.

A transport is built once per worker thread (so it may keep a connection or an HTTP pool without
locking) and closed when the thread ends. ``deliver()`` returns when the destination has accepted the
message and raises otherwise: ``PermanentDeliveryError`` to give up at once, anything else to retry.
Transports that can confirm many messages in one round trip override ``deliver_batch()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from django.core.checks import CheckMessage

from ..options import Problem, declared, raise_first, validate

if TYPE_CHECKING:
    from ..models import Message

#: A required option is missing (declared without a default, or in ``required_options``).
MISSING_OPTION = "django_outbox.E013"
#: An option the transport does not declare (often a typo, or a lower-case name).
UNKNOWN_OPTION = "django_outbox.E050"
#: A value of the wrong type or out of range, unless its option names an id of its own.
BAD_OPTION = "django_outbox.E051"


class BaseTransport:
    """A destination; its ``OPTIONS`` are declared once, by ``options_class``, and checked from there.

    ``options_class`` is a frozen dataclass of ``django_outbox.options.option()`` fields (lower-case
    names, spelt in capitals in ``OPTIONS``); the transport reads the parsed values as ``self.settings``.
    A transport that declares none (a third party's, say) takes any ``OPTIONS`` and may list the ones
    it needs in ``required_options``.
    """

    #: The options this transport takes; None: any (only ``required_options`` are checked).
    options_class: ClassVar[type | None] = None
    #: Options that must be present in ``OPTIONS`` when no ``options_class`` declares them.
    required_options: ClassVar[tuple[str, ...]] = ()
    #: The check ids of an option the class does not declare, and of a value its option refuses.
    unknown_option_id: ClassVar[str] = UNKNOWN_OPTION
    bad_option_id: ClassVar[str] = BAD_OPTION

    def __init__(self, *, name: str, options: Mapping[str, Any]) -> None:
        self.name = name
        self.options = options
        self.settings: Any = None
        if self.options_class is not None:
            # as check() says: a worker started without 'manage.py check' still refuses bad options
            values, problems = self.option_problems(name, options)
            raise_first(problems)
            self.settings = self.options_class(**values)

    def deliver(self, message: Message) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement deliver()")

    def deliver_batch(self, messages: Sequence[Message]) -> list[BaseException | None]:
        """Deliver in order; one result per message, ``None`` for delivered.

        The relay only calls this for transports that override it; the default keeps the contract for
        callers that batch anyway.
        """
        results: list[BaseException | None] = []
        for message in messages:
            try:
                self.deliver(message)
            except Exception as exc:
                results.append(exc)
            else:
                results.append(None)
        return results

    def close(self) -> None:
        """Release connections; called once when the worker thread that owns the transport stops."""

    @classmethod
    def check(cls, name: str, options: Mapping[str, Any]) -> list[CheckMessage]:
        """Configuration problems, reported by ``manage.py check`` before any worker starts.

        A subclass adding checks of its own extends this (``[*super().check(name, options), ...]``).
        """
        where = f"OUTBOX['TRANSPORTS'][{name!r}]['OPTIONS']"
        _, problems = cls.option_problems(name, options)
        return [p.error(obj=where) for p in problems]

    @classmethod
    def option_problems(cls, name: str, options: Mapping[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
        """The declared options' values and every problem with ``options``; the combination is checked
        only once each option is valid alone."""
        where = f"OUTBOX['TRANSPORTS'][{name!r}]['OPTIONS']"
        owner = f"Transport {name!r} ({cls.__module__}.{cls.__qualname__})"
        if cls.options_class is None:
            missing = [
                Problem(MISSING_OPTION, f"{owner} needs OPTIONS[{key!r}].", f"Add {key!r} to {where}.")
                for key in cls.required_options
                if key not in options
            ]
            return {}, missing
        values, problems = validate(
            declared(cls.options_class),
            options,
            where=where,
            unknown_id=cls.unknown_option_id,
            invalid_id=cls.bad_option_id,
            missing_id=MISSING_OPTION,
            owner=owner,
        )
        if not problems:
            problems = cls.check_combination(name, options)
        return values, problems

    @classmethod
    def check_combination(cls, name: str, options: Mapping[str, Any]) -> list[Problem]:
        """Problems between options that are each valid alone; none by default."""
        return []

    @classmethod
    def supports_batch(cls) -> bool:
        return cls.deliver_batch is not BaseTransport.deliver_batch


class BatchTransport(BaseTransport):
    """A transport whose natural unit is the batch (one broker round trip, one SMTP connection).

    Subclasses implement ``deliver_batch()`` only; a single message is a batch of one.
    """

    def deliver(self, message: Message) -> None:
        (result,) = checked_results(self, [message], self.deliver_batch([message]))
        if result is not None:
            raise result

    def deliver_batch(self, messages: Sequence[Message]) -> list[BaseException | None]:
        raise NotImplementedError(f"{type(self).__name__} must implement deliver_batch()")


def checked_results(
    transport: BaseTransport, messages: Sequence[Message], results: object
) -> list[BaseException | None]:
    """``deliver_batch()``'s results, held to its contract: one per message, each None or an exception.

    A transport that returns too few results, or a value that is neither, fails the messages it was
    given with an error that names it, rather than the worker that called it.
    """
    name = f"{type(transport).__module__}.{type(transport).__qualname__}"
    try:
        checked = list(results)  # type: ignore[call-overload]
    except Exception as exc:
        raise TypeError(f"{name}.deliver_batch() returned {type(results).__name__}, not a list of results") from exc
    if len(checked) != len(messages):
        raise TypeError(
            f"{name}.deliver_batch() returned {len(checked)} results for {len(messages)} messages; "
            "it must return one per message, None for delivered or the exception that failed it"
        )
    return [
        result
        if result is None or isinstance(result, BaseException)
        else TypeError(
            f"{name}.deliver_batch() returned a {type(result).__name__} for message #{message.id}; "
            "a result is None (delivered) or the exception that failed the message"
        )
        for message, result in zip(messages, checked, strict=True)
    ]
