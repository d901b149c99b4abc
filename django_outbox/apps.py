from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class OutboxConfig(AppConfig):
    name = "django_outbox"
    label = "django_outbox"
    verbose_name = _("Outbox")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.apps import apps
        from django.utils.module_loading import autodiscover_modules

        # Each feature registers its own system checks and, where Django's admin is installed, its pages.
        from . import checks  # noqa: F401
        from .inbox import checks as inbox_checks  # noqa: F401

        if apps.is_installed("django.contrib.admin"):
            from .mail import admin as mail_admin  # noqa: F401
            from .retention import admin as retention_admin  # noqa: F401

        if uses_outbox_tasks():
            from .tasks.backend import OutboxBackend
            from .tasks.runner import register_handler

            register_handler(OutboxBackend)  # a worker serves tasks.* before any code asks for the backend

        autodiscover_modules("outbox")


def uses_outbox_tasks() -> bool:
    """Whether ``TASKS`` names ``django_outbox.tasks.OutboxBackend`` (Django 6.0+ only: 5.2 has no tasks)."""
    import django
    from django.conf import settings

    if django.VERSION < (6, 0):
        return False
    backends = getattr(settings, "TASKS", None) or {}
    return isinstance(backends, dict) and any(
        isinstance(params, dict) and str(params.get("BACKEND", "")).startswith("django_outbox.tasks.")
        for params in backends.values()
    )
