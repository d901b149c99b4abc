"""Claiming: leasing due messages to a worker, and what an idle worker asks (when to look again, whether
to wait).

Each statement runs in autocommit where the database allows (PostgreSQL data-modifying CTEs, SQLite
``UPDATE ... RETURNING``), so a claim is one round trip and no transaction outlives the function.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from django.conf import settings
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from . import mysql
from .cursors import unprepared_on_loss, worker_cursor
from .db import (
    DEAD,
    MESSAGE,
    PENDING,
    PROCESSING,
    SERVER_NOW,
    connection,
    is_mysql,
    is_pg,
    literal,
    prep_dt,
    topic_filter,
)
from .models import Message
from .rows import COLUMN_NAMES, COLUMNS, to_messages

try:
    import psycopg
except ImportError:  # pragma: no cover - an install without the postgres extra
    psycopg = None  # type: ignore[assignment]


def claim(
    alias: str,
    *,
    worker: str,
    limit: int,
    lease_seconds: float,
    topics: Sequence[str] | None = None,
    ids: Sequence[int] | None = None,
) -> list[Message]:
    """Lease up to ``limit`` due messages to ``worker`` and count the attempt; committed on return.

    A keyed message is claimed only with every open message of its key before it (``_runs_text``): a
    batch holds a run from each key's head, in id order, which the pipeline delivers in order and stops
    at the key's first failure. ``ids`` limits the claim to those messages (``OUTBOX["EAGER"]`` delivers
    what one transaction sent), one per key, at its head; the head-of-key rule still looks at every
    message, so a keyed one behind another stays behind it.
    """
    conn = connection(alias)
    messages = unprepared_on_loss(
        conn,
        lambda: _claim_once(
            alias, conn, worker=worker, limit=limit, lease_seconds=lease_seconds, topics=topics, ids=ids
        ),
    )
    messages.sort(key=lambda m: m.id)
    if ids is None:
        _advance_cursor(worker, messages)
    return messages


#: Where each worker's next claim starts its walk over the keys (``_advance_cursor``), by worker id.
_cursors: dict[str, str] = {}
_cursors_lock = threading.Lock()
#: Workers whose cursor is kept, at most: a process runs one worker, tests and scripts a few.
_CURSORS_KEPT = 1_000


def key_cursor(worker: str) -> str:
    """The key after which ``worker``'s next claim looks for keys first ("" for the first claim)."""
    return _cursors.get(worker, "")


def _advance_cursor(worker: str, messages: Sequence[Message]) -> None:
    """Move past the keys this claim served, so the next claim offers the following keys first.

    The walk over the keys is in key order and bounded (``KEYS_PER_CLAIM``); without a cursor the keys
    early in that order would be served first on every claim while they had a backlog, and the others
    only by the walk of the pending rows. The cursor goes to the last key served after the old cursor,
    or, when the walk wrapped round, to the last key served before it.
    """
    keys = {m.key for m in messages if m.key is not None}
    if not keys:
        return
    with _cursors_lock:
        start = _cursors.get(worker, "")
        after = [k for k in keys if k > start]
        _cursors[worker] = max(after) if after else max(keys)
        if len(_cursors) > _CURSORS_KEPT:
            _cursors.pop(next(iter(_cursors)))


def blocking_statuses() -> tuple[str, ...]:
    """Statuses of an earlier message that hold back the later messages of its key."""
    from ..conf import get_settings

    return (PENDING, PROCESSING) if get_settings().ORDERING == "skip_dead" else (PENDING, PROCESSING, DEAD)


def claim_sql(
    conn: BaseDatabaseWrapper,
    *,
    worker: str,
    limit: int,
    lease_seconds: float,
    topics: Sequence[str] | None = None,
    ids: Sequence[int] | None = None,
) -> tuple[str, list[Any]]:
    """The claim statement and its parameters (public so a test can ``EXPLAIN`` it).

    Due pending rows are walked in id order on the partial index of pending rows. A keyed row qualifies
    only when no earlier row of its key is open (pending, processing, or dead under ORDERING "block"),
    probed on the partial index of open keyed rows; keyless rows skip both tests.

    No fence for rows still invisible: ids are taken at insert and rows appear at commit, but on
    PostgreSQL ``send()`` takes the key's advisory lock before the row's id and holds it to the end of
    its transaction, so a later id of a key is never committed while an earlier one is still open
    (``producing._insert_sql``, docs/ordering.md). SQLite has one writer at a time, whose ids are in
    commit order anyway.

    On PostgreSQL "due" and the lease's end are the server's ``statement_timestamp()`` (plus the lease's
    seconds): a worker whose clock is off neither claims early nor leases for minutes too long or short.
    """
    pg = is_pg(conn)
    if ids is None:
        return _runs_sql(conn, pg, worker=worker, limit=limit, lease_seconds=lease_seconds, topics=topics)
    topic_sql, params = topic_filter(topics)
    # one parameter whatever the count of ids: one text, one prepared statement
    topic_sql += " AND c.id = ANY(%s)" if pg else " AND c.id IN (SELECT value FROM json_each(%s))"
    topic_params = [*params, [int(i) for i in ids] if pg else json.dumps([int(i) for i in ids])]
    sql = _claim_text(pg, topic_sql, blocking_statuses(), int(limit) if pg else None)
    if pg:
        return sql, [*topic_params, worker, float(lease_seconds)]
    now = timezone.now()
    lease = [worker, prep_dt(conn, now + dt.timedelta(seconds=lease_seconds))]
    return sql, [*lease, prep_dt(conn, now), *topic_params, limit]


#: The database server's clock in every PostgreSQL statement that decides by time. Not ``now()``, which
#: stands still for a whole transaction (a caller's, in tests and ``relay_all()``); the statement's
#: start, which Django's ``Now()`` also uses.


@functools.cache
def _claim_text(pg: bool, topic_sql: str, blocking: tuple[str, ...], limit: int | None) -> str:
    """The claim's text, built once per shape (building it cost ~40 µs of every wake-up).

    The prepared claim's plan is pinned to the walk by ``walking_plan``'s settings, under which PostgreSQL
    may keep a generic plan: left to itself, a generic plan chosen while few messages were pending (a
    sort of every due row) would be kept for the connection's life, however large the backlog grew.
    Statuses are literals, which the partial indexes' predicates can be matched against in any plan. On
    PostgreSQL the limit is one too (a worker's batch size, one text per worker): bound, it made the
    generic plan's estimate a tenth of the pending rows, dearer than any custom plan's, so PostgreSQL
    never chose it.
    """
    pending, processing = literal(PENDING), literal(PROCESSING)
    open_ = f"b.key IS NOT NULL AND b.status IN ({', '.join(map(literal, blocking))})"
    if pg:
        # The key's head read off the index of open keyed rows: its first entry at or after (key, -1). The
        # ORDER BY has no column equal to the outer row's, so only that index returns rows in this order;
        # a NOT EXISTS probe (b.key = c.key AND b.id < c.id) let the planner walk the primary key instead,
        # through every finished row before the head, whenever the table had few distinct keys: each
        # claim then read the whole table once per key (10 msg/s for 3,000 messages on five keys).
        head = (
            f"c.id = (SELECT b.id FROM {MESSAGE} AS b WHERE (b.key, b.id) > (c.key, -1) AND {open_}"
            " ORDER BY b.key, b.id LIMIT 1)"
        )
    else:
        head = f"NOT EXISTS (SELECT 1 FROM {MESSAGE} AS b WHERE b.key = c.key AND b.id < c.id AND {open_})"
    if not pg:
        set_lease = f"status = {processing}, locked_by = %s, locked_until = %s"
        return (
            f"UPDATE {MESSAGE} SET {set_lease}, attempts = {_next_attempt('attempts')}"
            f" WHERE id IN (SELECT c.id FROM {MESSAGE} AS c WHERE c.status = {pending} AND c.available_at <= %s"
            f"{topic_sql} AND (c.key IS NULL OR {head}) ORDER BY c.id LIMIT %s) RETURNING {COLUMNS}"
        )
    # The claim's commit waits for the disk like any other. Committing it asynchronously saved ~0.2 ms
    # per claim, but a crash could then forget a claim whose attempt number the record's fence relies
    # on: re-issued to another delivery thread of the same worker, it let a late record of the first
    # delivery land on the second's lease (docs/performance.md, rejected optimisations).
    set_lease = f"status = {processing}, locked_by = %s, locked_until = {SERVER_NOW} + %s * interval '1 second'"
    return (
        f"WITH picked AS MATERIALIZED (SELECT c.id FROM {MESSAGE} AS c"
        f" WHERE c.status = {pending} AND c.available_at <= {SERVER_NOW}{topic_sql}"
        f" AND (c.key IS NULL OR {head})"
        f" ORDER BY c.id LIMIT {int(limit or 0)} FOR UPDATE OF c SKIP LOCKED)"
        f" UPDATE {MESSAGE} AS m SET {set_lease},"
        f" attempts = {_next_attempt('m.attempts')} FROM picked WHERE m.id = picked.id"
        f" RETURNING {', '.join('m.' + c for c in COLUMN_NAMES)}"
    )


def _runs_sql(
    conn: BaseDatabaseWrapper,
    pg: bool,
    *,
    worker: str,
    limit: int,
    lease_seconds: float,
    topics: Sequence[str] | None,
) -> tuple[str, list[Any]]:
    """The claim of any due message (no ``ids``): unkeyed rows, and keys' runs (``_runs_text``)."""
    from ..conf import get_settings

    topic_sql, params = topic_filter(topics)
    topic_params: list[Any] = list(params)
    cap = max(1, min(int(get_settings().KEY_BATCH_SIZE), int(limit)))
    sql = _runs_text(pg, topic_sql, blocking_statuses(), int(limit), cap)
    cursor = key_cursor(worker)
    if pg:
        # the topic filter: the head's lock and the run (k1), the unkeyed walk (u), the heads' walk (k2)
        return sql, [cursor, cursor, cursor, *topic_params * 4, worker, float(lease_seconds)]
    now = timezone.now()
    due = prep_dt(conn, now)
    until = prep_dt(conn, now + dt.timedelta(seconds=lease_seconds))
    return sql, [cursor, cursor, cursor, due, *topic_params, due, *topic_params, due, *topic_params, worker, until]


def keys_per_claim(limit: int) -> int:
    """How many keys a claim's walk over the keys visits at most: one more than a batch could serve, so a
    claim that reaches the bound knows more keys wait than the walk saw (and walks the pending rows too)."""
    return int(limit) + 1


@functools.cache
def _runs_text(pg: bool, topic_sql: str, blocking: tuple[str, ...], limit: int, cap: int) -> str:
    """The claim's text: up to ``limit`` due messages, oldest first, a keyed one only with every open
    message of its key before it in the same claim (a run from the key's head, at most ``cap`` long).

    Three sources, each bounded by the batch, so a claim reads about a batch whatever the backlog:

    - ``keys``: a skip scan over the index of open keyed rows, one probe per distinct key (not per
      message), from the worker's cursor (``key_cursor``) round to it again, at most ``keys_per_claim``
      keys; for each key its first ``cap`` open messages, kept while pending and due (a run stops at the
      first message that is processing, scheduled, dead under ORDERING "block", or of another topic);
    - ``u``: unkeyed due messages in id order, on the partial index of pending unkeyed rows;
    - ``k2``: only when the skip scan stopped at its bound (more keys are open than a batch could
      serve): the key heads found by walking the pending rows in id order, as the claim always did, so a
      key the bounded scan did not reach is still served, oldest first.

    The oldest ``limit`` of them are taken. On PostgreSQL they are then locked (``SKIP LOCKED``), and a
    key's messages are kept only as far as every one before them in the claim was locked: a concurrent
    claim that took a key's head, or a message in the middle of its run, leaves this claim none of the
    key's messages after it, so no two workers ever hold parts of one key's run.
    """
    pending, processing = literal(PENDING), literal(PROCESSING)
    statuses = ", ".join(map(literal, blocking))
    open_b = f"b.key IS NOT NULL AND b.status IN ({statuses})"
    now = SERVER_NOW if pg else "%s"
    bound = keys_per_claim(limit)

    def after(key: str) -> str:
        return f"(SELECT b.key FROM {MESSAGE} AS b WHERE b.key > {key} AND {open_b} ORDER BY b.key LIMIT 1)"

    first = f"(SELECT b.key FROM {MESSAGE} AS b WHERE {open_b} ORDER BY b.key LIMIT 1)"
    # Each row carries its key's successor (``nxt``), probed once: the next row's key is that successor or,
    # past the last key, the first key (once: ``wrapped``). Probed in the step's two places, the successor
    # was two index probes a key.
    step = f"COALESCE(keys.nxt, CASE WHEN keys.wrapped THEN NULL ELSE {first} END)"
    keys = (
        f"keys(k, nxt, n, wrapped) AS (SELECT s.k, {after('s.k')}, 1, s.wrapped"
        f" FROM (SELECT CAST(COALESCE(a.k, {first}) AS TEXT) AS k, a.k IS NULL AS wrapped"
        f" FROM (SELECT {after('%s')} AS k) AS a) AS s"
        f" UNION ALL SELECT CAST({step} AS TEXT), {after(step)}, keys.n + 1, keys.wrapped OR keys.nxt IS NULL"
        f" FROM keys WHERE keys.k IS NOT NULL AND keys.n < {bound} AND NOT (keys.wrapped AND keys.k > %s)),"
        " served AS (SELECT k FROM keys WHERE k IS NOT NULL AND NOT (wrapped AND k > %s))"
    )
    ok = f"status = {pending} AND available_at <= {now}{topic_sql}"
    if pg:
        # The key's head is locked first (SKIP LOCKED, and only if it can be claimed, rereading it as it is
        # now): a key whose head another claim holds is passed over, and the walk goes on to other keys
        # instead of filling the batch with a run it cannot have. The rest of the run is read from the
        # statement's snapshot and locked with the other candidates (``locked``). A row that cannot be
        # claimed is never locked: a claim of another worker's topics must not hide it from that worker.
        this_key = "(b.key, b.id) > (served.k, -1) AND b.key <= served.k"
        k1 = (
            "k1 AS (SELECT r.id, r.key FROM served"
            f" CROSS JOIN LATERAL (SELECT b.id FROM {MESSAGE} AS b WHERE {this_key} AND {open_b}"
            " ORDER BY b.key, b.id LIMIT 1) AS h"
            f" CROSS JOIN LATERAL (SELECT x.id FROM {MESSAGE} AS x WHERE x.id = h.id AND x.{ok}"
            " FOR UPDATE OF x SKIP LOCKED) AS lk"
            " CROSS JOIN LATERAL (SELECT w.id, w.key FROM"
            f" (SELECT b.id, b.key, bool_and(b.{ok}) OVER (ORDER BY b.id) AS ok FROM"
            f" (SELECT b.id, b.key, b.status, b.available_at, b.topic FROM {MESSAGE} AS b"
            f" WHERE {this_key} AND {open_b} ORDER BY b.key, b.id LIMIT {cap}) AS b) AS w"
            f" WHERE w.ok AND w.id >= lk.id) AS r LIMIT {limit})"
        )
        head = (
            f"c.id = (SELECT b.id FROM {MESSAGE} AS b WHERE (b.key, b.id) > (c.key, -1) AND {open_b}"
            " ORDER BY b.key, b.id LIMIT 1)"
        )
    else:
        k1 = (
            "k1 AS (SELECT w.id, w.key FROM (SELECT r.id, r.key,"
            f" min(r.{ok}) OVER (PARTITION BY r.key ORDER BY r.id) AS ok"
            f" FROM served JOIN {MESSAGE} AS r ON r.id IN (SELECT b.id FROM {MESSAGE} AS b"
            f" WHERE b.key = served.k AND {open_b} ORDER BY b.id LIMIT {cap})) AS w WHERE w.ok LIMIT {limit})"
        )
        head = f"NOT EXISTS (SELECT 1 FROM {MESSAGE} AS b WHERE b.key = c.key AND b.id < c.id AND {open_b})"
    due_c = f"c.status = {pending} AND c.available_at <= {now}{topic_sql}"
    # Locked as they are walked (SKIP LOCKED), so two claims at once each walk on past what the other holds.
    skip_locked = " FOR UPDATE OF c SKIP LOCKED" if pg else ""
    u = (
        f"u AS (SELECT c.id, c.key FROM {MESSAGE} AS c WHERE {due_c} AND c.key IS NULL"
        f" ORDER BY c.id LIMIT {limit}{skip_locked})"
    )
    k2 = (
        f"k2 AS (SELECT c.id, c.key FROM {MESSAGE} AS c WHERE {due_c} AND c.key IS NOT NULL AND {head}"
        f" AND (SELECT count(*) FROM k1) < {limit} AND (SELECT max(n) FROM keys) >= {bound}"
        f" ORDER BY c.id LIMIT {limit}{skip_locked})"
    )
    cand = (
        "cand AS (SELECT x.id, x.key FROM (SELECT id, key FROM k1 UNION SELECT id, key FROM k2"
        f" UNION SELECT id, key FROM u) AS x ORDER BY x.id LIMIT {limit})"
    )
    attempts = _next_attempt("attempts")
    if not pg:
        return (
            f"WITH RECURSIVE {keys}, {k1}, {u}, {k2}, {cand}"
            f" UPDATE {MESSAGE} SET status = {processing}, locked_by = %s, locked_until = %s, attempts = {attempts}"
            f" WHERE id IN (SELECT id FROM cand) RETURNING {COLUMNS}"
        )
    kept = (
        f"locked AS (SELECT m.id FROM cand JOIN {MESSAGE} AS m ON m.id = cand.id"
        f" WHERE m.status = {pending} FOR UPDATE OF m SKIP LOCKED),"
        " ranked AS (SELECT c.id, c.key, row_number() OVER (PARTITION BY c.key ORDER BY c.id) AS rk FROM cand AS c),"
        " kept AS (SELECT z.id FROM (SELECT r.id, r.key, r.rk, row_number() OVER (PARTITION BY r.key ORDER BY r.id)"
        " AS got FROM ranked AS r WHERE r.id IN (SELECT id FROM locked)) AS z WHERE z.key IS NULL OR z.got = z.rk)"
    )
    set_lease = f"status = {processing}, locked_by = %s, locked_until = {SERVER_NOW} + %s * interval '1 second'"
    return (
        f"WITH RECURSIVE {keys}, {k1}, {u}, {k2}, {cand}, {kept}"
        f" UPDATE {MESSAGE} AS m SET {set_lease}, attempts = {_next_attempt('m.attempts')} FROM kept"
        f" WHERE m.id = kept.id RETURNING {', '.join('m.' + c for c in COLUMN_NAMES)}"
    )


#: The attempt counter stops at the integer column's largest value: past it, ``attempts + 1`` failed the
#: whole claim on PostgreSQL ("integer out of range"), so one row kept every worker from claiming
#: anything. A message claimed at this count has used up any ``max_attempts`` and goes dead.
ATTEMPTS_MAX = 2**31 - 1


def _next_attempt(column: str) -> str:
    """The claim's new attempt count; a CASE, since ``LEAST(attempts + 1, ...)`` overflows before LEAST."""
    return f"CASE WHEN {column} < {ATTEMPTS_MAX} THEN {column} + 1 ELSE {column} END"


def _claim_once(
    alias: str,
    conn: BaseDatabaseWrapper,
    *,
    worker: str,
    limit: int,
    lease_seconds: float,
    topics: Sequence[str] | None,
    ids: Sequence[int] | None = None,
) -> list[Message]:
    if is_mysql(conn) and ids is None:  # keys in runs, read first, then locked in one short transaction
        from ..conf import get_settings

        return mysql.claim_runs(
            alias,
            conn,
            worker=worker,
            limit=limit,
            lease_seconds=lease_seconds,
            topics=topics,
            blocking=blocking_statuses(),
            attempts_max=ATTEMPTS_MAX,
            cap=max(1, min(int(get_settings().KEY_BATCH_SIZE), int(limit))),
            after_key=key_cursor(worker),
            bound=keys_per_claim(limit),
        )
    if is_mysql(conn) and ids is not None:  # the ids named: two statements in one short transaction
        topic_sql, topic_params = _mysql_filter(topics, ids)
        return mysql.claim(
            alias,
            conn,
            worker=worker,
            limit=limit,
            lease_seconds=lease_seconds,
            topic_sql=topic_sql,
            topic_params=topic_params,
            blocking=blocking_statuses(),
            attempts_max=ATTEMPTS_MAX,
        )
    sql, params = claim_sql(conn, worker=worker, limit=limit, lease_seconds=lease_seconds, topics=topics, ids=ids)
    # Prepared only where the walking plan's settings apply: a generic plan made without them (in a
    # transaction of the caller's, say) would stay with the connection's claims.
    with worker_cursor(conn) if _walks(conn) else conn.cursor() as cursor:
        with walking_plan(conn):
            cursor.execute(sql, params)
        rows = cursor.fetchall()
    return to_messages(alias, conn, rows)


def _mysql_filter(topics: Sequence[str] | None, ids: Sequence[int]) -> tuple[str, list[Any]]:
    topic_sql, params = topic_filter(topics, column="c.topic", escape=mysql.LIKE_ESCAPE)
    wanted = [int(i) for i in ids]
    topic_sql += f" AND c.id IN ({', '.join(['%s'] * len(wanted))})" if wanted else " AND FALSE"
    return topic_sql, [*params, *wanted]


_PLAN_AS_A_WALK = (
    "SELECT set_config('enable_sort', 'off', true), set_config('enable_hashjoin', 'off', true),"
    " set_config('enable_mergejoin', 'off', true), set_config('enable_seqscan', 'off', true),"
    " set_config('plan_cache_mode', 'force_generic_plan', true), set_config('jit', 'off', true),"
    " set_config('enable_bitmapscan', 'off', true)"
)


@contextlib.contextmanager
def walking_plan(conn: BaseDatabaseWrapper) -> Iterator[None]:
    """Plan the claim with sorting disabled, in the same round trip, so it walks the pending index.

    The claim takes the first due messages in id order. Walking the partial index of pending rows
    reads about one batch however long the backlog. Whenever its estimates say few rows are pending,
    the planner prefers to collect every due row and sort them: on a table PostgreSQL has not analyzed
    yet (a new deployment, or after ``pg_upgrade``, which keeps no statistics), each claim sorted the
    whole backlog (18 ms per batch of 100 from a 40,000-message backlog, against 4 ms;
    docs/performance.md), until autovacuum analyzed the table.

    ``enable_sort = off`` is set for the claim's transaction only (``SET LOCAL``), with hash and merge
    joins and sequential scans off too: sent in the same pipeline, the statements share PostgreSQL's
    implicit transaction and one round trip. With all four off the one plan left is the walk, a nested
    loop over the picked ids on the primary key and the key's head on the open keys' index, whatever
    the statistics say, so the prepared claim may settle on a generic plan: it did after five claims,
    which saved each claim its planning (about 0.25 ms of an idle worker's ~2 ms wake-up;
    docs/performance.md, idle wake-up, third pass). With ``enable_sort`` alone, a generic plan made
    with fresh statistics of 20,000 pending rows joined the picked ids to a sequential scan of the
    whole table (14.8 ms against 3.3 ms), which is why the claim used to be planned afresh each time.
    Where the settings are not set (inside a transaction of the caller's: tests, ``relay_all()``; or
    without psycopg's pipelines) the claim is planned as usual, and not prepared (``_claim_once``). In
    the pipeline a failing claim raises when the pipeline closes, after Django's execute wrappers have
    returned: they see the claim sent, not its outcome.
    """
    if not _walks(conn):
        yield
        return
    raw = conn.connection
    with conn.wrap_database_errors, raw.pipeline():
        raw.execute(_PLAN_AS_A_WALK)
        yield


def _walks(conn: BaseDatabaseWrapper) -> bool:
    """Whether ``walking_plan`` sets its settings for the claim: on psycopg 3 with pipelines, outside a
    transaction of the caller's (where they could not be scoped to the claim)."""
    return (
        psycopg is not None
        and is_pg(conn)
        and isinstance(conn.connection, psycopg.Connection)
        and not conn.in_atomic_block
        and conn.get_autocommit()
        and psycopg.Pipeline.is_supported()
    )


def next_due(alias: str, *, topics: Sequence[str] | None = None) -> float | None:
    """Seconds until an idle worker should look again: until the earliest future ``available_at`` of a
    pending message. None when nothing is scheduled.

    On PostgreSQL the wait is measured on the server's clock, which the claim's "due" test uses, so a
    worker sleeps the right time whatever its own clock says.
    """
    conn = connection(alias)
    if is_mysql(conn):
        return mysql.next_due_seconds(conn, *topic_filter(topics, escape=mysql.LIKE_ESCAPE))
    topic_sql, topic_params = topic_filter(topics)
    pg = is_pg(conn)
    now = None if pg else timezone.now()
    # Only the future counts: a message due now that the claim left behind is held behind an earlier
    # message of its key, and is woken by that message's outcome, not by the clock.
    if pg:
        sql = (
            f"SELECT extract(epoch FROM MIN(available_at) - {SERVER_NOW})::float8 FROM {MESSAGE}"
            f" WHERE status = %s AND available_at > {SERVER_NOW}{topic_sql}"
        )
        params: list[Any] = [PENDING, *topic_params]
    else:
        sql = f"SELECT MIN(available_at) FROM {MESSAGE} WHERE status = %s AND available_at > %s{topic_sql}"
        params = [PENDING, prep_dt(conn, now), *topic_params]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    value = row[0] if row else None
    if value is None:
        return None
    if pg:
        return max(0.0, float(value))
    if isinstance(value, str):  # SQLite returns the stored text for an aggregate
        from django.utils.dateparse import parse_datetime

        value = parse_datetime(value)
    if value is not None and settings.USE_TZ and timezone.is_naive(value):  # SQLite's text is UTC
        value = timezone.make_aware(value, dt.UTC)
    return None if value is None or now is None else max(0.0, (value - now).total_seconds())


def work_in_progress(alias: str, *, topics: Sequence[str] | None = None) -> bool:
    """Whether a worker that found nothing to claim must still wait rather than call the outbox empty:
    while a message is being processed (it may fail and come back). Messages scheduled for later, or
    held behind an earlier message of their key, do not count.
    """
    conn = connection(alias)
    topic_sql, topic_params = topic_filter(topics, escape=mysql.LIKE_ESCAPE if is_mysql(conn) else "\\")
    with conn.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {MESSAGE} WHERE status = %s{topic_sql} LIMIT 1", [PROCESSING, *topic_params])
        if cursor.fetchone() is not None:
            return True
        if is_mysql(conn):
            # A due head the claim did not get is being claimed by a peer (its two statements not committed
            # yet, so it is not "processing" to this read): wait for it, it may fail and come back.
            return mysql.due_head_exists(conn, topics, blocking_statuses())
        return False
