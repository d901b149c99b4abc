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

if TYPE_CHECKING:
    from ..models import Message


class BaseTransport:
    #: Options that must be present in ``OPTIONS``; checked by ``manage.py check``.
    required_options: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, name: str, options: Mapping[str, Any]) -> None:
        self.name = name
        self.options = options

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
        """Configuration problems, reported by ``manage.py check`` before any worker starts."""
        from django.core.checks import Error

        return [
            Error(
                f"Transport {name!r} ({cls.__module__}.{cls.__qualname__}) needs OPTIONS[{option!r}].",
                hint=f"Add {option!r} to OUTBOX['TRANSPORTS'][{name!r}]['OPTIONS'].",
                id="django_outbox.E013",
            )
            for option in cls.required_options
            if option not in options
        ]

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
