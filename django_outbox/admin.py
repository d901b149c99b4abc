"""Admin registrations."""

from .mail import admin as mail_admin  # noqa: F401  (the email log)
