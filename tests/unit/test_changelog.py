"""CHANGELOG.md in the Keep a Changelog form: one 0.1.0 section, only "Added", written for users.

The first release has no earlier one a user could have run, so the entries say what the release does,
never what an earlier state of the code did ("no longer", "replaces the earlier", a flaky test).
"""

from __future__ import annotations

import re

from tests.support import ROOT

TEXT = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
#: Wording that tells the history of the code before its first release, not what a user gets.
PRE_RELEASE_HISTORY = re.compile(
    r"no longer|formerly|replaces the earlier|the earlier version|flaky|\bissue \d+|\b\d+% less|about .{1,20} less",
    re.IGNORECASE,
)


def test_one_release_section_with_only_added():
    assert "keepachangelog.com" in TEXT
    assert re.findall(r"^## .*$", TEXT, re.M) == ["## 0.1.0 - Unreleased"]
    assert re.findall(r"^### .*$", TEXT, re.M) == ["### Added"]


def test_the_entries_speak_of_the_release_not_of_its_history():
    found = sorted({m.group(0).lower() for m in PRE_RELEASE_HISTORY.finditer(TEXT)})
    assert not found, f"CHANGELOG.md tells the code's pre-release history: {found}"


def test_the_history_pattern_sees_what_it_should():
    assert PRE_RELEASE_HISTORY.search("System check E005 no longer refuses MariaDB")
    assert PRE_RELEASE_HISTORY.search("it also made the cross-topic hand-off test flaky")
    assert PRE_RELEASE_HISTORY.search("Recording a batch costs about 20% less")
