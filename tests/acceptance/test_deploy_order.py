"""A new release meets a database before its ``migrate`` has run: a rolling deploy starts the new worker
whenever the platform likes. The worker waits, saying once which migration it needs; ``manage.py check``
warns (``django_outbox.W004``); a one-off ``--until-empty`` run refuses. Real processes on a real, empty
database of the run's own server."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.database import empty_database
from tests.support.processes import WorkerProcess, worker_env
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

NEEDS = "lacks the outbox migration django_outbox.0001_initial"


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env={**worker_env(), "TEST_WITHOUT_OTHER": "1", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_until(worker: WorkerProcess, text: str) -> str:
    """The worker's output up to the line that says ``text``: a slow start (a loaded machine) is waited
    for, not guessed at with a sleep. Blocking reads, line by line (a ``select()`` on the pipe would miss
    the lines already in the reader's buffer); the run's timeout bounds a worker that never says it, and
    one that exits ends the read."""
    assert worker.proc.stdout is not None
    seen: list[str] = []
    for line in iter(worker.proc.stdout.readline, ""):
        seen.append(line)
        if text in line:
            return "".join(seen)
    pytest.fail(f"the worker exited without saying {text!r}:\n{''.join(seen)}")


def test_check_warns_until_the_outbox_migrations_are_applied(tmp_path: Path) -> None:
    with empty_database(tmp_path) as env:
        before = manage(env, "check")
        assert before.returncode == 0, before.stderr  # a warning: the deploy's next step is migrate
        assert "(django_outbox.W004)" in before.stderr, before.stderr
        assert "django_outbox.0001_initial" in before.stderr and "manage.py migrate" in before.stderr
        # The commands that make or apply migrations run the checks too, before they apply anything: the
        # warning would tell the reader running migrate to run migrate.
        made = manage(env, "makemigrations", "--check", "--dry-run")
        assert made.returncode == 0 and "W004" not in made.stdout + made.stderr, made.stdout + made.stderr
        migrated = manage(env, "migrate", "-v1")
        assert migrated.returncode == 0, migrated.stderr
        assert "W004" not in migrated.stdout + migrated.stderr, migrated.stdout + migrated.stderr
        after = manage(env, "check")
        assert after.returncode == 0 and "W004" not in after.stderr, after.stderr


def test_a_one_off_run_refuses_a_database_without_the_migrations(tmp_path: Path) -> None:
    with empty_database(tmp_path) as env:
        run = manage(env, "outbox_worker", "--until-empty")
    assert run.returncode == 1, run.stdout + run.stderr
    assert NEEDS in run.stderr and "run manage.py migrate first" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.slow
def test_a_worker_started_before_migrate_waits_says_so_once_then_delivers(tmp_path: Path) -> None:
    with empty_database(tmp_path) as env:
        worker = WorkerProcess("--poll-interval", "0.5", env={"TEST_WITHOUT_OTHER": "1", **env})
        try:
            said = read_until(worker, NEEDS)  # its first check, whenever a loaded machine lets it start
            time.sleep(2)  # four more checks while they are still missing
            assert worker.proc.poll() is None, "the worker exited instead of waiting"
            assert manage(env, "migrate", "-v0").returncode == 0
            code = "from django_outbox import outbox; outbox.send('probe.ok', {'n': 1})"
            assert manage(env, "shell", "-c", code).returncode == 0
            count = (
                "from django_outbox.models import Message; print(Message.objects.filter(status='delivered').count())"
            )
            # The last line: Django's shell may first say what it imported.
            wait_for(lambda: manage(env, "shell", "-c", count).stdout.split()[-1:] == ["1"], timeout=60, interval=0.5)
            worker.send_signal(signal.SIGTERM)
            exit_code, rest = worker.wait(timeout=30)
            out = said + rest
        finally:
            worker.stop()
    assert exit_code == 0, out
    assert out.count(NEEDS) == 1, out  # said once (on standard error), not on every check
    assert "Traceback" not in out, out


def test_a_worker_stopped_while_it_waits_exits_at_once_and_cleanly(tmp_path: Path) -> None:
    with empty_database(tmp_path) as env:
        worker = WorkerProcess("--poll-interval", "5", env={"TEST_WITHOUT_OTHER": "1", **env})
        try:
            # In its wait (five seconds between checks): it says so once its signal handlers are in place.
            said = read_until(worker, NEEDS)
            worker.send_signal(signal.SIGTERM)
            exit_code, rest = worker.wait(timeout=30)
            out = said + rest
        finally:
            worker.stop()
        tables = manage(
            env, "shell", "-c", "from django.db import connection; print(connection.introspection.table_names())"
        )
    assert exit_code == 0, out
    assert NEEDS in out and "Traceback" not in out, out
    assert "django_outbox" not in tables.stdout, tables.stdout  # it wrote nothing: no heartbeat row, no table
