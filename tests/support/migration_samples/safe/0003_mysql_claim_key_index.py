"""The package's third migration (MariaDB/MySQL only), so this module's state is the package's before its
own changes."""

import importlib

Migration = importlib.import_module("django_outbox.migrations.0003_mysql_claim_key_index").Migration
