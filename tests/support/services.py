"""Services on loopback (brokers, PostgreSQL's extras): skipped on a laptop without them, required in CI."""

from __future__ import annotations

import socket

import pytest

from . import IN_CI


def require_service(name: str, host: str, port: int) -> None:
    """Skip when a service is missing on a laptop; under CI=true a missing service fails the test."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return
    except OSError as exc:
        if IN_CI:
            pytest.fail(f"{name} is not reachable at {host}:{port} ({exc}); under CI=true this is a failure")
        pytest.skip(f"{name} not reachable at {host}:{port}")
