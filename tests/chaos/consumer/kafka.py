"""The consumer of the chaos run's Kafka topic: it reads every partition and commits a record's offset
(to its consumer group) only after the record's effect committed (effects.py).

The test broker (Tansu) keeps its records and the group's offsets in memory, so the run restarts this
consumer with the broker, under a new ``generation``: it then reads the new, empty topic from its start.
A consumer killed by a fault is started again in the same generation and goes on from the group's
committed offset, reading again what it had not committed (the inbox makes that harmless).

Every record read is logged to a file first (``recv``), and once its effect committed (``done``), each
line naming the generation, partition and offset: the run's raw audit counts one broker record per
distinct (generation, partition, offset), however often it was read, and the broker forgets its records
when it restarts.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

GROUP = "chaos"
PARTITIONS = 3


def _append(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())  # in the page cache: survives a SIGKILL of this process
    finally:
        os.close(fd)


def _header(record: Any, name: str) -> str | None:
    for key, value in record.headers() or []:
        if key == name:
            return value.decode() if isinstance(value, bytes) else value
    return None


def create_topic(bootstrap: str, topic: str) -> None:
    """The topic with a few partitions, before anything produces to it (or again, on a restarted broker)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        try:
            future.result(15)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


def run(bootstrap: str, topic: str, generation: int, log: Path) -> None:
    import django

    django.setup()
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    from django.db import Error, connection

    from .effects import ConsumerFailure, consume, faults_struck

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": GROUP,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
        }
    )
    # Assigned, not subscribed: a consumer SIGKILLed by a fault stays in a subscribed group until its session
    # times out (45 s), and its successor would wait that long for a rebalance. The group still keeps the
    # committed offsets, where an assigned partition starts (or at its beginning, before any commit).
    consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
    try:
        while True:
            batch = consumer.consume(100, timeout=0.5)
            for index, record in enumerate(batch):
                error = record.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        print(f"chaos kafka consumer: {error.str()}", flush=True)
                    continue
                partition, offset = record.partition() or 0, record.offset() or 0
                where = f"{generation} {partition} {offset}"
                message_uuid = _header(record, "Outbox-Message-Id") or "?"
                _append(log, f"recv {where} {message_uuid}")
                try:
                    payload = json.loads(record.value() or b"null")
                    armed = "fault" in payload and message_uuid not in faults_struck()
                    consume(message_uuid, payload, attempt=0, armed=armed)
                except (Error, ConsumerFailure):  # not committed: read it again
                    connection.close()
                    time.sleep(0.2)
                    # ... with the rest of the batch: the consumer's position is past every record consume()
                    # returned, of every partition, so each partition goes back to its first record left.
                    rewind: dict[int, int] = {}
                    for left in batch[index:]:
                        if left.error() is None:
                            rewind.setdefault(left.partition() or 0, left.offset() or 0)
                    for left_partition, left_offset in rewind.items():
                        consumer.seek(TopicPartition(topic, left_partition, left_offset))
                    break
                _append(log, f"done {where} {message_uuid}")
                consumer.commit(message=record, asynchronous=False)
    finally:
        consumer.close()


def held(bootstrap: str, topic: str) -> set[tuple[int, int]]:
    """(partition, offset) of every record the broker holds in ``topic``, read from the start of each partition."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(topic, timeout=10).topics.get(topic)
    if metadata is None or metadata.error is not None:
        return set()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "chaos-audit", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, -2) for p in metadata.partitions])  # -2: from the beginning
    found: set[tuple[int, int]] = set()
    idle = 0
    try:
        while idle < 3:
            batch = consumer.consume(1000, timeout=0.5)
            found.update((r.partition() or 0, r.offset() or 0) for r in batch if r.error() is None)
            idle = 0 if batch else idle + 1
    finally:
        consumer.close()
    return found


def read_log(log: Path) -> list[tuple[str, int, int, int, str]]:
    """(kind, generation, partition, offset, message uuid) per line of the consumer's log."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 5:
            out.append((parts[0], int(parts[1]), int(parts[2]), int(parts[3]), parts[4]))
    return out


def done(lines: Iterable[tuple[str, int, int, int, str]], generation: int) -> set[tuple[int, int]]:
    return {(p, o) for kind, g, p, o, _ in lines if kind == "done" and g == generation}


def settled(bootstrap: str, topic: str, generation: int, log: Path) -> bool:
    """Every record the broker holds had its effect committed by the consumer of this generation."""
    return held(bootstrap, topic) <= done(read_log(log), generation)
