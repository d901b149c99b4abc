"""The outbox console in Django's admin: the messages and their actions, the overview.

Django's admin autodiscovery imports this package, and importing it registers the messages' pages
(``messages``). The features register their own pages (``django_outbox.retention.admin``, the archive;
``django_outbox.mail.admin``, the email log) from the app's ``ready()``; every page builds on ``display``,
which imports none of them, so nothing here imports a feature.

The figures (``overview``, ``counting``) also serve ``manage.py outbox_status`` and the content policy
(``redaction``) the email log, in projects without ``django.contrib.admin`` too; Django's admin site
and its log exist only where that app is installed, so only there are the pages registered.
"""

from django.apps import apps

if apps.is_installed("django.contrib.admin"):
    from . import messages

    __all__ = ["messages"]
