"""Every check id is declared once in the package and documented once in docs/checks.md."""

from __future__ import annotations

import re
from collections import Counter

from tests.support import ROOT

_ID = re.compile(r"django_outbox\.[EW]\d{3}")
#: A row of a table in docs/checks.md: ``| `django_outbox.E001` | meaning | fix |``.
_DOC_ROW = re.compile(r"^\|\s*`(django_outbox\.[EW]\d{3})`\s*\|", re.MULTILINE)


def code_ids() -> Counter[str]:
    found: Counter[str] = Counter()
    for path in sorted((ROOT / "django_outbox").rglob("*.py")):
        found.update(_ID.findall(path.read_text(encoding="utf-8")))
    return found


def documented_ids() -> Counter[str]:
    return Counter(_DOC_ROW.findall((ROOT / "docs" / "checks.md").read_text(encoding="utf-8")))


def test_each_check_id_is_declared_once_in_the_code():
    repeated = sorted(i for i, n in code_ids().items() if n > 1)
    assert not repeated, f"declare each id once (a named constant) and use the name: {repeated}"


def test_each_check_id_is_documented_once():
    repeated = sorted(i for i, n in documented_ids().items() if n > 1)
    assert not repeated, f"docs/checks.md lists these ids more than once: {repeated}"


def test_the_code_and_the_docs_know_the_same_ids():
    code, docs = set(code_ids()), set(documented_ids())
    assert code - docs == set(), "checks missing from docs/checks.md"
    assert docs - code == set(), "docs/checks.md lists ids no check reports (removed checks must go from the table)"


def test_the_scan_finds_ids_at_all():
    assert len(code_ids()) > 30 and len(documented_ids()) > 30
