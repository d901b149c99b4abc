"""The package's second migration, so this module's state is the package's before its own changes: on
SQLite a change that rebuilds the table rebuilds it from this state, which must hold the package's index."""

import importlib

Migration = importlib.import_module("django_outbox.migrations.0002_pending_unkeyed_index").Migration
