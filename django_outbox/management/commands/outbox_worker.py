"""``manage.py outbox_worker``: parse options, build the relay, run it until stopped."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_outbox.conf import EAGER_WORKER, bounded, get_settings
from django_outbox.worker import Counts, Relay, RelayConfig


def _setting(name: str, kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse type for an option that overrides ``OUTBOX[name]``: the same bounds as ``check``'s."""

    def parse(text: str) -> int | float:
        try:
            return bounded(name, kind(text))
        except ValueError as exc:
            message = str(exc) if str(exc).startswith("OUTBOX[") else f"{text!r} is not {kind.__name__}"
            raise argparse.ArgumentTypeError(message.replace(f"OUTBOX[{name!r}]", "the value")) from exc

    parse.__name__ = name.lower()
    return parse


def _port(text: str) -> int:
    """``--metrics-port``: 0 lets the system choose (the port is printed), else 1 to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (1 to 65535, or 0 for any free port)")
    return port


def _address(text: str) -> str:
    from django_outbox.observability.labels import check_address

    try:
        return check_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class Command(BaseCommand):
    help = "Relay outbox messages to their destinations until stopped (SIGTERM/SIGINT stop gracefully)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--until-empty",
            action="store_true",
            help="Exit once nothing can be claimed now and nothing is being processed.",
        )
        parser.add_argument(
            "--batch-size", type=_setting("BATCH_SIZE", int), help="Messages claimed per batch (default 100)."
        )
        parser.add_argument(
            "--concurrency",
            type=_setting("CONCURRENCY", int),
            help="Delivery threads (default OUTBOX['CONCURRENCY']: 2 on PostgreSQL and MariaDB/MySQL, 1 on SQLite).",
        )
        parser.add_argument(
            "--topics",
            nargs="+",
            metavar="TOPIC",
            help="Only relay these topics; shell patterns such as 'orders.*' allowed.",
        )
        parser.add_argument(
            "--lease",
            type=_setting("LEASE_SECONDS", float),
            metavar="SECONDS",
            help="How long a claim is held before another worker may take it over.",
        )
        parser.add_argument(
            "--poll-interval",
            type=_setting("POLL_INTERVAL_SECONDS", float),
            metavar="SECONDS",
            help="Longest sleep between looks at the table when no wake-up arrives.",
        )
        parser.add_argument(
            "--handler-timeout",
            type=_setting("HANDLER_TIMEOUT_SECONDS", float),
            metavar="SECONDS",
            help="Give up on a delivery call after this long (default OUTBOX['HANDLER_TIMEOUT_SECONDS']: no limit).",
        )
        parser.add_argument("--database", help="Database alias holding the outbox (default OUTBOX['DATABASE']).")
        parser.add_argument(
            "--metrics-port",
            type=_port,
            metavar="PORT",
            help="Serve Prometheus metrics on http://ADDR:PORT/metrics (needs the [prometheus] extra).",
        )
        parser.add_argument(
            "--metrics-addr",
            type=_address,
            metavar="ADDR",
            help="The address --metrics-port listens on (default 127.0.0.1; 0.0.0.0 for every interface).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self._warn_if_eager()
        config = RelayConfig.from_settings(
            database=options["database"],
            batch_size=options["batch_size"],
            concurrency=options["concurrency"],
            topics=tuple(options["topics"] or ()),
            lease_seconds=options["lease"],
            poll_interval=options["poll_interval"],
            until_empty=options["until_empty"] or None,
            handler_timeout=options["handler_timeout"],
        )
        self._refuse_a_server_it_cannot_rely_on(config.database)
        metrics = self._metrics_server(config, options)
        observers = [*self._tracers(), *([metrics.observer] if metrics else [])]
        relay = Relay(config, observers=observers)
        previous = self._install_signal_handlers(relay)
        try:
            if not self._wait_for_migrations(relay, config):
                return  # stopped while it waited
            if metrics is not None and metrics.requested_port is not None:
                self._serve_metrics(metrics, options["verbosity"])
            self._run(relay, config, options["verbosity"])
        finally:
            if metrics is not None:
                metrics.stop()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    @staticmethod
    def _tracers() -> list[Any]:
        """The delivery spans, when opentelemetry-api is installed (docs/operating.md#tracing)."""
        from django_outbox.observability import delivery

        return list(delivery.tracers())

    @staticmethod
    def _metrics_server(config: RelayConfig, options: dict[str, Any]) -> Any:
        """The metrics: served with ``--metrics-port``; counted without it in prometheus-client's
        multiprocess mode, where the worker that serves reads every worker's counts."""
        port = options["metrics_port"]
        if port is None and options["metrics_addr"] is not None:
            raise CommandError("--metrics-addr needs --metrics-port")
        if port is None and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            return None
        try:
            from django_outbox.observability.metrics import MetricsServer
        except ImportError as exc:
            if port is None:
                return None  # multiprocess mode asked for by the environment, but nothing to count with
            raise CommandError(
                f"--metrics-port needs prometheus-client ({exc}): pip install 'django-transactional-outbox[prometheus]'"
            ) from exc
        return MetricsServer(config.database, addr=options["metrics_addr"] or "127.0.0.1", port=port)

    def _serve_metrics(self, metrics: Any, verbosity: int) -> None:
        try:
            metrics.start()
        except OSError as exc:
            raise CommandError(
                f"cannot serve metrics on {metrics.addr} port {metrics.requested_port}: {exc.strerror or exc}"
                " (another process may use the port; give each worker its own, see docs/operating.md)"
            ) from exc
        where = f"http://{metrics.addr}:{metrics.port}/metrics"
        logging.getLogger("django_outbox.relay").info("serving metrics on %s", where)
        if verbosity >= 1:
            self.stdout.write(f"metrics on {where}")

    def _refuse_a_server_it_cannot_rely_on(self, alias: str) -> None:
        """MariaDB/MySQL: the database checks (E110-E115) for the worker's own database, before it starts.

        Django's commands run only the checks that need no database; under one of these findings a
        worker delivered without ever showing up alive (``EMPTY_STRING_IS_NULL``: its heartbeat could not
        be written), or claimed what it should not. One query; other databases have no such check.
        """
        from django.db import connections

        from django_outbox.checks import mysql_findings

        if connections[alias].vendor != "mysql":
            return
        errors = [e for e in mysql_findings(alias) if e.is_serious() and e.id not in settings.SILENCED_SYSTEM_CHECKS]
        if errors:
            raise CommandError("\n".join(f"{e.id}: {e.msg}\n\tHINT: {e.hint}" for e in errors))

    def _warn_if_eager(self) -> None:
        """Say loudly that ``OUTBOX["EAGER"]`` is on: test settings where a worker runs.

        A warning, not a refusal: a worker beside eager sends is safe (both claim through the same
        leased statement, so nothing is delivered twice) and a test suite may start one on purpose, to
        deliver what eager delivery leaves waiting (retries, scheduled messages). What the setting costs
        in production is every request that sends waiting for the deliveries, so it must not go unseen.
        """
        if not get_settings().EAGER or EAGER_WORKER in settings.SILENCED_SYSTEM_CHECKS:
            return
        logging.getLogger("django_outbox.relay").warning(
            "OUTBOX['EAGER'] is on in a worker's settings (%s): it is meant for tests", EAGER_WORKER
        )
        self.stderr.write(
            self.style.WARNING(
                f"WARNING ({EAGER_WORKER}): OUTBOX['EAGER'] is on, a setting for tests: every transaction that"
                " sends delivers its messages itself, in the sending process, right after its commit.\n"
                "\tHINT: Remove OUTBOX['EAGER'] from the settings this worker runs with (docs/testing.md)."
            )
        )

    def _wait_for_migrations(self, relay: Relay, config: RelayConfig) -> bool:
        """Wait until the database has every outbox migration this code ships; False if stopped first.

        In a rolling deploy the new release's worker may start before ``migrate`` has run: claiming with
        columns the table lacks would fail every statement, and a supervisor restarting the crashed worker
        would fill the logs. So it says once what it waits for, checks again every few seconds, and starts
        when the migrations are in. ``--until-empty`` (a one-off job) refuses at once instead.
        """
        from django_outbox.worker import migrations

        log = logging.getLogger("django_outbox.relay")
        said = ""
        every = min(max(config.poll_interval, 0.5), 5.0)
        try:
            while (wait := migrations.waiting_reason(config.database)) is not None:
                reason = wait.reason
                if config.until_empty and wait.unapplied:
                    raise CommandError(reason.replace(": waiting for", "; run") + " first")
                if reason != said:
                    log.warning("%s (checking every %g s)", reason, every)
                    self.stderr.write(f"{reason} (checking every {every:g} s; Ctrl-C to stop)")
                    said = reason
                if relay.wait_for_stop(every):
                    return False
            if said:
                log.info("the outbox's migrations are applied: starting")
            return True
        finally:
            migrations.close(config.database)  # the relay's threads use their own connections

    def _run(self, relay: Relay, config: RelayConfig, verbosity: int) -> None:
        if verbosity >= 1:
            self.stdout.write(
                f"outbox worker {config.worker_id} relaying from database {config.database!r} "
                f"({'until empty' if config.until_empty else 'Ctrl-C to stop'})"
            )
        relay.run(progress=self._progress if verbosity >= 1 else None)
        if relay.crashed:
            raise CommandError("the worker stopped after an unexpected error (see the log above)")
        if relay.stats.in_flight:
            raise CommandError("stopped with deliveries still in progress; their leases will expire")

    def _progress(self, counts: Counts) -> None:
        line = counts.line()  # the closing line: the counts of the last heartbeat (``outbox_status``'s)
        if self.stdout.isatty():
            self.stdout.write("\r" + line, ending="")
            self.stdout.flush()
        else:
            self.stdout.write(line)

    def _install_signal_handlers(self, relay: Relay) -> dict[int, Any]:
        def handle(signum: int, frame: FrameType | None) -> None:
            if relay.stopping:
                sys.stderr.write("second signal: stopping without waiting for deliveries in progress\n")
                relay.stop(graceful=False)
            else:
                sys.stderr.write(
                    f"{signal.Signals(signum).name}: finishing deliveries in progress, then stopping "
                    "(signal again to stop at once)\n"
                )
                relay.stop()

        previous: dict[int, Any] = {}
        try:
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, handle)
        except ValueError:  # not the main thread (e.g. call_command from a test thread)
            pass
        return previous
