"""The previous release, as the upgrade test runs it: the one place that names it.

A release's migrations must keep the previous release's code working until its processes are replaced
(expand, then contract: docs/upgrading.md). ``tests/acceptance/test_upgrade.py`` takes the package at this
commit out of the git history and runs its producer and workers while this checkout's ``migrate`` runs.
Move it to the release's commit at each release (docs/contributing.md, "Releasing"). Before the first
release it names a commit of main: the code a development checkout ran before the changes since.
"""

from __future__ import annotations

#: The commit of the previous release (or, before the first, of main), in full.
PREVIOUS_RELEASE = "a8732f7a5849a6b674fd39cfd2d9d3ccfa4857df"
