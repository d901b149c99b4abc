"""A rolling deploy, as it happens: the previous release's producer and two of its workers keep running
while this checkout's ``migrate`` runs, then this checkout's worker joins and the old ones are stopped.

The previous release is the package at ``tests/support/releases.PREVIOUS_RELEASE``, taken out of the git
history; its processes import it first and take everything else (the settings, the probe app) from this
checkout. Nothing may be lost, no ``send()`` may fail, and a message delivered twice must have its
abandoned attempt in the audit log. Real processes on a database of the run's own server.
"""

from __future__ import annotations

import collections
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from django.db import connection

from tests.support import IN_CI, ROOT
from tests.support.database import empty_database
from tests.support.processes import worker_env
from tests.support.releases import PREVIOUS_RELEASE
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: One message every 5 ms from the old release's producer, half of them keyed (order per key is checked).
PRODUCER = """
import json, os, pathlib, time
from django.db import transaction
from django_outbox import outbox
stop = pathlib.Path(os.environ["UPGRADE_STOP_FILE"])
started = pathlib.Path(os.environ["UPGRADE_STARTED_FILE"])
sent, errors, longest, times = 0, [], 0.0, []
while not stop.exists():
    began = time.monotonic()
    times.append(time.time())
    try:
        with transaction.atomic():
            outbox.send("probe.upgrade", {"n": sent}, key=f"k{sent % 5}" if sent % 2 else None)
        sent += 1
        if sent == 1:
            started.touch()
    except Exception as exc:
        errors.append(repr(exc)[:300])
    longest = max(longest, time.monotonic() - began)
    time.sleep(0.005)
print(json.dumps({"sent": sent, "errors": errors[:5], "failed": len(errors), "longest": longest, "times": times}))
"""

UNDELIVERED = "from django_outbox.models import Message; print(Message.objects.exclude(status='delivered').count())"

#: What the database holds at the end, read by this checkout's code.
AUDIT = """
import json
from django_outbox.models import Attempt, Message
from tests.probe.models import Delivery
print(json.dumps({
    "statuses": sorted(set(Message.objects.values_list("status", flat=True))),
    "messages": Message.objects.count(),
    "deliveries": list(Delivery.objects.values_list("message_id", flat=True)),
    "abandoned": list(Attempt.objects.filter(outcome="abandoned").values_list("message_id", flat=True)),
    "workers": sorted(set(Attempt.objects.values_list("worker", flat=True))),
    "keyed": list(Message.objects.exclude(key=None).exclude(key="").order_by("id").values_list("key", "id")),
    "delivered_order": list(Delivery.objects.order_by("id").values_list("message_id", flat=True)),
}))
"""


def previous_release(tmp_path: Path) -> Path:
    """The package at the previous release's commit, extracted under ``tmp_path``."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"], capture_output=True
    )
    if found.returncode != 0:
        message = f"the previous release's commit {PREVIOUS_RELEASE} is not in this clone's history (fetch it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", PREVIOUS_RELEASE, "django_outbox"],
        capture_output=True,
        check=True,
    )
    old = tmp_path / "previous"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(old, filter="data")
    return old


class Release:
    """Runs ``django-admin`` commands with one release's package first on the path."""

    def __init__(self, package_root: Path, env: dict[str, str]) -> None:
        self.cwd = package_root
        self.env = {**worker_env(), "TEST_WITHOUT_OTHER": "1", **env}
        # The package from package_root, the rest (tests.settings, the probe app) from this checkout.
        self.env["PYTHONPATH"] = os.pathsep.join([str(package_root), str(ROOT)])

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "django", *args]

    def run(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args), cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def start(self, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*args),
            cwd=self.cwd,
            env={**self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def shell(self, code: str) -> str:
        done = self.run("shell", "-c", code)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.strip().splitlines()[-1]  # Django's shell may first say what it imported


def stop(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=timeout)
    return out


def test_the_previous_release_keeps_working_while_migrate_runs_then_hands_over(tmp_path: Path) -> None:
    if connection.vendor == "sqlite":
        pytest.skip("a rolling deploy runs processes of two releases against a server, not a file")
    old_package = previous_release(tmp_path)
    with empty_database(tmp_path) as env:
        old = Release(old_package, env)
        new = Release(ROOT, env)
        assert old.shell("import django_outbox; print(django_outbox.__file__)").startswith(str(old_package))
        assert new.shell("import django_outbox; print(django_outbox.__file__)").startswith(str(ROOT))

        migrated = old.run("migrate", "-v0")  # the database as the previous release left it
        assert migrated.returncode == 0, migrated.stderr
        stop_file = tmp_path / "stop-producer"
        started_file = tmp_path / "producer-started"
        producer = old.start(
            "shell", "-c", PRODUCER, UPGRADE_STOP_FILE=str(stop_file), UPGRADE_STARTED_FILE=str(started_file)
        )
        old_workers = [old.start("outbox_worker", "--poll-interval", "0.2") for _ in range(2)]
        new_worker = None
        outputs: list[str] = []
        try:
            wait_for(started_file.exists, timeout=60)  # the producer's first send (its start-up is slow under load)
            time.sleep(2)  # the old release at work
            migrate_began = time.time()
            upgrade = new.run("migrate", "-v1")
            migrate_ended = time.time()
            assert upgrade.returncode == 0, upgrade.stdout + upgrade.stderr
            time.sleep(2)  # the old release on the new schema
            new_worker = new.start("outbox_worker", "--poll-interval", "0.2")
            time.sleep(2)
            for worker in old_workers:  # the deploy replaces them
                outputs.append(stop(worker))
                assert worker.returncode == 0, outputs[-1]
            time.sleep(1)
            stop_file.touch()
            produced = json.loads(producer.communicate(timeout=60)[0].strip().splitlines()[-1])
            count = (
                "from django_outbox.models import Message; print(Message.objects.exclude(status='delivered').count())"
            )
            wait_for(lambda: new.shell(count) == "0", timeout=120, interval=0.5)
            outputs.append(stop(new_worker))
            assert new_worker.returncode == 0, outputs[-1]
        finally:
            stop_file.touch()
            for proc in [producer, *old_workers, *([new_worker] if new_worker else [])]:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
        audit = json.loads(new.shell(AUDIT))

    assert produced["failed"] == 0, produced["errors"]  # no send() failed, before, during or after migrate
    # The producer ran throughout: before migrate, while it ran (when it took long enough for a send to
    # start), and after it, through the new worker's start (counted by time, not by the number of sends,
    # which a loaded machine makes fewer).
    times = produced["times"]
    assert min(times) < migrate_began and max(times) > migrate_ended + 4, (migrate_began, migrate_ended, times[:3])
    if migrate_ended - migrate_began > 0.5:
        assert any(migrate_began <= t <= migrate_ended for t in times), "no send() while migrate ran"
    assert audit["messages"] == produced["sent"] and audit["statuses"] == ["delivered"], audit["statuses"]
    per_message = collections.Counter(audit["deliveries"])
    assert len(per_message) == produced["sent"]  # none lost
    duplicated = {mid for mid, n in per_message.items() if n > 1}
    assert duplicated <= set(audit["abandoned"]), "a message delivered twice has its abandoned attempt logged"
    new_id = new_worker_id(outputs[-1])
    assert new_id in audit["workers"], f"this checkout's worker delivered nothing: {audit['workers']}"
    first_delivery: dict[int, int] = {}
    for position, mid in enumerate(audit["delivered_order"]):
        first_delivery.setdefault(mid, position)
    by_key: dict[str, list[int]] = collections.defaultdict(list)
    for key, mid in audit["keyed"]:
        by_key[key].append(mid)
    for key, ids in by_key.items():
        order = [first_delivery[mid] for mid in ids]
        assert order == sorted(order), f"key {key} was delivered out of send order across the deploy"
    for out in outputs:
        assert "Traceback" not in out, out


def new_worker_id(output: str) -> str:
    """The worker's id from its opening line, ``outbox worker <id> relaying from database ...``."""
    for line in output.splitlines():
        if line.startswith("outbox worker ") and " relaying " in line:
            return line.split()[2]
    raise AssertionError(f"no opening line in the worker's output:\n{output}")
