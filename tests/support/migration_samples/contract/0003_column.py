"""As in ``safe``."""

import importlib

Migration = importlib.import_module("tests.support.migration_samples.safe.0003_column").Migration
