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

        autodiscover_modules("outbox")
