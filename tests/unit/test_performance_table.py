"""docs/performance.md's table is what bench/table.py writes from the kept results, figure for figure."""

from __future__ import annotations

import re

from bench import table
from tests.support import ROOT

RESULTS = ("performance-quick.json",)


def docs_table() -> str:
    text = (ROOT / "docs" / "performance.md").read_text()
    match = re.search(r"^\| figure \| the outbox \|.*?(?=\n\n)", text, re.S | re.M)
    assert match, "docs/performance.md has no table of figures"
    return match.group(0)


def test_the_docs_table_is_the_kept_runs_rendered():
    rendered = table.render(table.merged([ROOT / "bench" / "results" / name for name in RESULTS]))
    assert docs_table() == rendered


def test_the_docs_name_the_kept_runs_the_table_comes_from():
    """The page's command that prints its table again names the same files, in the same order."""
    text = (ROOT / "docs" / "performance.md").read_text()
    command = re.search(r"`python bench/table\.py ([^`]+)`", text)
    assert command, "docs/performance.md does not say how to print its table from the kept results"
    assert tuple(path.removeprefix("bench/results/") for path in command.group(1).split()) == RESULTS


def test_every_section_of_the_harness_has_rows_in_the_table():
    from bench.run import SECTIONS

    rendered = table.render(table.merged([ROOT / "bench" / "results" / name for name in RESULTS]))
    named = set(re.findall(r"\| `(\w+)` \|$", rendered, re.M))
    assert named == set(SECTIONS)


def test_a_section_whose_script_failed_before_its_figures_gives_no_row():
    results = table.merged([ROOT / "bench" / "results" / "performance-quick.json"])
    results["figures"]["brokers"] = {"failed": 1}
    rendered = table.render(results)
    assert "`brokers`" not in rendered and "`topology`" in rendered
