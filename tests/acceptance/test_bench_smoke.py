"""The benchmark harness in its tiniest mode, so it cannot rot. Its figures are not checked: no timings in tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg
import pytest
from django.db import connection

from tests.support import ROOT

pytestmark = [pytest.mark.usefixtures("postgres"), pytest.mark.slow]

SECTIONS = "send,drain,latency,enqueue,scale,opentx,memory"  # all but the comparisons (their own virtualenv)
FIGURES = {
    "send",
    "send_batch",
    "drain",
    "latency_neighbour",
    "enqueue",
    "claim_cost",
    "open_transaction",
    "memory",
}


def _test_database_name() -> str:
    """The test database's name, which carries the run's suffixes (``TEST_DATABASE_SUFFIX``, pytest-xdist's):
    these tests use no test database, so ``NAME`` is still the configured one, shared by runs side by side,
    whose teardown would drop each other's benchmark databases."""
    s = connection.settings_dict
    return s.get("TEST", {}).get("NAME") or f"test_{s['NAME']}"


@pytest.fixture
def bench_dsn():
    """A database of the benchmark's own beside the test database (never the test database itself)."""
    s = connection.settings_dict
    server = f"postgres://{s['USER'] or 'postgres'}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}"
    name = f"{_test_database_name()}_benchsmoke"
    yield f"{server}/{name}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        # and the databases of the sections run by their own script (``<name>_<section>``)
        made = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [f"{name}%"]).fetchall()
        for (made_name,) in made:
            conn.execute(f'DROP DATABASE IF EXISTS "{made_name}" WITH (FORCE)')


def test_smoke_run_measures_every_figure(bench_dsn, tmp_path):
    output = tmp_path / "results.json"
    run = subprocess.run(
        [sys.executable, "bench/run.py", "--smoke", "--only", SECTIONS, "--output", str(output)],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": bench_dsn},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads(output.read_text())
    figures = results["figures"]
    assert set(figures) == FIGURES
    # Every message sent for the latency figures reached the handler, keyed or not, with and without the
    # busy neighbour database (which did run transactions meanwhile).
    neighbour = figures["latency_neighbour"]
    assert neighbour["idle"]["lost"] == neighbour["busy"]["lost"] == 0
    assert all(rep["busy"]["neighbour_transactions"] > 0 for rep in neighbour["reps"])
    # the minimal relay, woken by its own NOTIFY, is the latency figure's reference
    assert neighbour["idle"]["minimal"]["p50_ms"] > 0 and neighbour["busy"]["minimal"]["p50_ms"] > 0
    # The split at COMMIT's return: the sender's COMMIT, then the rest; each a time, so neither negative.
    for kind in ("unkeyed", "keyed", "minimal"):
        split = neighbour["idle"][kind]
        assert split["commit_p50_ms"] > 0 and split["after_commit_p50_ms"] > 0, split
    one_process = figures["drain"]["by_processes"]["1"]
    assert one_process["reps"]
    # Each drain runs the project beside both references in the same rounds (and, at one process, with
    # one delivery thread beside the default's two).
    assert all({"outbox", "outbox_one_thread", "baseline", "minimal"} <= set(rep) for rep in one_process["reps"])
    assert one_process["one_thread_per_s"] > 0 and one_process["minimal_per_s"] > 0
    # The send() floor and the enqueue concurrency ran every mode.
    assert figures["send"]["minimal_us_per_tx"] > 0
    assert figures["send_batch"]["api"]
    for by in figures["enqueue"]["by_producers"].values():
        assert all(by[f"{mode}_per_s"] > 0 for mode in ("send", "send_quiet", "floor", "floor_notify"))
    assert figures["claim_cost"]["large"]["reference_ms"] > 0
    assert figures["memory"]["messages"] == 500
    # The server settings that move the figures are on record with them.
    server = results["environment"]["postgresql"]
    assert server["autovacuum"] in ("on", "off") and server["synchronous_commit"] and server["server_version"]
    # The command prints docs/performance.md's table: a row for each figure, naming its section.
    for row in (
        "| `send()` in a one-row business transaction |",
        "worker processes, 300 messages |",
        "| commit to handler, idle worker, PostgreSQL `NOTIFY` |",
        "| the same, keyed, a busy neighbour database on the server |",
        "| enqueue: ",
        "| claim of 100, ",
        "| drain while a transaction stays open elsewhere",
        "| worker memory (RSS) over 500 messages |",
    ):
        assert row in run.stdout


@pytest.fixture
def bench_mariadb_dsn():
    """A MariaDB database of the benchmark's own, on the server of MARIADB_URL (never its database itself)."""
    from urllib.parse import urlparse

    from bench import mariadb

    parsed = urlparse(os.environ.get("MARIADB_URL") or "mysql://root@127.0.0.1:3306/test")
    server = parsed._replace(path="").geturl()
    if not mariadb.reachable(server):
        if os.environ.get("CI") == "true":
            pytest.fail(f"no MariaDB at {server}; under CI=true that is a failure")
        pytest.skip(f"no MariaDB at {server}")
    name = f"{_test_database_name()}_benchsmoke"
    yield f"{server}/{name}"
    conn = mariadb.connect(f"{server}/mysql", autocommit=True)
    try:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()


def test_smoke_run_measures_mariadb(bench_dsn, bench_mariadb_dsn, tmp_path):
    """The MariaDB section: the drain beside the two-statement relay, send() beside its INSERT floor."""
    output = tmp_path / "results.json"
    run = subprocess.run(
        [sys.executable, "bench/run.py", "--smoke", "--only", "mariadb", "--output", str(output)],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": bench_dsn, "MARIADB_URL": bench_mariadb_dsn},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    figures = json.loads(output.read_text())["figures"]
    assert set(figures) == {"mariadb"}
    maria = figures["mariadb"]
    assert "MariaDB" in maria["server"]
    rounds = maria["drain"]["by_processes"]["1"]["reps"]
    systems = {"outbox", "reference"}
    assert rounds and all(set(r) == systems and min(r.values()) > 0 for r in rounds)
    assert maria["send"]["send_us_per_tx"] > 0 and maria["send"]["floor_us_per_tx"] > 0
    for row in ("| MariaDB drain, 1 worker processes", "the two-statement relay", "| MariaDB `send()` in"):
        assert row in run.stdout


def test_topology_smoke_run_measures_every_topology(bench_dsn, tmp_path):
    """bench/topology.py in its tiniest mode: every topology, the NOTIFY references, both prepared modes."""
    from tests.support import pgbouncer

    pgbouncer.require()
    output = tmp_path / "topology.json"
    run = subprocess.run(
        [sys.executable, "bench/topology.py", "--smoke", "--output", str(output)],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": bench_dsn},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    figures = json.loads(output.read_text())["figures"]
    names = {"direct", "session", "transaction_listen", "transaction_polling", "django_pool"}
    assert set(figures["latency"]) == names
    for name, lat in figures["latency"].items():
        assert lat["lost"] == 0 and lat["trouble_lines"] == 0, name
        assert all(rep["received"] == rep["sent"] > 0 for rep in lat["reps"]), name
        # a bare NOTIFY's round trip beside it, except where nothing can hear one
        assert ("notify_p50_ms" in lat) is (name != "transaction_polling"), name
    for section, expected in (("drain", names), ("prepared", {"transaction_listen", "transaction_listen_unprepared"})):
        by = figures[section]["by_processes"]["1"]
        assert set(by) == expected
        for name, d in by.items():
            assert d["duplicates"] == 0 and d["not_once"] == 0 and d["trouble_lines"] == 0, (section, name)
            assert d["per_s"] > 0
    for row in ("direct connections", "transaction pooling, no LISTEN_DATABASE", "PREPARED_STATEMENTS = False"):
        assert row in run.stdout


def test_send_many_scale_measures_both_databases_beside_their_reference(bench_dsn, bench_mariadb_dsn, tmp_path):
    """Through the harness: its ``send_many`` section is bench/send_many_scale.py's run, kept in the JSON."""
    output = tmp_path / "results.json"
    run = subprocess.run(
        [sys.executable, "bench/run.py", "--smoke", "--only", "send_many", "--output", str(output)],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": bench_dsn, "MARIADB_URL": bench_mariadb_dsn},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    figure = json.loads(output.read_text())["figures"]["send_many"]
    assert "failed" not in figure, run.stdout[-3000:]
    for database in ("postgresql", "mariadb"):
        (rep,) = figure[database]["reps"]
        assert set(rep) == {"unkeyed", "idempotent", "keyed", "reference"} and min(rep.values()) > 0
    assert set(figure["mariadb_vs_postgresql"]) == {"unkeyed", "idempotent", "keyed", "reference"}
    assert "| MariaDB `send_many()`, the same items |" in run.stdout


def test_every_script_section_takes_the_flag_the_harness_gives_its_json_file():
    """A section run by a script of its own is kept only if the script writes where the harness asks."""
    code = (
        "import json, bench.run as r; print(json.dumps({k: [v.script, v.output, str(v.python or '')]"
        " for k, v in r.SCRIPTS.items()}))"
    )
    listed = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    scripts = json.loads(listed.stdout)
    assert {"send_many", "keyed_drain", "brokers", "migrations", "chaos"} <= set(scripts)
    for section, (script, flag, python) in scripts.items():
        if python and not os.path.exists(python):
            continue  # the Django 6 interpreter, made by the test command; its own cell runs the tasks tests
        shown = subprocess.run([python or sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True)
        assert shown.returncode == 0, (section, shown.stderr[-2000:])
        assert flag in shown.stdout, (section, script, flag)
