"""The pooler scenarios' shared PgBouncer, started once per pool mode for each test that asks for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import pgbouncer


@pytest.fixture(params=["transaction", "session"])
def bouncer(request: pytest.FixtureRequest) -> Iterator[pgbouncer.PgBouncer]:
    """A private PgBouncer in front of the test server. In transaction pooling it has fewer server
    connections than clients, as in production, where clients share them; a module may set that number
    (``TRANSACTION_POOL_SIZE``, 3 unless it says). Session pooling gives each client its own."""
    pgbouncer.require()
    size = getattr(request.module, "TRANSACTION_POOL_SIZE", 3) if request.param == "transaction" else 30
    pooler = pgbouncer.PgBouncer(request.param, pool_size=size)
    yield pooler
    pooler.stop()
