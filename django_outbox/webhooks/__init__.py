"""Signed webhooks: Standard Webhooks signing and ``verify()`` for receivers, and the webhook transport.

``signing`` needs nothing beyond Django, so a receiving app imports ``django_outbox.webhooks`` without
the ``[webhooks]`` extra; ``transport`` (httpx) is imported only through its dotted path in settings,
``django_outbox.transports.webhook.WebhookTransport``, never from here.
"""

from .signing import (
    DEFAULT_TOLERANCE_SECONDS,
    SECRET_PREFIX,
    WebhookVerificationError,
    new_secret,
    secret_key,
    sign,
    verify,
)

__all__ = [
    "DEFAULT_TOLERANCE_SECONDS",
    "SECRET_PREFIX",
    "WebhookVerificationError",
    "new_secret",
    "secret_key",
    "sign",
    "verify",
]
