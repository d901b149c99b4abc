"""Two benchmark runs on databases of their own never share one: the sections measured on both servers
(keyed drain, migrations) once wrote into fixed names, so a second run dropped the first one's tables; and
they measure on the harness's servers (its PostgreSQL, MARIADB_URL's MariaDB), not on a default one."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import pytest

from bench import common, run

PROBE = (
    "import json, os, sys\n"
    "env = {k: os.environ.get(k) for k in ('BENCH_DATABASE', 'BENCH_POSTGRESQL')}\n"
    "json.dump({**env, 'args': sys.argv[1:-2]}, open(sys.argv[-1], 'w'))\n"
)


def test_the_harness_names_a_both_servers_sections_database_after_its_own(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    script = run.Script(str(probe), "--json", smoke="--reps 1", mariadb=True)
    dsn = "postgres://bench@pg.internal:6432/bench_mine"
    figures = run.run_script(script, "keyed_drain", "smoke", dsn, with_mariadb=True)
    assert figures == {
        "BENCH_DATABASE": "bench_mine_keyed_drain",
        "BENCH_POSTGRESQL": "postgres://bench@pg.internal:6432",
        "args": ["--reps", "1", "--databases", "postgresql,mysql"],
    }


@pytest.mark.parametrize(
    ("vendor", "expected"),
    [
        ("mysql", "mysql://root@db.internal:3307/bench_mine_keyed_drain"),
        ("postgresql", "postgres://bench@pg.internal:6432/bench_mine_keyed_drain"),
    ],
)
def test_a_section_measures_in_the_named_database_on_the_harness_servers(
    monkeypatch: Any, vendor: str, expected: str
) -> None:
    """MariaDB: ``MARIADB_URL``'s server; PostgreSQL: the harness's (``DATABASE_URL``'s), not a default."""
    monkeypatch.setenv("BENCH_DATABASE", "bench_mine_keyed_drain")
    monkeypatch.setenv("MARIADB_URL", "mysql://root@db.internal:3307/test")
    monkeypatch.setenv("BENCH_POSTGRESQL", "postgres://bench@pg.internal:6432")
    monkeypatch.setenv("DATABASE_URL", "")
    seen: dict[str, str] = {}

    def measure(vendor: str) -> dict[str, Any]:
        seen[vendor] = os.environ["DATABASE_URL"]
        return {}

    common.by_database(argparse.Namespace(databases=vendor, json=None), "bench_keyed", measure)
    assert seen == {vendor: expected}
