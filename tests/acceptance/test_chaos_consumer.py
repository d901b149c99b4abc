"""The chaos run's consumer check ("count the nines") in its smallest form, so it cannot rot, and proof it can fail.

The runs are real: tests/chaos/run.py starts producer and worker processes, the consumer kills itself between
its effect and its commit and after its commit, and the figures come from the consumer's tables.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.chaos.run import audit_effects
from tests.support import IN_CI, ROOT

SMALLEST = ("--messages", "100", "--duration", "3", "--producers", "1", "--workers", "2", "--timeout", "240")


def run_chaos(tmp_path: Path, *options: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    output = tmp_path / "figures.json"
    run = subprocess.run(
        [sys.executable, "tests/chaos/run.py", *SMALLEST, "--json", str(output), *options],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        capture_output=True,
        text=True,
        timeout=280,
    )
    figures = json.loads(output.read_text()) if output.exists() else {}
    return run, figures


def test_effect_audit_counts_double_lost_and_stray_effects() -> None:
    expected = {"m1": ("a0", 5), "m2": ("a1", 7), "m3": ("a1", 1)}
    clean = audit_effects(expected, [("m1", "a0", 5), ("m2", "a1", 7), ("m3", "a1", 1)], {"a0": 5, "a1": 8})
    assert clean.ok and (clean.expected, clean.applied, clean.accounts_wrong) == (3, 3, 0)

    # m1 applied three times (balance too high), m3 never, and m9 (say, a rolled-back message) once.
    effects = [("m1", "a0", 5), ("m1", "a0", 5), ("m1", "a0", 5), ("m2", "a1", 7), ("m9", "a2", 4)]
    bad = audit_effects(expected, effects, {"a0": 15, "a1": 7, "a2": 4})
    assert not bad.ok
    assert (bad.applied, bad.applied_twice, bad.lost, bad.unexpected) == (2, 2, 1, 1)
    assert (bad.accounts, bad.accounts_wrong) == (3, 3)

    # A balance moved without an Effect row (a torn write) is caught by the counter alone.
    torn = audit_effects(expected, [("m1", "a0", 5), ("m2", "a1", 7), ("m3", "a1", 1)], {"a0": 10, "a1": 8})
    assert not torn.ok and torn.accounts_wrong == 1 and torn.applied_twice == 0


@pytest.mark.slow
def test_smallest_chaos_run_applies_every_effect_exactly_once(tmp_path: Path) -> None:
    """On the suite's database: SQLite, or a private PostgreSQL cluster or MariaDB server (restarted mid-run)."""
    database = {"postgresql": "postgresql", "mysql": "mariadb"}.get(connection.vendor, "sqlite")
    missing = None
    if database == "postgresql" and not (glob.glob("/usr/lib/postgresql/*/bin/pg_ctl") or shutil.which("pg_ctl")):
        missing = "tests/chaos/run.py needs PostgreSQL's server binaries for its private cluster"
    if database == "mariadb" and not (shutil.which("mariadbd") or Path("/usr/sbin/mariadbd").exists()):
        missing = "tests/chaos/run.py needs MariaDB's server binaries (mariadbd) for its private server"
    if missing:
        if IN_CI:
            pytest.fail(f"{missing}; under CI=true this is a failure")
        pytest.skip(missing)
    run, figures = run_chaos(tmp_path, "--database", database)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "files are kept" not in run.stdout  # a run that passed leaves nothing behind
    assert figures["database"] == database
    assert figures["sent (committed)"] == figures["effects expected (messages to the consumer)"] == 100
    assert figures["effects applied"] == 100
    assert figures["effects applied more than once"] == 0
    assert figures["effects lost"] == 0
    assert figures["accounts with a wrong balance"] == "0 of 10"
    # Each fault struck once (message 10, 30, 50 and 70 of the one producer), and the killed workers were replaced.
    for fault in (
        "consumer killed between effect and commit",
        "consumer killed after commit, before the ack",
        "consumer raised between effect and commit",
        "consumer raised after commit",
    ):
        assert figures[fault] == 1, fault
    assert figures["workers that exited on their own (consumer kills)"] >= 2
    assert figures["raw duplicates per million deliveries"] > 0  # the faults did cause redeliveries
    if database == "postgresql":
        assert figures["PostgreSQL restarts"] == 1
    if database == "mariadb":
        assert figures["MariaDB restarts"] == 1


@pytest.mark.slow
@pytest.mark.database_independent  # on a SQLite file of its own, whatever the suite's database
def test_chaos_run_catches_a_consumer_without_the_inbox(tmp_path: Path) -> None:
    """The same run with the effect applied in a plain transaction: the kill after commit and the
    exception after commit each make a redelivery apply the effect again, and the run must say so."""
    run, figures = run_chaos(tmp_path, "--database", "sqlite", "--consumer-without-inbox")
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-4000:]
    assert "FAILED" in run.stdout
    assert figures["effects applied more than once"] >= 2
    assert figures["accounts with a wrong balance"] != "0 of 10"
    assert figures["lost"] == 0  # the outbox itself lost nothing: only the consumer is at fault
    # A failed run keeps its files (the workers' and consumers' logs, the producers' lists) to be read.
    kept = re.search(r"the run's files are kept in (\S+)", run.stdout)
    assert kept, run.stdout[-2000:]
    try:
        assert sorted(Path(kept[1]).glob("worker-*.log")) and sorted(Path(kept[1]).glob("producer-*.json"))
    finally:
        shutil.rmtree(kept[1], ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_smallest_chaos_run_through_a_restarted_and_paused_pooler(tmp_path: Path, mode: str) -> None:
    """The run's pooler scenarios in their smallest form: producers and workers reach the private cluster
    through PgBouncer, which is killed and restarted on its port, then paused and resumed, mid-drain."""
    from tests.support import pgbouncer

    if connection.vendor != "postgresql":
        pytest.skip("the pooler stands in front of the private PostgreSQL cluster")
    pgbouncer.require()
    run, figures = run_chaos(tmp_path, "--pooler", mode)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert figures["pooler"] == f"PgBouncer, {mode} pooling"
    assert figures["pooler restarts (SIGKILL, same port)"] == 1
    assert figures["pooler pauses (PAUSE, RESUME 3 s or more later)"] == 1
    assert figures["PostgreSQL restarts"] == 1
    assert figures["sent (committed)"] == figures["effects applied"] == 100
    assert figures["lost"] == figures["duplicates unexplained"] == 0
    assert figures["effects applied more than once"] == figures["effects lost"] == 0
    assert figures["accounts with a wrong balance"] == "0 of 10"
    if mode == "transaction":  # the workers' next transactions waited on the pause (SHOW POOLS in its middle)
        assert figures["clients waiting in the pause (SHOW POOLS)"] > 0


def test_the_pooler_needs_the_private_postgresql() -> None:
    """PgBouncer stands in front of a PostgreSQL server: on SQLite the option is refused before anything starts."""
    run = subprocess.run(
        [sys.executable, "tests/chaos/run.py", "--pooler", "transaction", "--database", "sqlite"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "--pooler puts PgBouncer in front of the private PostgreSQL" in run.stderr
    assert "SQLite file" not in run.stdout  # refused before the run made anything
