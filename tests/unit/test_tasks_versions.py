"""``django_outbox.tasks`` needs Django 6.0+ (``django.tasks``): on Django 5.2 importing it says so."""

from __future__ import annotations

import importlib
import sys

import django
import pytest
from django.core.exceptions import ImproperlyConfigured

from django_outbox.apps import uses_outbox_tasks

OUTBOX_TASKS = {"default": {"BACKEND": "django_outbox.tasks.OutboxBackend"}}


@pytest.fixture
def fresh_import():
    sys.modules.pop("django_outbox.tasks", None)
    yield
    if django.VERSION < (6, 0):
        sys.modules.pop("django_outbox.tasks", None)


@pytest.mark.skipif(django.VERSION >= (6, 0), reason="Django 5.2 only")
@pytest.mark.usefixtures("fresh_import")
def test_on_django_5_importing_the_backend_raises_improperly_configured():
    with pytest.raises(ImproperlyConfigured, match=r"needs Django 6\.0 or later .* this is Django 5\."):
        importlib.import_module("django_outbox.tasks")


@pytest.mark.skipif(django.VERSION >= (6, 0), reason="Django 5.2 only")
def test_on_django_5_a_tasks_setting_registers_nothing(settings):
    settings.TASKS = OUTBOX_TASKS
    assert uses_outbox_tasks() is False


@pytest.mark.skipif(django.VERSION < (6, 0), reason="Django 6.x only")
def test_on_django_6_the_backend_imports_and_the_setting_is_recognised(settings):
    module = importlib.import_module("django_outbox.tasks")
    from django.tasks.backends.base import BaseTaskBackend

    assert issubclass(module.OutboxBackend, BaseTaskBackend)
    settings.TASKS = OUTBOX_TASKS
    assert uses_outbox_tasks() is True
    settings.TASKS = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}
    assert uses_outbox_tasks() is False
