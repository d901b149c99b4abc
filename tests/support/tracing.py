"""OpenTelemetry's SDK for the tracing tests: spans in memory in this process, in a file in a worker's."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@functools.cache
def memory_exporter() -> InMemorySpanExporter:
    """This process's spans, kept in memory (the global provider can be set once per process)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


def export_spans_to(path: str) -> None:
    """In a worker process (tests/settings.py): each span as one JSON line, written as it ends.

    The SDK's console exporter with a file for its output: the process's real spans, read by the test.
    """
    out = open(path, "a", encoding="utf-8", buffering=1)  # open for the process's life
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n"))
    )
    trace.set_tracer_provider(provider)


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def traceparent(span: Any) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
