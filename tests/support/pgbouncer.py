"""A private PgBouncer (Debian's ``pgbouncer``) in front of the test server, on a free loopback port.

Production Django sites on PostgreSQL mostly reach it through a pooler; the tests put one in the way to
show what the outbox does there. ``PgBouncer(mode)`` starts one in ``transaction`` or ``session``
pooling; ``admin()`` runs a command on its console (``PAUSE``, ``RESUME``, ``SHOW POOLS``...); ``restart()`` kills it
and starts it again on the same port (tests/chaos/run.py's pooler faults use both).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from .servers import free_port

BINARY = "/usr/sbin/pgbouncer"


def available() -> bool:
    return Path(BINARY).exists()


def require() -> None:
    """Skip a test that needs PgBouncer where it is missing on a laptop; under ``CI=true``, fail it."""
    import pytest

    if available():
        return
    if os.environ.get("CI") == "true":
        pytest.fail("pgbouncer is not installed (apt-get install pgbouncer); under CI=true that is a failure")
    pytest.skip("pgbouncer is not installed")


class PgBouncer:
    def __init__(self, mode: str, *, server_host: str = "127.0.0.1", server_port: int = 5432, pool_size: int = 20):
        if mode not in ("transaction", "session"):
            raise ValueError(f"pool mode {mode!r}")
        self.mode = mode
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-pgbouncer-"))
        (self.dir / "users.txt").write_text('"postgres" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={server_host} port={server_port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\n"
            f"unix_socket_dir = {self.dir}\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'users.txt'}\n"
            f"pool_mode = {mode}\n"
            f"default_pool_size = {pool_size}\nmax_client_conn = 500\n"
            "admin_users = postgres\n"
            # psycopg and Django send no startup options that PgBouncer refuses, but libpq users may.
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
            f"pidfile = {self.dir / 'pgbouncer.pid'}\n"
        )
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        args = [BINARY, str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            user = pwd.getpwnam("postgres")
            shutil.chown(self.dir, user.pw_uid, user.pw_gid)
            for child in self.dir.iterdir():
                shutil.chown(child, user.pw_uid, user.pw_gid)
            args[1:1] = ["-u", "postgres"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self._wait_listening()
        return self.proc

    def restart(self) -> float:
        """Kill the pooler (SIGKILL: every client and server connection drops at once, as in a crash or an
        OOM kill) and start it again on the same port; returns the seconds it was away."""
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        (self.dir / "pgbouncer.pid").unlink(missing_ok=True)  # a killed PgBouncer leaves its pidfile behind
        self._start()
        return time.monotonic() - started

    def _wait_listening(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited with {self.proc.returncode}: {self.log()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not listen on 127.0.0.1:{self.port}: {self.log()[-2000:]}")

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def admin(self, command: str) -> list[tuple[Any, ...]]:
        """Run a command on PgBouncer's admin console (the ``pgbouncer`` database)."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="pgbouncer", autocommit=True
        ) as conn:
            cursor = conn.execute(command)
            return cursor.fetchall() if cursor.description else []

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def direct_url(database: str) -> str:
    """The test server itself, bypassing any pooler: for a listener that needs a session of its own."""
    from django.db import connection

    settings = connection.settings_dict
    return f"postgres://postgres@{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}/{database}"


def worker_env(pooler: PgBouncer, *, listen_direct: bool = False) -> dict[str, str]:
    """Environment for a worker process on the test database through ``pooler``. ``listen_direct``: in
    transaction pooling, its listener on a direct alias of its own (``LISTEN_DATABASE_URL``)."""
    from django.db import connection

    name = connection.settings_dict["NAME"]
    env = {"DATABASE_URL": pooler.url(name), "OUTBOX_LOG_LEVEL": "WARNING", "DEBUG": "false"}
    if listen_direct and pooler.mode == "transaction":
        env["LISTEN_DATABASE_URL"] = direct_url(name)
    return env
