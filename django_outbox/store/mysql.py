"""MariaDB and MySQL: the statements that cannot be shared with PostgreSQL or SQLite.

Measured on MariaDB 10.11 (docs/databases.md): there is no ``UPDATE ... RETURNING``; an ``UPDATE`` whose
``IN`` subquery has ``LIMIT`` is refused (error 1235); ``FOR UPDATE SKIP LOCKED`` hands two sessions
disjoint rows only when an index backs the ``ORDER BY`` (without one InnoDB locks what it scans and the
second session gets nothing). So a claim is two statements in one short transaction: the due heads are
selected in id order on the ``(status, id)`` index with ``SKIP LOCKED``, then leased by id, and the
transaction commits before anything is delivered.

``key`` is a reserved word there: every statement names it quoted (or qualified, ``c.key``).

Commit order: ids are taken at insert and rows appear at commit, so a later id of a key could commit, be
claimed and delivered before an earlier one still in flight. PostgreSQL guards that on the claim's side;
MariaDB has no transaction-scoped advisory lock (``GET_LOCK`` outlives the commit), so ``send()`` of a keyed
message first takes a row lock on that key's row in ``django_outbox_key_lock`` (the initial migration), held to
the end of the producer's transaction: a second producer of the key waits there before it takes its id,
so per key, id order is commit order.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from .db import DEAD, MESSAGE, MYSQL_NOW, PENDING, PROCESSING, decision_now, literal, mysql_server_clock, prep_dt
from .models import Message
from .rows import COLUMN_NAMES, to_messages

#: The producers' per-key lock rows (the initial migration creates the table on MariaDB/MySQL only).
KEY_LOCK = "django_outbox_key_lock"
#: Every column of the message table, quoted (``key`` is reserved).
COLUMNS = ", ".join(f"`{c}`" for c in COLUMN_NAMES)
#: MySQL's error for a duplicate entry in a unique index.
ER_DUP_ENTRY = 1062
#: The unique index on ``idempotency_key`` (the initial migration): many NULLs, one row per key.
IDEMPOTENCY_INDEX = "outbox_msg_idem_key_uniq"
#: ``LIKE``'s escape character in topic patterns (a backslash would escape the literal's closing quote).
LIKE_ESCAPE = "!"
#: The latest time a ``DateTimeField`` reads back into Python.
LAST_TIME = "CAST('9999-12-31 23:59:59.999999' AS DATETIME(6))"
#: The claim's index: ``status = 'pending'`` then id order, so SKIP LOCKED skips rather than waits.
CLAIM_INDEX = "outbox_msg_status_id_idx"


def interval(seconds: float) -> int:
    """A duration as whole microseconds, for ``+ INTERVAL %s MICROSECOND`` (both servers accept it)."""
    return round(float(seconds) * 1_000_000)


def now_sql(conn: BaseDatabaseWrapper) -> tuple[str, list[Any]]:
    """The statement's "now": the server's clock, or the host's as a parameter (``mysql_server_clock``)."""
    if mysql_server_clock(conn):
        return MYSQL_NOW, []
    return "%s", [prep_dt(conn, timezone.now())]


def _as_stored(conn: BaseDatabaseWrapper, value: dt.datetime) -> dt.datetime:
    """An aware (or, under ``USE_TZ = False``, naive local) time as a naive ``DATETIME`` value."""
    if timezone.is_aware(value):
        return timezone.make_naive(value, conn.timezone if settings.USE_TZ else timezone.get_current_timezone())
    return value


#: MariaDB's ``JSON_VALID()``, the ``CHECK`` of every JSON column there, refuses nesting of 32 levels or more.
JSON_MAX_DEPTH = 31
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def json_depth(encoded: str) -> int:
    """How deeply ``encoded`` (valid JSON) nests lists and objects; counted only past the cheap bound."""
    if encoded.count("[") + encoded.count("{") <= JSON_MAX_DEPTH:
        return 0
    depth = deepest = 0
    for char in _JSON_STRING.sub("", encoded):
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def refuse_deep_json(what: str, encoded: str, *, caller: str = "outbox.send()") -> None:
    """A clear error at send time, where the server's ``CHECK`` would raise error 4025 naming a constraint.

    ``caller`` starts the message: ``send_many()`` names the item (``outbox.send_many(): item 3``).
    """
    depth = json_depth(encoded)
    if depth > JSON_MAX_DEPTH:
        raise ValueError(
            f"{caller}: {what} nests lists and objects {depth} levels deep; MariaDB stores JSON up to "
            f"{JSON_MAX_DEPTH} levels (docs/databases.md)."
        )


#: Takes a key's lock row and holds it to the end of the transaction (see the module's docstring):
#: ``ON DUPLICATE KEY UPDATE`` of a row to its own value takes the row's exclusive lock without an error,
#: whether the row was there or not; a second producer of the key waits for the first to end.
LOCK_KEY_SQL = f"INSERT INTO {KEY_LOCK} (`key`) VALUES (%s) ON DUPLICATE KEY UPDATE `key` = `key`"


#: What a message's times are in its ``INSERT``, and what comes back with its id, by how it is scheduled:
#: ``host``, both the sender's (MySQL, or a connection whose stored times are not UTC); on MariaDB and
#: the server's clock, ``given`` (due at the time the sender gave), ``now`` (due when created: one
#: ``UTC_TIMESTAMP(6)`` per statement) and ``delay`` (due the delay after it, the interval capped at the
#: latest time a DateTimeField reads back, as on PostgreSQL: a sum past year 9999 is an error in strict
#: mode, 1441, not a NULL to COALESCE). Only the times the server computed come back.
INSERT_TIMES = {
    "host": ("%s, %s", ""),
    "given": (f"%s, {MYSQL_NOW}", "id, created_at"),
    "now": (f"{MYSQL_NOW}, {MYSQL_NOW}", "id, created_at"),
    "delay": (
        f"{MYSQL_NOW} + INTERVAL LEAST(%s, TIMESTAMPDIFF(MICROSECOND, {MYSQL_NOW}, {LAST_TIME})) MICROSECOND,"
        f" {MYSQL_NOW}",
        "id, created_at, available_at",
    ),
}


@functools.cache
def insert_sql(shape: tuple[bool, bool, bool, str]) -> str:
    """One message's ``INSERT`` for ``shape`` (keyed, idempotent, with headers, ``INSERT_TIMES`` key).

    What a message of the shape lacks (key, idempotency key, headers) is written into the text rather than
    bound: each bound value is one more literal for the driver to quote, as on PostgreSQL.
    """
    keyed, idempotent, headers, schedule = shape
    times, returning = INSERT_TIMES[schedule]
    key = "%s" if keyed else "NULL"
    header_values = "%s" if headers else "'{}'"
    idempotency_key = "%s" if idempotent else "NULL"
    sql = (
        f"INSERT INTO {MESSAGE} (uuid, topic, `key`, payload, headers, idempotency_key, status, attempts,"
        f" max_attempts, available_at, created_at, last_error)"
        f" VALUES (%s, %s, {key}, %s, {header_values}, {idempotency_key}, '{PENDING}', 0, %s, {times}, '')"
    )
    return f"{sql} RETURNING {returning}" if returning else sql


#: The most text one statement of a batch carries when the server's ``max_allowed_packet`` allows it:
#: larger statements write no faster, and hold the server's parser and the driver's buffer longer.
BATCH_BYTES = 4 * 1024 * 1024
#: A batch smaller than this is written without asking the server's ``max_allowed_packet`` (1 MiB at least
#: on any server with ``SKIP LOCKED``).
_SMALL_BATCH_BYTES = 512 * 1024


def text_bytes(*values: str | None) -> int:
    """Bytes ``values`` take in a statement at most: escaping can double each (a JSON text's quotes)."""
    total = 0
    for value in values:
        if value is not None:
            total += 2 * (len(value) if value.isascii() else len(value.encode()))
    return total


def batch_chunks(conn: BaseDatabaseWrapper, sizes: list[int]) -> list[tuple[int, int]]:
    """``sizes`` (each row's bytes) cut into ``(start, stop)`` runs that fit one statement each.

    A row larger than a statement's budget goes alone: the server then refuses it as it would refuse the
    same message from ``send()``, naming ``max_allowed_packet``.
    """
    budget = BATCH_BYTES
    if sum(sizes) > _SMALL_BATCH_BYTES:
        with conn.cursor() as cursor:
            cursor.execute("SELECT @@max_allowed_packet")
            budget = max(_SMALL_BATCH_BYTES, min(BATCH_BYTES, int(cursor.fetchone()[0]) // 2))
    chunks: list[tuple[int, int]] = []
    start = size = 0
    for index, row in enumerate(sizes):
        if index > start and size + row > budget:
            chunks.append((start, index))
            start, size = index, 0
        size += row
    if start < len(sizes):
        chunks.append((start, len(sizes)))
    return chunks


def lock_keys(conn: BaseDatabaseWrapper, keys: list[str]) -> None:
    """Hold the lock rows of ``keys`` (sorted by the caller) to the end of the transaction, one statement
    per chunk: InnoDB takes a multi-row ``INSERT``'s row locks in the order of its rows, so two batches
    sharing keys take them in one order and never wait on each other in a cycle."""
    with conn.cursor() as cursor:
        for start, stop in batch_chunks(conn, [text_bytes(key) + 8 for key in keys]):
            chunk = keys[start:stop]
            cursor.execute(
                f"INSERT INTO {KEY_LOCK} (`key`) VALUES {', '.join(['(%s)'] * len(chunk))}"
                " ON DUPLICATE KEY UPDATE `key` = `key`",
                chunk,
            )


class IdempotencyKeyTaken(Exception):
    """A row of a batch was refused by the unique index on ``idempotency_key``: a concurrent producer
    committed the key after the batch looked for its holders."""


def insert_rows(cursor: Any, rows: list[str], params: list[Any]) -> list[tuple[Any, ...]]:
    """Write several messages in one ``INSERT ... RETURNING id, uuid`` (MariaDB), ids in the rows' order.

    ``rows`` are the rows' ``VALUES`` tuples (the columns of ``insert_sql()``'s statement) and ``params``
    every value they bind, in turn. A taken idempotency key fails the statement whole, as it should:
    raised as ``IdempotencyKeyTaken`` for the caller to look the holders up and write the rest again.
    """
    sql = (
        f"INSERT INTO {MESSAGE} (uuid, topic, `key`, payload, headers, idempotency_key, status, attempts,"
        f" max_attempts, available_at, created_at, last_error) VALUES {', '.join(rows)} RETURNING id, uuid"
    )
    try:
        cursor.execute(sql, params)
    except IntegrityError as exc:
        cause = exc.__cause__
        code = cause.args[0] if cause is not None and cause.args else None
        if code == ER_DUP_ENTRY and IDEMPOTENCY_INDEX in str(cause):
            raise IdempotencyKeyTaken from exc
        raise
    return list(cursor.cursor.fetchall())  # the driver's own cursor: already in memory, nothing to translate


def insert_row(cursor: Any, sql: str, params: list[Any], *, returning: bool) -> tuple[Any, ...] | None:
    """Write one message with ``insert_sql()``'s statement; None when its idempotency key is taken.

    A duplicate key is refused by the unique index: MySQL undoes that statement only, so the caller's
    transaction goes on. (``INSERT IGNORE`` would also turn a too-long value or a bad date into a warning
    and a truncated row; ``ON DUPLICATE KEY UPDATE`` cannot tell "inserted" from "was there" under the
    ``CLIENT.FOUND_ROWS`` flag Django sets.) Any other integrity error is raised.
    """
    try:
        cursor.execute(sql, params)
    except IntegrityError as exc:
        cause = exc.__cause__
        code = cause.args[0] if cause is not None and cause.args else None
        if code == ER_DUP_ENTRY and IDEMPOTENCY_INDEX in str(cause):
            return None
        raise
    if returning:  # the driver's own cursor: the row is already in memory, no error to translate
        row: tuple[Any, ...] = cursor.cursor.fetchone()
        return row
    return (cursor.lastrowid,)


def stored_by_idempotency_key(conn: BaseDatabaseWrapper, key: str) -> tuple[Any, ...] | None:
    rows = stored_by_idempotency_keys(conn, [key])
    return rows[0] if rows else None


def stored_by_idempotency_keys(conn: BaseDatabaseWrapper, keys: list[str]) -> list[tuple[Any, ...]]:
    """The holders of ``keys``, as last committed: read after the unique index refused a row for one.

    A locking read, because a plain one reads the transaction's snapshot: under REPEATABLE READ (the
    server's default isolation, Django's when configured so) a holder committed after the transaction's
    first read refuses the row yet is not in that snapshot, and the write failed as if the key kept being
    freed. The shared lock also keeps the holder from being archived until the transaction ends.
    """
    with conn.cursor() as cursor:
        cursor.execute(
            f"SELECT {COLUMNS} FROM {MESSAGE} WHERE idempotency_key IN ({', '.join(['%s'] * len(keys))})"
            " LOCK IN SHARE MODE",
            keys,
        )
        return list(cursor.fetchall())


def claim(
    alias: str,
    conn: BaseDatabaseWrapper,
    *,
    worker: str,
    limit: int,
    lease_seconds: float,
    topic_sql: str,
    topic_params: list[Any],
    blocking: tuple[str, ...],
    attempts_max: int,
) -> list[Message]:
    """Select the due heads with ``SKIP LOCKED``, lease them by id, commit: one short transaction.

    The first statement also reads the server's clock, from which the lease's end is computed, so the
    second needs nothing back and no third statement reads the rows again.
    """
    server_clock = mysql_server_clock(conn)
    if server_clock:
        now, now_params, clock = MYSQL_NOW, [], f", {MYSQL_NOW}"
    else:  # the host's clock, as on SQLite
        host_now = timezone.now()
        now, now_params, clock = "%s", [prep_dt(conn, host_now)], ""
    head = f"NOT {_open_before('c', blocking)}"
    select = (
        f"SELECT {', '.join('c.' + c for c in COLUMN_NAMES)}{clock} FROM {MESSAGE} AS c"
        f" FORCE INDEX ({CLAIM_INDEX}) WHERE c.status = {literal(PENDING)} AND c.available_at <= {now}{topic_sql}"
        f" AND (c.key IS NULL OR {head}) ORDER BY c.id LIMIT %s FOR UPDATE SKIP LOCKED"
    )
    return _lease(
        alias,
        conn,
        select,
        [*now_params, *topic_params, limit],
        None,
        worker=worker,
        lease=lease_seconds,
        host_now=None if server_clock else host_now,
        attempts_max=attempts_max,
    )


def _open_before(outer: str, blocking: tuple[str, ...]) -> str:
    """An earlier open message of ``outer``'s key, read off the open keys' index (not the key's history)."""
    return (
        f"EXISTS (SELECT 1 FROM {MESSAGE} AS b FORCE INDEX ({CLAIM_KEY_INDEX})"
        f" WHERE b.{CLAIM_KEY_COLUMN} = {outer}.key"
        f" AND b.id < {outer}.id AND b.status IN ({', '.join(map(literal, blocking))}))"
    )


def _keys_sql(bound: int) -> str:
    """The open keys after the worker's cursor, then from the first up to it (the walk wraps round), at
    most ``bound`` of each, with each key's first open message: a loose index scan of the claim's index
    (``GROUP BY`` on it jumps from one key to the next, one probe per key whatever its backlog), the
    claim's ``keys`` on PostgreSQL and SQLite. A recursive probe of the next key, as there, read the
    index's NULL entries (every finished message's) from the start on each step."""
    col, bound = CLAIM_KEY_COLUMN, int(bound)
    return (
        f"(SELECT {col}, MIN(id) FROM {MESSAGE} WHERE {col} > %s GROUP BY {col} ORDER BY {col} LIMIT {bound})"
        f" UNION ALL (SELECT {col}, MIN(id) FROM {MESSAGE} WHERE {col} > {UNKEYED} AND {col} <= %s"
        f" GROUP BY {col} ORDER BY {col} LIMIT {bound})"
    )


def claim_runs(
    alias: str,
    conn: BaseDatabaseWrapper,
    *,
    worker: str,
    limit: int,
    lease_seconds: float,
    topics: Any,
    blocking: tuple[str, ...],
    attempts_max: int,
    cap: int,
    after_key: str,
    bound: int,
) -> list[Message]:
    """The claim of any due message with keys in runs: the claim of PostgreSQL and SQLite in statements
    MariaDB takes (no ``UPDATE ... RETURNING``, no ``LATERAL``, no ``LIMIT`` in an ``IN`` subquery).

    Read without locks, in autocommit, off the claim's index (``CLAIM_KEY_COLUMN``): the open keys
    (``_keys_sql``); then, in one statement, each key's first open messages (``cap`` of them, fewer when
    many keys share the batch: a batch takes the oldest of them), the unkeyed pending messages in id order
    and, when the keys outnumber a batch, the heads of the others found by the walk of the pending rows, as
    the claim without runs does. A key's run is its messages from its head while they are pending, due and
    of the worker's topics. The oldest ``limit`` candidates are then locked by primary key (``SKIP
    LOCKED``, the due test asked again of the row as last committed), a key's messages kept only as far as
    each one before them was locked, leased, and committed: one short transaction, and no two workers hold
    parts of a key's run.
    """
    from .db import topic_filter

    server_clock = mysql_server_clock(conn)
    if server_clock:
        now, now_params, clock = MYSQL_NOW, [], f", {MYSQL_NOW}"
    else:  # the host's clock, as on SQLite
        host_now = timezone.now()
        now, now_params, clock = "%s", [prep_dt(conn, host_now)], ""
    col, index, limit = CLAIM_KEY_COLUMN, CLAIM_KEY_INDEX, int(limit)
    c_topics, c_params = topic_filter(topics, column="c.topic", escape=LIKE_ESCAPE)
    with conn.cursor() as cursor:
        cursor.execute(_keys_sql(bound), [after_key, after_key])
        keys = [(str(row[0]), int(row[1])) for row in cursor.fetchall()][:bound]
    if not keys:  # no key is open: the unkeyed messages, walked and locked in one statement
        return _lease(
            alias,
            conn,
            f"SELECT {', '.join('c.' + c for c in COLUMN_NAMES)}{clock} FROM {MESSAGE} AS c"
            f" FORCE INDEX ({index}) WHERE c.{col} = {UNKEYED} AND c.available_at <= {now}{c_topics}"
            f" ORDER BY c.id LIMIT {limit} FOR UPDATE SKIP LOCKED",
            [*now_params, *c_params],
            None,
            worker=worker,
            lease=lease_seconds,
            host_now=None if server_clock else host_now,
            attempts_max=attempts_max,
        )
    with conn.cursor() as cursor:
        parts: list[str] = []
        params: list[Any] = []
        heads: dict[int, str] = {}
        if len(keys) > limit // HEADS_ONLY_SHARE and set(blocking) == set(OPEN_STATUSES):
            # Many keys: a batch is their heads (the oldest of them), which the scan read off the index;
            # the lock below asks each whether it can be claimed. Reading runs too cost a statement part
            # per key, and the batch would take only the oldest message or two of each.
            heads = {head: key for key, head in keys}
        elif keys:
            b_topics, b_params = topic_filter(topics, column="b.topic", escape=LIKE_ESCAPE)
            # The first key from the cursor gets a whole run (the batch goes to it first, so a second
            # worker finds the next keys free); the others up to twice their share of the batch.
            share = max(1, min(int(cap), -(-2 * limit // len(keys))))
            for rank, (key, _) in enumerate(keys):
                parts.append(
                    f"(SELECT b.id, b.{col}, b.status = {literal(PENDING)} AND b.available_at <= {now}{b_topics}"
                    f" FROM {MESSAGE} AS b FORCE INDEX ({index}) WHERE b.{col} = %s"
                    f" AND b.status IN ({', '.join(map(literal, blocking))}) ORDER BY b.id"
                    f" LIMIT {int(cap) if rank == 0 else share})"
                )
                params += [*now_params, *b_params, key]
        due = f"c.available_at <= {now}{c_topics}"
        parts.append(
            f"(SELECT c.id, NULL, 1 FROM {MESSAGE} AS c FORCE INDEX ({index}) WHERE c.{col} = {UNKEYED} AND {due}"
            f" ORDER BY c.id LIMIT {limit})"
        )
        params += [*now_params, *c_params]
        if len(keys) >= bound:  # more keys are open than the scan visits: the oldest heads, as without runs
            parts.append(
                f"(SELECT c.id, c.key, 2 FROM {MESSAGE} AS c FORCE INDEX ({CLAIM_INDEX})"
                f" WHERE c.status = {literal(PENDING)} AND {due} AND c.key IS NOT NULL"
                f" AND NOT {_open_before('c', blocking)} ORDER BY c.id LIMIT {limit})"
            )
            params += [*now_params, *c_params]
        cursor.execute(" UNION ALL ".join(parts), params)
        rows = cursor.fetchall()
    # The keyed candidates, key by key from the cursor (a key's run in id order, kept while each message can
    # be claimed), then the heads, oldest first; the batch is the oldest of them and of the unkeyed ones.
    runs: dict[str, list[int]] = {key: [] for key, _ in keys}
    stopped: set[str] = set()
    unkeyed: list[int] = []
    others: list[tuple[int, str]] = sorted(heads.items())
    for message_id, row_key, ok in sorted(rows, key=lambda row: int(row[0])):
        if row_key is None:
            unkeyed.append(int(message_id))
        elif ok == 2:  # a head found by the walk of the pending rows
            others.append((int(message_id), str(row_key)))
        elif row_key not in stopped:
            if ok:
                runs[str(row_key)].append(int(message_id))
            else:
                stopped.add(str(row_key))
    candidates: dict[int, str | None] = {}
    for key, run in runs.items():
        candidates.update((message_id, key) for message_id in run[: max(0, limit - len(candidates))])
    for message_id, key in sorted(others):
        if len(candidates) >= limit:
            break
        candidates.setdefault(message_id, key)
    candidates.update((message_id, None) for message_id in unkeyed)
    picked = sorted(candidates)[:limit]
    if not picked:
        return []
    return _lease(
        alias,
        conn,
        f"SELECT {', '.join('c.' + c for c in COLUMN_NAMES)}{clock} FROM {MESSAGE} AS c"
        f" WHERE c.id IN ({', '.join(['%s'] * len(picked))}) AND c.status = {literal(PENDING)}"
        f" AND c.available_at <= {now}{c_topics} FOR UPDATE SKIP LOCKED",
        [*picked, *now_params, *c_params],
        [(message_id, candidates[message_id]) for message_id in picked],
        worker=worker,
        lease=lease_seconds,
        host_now=None if server_clock else host_now,
        attempts_max=attempts_max,
    )


def _lease(
    alias: str,
    conn: BaseDatabaseWrapper,
    select: str,
    params: list[Any],
    picked: list[tuple[int, str | None]] | None,
    *,
    worker: str,
    lease: float,
    host_now: dt.datetime | None,
    attempts_max: int,
) -> list[Message]:
    """Lock the rows ``select`` reads (``FOR UPDATE SKIP LOCKED``, the server's clock last unless
    ``host_now``), lease them by id and commit: the claim's one short transaction.

    ``picked``: the candidates in id order with their keys; a key's messages are kept only as far as each
    one before them was locked. None: every row locked is kept.
    """
    status_at = COLUMN_NAMES.index("status")
    attempts_at = COLUMN_NAMES.index("attempts")
    locked_by_at = COLUMN_NAMES.index("locked_by")
    locked_until_at = COLUMN_NAMES.index("locked_until")
    with transaction.atomic(using=alias), conn.cursor() as cursor:
        cursor.execute(select, params)
        rows = [list(r) for r in cursor.fetchall()]
        if picked is None:
            kept = rows
        else:
            locked = {int(r[0]): r for r in rows}
            kept = []
            broken: set[str] = set()
            for message_id, of_key in picked:  # in id order: a key's messages after one not locked are not kept
                row = locked.get(message_id)
                if of_key is not None and (of_key in broken or row is None):
                    broken.add(of_key)
                    continue
                if row is not None:
                    kept.append(row)
        if not kept:
            return []
        # The lease's end as the column holds it: naive, UTC on the server's clock (or the host's time in
        # the connection's zone), read back through Django's converters like any stored value.
        span = dt.timedelta(seconds=lease)
        until = kept[0][-1] + span if host_now is None else _as_stored(conn, host_now + span)
        ids = [r[0] for r in kept]
        cursor.execute(
            f"UPDATE {MESSAGE} SET status = {literal(PROCESSING)}, locked_by = %s, locked_until = %s,"
            f" attempts = CASE WHEN attempts < {attempts_max} THEN attempts + 1 ELSE attempts END"
            f" WHERE id IN ({', '.join(['%s'] * len(ids))})",
            [worker, until, *ids],
        )
    for r in kept:
        if host_now is None:
            del r[-1]
        r[status_at] = PROCESSING
        r[attempts_at] = r[attempts_at] + 1 if r[attempts_at] < attempts_max else r[attempts_at]
        r[locked_by_at] = worker
        r[locked_until_at] = until
    return to_messages(alias, conn, kept)


def due_head_exists(conn: BaseDatabaseWrapper, topics: Any, blocking: tuple[str, ...]) -> bool:
    """A due pending message at the head of its key (or keyless), read without locking."""
    from .db import topic_filter

    topic_sql, topic_params = topic_filter(topics, column="c.topic", escape=LIKE_ESCAPE)
    now, now_params = now_sql(conn)
    with conn.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {MESSAGE} AS c WHERE c.status = {literal(PENDING)} AND c.available_at <= {now}{topic_sql}"
            f" AND (c.key IS NULL OR NOT {_open_before('c', blocking)}) LIMIT 1",
            [*now_params, *topic_params],
        )
        return cursor.fetchone() is not None


def next_due_seconds(conn: BaseDatabaseWrapper, topic_sql: str, topic_params: list[Any]) -> float | None:
    """Seconds until the earliest future ``available_at`` of a pending message, on the server's clock."""
    now, now_params = now_sql(conn)
    with conn.cursor() as cursor:
        cursor.execute(
            f"SELECT TIMESTAMPDIFF(MICROSECOND, {now}, MIN(available_at)) FROM {MESSAGE}"
            f" WHERE status = %s AND available_at > {now}{topic_sql}",
            [*now_params, PENDING, *now_params, *topic_params],
        )
        row = cursor.fetchone()
    if row is None or row[0] is None:
        return None
    return max(0.0, int(row[0]) / 1_000_000)


#: ``locked_by``: non-NULL only on the rows in flight (every change away from ``processing`` clears it).
LEASE_INDEX = "outbox_msg_lease_idx"


def extend_leases(conn: BaseDatabaseWrapper, *, worker: str, lease_seconds: float) -> int:
    """The heartbeat: this worker's leases, found on the lease index. On the ``(status, id)`` index the
    planner preferred, the ``UPDATE`` read every worker's rows in flight to find its own."""
    now, now_params = now_sql(conn)
    with conn.cursor() as cursor:
        cursor.execute(
            f"UPDATE {MESSAGE} FORCE INDEX ({LEASE_INDEX}) SET locked_until = {now} + INTERVAL %s MICROSECOND"
            f" WHERE locked_by = %s AND status = %s",
            [*now_params, interval(lease_seconds), worker, PROCESSING],
        )
        return int(cursor.rowcount)


def reap_candidates(conn: BaseDatabaseWrapper, limit: int) -> tuple[dt.datetime, list[tuple[Any, ...]]]:
    """Within the reaper's transaction: expired leases, locked (``SKIP LOCKED``: reapers share them out),
    and the server's now the reaper records them at."""
    now = decision_now(conn)
    with conn.cursor() as cursor:
        cursor.execute(
            f"SELECT id, attempts, max_attempts, locked_by, locked_until FROM {MESSAGE} FORCE INDEX ({CLAIM_INDEX})"
            f" WHERE status = %s AND locked_until < %s ORDER BY status, id LIMIT %s FOR UPDATE SKIP LOCKED",
            [PROCESSING, prep_dt(conn, now), limit],
        )
        return now, list(cursor.fetchall())


def heartbeat_sql(started: str, seen: str, stopped: str) -> str:
    from .db import WORKER

    return (
        f"INSERT INTO {WORKER} (worker_id, hostname, pid, started_at, last_seen, in_flight, delivered, failed,"
        f" stopped_at, housekeeping_failures, housekeeping_error)"
        f" VALUES (%s, %s, %s, {started}, {seen}, %s, %s, %s, {stopped}, %s, %s)"
        f" ON DUPLICATE KEY UPDATE last_seen = VALUES(last_seen), in_flight = VALUES(in_flight),"
        f" delivered = VALUES(delivered), failed = VALUES(failed), stopped_at = VALUES(stopped_at),"
        f" housekeeping_failures = VALUES(housekeeping_failures), housekeeping_error = VALUES(housekeeping_error)"
    )


#: The first servers with ``SKIP LOCKED``.
MARIADB_MIN = (10, 6)
MYSQL_MIN = (8, 0, 1)


def server_facts(conn: BaseDatabaseWrapper) -> dict[str, Any]:
    """What the system checks judge (one query): version, binary log, isolation, the outbox's indexes."""
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT @@version, @@log_bin, @@binlog_format, @@transaction_isolation"
            if not conn.mysql_is_mariadb  # type: ignore[attr-defined]
            else "SELECT @@version, @@log_bin, @@binlog_format, @@tx_isolation"
        )
        version, log_bin, binlog_format, isolation = cursor.fetchone()
        cursor.execute(
            "SELECT index_name, GROUP_CONCAT(column_name ORDER BY seq_in_index) FROM information_schema.statistics"
            " WHERE table_schema = DATABASE() AND table_name = %s GROUP BY index_name",
            [MESSAGE],
        )
        indexes = {str(name): str(columns) for name, columns in cursor.fetchall()}
        cursor.execute(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = %s",
            [KEY_LOCK],
        )
        key_lock = bool(cursor.fetchone()[0])
    return {
        "version": str(version),
        "mariadb": bool(conn.mysql_is_mariadb),  # type: ignore[attr-defined]
        "version_tuple": tuple(conn.mysql_version),  # type: ignore[attr-defined]
        "log_bin": bool(int(log_bin)),
        "binlog_format": str(binlog_format).upper(),
        "isolation": str(isolation).upper().replace("_", "-"),
        "indexes": indexes,
        "key_lock": key_lock,
    }


#: The generated column the claim finds messages on, and its index (migration
#: ``0003_mysql_claim_key_index``): the key while a keyed message is open (``OPEN_STATUSES``), ``''``
#: while an unkeyed message is pending (``send()`` refuses an empty key), NULL otherwise. It is on
#: MariaDB/MySQL what two partial indexes are on PostgreSQL and SQLite, ``outbox_msg_key_open_idx`` and
#: ``outbox_msg_unkeyed_idx``; finished messages, the table's history, are NULL in it.
CLAIM_KEY_COLUMN = "claim_key"
#: More open keys than a batch's share of this, and a claim takes their heads only (``claim_runs``).
HEADS_ONLY_SHARE = 4
CLAIM_KEY_INDEX = "outbox_msg_claim_key_idx"
#: Its value for a pending unkeyed message.
UNKEYED = "''"


def claim_key_column_sql(conn: BaseDatabaseWrapper) -> str:
    """The column's definition: the key's type and bytewise collation (the initial migration's), computed
    by the server and stored. Stored, not virtual: beside an indexed virtual column MariaDB can neither add
    a column instantly nor rebuild the table without blocking writes, which every later release's
    expand step needs."""
    collation = "utf8mb4_nopad_bin" if conn.mysql_is_mariadb else "utf8mb4_0900_bin"  # type: ignore[attr-defined]
    statuses = ", ".join(map(literal, OPEN_STATUSES))
    return (
        f"{CLAIM_KEY_COLUMN} varchar(200) CHARACTER SET utf8mb4 COLLATE {collation} AS (IF(`key` IS NULL,"
        f" IF(status = {literal(PENDING)}, {UNKEYED}, NULL), IF(status IN ({statuses}), `key`, NULL))) STORED"
    )


#: The statuses that keep a key's lock row (``outbox_msg_key_open_idx``'s): a message still to deliver,
#: being delivered, or dead and holding its key back.
OPEN_STATUSES = (PENDING, PROCESSING, DEAD)


def prune_key_locks(conn: BaseDatabaseWrapper, *, after: str | None, limit: int) -> tuple[int, str | None]:
    """Delete up to ``limit`` lock rows (keys past ``after``, in key order) whose key has no open message.

    Returns how many were deleted and the last key looked at (None when the table's end was reached).
    A lock row exists only to serialise producers of one key; deleting one never weakens that (a producer
    finding no row inserts it, and two such producers serialise on the primary key's entry, as on the
    row). What must not happen is housekeeping waiting on a producer, or a producer on housekeeping for
    longer than a few statements. So: candidates are read without locks; then, in one short transaction,
    the candidates are locked with ``SKIP LOCKED`` (a row a producer holds, whose message is not committed
    yet, is skipped, never waited for), checked again under that lock (a message committed since the
    first read keeps its key: no producer can be inside ``send()`` for a key whose row this transaction
    holds, so what the check reads is the whole truth), and deleted. A producer that comes to a row while
    it is locked here waits for this transaction's few statements, then inserts the row afresh. This
    transaction takes each lock in one statement and then waits for nothing, so it can be in no deadlock.
    """
    statuses = ", ".join(map(literal, OPEN_STATUSES))
    where_after, params = ("AND kl.`key` > %s ", [after]) if after is not None else ("", [])
    with conn.cursor() as cursor:
        cursor.execute(
            f"SELECT kl.`key` FROM {KEY_LOCK} AS kl WHERE NOT EXISTS (SELECT 1 FROM {MESSAGE} AS m"
            f" WHERE m.`key` = kl.`key` AND m.status IN ({statuses})) {where_after}ORDER BY kl.`key` LIMIT %s",
            [*params, limit],
        )
        candidates = [row[0] for row in cursor.fetchall()]
    if not candidates:
        return 0, None
    last = candidates[-1] if len(candidates) == limit else None
    marks = ", ".join(["%s"] * len(candidates))
    with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
        cursor.execute(
            f"SELECT `key` FROM {KEY_LOCK} WHERE `key` IN ({marks}) ORDER BY `key` FOR UPDATE SKIP LOCKED",
            candidates,
        )
        locked = [row[0] for row in cursor.fetchall()]
        if locked:
            marks = ", ".join(["%s"] * len(locked))
            cursor.execute(
                f"SELECT DISTINCT `key` FROM {MESSAGE} WHERE `key` IN ({marks}) AND status IN ({statuses})", locked
            )
            still_open = {row[0] for row in cursor.fetchall()}
            idle = [key for key in locked if key not in still_open]
        else:
            idle = []
        deleted = _delete_key_locks(conn, cursor, idle)
    return deleted, last


def _delete_key_locks(conn: BaseDatabaseWrapper, cursor: Any, keys: list[str]) -> int:
    """The last statement of the prune's transaction, on rows it already holds (a seam for the tests
    that hold the transaction open here, with its locks, to race producers against it)."""
    if not keys:
        return 0
    cursor.execute(f"DELETE FROM {KEY_LOCK} WHERE `key` IN ({', '.join(['%s'] * len(keys))})", keys)
    return int(cursor.rowcount)
