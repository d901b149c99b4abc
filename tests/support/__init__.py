"""Helpers shared by every layer of the suite: paths, services, processes, servers, poolers, fixtures.

Nothing here is collected as a test. Fixtures shared by several layers live in the modules listed in
``tests/conftest.py``'s ``pytest_plugins``; helpers are imported by name from their module.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The repository's root (manage.py, docs/, bench/).
ROOT = Path(__file__).resolve().parent.parent.parent
IN_CI = os.environ.get("CI") == "true"
