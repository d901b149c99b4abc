from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

import django_outbox
from django_outbox.checks import database_messages
from django_outbox.conf import get_settings
from django_outbox.exceptions import OutboxImproperlyConfigured
from tests.support.checks import outbox_errors


def test_public_names_are_sorted_and_importable():
    assert django_outbox.__all__ == sorted(django_outbox.__all__)
    for name in django_outbox.__all__:
        assert getattr(django_outbox, name) is not None


def test_valid_settings_have_no_errors():
    assert outbox_errors() == []


@pytest.mark.parametrize(
    ("outbox", "expected"),
    [
        ("not a dict", "django_outbox.E001"),
        ({"MAX_ATEMPTS": 3}, "django_outbox.E002"),
        ({"MAX_ATTEMPTS": 0}, "django_outbox.E003"),
        ({"MAX_ATTEMPTS": "3"}, "django_outbox.E003"),
        ({"LEASE_SECONDS": True}, "django_outbox.E003"),
        ({"NOTIFY": "yes"}, "django_outbox.E003"),
        ({"BACKOFF_BASE_SECONDS": 10, "BACKOFF_MAX_SECONDS": 1}, "django_outbox.E003"),
        ({"DATABASE": "missing"}, "django_outbox.E004"),
        ({"LISTEN_DATABASE": "missing"}, "django_outbox.E008"),
        ({"LISTEN_DATABASE": 3}, "django_outbox.E008"),
        ({"TRANSPORTS": {"x": {"OPTIONS": {}}}}, "django_outbox.E010"),
        ({"TRANSPORTS": {"x": {"BACKEND": "a.b", "URL": "nope"}}}, "django_outbox.E010"),
        ({"ROUTES": ["orders.*"]}, "django_outbox.E020"),
        ({"ROUTES": {"orders.*": "nowhere"}}, "django_outbox.E021"),
    ],
)
def test_malformed_settings_are_reported_with_stable_ids(outbox, expected):
    with override_settings(OUTBOX=outbox):
        assert expected in outbox_errors()
        # code that needs the settings refuses to run on them, naming the same id
        with pytest.raises(OutboxImproperlyConfigured, match=expected):
            get_settings()


@pytest.mark.parametrize("backend", ["no.such.module.Transport", "django_outbox.models.Message"])
def test_a_backend_that_is_not_a_transport_is_reported(backend):
    with override_settings(OUTBOX={"TRANSPORTS": {"x": {"BACKEND": backend}}}):
        assert outbox_errors() == ["django_outbox.E011"]


def test_manage_py_check_fails_on_bad_settings():
    with override_settings(OUTBOX={"MAX_ATTEMPTS": -1}), pytest.raises(SystemCheckError, match="E003"):
        call_command("check")


def test_sqlite_without_immediate_transactions_warns():
    (warning,) = database_messages("default", {"ENGINE": "django.db.backends.sqlite3"})
    assert warning.id == "django_outbox.W001"
    assert all(option in (warning.hint or "") for option in ("'transaction_mode': 'IMMEDIATE'", "'timeout': 20", "WAL"))
    immediate = {"ENGINE": "django.db.backends.sqlite3", "OPTIONS": {"transaction_mode": "IMMEDIATE"}}
    assert database_messages("default", immediate) == []


def test_unsupported_database_is_an_error():
    messages = database_messages("default", {"ENGINE": "django.db.backends.oracle"})
    assert [m.id for m in messages] == ["django_outbox.E005"]
    assert database_messages("default", {"ENGINE": "django.db.backends.postgresql"}) == []


def test_settings_are_reread_after_override():
    assert get_settings().MAX_ATTEMPTS == 5
    with override_settings(OUTBOX={"MAX_ATTEMPTS": 9}):
        assert get_settings().MAX_ATTEMPTS == 9
    assert get_settings().MAX_ATTEMPTS == 5


def test_handler_timeout_setting_is_read():
    assert get_settings().HANDLER_TIMEOUT_SECONDS is None
    with override_settings(OUTBOX={"HANDLER_TIMEOUT_SECONDS": 2}):
        assert get_settings().HANDLER_TIMEOUT_SECONDS == 2.0
        assert outbox_errors() == []
