"""The consumer of the chaos run's Redis stream: a consumer group reader that acknowledges (``XACK``)
each entry only after its effect committed (effects.py).

It reads its own pending entries first (``XREADGROUP ... 0``), so that after it was killed, or after
a failure, the entries it had read but not acknowledged are read again; then new ones (``>``). A fault
strikes once per message (effects.py).
"""

from __future__ import annotations

import json
import time
from typing import Any

GROUP = "chaos"
CONSUMER = "chaos-consumer"  # one name across restarts: its pending entries are its own


def run(redis_url: str, stream: str) -> None:
    import django

    django.setup()
    import redis
    from django.db import Error, connection

    from .effects import ConsumerFailure, consume, faults_struck

    client: Any = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
    pending = True
    while True:
        read_from = "0" if pending else ">"
        answer = client.xreadgroup(GROUP, CONSUMER, {stream: read_from}, count=100, block=None if pending else 500)
        entries = answer[0][1] if answer else []
        if pending and not entries:
            pending = False
            continue
        for entry_id, fields in entries:
            try:
                payload = json.loads(fields["payload"])
                armed = "fault" in payload and fields["id"] not in faults_struck()
                consume(fields["id"], payload, attempt=0, armed=armed)
            except (Error, ConsumerFailure):  # not acknowledged: read again from the pending entries
                connection.close()
                time.sleep(0.2)
                pending = True
                break
            client.xack(stream, GROUP, entry_id)


def settled(redis_url: str, stream: str) -> bool:
    """Every entry of the stream read and acknowledged by the group."""
    import redis

    client: Any = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        if not client.exists(stream):
            return True
        last = client.xinfo_stream(stream)["last-generated-id"]
        groups = {g["name"]: g for g in client.xinfo_groups(stream)}
        group = groups.get(GROUP)
        return group is not None and group["pending"] == 0 and group["last-delivered-id"] == last
    finally:
        client.close()
