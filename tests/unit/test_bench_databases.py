"""Two benchmark runs on databases of their own never share one: the sections measured on both servers
(keyed drain, migrations) once wrote into fixed names, so a second run dropped the first one's tables."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from bench import common, run

PROBE = (
    "import json, os, sys\n"
    "json.dump({'name': os.environ.get('BENCH_DATABASE'), 'args': sys.argv[1:-2]}, open(sys.argv[-1], 'w'))\n"
)


def test_the_harness_names_a_both_servers_sections_database_after_its_own(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    script = run.Script(str(probe), "--json", smoke="--reps 1", mariadb=True)
    dsn = "postgres://postgres@127.0.0.1:5432/bench_mine"
    figures = run.run_script(script, "keyed_drain", "smoke", dsn, with_mariadb=True)
    assert figures == {"name": "bench_mine_keyed_drain", "args": ["--reps", "1", "--databases", "postgresql,mysql"]}


def test_a_section_measures_in_the_named_database_on_mariadb_urls_server(monkeypatch: Any) -> None:
    monkeypatch.setenv("BENCH_DATABASE", "bench_mine_keyed_drain")
    monkeypatch.setenv("MARIADB_URL", "mysql://root@db.internal:3307/test")
    monkeypatch.setenv("DATABASE_URL", "")
    seen: dict[str, str] = {}

    def measure(vendor: str) -> dict[str, Any]:
        seen[vendor] = os.environ["DATABASE_URL"]
        return {}

    common.by_database(argparse.Namespace(databases="mysql", json=None), "bench_keyed", measure)
    assert seen == {"mysql": "mysql://root@db.internal:3307/bench_mine_keyed_drain"}
