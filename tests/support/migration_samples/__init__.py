"""Migration modules (``MIGRATION_MODULES``) for the migration linter's tests, the online operations'
tests and ``bench/online_migrations.py``. Each repeats the package's initial migration (all but
``unsafe``: all of the package's migrations) and adds its own after them:
``unsafe`` (refused by the linter), ``safe`` (the same change with the package's online operations) and
``plain`` (that change as ``makemigrations`` writes it: the benchmark's reference). ``initial`` holds the
initial migration alone: the schema before the package's later migrations, for the benchmark's workers of
the previous release."""
