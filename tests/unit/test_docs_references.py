"""The docs name tests as evidence (docs/reliability.md's hostile inputs, for one): each must exist."""

from __future__ import annotations

import ast
import re

import pytest

from tests.support import ROOT

#: ``tests/test_x.py::test_name`` and the short form ``::test_name`` after a full one in the same cell.
_REFERENCE = re.compile(r"(tests/[\w/]+\.py)?::((?:test|Test)\w*)")


def _references() -> list[tuple[str, str, str]]:
    found = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        current = None
        for match in _REFERENCE.finditer(page.read_text(encoding="utf-8")):
            path, name = match.groups()
            current = path or current
            if current is not None:
                found.append((str(page.relative_to(ROOT)), current, name))
    return found


def _defined(path: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}


@pytest.mark.parametrize(("page", "path", "name"), _references())
def test_every_test_the_docs_name_exists(page, path, name):
    assert (ROOT / path).exists(), f"{page} names {path}, which does not exist"
    assert name in _defined(path), f"{page} names {path}::{name}, which does not exist"


def test_the_docs_name_tests_at_all():
    assert len(_references()) > 50, "the reference pattern found nothing: the test would pass on anything"
