"""Without prometheus-client or opentelemetry installed, nothing of theirs is imported, send() works as
before, and ``--metrics-port`` says which extra to install. Each check runs in a process of its own in
which the packages cannot be imported (as if they were not installed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import ROOT
from tests.support.processes import worker_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SCRIPT = """
import json, sys
sys.modules["opentelemetry"] = None
sys.modules["prometheus_client"] = None
import django
django.setup()
from django.core.management import CommandError, call_command
from django.db import transaction
from django_outbox import outbox
with transaction.atomic():
    message = outbox.send("probe.ok", {"n": 1}, headers={"tenant": "7"})
    transaction.set_rollback(True)
try:
    call_command("outbox_worker", "--metrics-port", "0", "--until-empty")
    error = None
except CommandError as exc:
    error = str(exc)
call_command("outbox_worker", "--until-empty", verbosity=0)  # the worker itself runs without them
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("opentelemetry", "prometheus_client") and sys.modules[m])
print(json.dumps({"headers": message.headers, "error": error, "loaded": loaded}))
"""


def test_nothing_of_theirs_is_imported_without_them():
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["loaded"] == []
    assert report["headers"] == {"tenant": "7"}
    assert "[prometheus]" in report["error"]
    assert "prometheus-client" in report["error"]
