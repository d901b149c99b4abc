"""``manage.py outbox_status``: the admin overview's figures in a terminal, as text or JSON, and a health check."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_outbox.admin import overview
from django_outbox.conf import get_settings


def _threshold(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """A health check's bound: NaN would make its comparison never fire, a negative one always."""

    def parse(text: str) -> int | float:
        value = kind(text)
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number >= 0")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its "invalid ... value" message
    return parse


class Command(BaseCommand):
    help = (
        "Show the outbox backlog, lag, throughput, dead messages per topic and workers. With --fail-if-* "
        "options it exits with status 1 when the outbox is unhealthy (for health checks and monitoring)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print one JSON object (for scripts).")
        parser.add_argument("--database", help="Database alias holding the outbox (default OUTBOX['DATABASE']).")
        parser.add_argument(
            "--stale-after",
            type=_threshold(float),
            default=overview.STALE_AFTER_SECONDS,
            metavar="SECONDS",
            help="A worker not heard from for this long counts as gone (default %(default)s).",
        )
        parser.add_argument(
            "--fail-if-lag-over",
            type=_threshold(float),
            metavar="SECONDS",
            help="Exit 1 when the oldest deliverable message has waited longer than this.",
        )
        parser.add_argument("--fail-if-no-worker", action="store_true", help="Exit 1 when no worker is alive.")
        parser.add_argument(
            "--fail-if-housekeeping-failing",
            action="store_true",
            help="Exit 1 when the last housekeeping round of a live worker raised.",
        )
        parser.add_argument(
            "--fail-if-dead-over", type=_threshold(int), metavar="N", help="Exit 1 when more than N messages are dead."
        )
        parser.add_argument(
            "--fail-if-blocked-keys-over",
            type=_threshold(int),
            metavar="N",
            help="Exit 1 when more than N keys are stopped behind a dead message (apart from the lag, which"
            " leaves them out).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"] or get_settings().DATABASE
        figures = overview.collect(using, stale_after=options["stale_after"])
        problems = self._problems(figures, options)
        if options["json"]:
            self.stdout.write(json.dumps({**figures.as_json(), "healthy": not problems, "problems": problems}))
        else:
            self._print(figures)
        if problems:
            raise CommandError("unhealthy: " + "; ".join(problems), returncode=1)

    @staticmethod
    def _problems(figures: overview.Overview, options: dict[str, Any]) -> list[str]:
        problems = []
        lag_limit = options["fail_if_lag_over"]
        if lag_limit is not None and figures.lag_seconds > lag_limit:
            problems.append(f"lag {figures.lag_seconds:.1f}s is over {lag_limit:g}s")
        if options["fail_if_no_worker"] and not figures.alive_workers:
            problems.append(f"no worker has sent a heartbeat in the last {options['stale_after']:g}s")
        failing = figures.housekeeping_failing
        if options["fail_if_housekeeping_failing"] and failing:
            where = ", ".join(f"{w.worker_id} ({w.housekeeping_failures} rounds)" for w in failing)
            problems.append(f"housekeeping failing on {where}")
        dead_limit = options["fail_if_dead_over"]
        dead = figures.counts["dead"].value
        if dead_limit is not None and dead > dead_limit:
            problems.append(f"{dead} dead messages, more than {dead_limit}")
        blocked_limit = options.get("fail_if_blocked_keys_over")
        if blocked_limit is not None and len(figures.blocked_keys) > blocked_limit:
            problems.append(
                f"{len(figures.blocked_keys)} keys blocked behind a dead message, more than {blocked_limit}"
            )
        return problems

    def _print(self, figures: overview.Overview) -> None:
        write = self.stdout.write
        write("messages: " + "  ".join(f"{status} {tally}" for status, tally in figures.counts.items()))
        oldest = f" (since {figures.oldest_deliverable_at:%Y-%m-%d %H:%M:%S})" if figures.oldest_deliverable_at else ""
        write(f"lag: {figures.lag_seconds:.1f}s{oldest}")
        write(
            f"held: {figures.held_by_schedule} scheduled, {figures.held_by_key} behind an earlier message of their key"
        )
        blocked = figures.blocked_keys
        write(
            f"blocked keys: {len(blocked)}"
            + (
                " (" + ", ".join(f"{b.key} at dead message {b.dead_message_id}" for b in blocked[:5]) + ")"
                if blocked
                else ""
            )
            + (", ..." if len(blocked) > 5 else "")
        )
        write(f"last hour: {figures.delivered_last_hour} delivered, {figures.failed_last_hour} failed or abandoned")
        if figures.dead_by_topic:
            write("dead per topic:")
            for topic, n in figures.dead_by_topic:
                write(f"  {n:>8}  {topic}")
        alive = figures.alive_workers
        write(f"workers: {len(alive)} alive")
        for w in figures.workers:
            write(
                f"  {w.state:<8} {w.worker_id}  pid {w.pid}  last seen {w.last_seen:%H:%M:%S}  "
                f"in flight {w.in_flight}  delivered {w.delivered}  failed {w.failed}"
            )
            if w.housekeeping_error:
                write(f"    housekeeping failing ({w.housekeeping_failures} failed rounds): {w.housekeeping_summary}")
