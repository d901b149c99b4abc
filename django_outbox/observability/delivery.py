"""The observers every path that delivers carries: the worker, ``relay_all()``, ``OUTBOX["EAGER"]`` and the
tasks runner (which runs inside one of them).

A user who tests tracing in their own suite, or drives delivery from a script, must see the same delivery
spans and counters a worker records; wiring them in the worker command alone hid them everywhere else.
Each is made once per process and only when its library is installed (nothing of OpenTelemetry's or
prometheus-client's is imported otherwise).
"""

from __future__ import annotations

import functools

from ..worker.observer import Observer


@functools.cache
def tracers() -> tuple[Observer, ...]:
    """The delivery span, when opentelemetry-api is installed; a provider set later is used then (the
    API's proxy tracer delegates to it)."""
    from .propagation import trace_headers

    if trace_headers is None:
        return ()
    from .tracing import DeliveryTracer

    return (DeliveryTracer(),)


def counters() -> tuple[Observer, ...]:
    """The worker's counters in this process's registry (``metrics.process_registry()``), when
    prometheus-client is installed."""
    try:
        from .metrics import process_metrics
    except ImportError:
        return ()
    return (process_metrics(),)


def observers() -> list[Observer]:
    """What ``relay_all()`` and ``EAGER`` deliver with: the spans and the counters."""
    return [*tracers(), *counters()]
