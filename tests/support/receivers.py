"""Webhook receivers written in other languages, run as real processes on loopback.

``NodeReceiver`` starts ``tests/support/node/standard_webhooks_receiver.mjs`` (node's http server and the
``standardwebhooks`` npm package pinned in package-lock.json; ``npm ci --prefix tests/support/node``
installs it). It prints ``{"port": N}`` once listening, then one JSON line per request it got:
``{"ok": true, "verified": <what the library returned>, "headers": {...}}`` or ``{"ok": false, "error": ...}``.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
from typing import Any

import pytest

from . import IN_CI, ROOT

NODE_DIR = ROOT / "tests" / "support" / "node"
NODE_RECEIVER = NODE_DIR / "standard_webhooks_receiver.mjs"


def require_node() -> str:
    """The path of ``node`` with the receiver's packages installed; skip on a laptop without, fail under CI."""
    node = shutil.which("node")
    missing = None
    if node is None:
        missing = "node is not installed (apt-get install nodejs npm)"
    elif not (NODE_DIR / "node_modules" / "standardwebhooks" / "package.json").exists():
        missing = "the npm packages of tests/support/node are not installed (npm ci --prefix tests/support/node)"
    if missing is not None:
        if IN_CI:
            pytest.fail(f"{missing}; under CI=true this is a failure (.ci/run installs them)")
        pytest.skip(missing)
    assert node is not None
    return node


class NodeReceiver:
    """The Node receiver as a subprocess; ``requests()`` returns the lines it printed, one per request."""

    def __init__(self, secret: str, *, timeout: float = 30.0) -> None:
        node = require_node()
        self.proc = subprocess.Popen(
            [node, str(NODE_RECEIVER)],
            cwd=NODE_DIR,
            env={**os.environ, "WEBHOOK_SECRET": secret},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="test-node-receiver", daemon=True)
        self._reader.start()
        first = self._next(timeout)
        self.port = int(first["port"])

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _next(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the Node receiver printed nothing within {timeout:g} s") from None
        if line is None:
            stderr = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"the Node receiver exited ({self.proc.wait()}): {stderr}")
        return dict(json.loads(line))

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def requests(self, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The next ``count`` requests the receiver reported, waiting up to ``timeout`` seconds for each."""
        return [self._next(timeout) for _ in range(count)]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
