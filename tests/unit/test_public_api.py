"""The names each public module exports, pinned: a name that goes missing or appears by accident fails here.

Users import these modules (and the transports by the dotted paths the docs give for settings), so a
refactoring that moves code must keep every name below importable from where it is today. The lists are
written out rather than computed, so that changing one is a decision someone makes in a diff.
"""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys

import django
import pytest

from tests.support import ROOT

PUBLIC_NAMES: dict[str, list[str]] = {
    "django_outbox": [
        "DeliveryError",
        "DeliveryTimeoutError",
        "IdempotencyConflictError",
        "MissingExtraError",
        "Outbox",
        "OutboxError",
        "OutboxImproperlyConfigured",
        "PayloadTooLargeError",
        "PermanentDeliveryError",
        "TransientDeliveryError",
        "UnknownTopicError",
        "outbox",
    ],
    "django_outbox.exceptions": [
        "DeliveryError",
        "DeliveryTimeoutError",
        "IdempotencyConflictError",
        "MissingExtraError",
        "OutboxError",
        "OutboxImproperlyConfigured",
        "PayloadTooLargeError",
        "PermanentDeliveryError",
        "TransientDeliveryError",
        "UnknownTopicError",
    ],
    "django_outbox.models": [
        "ArchivedAttempt",
        "ArchivedMessage",
        "Attempt",
        "IdempotencyRecord",
        "InboxMessage",
        "Message",
        "OutboxEmail",
        "Worker",
    ],
    "django_outbox.signals": ["message_dead", "message_delivered", "message_failed"],
    "django_outbox.testing": ["NotSettledError", "OutboxMessages", "OutboxTestMixin", "relay_all"],
    "django_outbox.inbox": ["Receipt", "consumer", "purge", "receive"],
    "django_outbox.idempotency": ["IdempotencyOptions", "IdempotentMixin", "client_scope", "idempotent"],
    "django_outbox.webhooks": [
        "DEFAULT_TOLERANCE_SECONDS",
        "SECRET_PREFIX",
        "WebhookVerificationError",
        "new_secret",
        "secret_key",
        "sign",
        "verify",
    ],
    "django_outbox.mail": ["EmailBackend", "ReusedBrowserLinkError", "browser_link"],
    "django_outbox.transports": ["BaseTransport", "BatchTransport"],
    # The modules behind the dotted paths that settings name (docs/transports/, docs/settings.md).
    "django_outbox.transports.handler": ["HandlerTransport"],
    "django_outbox.transports.webhook": ["BlockedAddressError", "WebhookTarget", "WebhookTransport"],
    "django_outbox.transports.amqp": ["AMQPTransport"],
    "django_outbox.transports.redis": ["RedisStreamsTransport"],
    "django_outbox.transports.nats": ["NATSTransport"],
    "django_outbox.transports.kafka": ["KafkaTransport"],
    "django_outbox.mail.transport": ["EmailTransport"],
}
if django.VERSION >= (6, 0):  # django.tasks is new in Django 6.0 (tests/unit/test_tasks_versions.py for 5.2)
    PUBLIC_NAMES["django_outbox.tasks"] = ["OutboxBackend"]


@pytest.mark.parametrize("module_name", sorted(PUBLIC_NAMES))
def test_each_public_module_exports_exactly_its_names(module_name):
    module = importlib.import_module(module_name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{module_name} has no __all__"
    assert list(exported) == PUBLIC_NAMES[module_name]
    assert list(exported) == sorted(exported), f"{module_name}.__all__ is not sorted"


@pytest.mark.parametrize("module_name", sorted(PUBLIC_NAMES))
def test_every_exported_name_resolves(module_name):
    module = importlib.import_module(module_name)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{module_name}.__all__ names what it does not define: {missing}"


def _exception_classes(module_name: str) -> set[str]:
    module = importlib.import_module(module_name)
    return {
        name
        for name, value in vars(module).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == module_name
        and not name.startswith("_")
    }


def test_every_public_exception_is_exported_from_the_package():
    from django_outbox import exceptions

    defined = _exception_classes("django_outbox.exceptions")
    assert "DeliveryTimeoutError" in defined  # the one that was missing: the check itself must see it
    assert defined == set(exceptions.__all__)
    import django_outbox

    assert defined <= set(django_outbox.__all__), sorted(defined - set(django_outbox.__all__))
    for name in defined:
        assert getattr(django_outbox, name) is getattr(exceptions, name)


def test_the_dotted_paths_in_the_docs_resolve():
    """Every ``django_outbox.transports.<x>.<Class>`` and ``django_outbox.mail...`` path the docs give works."""
    import re

    from django.utils.module_loading import import_string

    pattern = re.compile(r"django_outbox\.(?:transports\.\w+|mail(?:\.transport)?)\.[A-Z]\w+")
    paths = {match for page in (ROOT / "docs").rglob("*.md") for match in pattern.findall(page.read_text("utf-8"))}
    assert "django_outbox.transports.webhook.WebhookTransport" in paths
    missing = []
    for path in sorted(paths):
        try:
            import_string(path)
        except ImportError:
            missing.append(path)
    assert not missing, f"the docs name dotted paths that do not import: {missing}"


def test_receivers_import_the_webhook_signing_without_httpx():
    """``django_outbox.webhooks`` is what a receiving app imports for ``verify()``; it must not need the extra."""
    code = (
        "import sys; sys.modules['httpx'] = None; sys.modules['httpcore'] = None\n"
        "import django; django.setup()\n"
        "from django_outbox.webhooks import verify, sign, new_secret\n"
        "assert 'django_outbox.webhooks.transport' not in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_every_public_module_has_an_api_reference_page():
    """docs/reference/ renders each public module's API (mkdocstrings' ``::: module``); the transports are
    documented by their guides (docs/transports/), the models by the pages of their features."""
    import re

    rendered = {
        match
        for page in (ROOT / "docs" / "reference").glob("*.md")
        for match in re.findall(r"^::: ([\w.]+)", page.read_text("utf-8"), re.M)
    }
    modules = {*PUBLIC_NAMES, "django_outbox.tasks"}  # tasks is public on Django 6.x, documented on both
    wanted = {m for m in modules if not m.startswith(("django_outbox.transports", "django_outbox.mail.transport"))}
    wanted.discard("django_outbox.models")
    assert "django_outbox.tasks" in wanted and "django_outbox.signals" in wanted
    missing = sorted(wanted - rendered)
    assert not missing, f"public modules without a page in docs/reference/: {missing}"
