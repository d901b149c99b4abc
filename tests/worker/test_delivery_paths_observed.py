"""Every path that delivers records the delivery span, in the sender's trace, and the counters a worker
records: ``relay_all()``, ``OUTBOX["EAGER"]`` and the tasks runner under either, beside the worker
command's own (tests/acceptance/test_tracing.py). Against OpenTelemetry's SDK with its in-memory exporter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import django
import pytest
from django.db import transaction
from opentelemetry import trace

from django_outbox import outbox
from django_outbox.observability.metrics import process_registry
from django_outbox.testing import relay_all
from tests.support.tracing import memory_exporter, traceparent

pytestmark = pytest.mark.django_db


def delivered(counter: str = "outbox_messages_delivered_total") -> float:
    return sum(
        sample.value for metric in process_registry().collect() for sample in metric.samples if sample.name == counter
    )


def sent_in_a_span(topic: str, send: Callable[[], Any]) -> tuple[Any, str]:
    with trace.get_tracer("tests").start_as_current_span(f"view {topic}") as view:
        message = send()
    return message, traceparent(view)


def assert_one_delivery_span(topic: str, sender: str) -> None:
    spans = [s for s in memory_exporter().get_finished_spans() if s.name == f"process {topic}"]
    assert len(spans) == 1, [s.name for s in memory_exporter().get_finished_spans()]
    (span,) = spans
    trace_id, span_id = sender.split("-")[1:3]
    context = span.get_span_context()
    assert context is not None and context.trace_id == int(trace_id, 16)  # in the sender's trace
    assert span.parent is not None and span.parent.span_id == int(span_id, 16)


def test_relay_all_records_the_span_and_the_counters(handler: Any) -> None:
    memory_exporter().clear()
    handler("paths.*", lambda m: None)
    before = delivered()
    _, sender = sent_in_a_span("paths.relay_all", lambda: outbox.send("paths.relay_all", {}))
    relay_all()
    assert_one_delivery_span("paths.relay_all", sender)
    assert delivered() == before + 1


def test_a_failure_under_relay_all_is_counted_as_the_worker_counts_it(handler: Any, settings: Any) -> None:
    # One attempt: relay_all() relays until nothing is due, and the suite's 0.05 s backoff can run out
    # inside it on a busy machine (a second failure counted); with no backoff at all it counted five.
    settings.OUTBOX = {**settings.OUTBOX, "BACKOFF_BASE_SECONDS": 60, "BACKOFF_MAX_SECONDS": 60}

    def fails(message: Any) -> None:
        raise RuntimeError("down")

    handler("paths.*", fails)
    before = delivered("outbox_messages_failed_total")
    outbox.send("paths.fails", {})
    relay_all()
    assert delivered("outbox_messages_failed_total") == before + 1


def test_eager_delivery_records_the_span_and_the_counters(
    handler: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "EAGER": True}
    memory_exporter().clear()
    handler("paths.*", lambda m: None)
    before = delivered()
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            message, sender = sent_in_a_span("paths.eager", lambda: outbox.send("paths.eager", {}))
    message.refresh_from_db()
    assert message.status == "delivered"
    assert_one_delivery_span("paths.eager", sender)
    assert delivered() == before + 1


@pytest.mark.skipif(django.VERSION < (6, 0), reason="Django's task API is Django 6.x's")
def test_a_task_run_by_relay_all_records_the_span_and_the_counters() -> None:
    from tests.probe import tasks  # the suite's TASKS name the outbox's backend on Django 6.x

    memory_exporter().clear()
    before = delivered()
    result, sender = sent_in_a_span("tasks", lambda: tasks.add.enqueue(2, 3))
    relay_all()
    spans = [s for s in memory_exporter().get_finished_spans() if s.name.startswith("process tasks.")]
    assert len(spans) == 1, [s.name for s in memory_exporter().get_finished_spans()]
    context = spans[0].get_span_context()
    assert context is not None and context.trace_id == int(sender.split("-")[1], 16)
    assert delivered() == before + 1
    result.refresh()
    assert result.return_value == 5
