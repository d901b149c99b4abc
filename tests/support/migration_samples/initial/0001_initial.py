"""The package's initial migration, as the first of this module's."""

import importlib

Migration = importlib.import_module("django_outbox.migrations.0001_initial").Migration
