"""``send()``'s half of tracing: the W3C trace context of the active span, stored in the message's headers.

Imported by ``api`` at import time, so it imports nothing of the package; without opentelemetry-api
installed ``trace_headers`` is None and ``send()`` skips it with one test (``bench/observability.py``).

A ``traceparent`` the caller put in ``headers`` is kept as given, with whatever ``tracestate`` came with
it: the caller said which trace the message belongs to (one relayed from another system, say), and a
header the caller wrote is never changed behind its back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

#: Takes what the caller passed as ``headers`` (not validated yet) and returns what send() validates.
HeaderInjector = Callable[[object], object]


def _injector() -> HeaderInjector | None:
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    propagator = TraceContextTextMapPropagator()  # only traceparent and tracestate: no baggage in a stored row

    def inject(headers: object) -> object:
        if not trace.get_current_span().get_span_context().is_valid:
            return headers
        if headers is not None and not isinstance(headers, Mapping):
            return headers  # send()'s validation refuses it with its usual message
        if headers and any(str(name).lower() == TRACEPARENT for name in headers):
            return headers
        carrier: dict[str, str] = {}
        propagator.inject(carrier)
        return {**headers, **carrier} if headers else carrier or headers

    return inject


#: ``inject(headers)`` -> the headers with the active span's trace context; None without opentelemetry-api.
trace_headers: HeaderInjector | None = _injector()
