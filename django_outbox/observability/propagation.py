"""``send()``'s half of tracing: the W3C trace context of the active span, stored in the message's headers.

Imported by ``api`` at import time, so it imports nothing of the package; without opentelemetry-api
installed ``trace_headers`` is None and ``send()`` skips it with one test (``bench/observability.py``).

A ``traceparent`` the caller put in ``headers`` is kept as given, with whatever ``tracestate`` came with
it: the caller said which trace the message belongs to (one relayed from another system, say), and a
pair the caller wrote is never changed behind its back. A ``tracestate`` without a ``traceparent``
belongs to no parent: W3C trace context calls it invalid and has it discarded, so inside a span it is
dropped (in any spelling) for the span's own pair, whether or not the span has a tracestate; outside
one, ``send()`` takes no part in a trace and stores the headers as given.
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
        if not headers:
            return carrier or headers
        # Without its traceparent a tracestate is invalid (W3C trace context: it MUST be discarded):
        # the span's pair goes in whole, and no state of the caller's sits beside a parent it is not of.
        own = {name: value for name, value in headers.items() if str(name).lower() != TRACESTATE}
        return {**own, **carrier}

    return inject


#: ``inject(headers)`` -> the headers with the active span's trace context; None without opentelemetry-api.
trace_headers: HeaderInjector | None = _injector()
