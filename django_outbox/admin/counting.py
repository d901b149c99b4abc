"""Counting rows of a table that may hold millions of them, without reading them all.

A plain ``COUNT(*)`` visits every matching row: on a million-row PostgreSQL table that is a sequential
scan on every admin page. Here a count stops at a cap (``COUNT(*)`` over ``LIMIT cap + 1``), which is
exact for the small sets operators usually look at (dead, pending, one topic). Past the cap PostgreSQL's
planner estimate stands in, which is free; SQLite has no such estimate and counts for real, which it
does quickly at the sizes an embedded database holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Model, QuerySet
from django.utils.functional import cached_property

#: Up to this many matching rows a count is exact.
EXACT_COUNT_CAP = 10_000


@dataclass(frozen=True, slots=True)
class Tally:
    value: int
    exact: bool

    def __str__(self) -> str:
        return f"{self.value}" if self.exact else f"~{self.value}"


def planner_estimate(queryset: QuerySet[Any]) -> int | None:
    """PostgreSQL's estimate of how many rows ``queryset`` returns (``EXPLAIN``, nothing executed)."""
    conn = connections[queryset.db]
    if conn.vendor != "postgresql":
        return None
    sql, params = queryset.order_by().query.sql_with_params()
    with conn.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        row = cursor.fetchone()
    if row is None:
        return None
    plan = json.loads(row[0]) if isinstance(row[0], str) else row[0]
    return int(plan[0]["Plan"]["Plan Rows"])


def tally(queryset: QuerySet[Any], *, cap: int = EXACT_COUNT_CAP) -> Tally:
    """How many rows ``queryset`` matches: exact up to ``cap``, estimated above it on PostgreSQL."""
    bounded = queryset.order_by().values("pk")[: cap + 1].count()
    if bounded <= cap:
        return Tally(bounded, exact=True)
    estimate = planner_estimate(queryset)
    if estimate is None:
        return Tally(queryset.order_by().count(), exact=True)
    return Tally(max(estimate, cap + 1), exact=False)


class EstimatingPaginator(Paginator):  # type: ignore[type-arg]  # generic only in the stubs
    """A paginator whose count never scans more than ``cap + 1`` rows; see ``tally``."""

    cap = EXACT_COUNT_CAP

    @cached_property
    def tally(self) -> Tally:
        object_list: Any = self.object_list
        if isinstance(object_list, QuerySet):
            return tally(object_list, cap=self.cap)
        return Tally(len(object_list), exact=True)

    @cached_property
    def count(self) -> int:
        return self.tally.value


def distinct_values(model: type[Model], column: str, *, using: str, limit: int) -> list[str]:
    """The first ``limit`` distinct values of an indexed column, by a loose index scan.

    ``SELECT DISTINCT`` reads the whole table; this recursive query jumps from one value to the next
    through the index instead, so it costs one index probe per distinct value.
    """
    table = connections[using].ops.quote_name(model._meta.db_table)
    col = connections[using].ops.quote_name(column)
    sql = f"""
        WITH RECURSIVE v(value) AS (
            SELECT (SELECT {col} FROM {table} ORDER BY {col} LIMIT 1)
            UNION ALL
            SELECT (SELECT {col} FROM {table} WHERE {col} > v.value ORDER BY {col} LIMIT 1)
            FROM v WHERE v.value IS NOT NULL
        )
        SELECT value FROM v WHERE value IS NOT NULL LIMIT %s
    """
    with connections[using].cursor() as cursor:
        cursor.execute(sql, [limit])
        return [row[0] for row in cursor.fetchall()]
