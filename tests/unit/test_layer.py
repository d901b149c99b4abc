"""``pytest tests/unit`` passes with nothing running, whatever database ``DATABASE_URL`` names.

A developer's shell may point ``DATABASE_URL`` at a server that is not up; the unit layer must not notice.
Run here in a child pytest against addresses where nothing listens, for each supported kind of server, on
the modules that run the system checks (which is where Django 6.x reached for the MariaDB server).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import ROOT

#: Port 9 (discard) on the loopback: nothing of this project listens there.
UNREACHABLE = {
    "postgresql": "postgres://postgres@127.0.0.1:9/nothing",
    "mysql": "mysql://root@127.0.0.1:9/nothing",
    "sqlite": "sqlite:////nonexistent/directory/db.sqlite3",
}
#: Unit modules that run Django's system checks (model checks included) on many settings.
CHECKING_MODULES = ["tests/unit/test_webhook_body.py", "tests/unit/test_check_bounds.py"]


@pytest.mark.parametrize("vendor", sorted(UNREACHABLE))
def test_the_unit_layer_runs_with_no_database_server(vendor):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEST_POOLER", "LISTEN_DATABASE"))}
    env.update(DATABASE_URL=UNREACHABLE[vendor], PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *CHECKING_MODULES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
