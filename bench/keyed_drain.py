"""How fast a keyed backlog drains, by the number of keys, beside the unkeyed drain of the same run; and
what one claim costs by the backlog behind a few keys.

    python bench/keyed_drain.py [--databases postgresql,mysql] [--messages 20000] [--keys 0,10000,100,5,1]
        [--cut 90] [--reps 3] [--backlogs 1000,10000,100000] [--json FILE]

Drain: ``--messages`` pending messages spread round-robin over K keys (0: no key), committed at once;
two ``outbox_worker --until-empty`` processes with the no-op handler; the rate is counted from the first
to the last ``delivered_at`` (start-up not counted), each drain cut at ``--cut`` seconds (then the rate
is what was delivered by the cut). Each figure is also given as a ratio to the unkeyed drain of the same
repetition; medians over the repetitions.

Claim cost: a backlog of B pending messages on 5 keys, behind nothing; the median time of 20 claims of a
batch of 100 by one in-process worker, each released again (so every claim sees the same backlog). With
one message per key per claim, and a claim that walks the backlog behind each key's head, this cost grows
with B; the target is that it does not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import procs  # noqa: E402  (needs ROOT on the path)

DSN = {
    "postgresql": "postgres://postgres@127.0.0.1:5432/bench_keyed",
    "mysql": "mysql://root@127.0.0.1:3306/bench_keyed",
}
FILL = {
    "postgresql": """
INSERT INTO django_outbox_message (uuid, topic, key, payload, headers, status, attempts, max_attempts,
    available_at, created_at, last_error)
SELECT gen_random_uuid(), 'bench.noop', {key}, jsonb_build_object('n', i), '{{}}'::jsonb, 'pending', 0, 5,
    now(), now(), ''
FROM generate_series(1, {n}) AS i
""",
    "mysql": """
INSERT INTO django_outbox_message (uuid, topic, `key`, payload, headers, status, attempts, max_attempts,
    available_at, created_at, last_error)
SELECT UUID(), 'bench.noop', {key}, JSON_OBJECT('n', seq), '{{}}', 'pending', 0, 5, UTC_TIMESTAMP(6),
    UTC_TIMESTAMP(6), ''
FROM seq_1_to_{n}
""",
}
KEY_EXPR = {
    "postgresql": "'key-' || (i % {keys})",
    "mysql": "CONCAT('key-', seq MOD {keys})",
}


def env_for(vendor: str) -> dict[str, str]:
    return {"DJANGO_SETTINGS_MODULE": "bench.settings", "DATABASE_URL": DSN[vendor], "BENCH_LOG_LEVEL": "WARNING"}


def prepare(vendor: str) -> None:
    name = urlparse(DSN[vendor]).path.lstrip("/")
    if vendor == "postgresql":
        import psycopg

        with psycopg.connect(DSN[vendor].rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
    else:
        import MySQLdb

        conn = MySQLdb.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.cursor().execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
        conn.close()
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"],
        cwd=ROOT,
        env={**os.environ, **env_for(vendor)},
        check=True,
    )


def execute(sql: str) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql)
        return list(cursor.fetchall()) if cursor.description else []


def reset() -> None:
    execute("DELETE FROM django_outbox_attempt")
    execute("DELETE FROM django_outbox_message")


def fill(vendor: str, n: int, keys: int) -> None:
    key = KEY_EXPR[vendor].format(keys=keys) if keys else "NULL"
    execute(FILL[vendor].format(n=n, key=key))
    execute("ANALYZE TABLE django_outbox_message" if vendor == "mysql" else "ANALYZE django_outbox_message")


def drain(vendor: str, messages: int, keys: int, cut: float) -> float:
    reset()
    fill(vendor, messages, keys)
    command = [sys.executable, str(ROOT / "manage.py"), "outbox_worker", "--until-empty", "--poll-interval", "0.2"]
    workers = [procs.Proc(command, env=env_for(vendor)) for _ in range(2)]
    deadline = time.monotonic() + cut
    try:
        while any(w.alive() for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for worker in workers:
            if worker.alive():
                worker.proc.terminate()
        for worker in workers:
            worker.proc.wait(timeout=60)
    rows = execute(
        "SELECT COUNT(*), MIN(delivered_at), MAX(delivered_at) FROM django_outbox_message WHERE status = 'delivered'"
    )
    count, first, last = rows[0]
    if not count or first is None or last is None or last <= first:
        return 0.0
    return float(count) / float((last - first).total_seconds())


def claim_cost(vendor: str, backlog: int) -> float:
    from django.db import connection

    from django_outbox.store import claiming

    reset()
    fill(vendor, backlog, 5)
    times = []
    for _ in range(20):
        started = time.perf_counter()
        claimed = claiming.claim("default", worker="bench:1:claim", limit=100, lease_seconds=60)
        times.append(time.perf_counter() - started)
        ids = ",".join(str(m.id) for m in claimed) or "0"
        execute(
            "UPDATE django_outbox_message SET status = 'pending', attempts = 0, locked_by = NULL, locked_until = NULL"
            f" WHERE id IN ({ids})"
        )
    connection.close()
    return float(statistics.median(times))


def measure(vendor: str, args: argparse.Namespace) -> dict[str, Any]:
    import django

    django.setup()
    prepare(vendor)
    key_counts = [int(k) for k in args.keys.split(",")]
    rates: dict[int, list[float]] = {k: [] for k in key_counts}
    ratios: dict[int, list[float]] = {k: [] for k in key_counts}
    for rep in range(args.reps):
        this = {keys: drain(vendor, args.messages, keys, args.cut) for keys in key_counts}
        for keys, rate in this.items():
            rates[keys].append(rate)
            ratios[keys].append(rate / this[0] if this.get(0) else float("nan"))
        print(f"{vendor} rep {rep + 1}: " + ", ".join(f"{k or 'no'} keys {r:,.0f}/s" for k, r in this.items()))
    print(f"\n{vendor}: {args.messages:,} messages, two worker processes, medians of {args.reps}")
    print(f"{'keys':>8} {'msg/s':>10} {'vs unkeyed':>11}")
    for keys in key_counts:
        print(f"{keys or 'none':>8} {statistics.median(rates[keys]):>10,.0f} {statistics.median(ratios[keys]):>10.3f}x")
    costs = {}
    for backlog in (int(b) for b in args.backlogs.split(",")):
        costs[backlog] = claim_cost(vendor, backlog)
        print(f"claim of 100 with {backlog:,} pending on 5 keys: {costs[backlog] * 1000:.2f} ms", flush=True)
    return {"rates": rates, "ratios": ratios, "claim_cost_s": costs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--databases", default="postgresql,mysql")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--keys", default="0,10000,100,5,1")
    parser.add_argument("--cut", type=float, default=90.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--backlogs", default="1000,10000,100000")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not args.keys.split(",")[0] == "0":
        parser.error("--keys must start with 0: every figure is a ratio to the unkeyed drain of its repetition")
    vendors = args.databases.split(",")
    if len(vendors) > 1:  # one process per database: Django reads its settings once per process
        combined: dict[str, Any] = {}
        for vendor in vendors:
            command = [sys.executable, __file__, f"--databases={vendor}", f"--messages={args.messages}"]
            command += [
                f"--keys={args.keys}",
                f"--cut={args.cut}",
                f"--reps={args.reps}",
                f"--backlogs={args.backlogs}",
            ]
            part = args.json.with_suffix(f".{vendor}.json") if args.json else None
            if part:
                command.append(f"--json={part}")
            subprocess.run(command, check=True)
            if part:
                combined.update(json.loads(part.read_text()))
                part.unlink()
        if args.json:
            args.json.write_text(json.dumps(combined, indent=2, default=str))
        return
    os.environ.update(env_for(vendors[0]))
    results = measure(vendors[0], args)
    if args.json:
        args.json.write_text(json.dumps({vendors[0]: results}, indent=2, default=str))


if __name__ == "__main__":
    main()
