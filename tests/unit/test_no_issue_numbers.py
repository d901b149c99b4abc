"""The docs, the tests and the benchmark speak to readers who have no tracker to look an issue up in:
no issue named by its number in them. What an issue asked is said in words; its history is in git."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import ROOT

#: "issue" or "issues", an optional "#", then digits; built so that this file does not match itself.
ISSUE_NUMBER = re.compile(r"\bissues?\s*#?" + r"\d+", re.IGNORECASE)


def _files() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for folder in ("tests", "bench"):
        # the project's own files: not the packages a tool installed there (node_modules, bench/.venv-compare)
        found += sorted(
            p
            for p in (ROOT / folder).rglob("*.py")
            if not any(part == "node_modules" or part.startswith(".venv") for part in p.relative_to(ROOT).parts)
        )
    return found


def test_no_file_of_the_docs_the_tests_or_the_benchmark_names_an_issue_number():
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}"
        for path in _files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ISSUE_NUMBER.search(line)
    ]
    assert offenders == [], "\n".join(offenders)


def test_the_guard_finds_an_issue_number():
    assert ISSUE_NUMBER.search("measured against the targets of Issue " + "19")
    assert ISSUE_NUMBER.search("see issue #" + "20")
    assert not ISSUE_NUMBER.search("an issue of the broker, 19 ms")
