"""docs/grafana's dashboard and alerts query only metrics the worker and the views really export."""

from __future__ import annotations

import datetime as dt
import json
import re

from prometheus_client import CollectorRegistry, generate_latest

from django_outbox.admin.counting import Tally
from django_outbox.admin.overview import Gauges
from django_outbox.observability.metrics import Backlog, WorkerMetrics
from tests.support import ROOT

GRAFANA = ROOT / "docs" / "grafana"
NAME = re.compile(r"\boutbox_[a-z_]+\b")
COMMANDS = {"outbox_status", "outbox_worker"}  # named in the texts too


def exported() -> set[str]:
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    for labelled in (metrics.delivered, metrics.failed, metrics.dead):
        labelled.labels("t", "x").inc()
    metrics.duration.labels("x").observe(0.1)
    backlog = Backlog("default")
    backlog.latest = Gauges(
        generated_at=dt.datetime.now(dt.UTC),
        counts={"pending": Tally(1, exact=True)},
        lag_seconds=0.0,
        lag_exact=True,
        blocked_keys=0,
        workers_alive=1,
    )
    registry.register(backlog)
    text = generate_latest(registry).decode()
    samples = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("outbox_")}
    histograms = {re.sub(r"_(bucket|sum|count)$", "", s) for s in samples if s.endswith("_bucket")}
    return samples | histograms  # a histogram is named by its family too


def queried(text: str) -> set[str]:
    return set(NAME.findall(text)) - COMMANDS


def test_the_dashboard_queries_only_exported_metrics():
    dashboard = json.loads((GRAFANA / "outbox-dashboard.json").read_text(encoding="utf-8"))
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    names = queried(" ".join(expressions))
    assert len(names) >= 8
    assert names <= exported(), names - exported()


def test_the_alerts_query_only_exported_metrics():
    names = queried((GRAFANA / "outbox-alerts.yml").read_text(encoding="utf-8"))
    assert {"outbox_lag_seconds", "outbox_messages_dead_total", "outbox_workers_alive"} <= names
    assert names <= exported(), names - exported()


def test_the_metric_names_of_the_docs_are_exported():
    documented = queried((ROOT / "docs" / "operating.md").read_text(encoding="utf-8"))
    assert documented <= exported(), documented - exported()
