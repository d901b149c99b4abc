"""The worker side of email: rebuild each stored email and hand it to the real backend.

One connection per batch: opened for the first email, reused for the rest, closed at the end, so an
idle worker holds no SMTP connection that the server may have dropped meanwhile. SMTP replies decide
the outcome: a 5xx refusal of every recipient, of the sender or of the data is permanent; everything
else (4xx, a server that is down, a dropped connection) is tried again later.

Each email has ``OPTIONS["TIMEOUT"]`` seconds for connecting, the whole SMTP dialogue and closing
(see ``deadline.py``). When the server could not be reached or ran out the deadline, the rest of the
batch fails at once with the same reason instead of waiting that long again, email after email.
"""

from __future__ import annotations

import smtplib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from django.core.checks import CheckMessage, Error, Warning
from django.core.mail.backends.base import BaseEmailBackend
from django.utils.module_loading import import_string

from ..conf import get_settings
from ..exceptions import DeliveryError, PermanentDeliveryError, TransientDeliveryError
from ..options import option
from ..transports.base import BatchTransport
from ..transports.deadlines import Watchdog
from .deadline import with_deadline
from .payload import from_payload

if TYPE_CHECKING:
    from ..models import Message

DEFAULT_TIMEOUT = 60.0
#: A day: beyond that a number is a mistake (and ``threading.Timer`` refuses what overflows its clock).
MAX_TIMEOUT = 86400.0

#: The check ids of email (docs/checks.md).
BAD_EMAIL_BACKEND = "django_outbox.E040"
#: The email transport's configuration: ``EMAIL_MAILER`` on an old Django or naming no mailer, or its OPTIONS.
BAD_EMAIL_CONFIG = "django_outbox.E041"
NO_BROWSER_LINKS = "django_outbox.W040"


@dataclass(frozen=True, kw_only=True)
class EmailOptions:
    """The email transport's ``OPTIONS``; the backend that really sends is ``OUTBOX["EMAIL_BACKEND"]``."""

    #: Seconds per email for connecting, the whole SMTP dialogue and closing.
    timeout: float = option(
        DEFAULT_TIMEOUT, kind=float, minimum=0, above=True, maximum=MAX_TIMEOUT, hint="Example: 'TIMEOUT': 60."
    )


OWN_BACKEND = "django_outbox.mail.EmailBackend"
_OWN_BACKENDS = {OWN_BACKEND, "django_outbox.mail.backend.EmailBackend"}


def _reply(code: int, text: bytes | str) -> str:
    return f"{code} {text.decode(errors='replace') if isinstance(text, bytes) else text}"


def classify(exc: BaseException) -> BaseException:
    """The delivery error the relay should see for what the backend raised (the cause is kept)."""
    if isinstance(exc, DeliveryError):
        return exc
    result: DeliveryError
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        replies = {addr: reply for addr, reply in exc.recipients.items()}
        summary = "; ".join(f"{addr}: {_reply(*reply)}" for addr, reply in replies.items())
        if replies and all(code >= 500 for code, _ in replies.values()):
            result = PermanentDeliveryError(f"the SMTP server refused every recipient: {summary}")
        else:
            result = TransientDeliveryError(f"the SMTP server refused the recipients for now: {summary}")
    elif isinstance(exc, smtplib.SMTPSenderRefused | smtplib.SMTPDataError) and exc.smtp_code >= 500:
        result = PermanentDeliveryError(f"the SMTP server rejected the email: {_reply(exc.smtp_code, exc.smtp_error)}")
    elif isinstance(exc, smtplib.SMTPResponseException):
        result = TransientDeliveryError(f"the SMTP server answered {_reply(exc.smtp_code, exc.smtp_error)}")
    elif isinstance(exc, smtplib.SMTPException | OSError):
        result = TransientDeliveryError(f"could not talk to the mail server: {type(exc).__name__}: {exc}")
    else:
        return exc
    result.__cause__ = exc
    return result


def real_backend() -> BaseEmailBackend:
    """The backend that really sends, built as Django builds it for the version in use."""
    conf = get_settings()
    if conf.EMAIL_MAILER:
        from django.core.mail import mailers  # type: ignore[attr-defined,unused-ignore]  # Django 6.1+

        backend: BaseEmailBackend = mailers[conf.EMAIL_MAILER]
        return backend
    cls = import_string(conf.EMAIL_BACKEND)
    built: BaseEmailBackend = cls()
    return built


class EmailTransport(BatchTransport):
    options_class: ClassVar[type | None] = EmailOptions
    unknown_option_id: ClassVar[str] = BAD_EMAIL_CONFIG
    bad_option_id: ClassVar[str] = BAD_EMAIL_CONFIG

    def __init__(self, *, name: str, options: Mapping[str, Any]) -> None:
        super().__init__(name=name, options=options)
        self.settings: EmailOptions
        self.timeout = self.settings.timeout
        self._backend: BaseEmailBackend | None = None
        self._watchdog = Watchdog()

    def deliver_batch(self, messages: Sequence[Message]) -> list[BaseException | None]:
        results: list[BaseException | None] = []
        unreachable: BaseException | None = None  # why the server could not be talked to, if it could not
        try:
            for message in messages:
                if unreachable is not None:
                    results.append(self._not_tried(unreachable))
                    continue
                result = self._send(message)
                results.append(result)
                if _unreachable(result):
                    unreachable = result
        finally:
            self._disconnect()
        return results

    def _send(self, message: Message) -> BaseException | None:
        try:
            email = from_payload(message.payload)
        except (ValueError, KeyError, TypeError) as exc:
            error = PermanentDeliveryError(f"the stored email cannot be rebuilt: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            return error
        self._watchdog.arm(self.timeout)
        try:
            try:
                if self._backend is None:
                    self._backend = real_backend()
                    with_deadline(self._backend, self.timeout)
                    self._backend.open()
                sent = self._backend.send_messages([email])
            except Exception as exc:
                expired = self._watchdog.expired()
                self._disconnect()  # the next email starts on a fresh connection; closing is within the deadline
                return self._timed_out(exc) if expired else classify(exc)
        finally:
            self._watchdog.disarm()
        backend_name = type(self._backend).__name__
        if self._watchdog.fired:  # the deadline struck just after the reply: that connection is shut
            self._disconnect()
        if not sent:
            return TransientDeliveryError(
                f"the email backend {backend_name} reported that it sent nothing; is it set to fail silently?"
            )
        return None

    def _timed_out(self, exc: BaseException) -> DeliveryError:
        error = _DeadlineError(
            f"the mail server did not complete the email within {self.timeout:g} s (OPTIONS['TIMEOUT'] of "
            f"transport {self.name!r} bounds connecting, the SMTP dialogue and closing together); "
            f"the connection was cut: {type(exc).__name__}: {exc}"
        )
        error.__cause__ = exc
        return error

    @staticmethod
    def _not_tried(reason: BaseException) -> DeliveryError:
        error = TransientDeliveryError(
            f"not tried: an earlier email of this batch found the mail server unusable ({reason})"
        )
        error.__cause__ = reason
        return error

    def _disconnect(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            try:
                backend.close()
            except Exception:  # closing a broken connection may fail too; it is gone either way
                pass

    def close(self) -> None:
        self._disconnect()

    @classmethod
    def check(cls, name: str, options: Mapping[str, Any]) -> list[CheckMessage]:
        import django

        conf = get_settings()
        found: list[CheckMessage] = [*super().check(name, options), *_link_warnings()]
        if conf.EMAIL_MAILER:
            if django.VERSION < (6, 1):
                found.append(
                    Error(
                        "OUTBOX['EMAIL_MAILER'] needs Django 6.1 or later (settings.MAILERS).",
                        hint="Name the real backend with OUTBOX['EMAIL_BACKEND'] instead.",
                        id=BAD_EMAIL_CONFIG,
                    )
                )
            else:
                from django.conf import settings

                config = getattr(settings, "MAILERS", {}).get(conf.EMAIL_MAILER)
                if config is None:
                    found.append(
                        Error(
                            f"OUTBOX['EMAIL_MAILER'] names {conf.EMAIL_MAILER!r}, which is not in settings.MAILERS.",
                            hint="Add that mailer, pointing at the backend that really sends (e.g. SMTP).",
                            id=BAD_EMAIL_CONFIG,
                        )
                    )
                elif config.get("BACKEND") in _OWN_BACKENDS:
                    found.append(_loop_error("OUTBOX['EMAIL_MAILER']"))
            return found
        if conf.EMAIL_BACKEND in _OWN_BACKENDS:
            return [*found, _loop_error("OUTBOX['EMAIL_BACKEND']")]
        try:
            import_string(conf.EMAIL_BACKEND)
        except Exception as exc:  # ImportError, ValueError (".x"), or what the module raised on import
            found.append(
                Error(
                    f"OUTBOX['EMAIL_BACKEND'] {conf.EMAIL_BACKEND!r} cannot be imported: {exc}",
                    hint="Name the email backend the worker should send with, e.g. "
                    "'django.core.mail.backends.smtp.EmailBackend'.",
                    id=BAD_EMAIL_BACKEND,
                )
            )
        return found


class _DeadlineError(TransientDeliveryError):
    """An email ran out of ``OPTIONS["TIMEOUT"]``."""


def _unreachable(result: BaseException | None) -> bool:
    """Whether ``result`` says the server cannot be talked to now (so later emails need not try)."""
    if isinstance(result, _DeadlineError):
        return True
    cause = result.__cause__ if isinstance(result, DeliveryError) else result
    return isinstance(cause, smtplib.SMTPServerDisconnected | smtplib.SMTPConnectError | ConnectionError | TimeoutError)


def _outbox_backend_in_use() -> bool:
    import warnings

    from django.conf import settings

    if hasattr(settings, "MAILERS"):  # Django 6.1+, where EMAIL_BACKEND must not be read any more
        return getattr(settings, "MAILERS", {}).get("default", {}).get("BACKEND") in _OWN_BACKENDS
    with warnings.catch_warnings():  # Django 6.1 deprecates the setting; reading it is still right there
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        return settings.EMAIL_BACKEND in _OWN_BACKENDS


def _link_warnings() -> list[CheckMessage]:
    from django.urls import NoReverseMatch, reverse

    if not _outbox_backend_in_use():
        return []
    try:
        reverse("django_outbox:email-view", kwargs={"token": "check"})
    except NoReverseMatch:
        return [
            Warning(
                "Emails go through the outbox, but django_outbox.urls is not in the URLconf, so HTML emails "
                "get no view-in-browser link.",
                hint='Add path("outbox/", include("django_outbox.urls")) to your urlpatterns.',
                id=NO_BROWSER_LINKS,
            )
        ]
    return []


def _loop_error(where: str) -> Error:
    return Error(
        f"{where} is the outbox's own email backend: the worker would write every email back to the outbox.",
        hint="Point it at the backend that really sends (e.g. django.core.mail.backends.smtp.EmailBackend); "
        "settings.EMAIL_BACKEND is the one that should be django_outbox.mail.EmailBackend.",
        id=BAD_EMAIL_BACKEND,
    )


__all__ = ["EmailTransport"]
