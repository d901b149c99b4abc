"""Metrics, traces and health for operators: what the worker and the web process tell about the outbox.

- ``labels``: the bounded ``topic`` label (``OUTBOX["METRICS_TOPIC_LABELS"]``), no third-party import;
- ``metrics``: Prometheus (extra ``[prometheus]``): the worker's ``Observer``, the sampled backlog
  gauges and the ``/metrics`` server of ``outbox_worker --metrics-port``;
- ``tracing``: OpenTelemetry (extra ``[otel]``): ``send()``'s ``traceparent`` and the worker's delivery
  spans;
- ``views``: ``metrics/`` and ``health/`` for the web process (``django_outbox.urls``).

Nothing here imports prometheus-client or opentelemetry until it is used; without them installed the
worker and ``send()`` run exactly as before (``bench/observability.py``).
"""
