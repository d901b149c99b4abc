"""``health/`` and ``metrics/`` for the web process: what a load balancer, a probe or a scraper asks.

Both show operational figures only (counts, lag, workers), never a message. They are open to active
staff sessions (whatever ``Authorization`` header a proxy adds) and to a request bearing
``OUTBOX["HEALTH_TOKEN"]`` (``Authorization: Bearer ...``), compared in constant time; anyone else gets
401 (a token is configured or a bearer was presented) or 403, and no figure. The token is never
logged, and Django's error pages hide ``*TOKEN*`` settings and the ``Authorization`` header.
"""

from __future__ import annotations

import hmac
import logging
import threading
from typing import Any

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from ..admin import overview
from ..conf import get_settings

OK, LAGGING, STALLED = "ok", "lagging", "stalled"

logger = logging.getLogger("django_outbox.health")


def _refused(request: HttpRequest) -> HttpResponse | None:
    """None when the request may see the figures; else the response that says it may not.

    Either credential opens them: a valid bearer token, or an active staff session. The session is
    looked at whatever ``Authorization`` header comes with it: a proxy in front of the site may add its
    own (``Basic`` for a protected staging host), and that must not lock the operators out.
    """
    token = get_settings().HEALTH_TOKEN
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    bearer = scheme.lower() == "bearer"
    if bearer and token and hmac.compare_digest(credentials.strip().encode(), token.encode()):
        return None
    user: Any = getattr(request, "user", None)
    if user is not None and user.is_active and user.is_staff:
        return None
    if token or bearer:
        return _unauthorized()
    return JsonResponse({"error": "staff only"}, status=403)


def _unauthorized() -> HttpResponse:
    response = JsonResponse({"error": "a valid bearer token is required"}, status=401)
    response["WWW-Authenticate"] = 'Bearer realm="outbox"'
    return response


def status_of(figures: overview.Gauges) -> str:
    """``stalled`` past HEALTH_STALLED_SECONDS of lag or with no live worker, ``lagging`` past HEALTH_LAG_SECONDS."""
    conf = get_settings()
    if figures.workers_alive == 0 or figures.lag_seconds > conf.HEALTH_STALLED_SECONDS:
        return STALLED
    if figures.lag_seconds > conf.HEALTH_LAG_SECONDS:
        return LAGGING
    return OK


@never_cache
@require_safe
def health(request: HttpRequest) -> HttpResponse:
    try:
        # A staff session is looked up in the database too: during an outage that lookup fails first.
        refused = _refused(request)
        if refused is not None:
            return refused
        figures = overview.gauges(get_settings().DATABASE)
    except DatabaseError:
        # A probe asks exactly when things are wrong: an outbox whose database cannot be read delivers
        # nothing. The answer is the JSON a probe parses, not Django's 500 page, and it carries no error
        # text (a driver's names the host, port and user) and no figure; the log has the error.
        logger.warning("health: the outbox database could not be read", exc_info=True)
        return JsonResponse(
            {
                "status": STALLED,
                "lag_seconds": None,
                "blocked_keys": None,
                "workers_alive": None,
                "error": "the outbox database could not be read (see the django_outbox.health log)",
            },
            status=503,
        )
    status = status_of(figures)
    return JsonResponse(
        {
            "status": status,
            "lag_seconds": round(figures.lag_seconds, 3),
            "blocked_keys": figures.blocked_keys,
            "workers_alive": figures.workers_alive,
        },
        status=200 if status == OK else 503,
    )


_backlog: Any = None
_backlog_lock = threading.Lock()


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """The backlog gauges in Prometheus' text format, sampled at most every few seconds per process."""
    global _backlog
    try:
        refused = _refused(request)  # a staff session's lookup needs the database too
    except DatabaseError:
        return _metrics_unreadable()
    if refused is not None:
        return refused
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        from .metrics import Backlog
    except ImportError:
        return JsonResponse(
            {"error": "prometheus-client is not installed: pip install 'django-transactional-outbox[prometheus]'"},
            status=501,
        )
    database = get_settings().DATABASE
    with _backlog_lock:
        if _backlog is None or _backlog.database != database:
            _backlog = Backlog(database)
        backlog = _backlog
    try:
        backlog.refresh()
    except DatabaseError:
        return _metrics_unreadable()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(backlog)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def _metrics_unreadable() -> HttpResponse:
    """As the health view's: a clear status at once (the scraper's ``up`` goes to 0 and the series are
    absent, which the alerts watch), no driver text (it names the host and user); the log has it."""
    logger.warning("metrics: the outbox database could not be read", exc_info=True)
    return HttpResponse(
        "the outbox database could not be read (see the django_outbox.health log)\n",
        status=503,
        content_type="text/plain; charset=utf-8",
    )
