"""Relay rate to RabbitMQ, Redis Streams, NATS JetStream and Kafka, against a no-op handler in the same run.

Each round fills the outbox with ``--messages`` pending messages and times one ``Relay`` (``until_empty``,
one delivery thread) relaying them to each destination in turn; each broker is then asked how many it
holds, so a transport that drops messages cannot look fast (the run fails). Medians over the rounds.
Kafka (a Tansu broker started here) is also set beside ``kafka-ref``: the simplest hand-written relay to
it (claim 100 rows of a minimal table ``FOR UPDATE SKIP LOCKED``, produce them with confluent-kafka's
idempotent ``acks=all`` producer, await the reports, mark them delivered), in the same process and run."""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import common  # noqa: E402
from bench.common import median  # noqa: E402

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/outbox_bench_brokers")
os.environ["DEBUG"] = "false"

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
REDIS_URL = "redis://127.0.0.1:6379/0"
NATS_URL = "nats://127.0.0.1:4222"
EXCHANGE = QUEUE = "outbox.bench"
STREAM = "OUTBOX_BENCH"
#: Ordering keys of the messages, in turn: a claim takes one message per key, so with a few keys the rate
#: would measure the claim, not the broker.
KEYS = 1000
PAYLOAD = "jsonb_build_object('order_id', i, 'total', '19.90', 'lines', jsonb_build_array(i, i + 1))"
FILL = f"""
INSERT INTO django_outbox_message (uuid, topic, key, payload, headers, idempotency_key, status, attempts,
    max_attempts, available_at, created_at, last_error)
SELECT gen_random_uuid(), %(topic)s, 'key-' || (i %% {KEYS}), {PAYLOAD},
       jsonb_build_object('trace', 'trace-' || i), %(topic)s || ':' || i, 'pending', 0, 5, now(), now(), ''
FROM generate_series(1, %(count)s) AS i
"""
REF_TABLE = "bench_kafka_ref"
REF_FILL = (
    f"INSERT INTO {REF_TABLE} (key, payload) SELECT 'key-' || (i %% {KEYS}), {PAYLOAD} FROM generate_series(1, %s) AS i"
)
REF_CLAIM = (
    f"UPDATE {REF_TABLE} SET claimed = true WHERE id IN (SELECT id FROM {REF_TABLE} WHERE NOT claimed "
    "ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED) RETURNING id, key, payload::text"
)
#: Each broker's transport (its module and class under django_outbox.transports) and options.
TRANSPORTS: dict[str, tuple[str, dict[str, Any]]] = {
    "rabbitmq": ("amqp.AMQPTransport", {"URL": AMQP_URL, "EXCHANGE": EXCHANGE}),
    "redis": ("redis.RedisStreamsTransport", {"URL": REDIS_URL, "STREAM": "bench:{topic}"}),
    "nats": (
        "nats.NATSTransport",
        {"SERVERS": NATS_URL, "STREAM": STREAM, "CREATE_STREAM": True, "STREAM_SUBJECTS": ["bench.>"]},
    ),
    "kafka": ("kafka.KafkaTransport", {"BOOTSTRAP_SERVERS": ""}),  # the Tansu broker main() starts
}


def rabbitmq_counter() -> Callable[[], int]:
    import pika

    def count(purge: bool = False) -> int:
        channel: Any = pika.BlockingConnection(pika.URLParameters(AMQP_URL)).channel()  # the stubs want enums
        try:
            if purge:
                channel.exchange_declare(EXCHANGE, "topic", durable=True)
                channel.queue_declare(QUEUE, durable=True)
                channel.queue_bind(QUEUE, EXCHANGE, "bench.#")
                channel.queue_purge(QUEUE)
            return int(channel.queue_declare(QUEUE, durable=True, passive=True).method.message_count or 0)
        finally:
            channel.connection.close()

    count(purge=True)
    return count


def redis_counter() -> Callable[[], int]:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    client.delete("bench:bench.redis")
    return lambda: int(client.xlen("bench:bench.redis"))


def nats_counter() -> Callable[[], int]:
    import nats
    import nats.js.errors

    async def stream(delete: bool) -> int:
        nc = await nats.connect(NATS_URL)
        try:
            if delete:
                await nc.jetstream().delete_stream(STREAM)
                return 0
            return int((await nc.jetstream().stream_info(STREAM)).state.messages)
        except nats.js.errors.NotFoundError:
            return 0
        finally:
            await nc.close()

    asyncio.run(stream(delete=True))
    return lambda: asyncio.run(stream(delete=False))


def kafka_counter(topic: str = "bench.kafka") -> Callable[[], int]:
    """Records the broker holds in ``topic`` from now on, counted by reading them all with a consumer
    (Tansu's high watermarks are not the partitions' lengths: 1 for a partition holding 50)."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    server = {"bootstrap.servers": TRANSPORTS["kafka"][1]["BOOTSTRAP_SERVERS"]}

    def total() -> int:
        partitions = AdminClient(server).list_topics(topic, timeout=10).topics[topic].partitions
        consumer = Consumer({**server, "group.id": "bench"})
        consumer.assign([TopicPartition(topic, p, -2) for p in partitions])  # -2: from the beginning
        count, idle = 0, 0
        try:
            while idle < 4:
                batch = consumer.consume(10_000, timeout=0.5)
                count += sum(1 for record in batch if record.error() is None)
                idle = 0 if batch else idle + 1
            return count
        finally:
            consumer.close()

    before = total()
    return lambda: total() - before


#: Every destination, in the order a round measures them (interleaved), and its counter: made before the
#: fill, it empties the broker with the broker's own client, then counts what it holds. The no-op is the baseline.
TARGETS: dict[str, Callable[[], Callable[[], int]] | None] = {
    "noop": None,
    "rabbitmq": rabbitmq_counter,
    "redis": redis_counter,
    "nats": nats_counter,
    "kafka": kafka_counter,
    "kafka-ref": functools.partial(kafka_counter, "bench.kafkaref"),
}


def relay(target: str) -> tuple[float, int]:
    """The outbox's ``Relay`` to ``target``: its seconds, and how many messages it delivered."""
    from django.test import override_settings

    from django_outbox.models import Message
    from django_outbox.routing import registry
    from django_outbox.worker import Relay, RelayConfig

    outbox: dict[str, Any] = {"MAX_ATTEMPTS": 5, "NOTIFY": False}
    if target == "noop":
        registry.register("bench.noop", lambda message: None)
    else:
        backend, options = TRANSPORTS[target]
        outbox["TRANSPORTS"] = {target: {"BACKEND": f"django_outbox.transports.{backend}", "OPTIONS": options}}
        outbox["ROUTES"] = {f"bench.{target}": target}
    with override_settings(OUTBOX=outbox):
        relay = Relay(RelayConfig.from_settings(until_empty=True, poll_interval=0.05, notify=False))
        started = time.perf_counter()
        relay.run()
        elapsed = time.perf_counter() - started
        return elapsed, Message.objects.filter(status=Message.Status.DELIVERED).count()


def reported(done: list[int], row_id: int, err: object, _msg: object) -> None:
    if err is None:
        done.append(row_id)


def kafka_reference() -> tuple[float, int]:
    """The simplest relay to Kafka by hand: claim 100 rows, produce them, await the reports, mark them."""
    from confluent_kafka import Producer

    bootstrap = TRANSPORTS["kafka"][1]["BOOTSTRAP_SERVERS"]
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    delivered = 0
    started = time.perf_counter()
    while rows := common.sql(REF_CLAIM):
        done: list[int] = []
        for row_id, key, payload in rows:
            report = functools.partial(reported, done, row_id)
            producer.produce("bench.kafkaref", value=payload.encode(), key=key.encode(), on_delivery=report)
        producer.flush(30)
        common.sql(f"UPDATE {REF_TABLE} SET delivered = true WHERE id = ANY(%s)", [done])
        delivered += len(done)
    return time.perf_counter() - started, delivered


def measure(target: str, count: int) -> float:
    """Fill, relay to ``target`` and time it; check the database and the broker hold every message."""
    counter = TARGETS[target]
    held = counter() if counter else None
    if target == "kafka-ref":
        common.sql(
            f"CREATE TABLE IF NOT EXISTS {REF_TABLE} (id bigserial PRIMARY KEY, key text, payload jsonb, "
            "claimed boolean NOT NULL DEFAULT false, delivered boolean NOT NULL DEFAULT false)"
        )
        common.sql(f"TRUNCATE {REF_TABLE}")
        common.sql(REF_FILL, [count])
        common.sql(f"VACUUM ANALYZE {REF_TABLE}")
        elapsed, delivered = kafka_reference()
    else:
        common.sql("TRUNCATE django_outbox_attempt, django_outbox_message")
        common.sql(FILL, {"topic": f"bench.{target}", "count": count})
        common.sql("VACUUM ANALYZE django_outbox_message")
        elapsed, delivered = relay(target)
    for what, n in (("delivered", delivered), ("the broker holds", held() if held else count)):
        if n != count:
            raise SystemExit(f"{target}: {what} {n} messages, expected {count}")
    return count / elapsed


def main() -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    common.setup_django("default", settings="tests.settings")
    from tests.support.tansu import Tansu

    tansu = Tansu()  # on a free loopback port; stopped when the run ends
    TRANSPORTS["kafka"][1]["BOOTSTRAP_SERVERS"] = tansu.bootstrap
    rates: dict[str, list[float]] = {t: [] for t in TARGETS}
    try:
        for round_number in range(1, args.rounds + 1):
            for target in TARGETS:  # interleaved, so a slow moment on the machine hits every target
                rates[target].append(measure(target, args.messages))
                print(f"round {round_number}: {target:<9} {rates[target][-1]:>8.0f} msg/s", flush=True)
    finally:
        tansu.stop()
    noop = median(rates["noop"])
    rows = [
        {"destination": t, "median_rate": round(median(r)), "ratio": round(median(r) / noop, 3), "rates": r}
        for t, r in rates.items()
    ]
    common.write_json(args.json, {"messages": args.messages, "rounds": args.rounds, "results": rows})
    print("medians against the no-op: " + ", ".join(f"{r['destination']} {r['ratio']:.2f}x" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
