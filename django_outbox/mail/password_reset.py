"""Recognising the email Django's ``PasswordResetForm`` sends, while the email backend writes it.

A password-reset link read by someone else is an account takeover, so the backend marks such an email
and the admin's audit records (``django_outbox.admin.redaction``) name that reason when one is shown.
It lives in ``mail`` because the backend runs it at send time, in projects with or without the admin.
"""

from __future__ import annotations

import sys

from django.apps import apps

#: The stored email's ``"protected"`` mark, and the reason the admin's audit records give for it.
PASSWORD_RESET = "password reset"
#: How far up the stack the email backend looks for the form that sends password-reset mail.
_STACK_DEPTH = 60
_RESET_FORM_METHODS = frozenset({"send_mail", "save"})


def sent_by_password_reset_form() -> bool:
    """Whether the email being written comes from Django's ``PasswordResetForm`` (or a subclass).

    Recognised by the form on the call stack, not by the subject or the template, which every project
    changes: the form's ``send_mail()`` or ``save()`` is running while the backend writes the email.
    """
    if not apps.is_installed("django.contrib.auth"):
        return False
    from django.contrib.auth.forms import PasswordResetForm

    frame = sys._getframe(1)
    for _ in range(_STACK_DEPTH):
        if frame is None:
            return False
        # The name first: only the frames of the form's own two methods have their locals read.
        if frame.f_code.co_name in _RESET_FORM_METHODS and isinstance(frame.f_locals.get("self"), PasswordResetForm):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False
