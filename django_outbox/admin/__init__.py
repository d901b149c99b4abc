"""The outbox console in Django's admin: messages, the overview, the archive and the email log.

Django's admin autodiscovery imports this package, and importing it registers the pages: the messages
(``messages``), the archive (``django_outbox.retention.admin``) and the email log
(``django_outbox.mail.admin``). Every page builds on ``display``, which imports none of them.

The figures (``overview``, ``counting``) also serve ``manage.py outbox_status`` and the content policy
(``redaction``) the email log, in projects without ``django.contrib.admin`` too; Django's admin site
and its log exist only where that app is installed, so only there are the pages registered.
"""

from django.apps import apps

if apps.is_installed("django.contrib.admin"):
    from ..mail import admin as mail_admin
    from ..retention import admin as retention_admin
    from . import messages

    __all__ = ["mail_admin", "messages", "retention_admin"]
