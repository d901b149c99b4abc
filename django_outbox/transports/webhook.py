"""The webhook transport under the dotted path settings name: ``django_outbox.transports.webhook.WebhookTransport``.

The code lives in ``django_outbox.webhooks.transport``, beside the signing it shares with receivers;
this module keeps the path users put in ``OUTBOX["TRANSPORTS"]`` (and import ``WebhookTarget`` from)
working. Importing it needs the ``[webhooks]`` extra (httpx).
"""

from ..webhooks.transport import BlockedAddressError, WebhookTarget, WebhookTransport

__all__ = ["BlockedAddressError", "WebhookTarget", "WebhookTransport"]
