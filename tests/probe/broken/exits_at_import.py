"""A task module that calls sys.exit() at import: the worker must survive it, and so must a web process."""

import sys

sys.exit("tests.probe.broken.exits_at_import called sys.exit() at import")
