"""Migration modules for the migration linter's tests (``MIGRATION_MODULES``): each repeats the package's
initial migration and adds one of its own after it, unsafe on a live table or done the safe way."""
