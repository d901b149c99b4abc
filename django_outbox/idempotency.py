"""Idempotent HTTP endpoints: the ``Idempotency-Key`` request header for Django views.

Follows the IETF httpapi draft "The Idempotency-Key HTTP Header Field" and Stripe's behaviour. The
first request with a key runs the view; its response is stored in the view's own transaction, so the
order, its outbox messages and the stored response commit together or not at all. A retry with the
same key and the same request replays the stored response (``Idempotent-Replayed: true``) without
running the view. The same key on a different request is 422, a retry while the first is still
running is 409, and a missing key on an endpoint that requires one is 400.

Two transactions per first request: a short one that commits the claim (so a concurrent retry sees
it and gets 409), then one around the view that stores the response. A crash between them leaves
only the claim, which lapses after ``lock_timeout``; nothing of the view was committed, so the retry
that takes it over runs the view as if for the first time.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, overload

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.request import RawPostDataException
from django.http.response import HttpResponseBase

from . import idempotency_records as records
from .conf import get_settings
from .limits import REQUEST_KEY_MAX_LENGTH, REQUEST_SCOPE_MAX_LENGTH

if TYPE_CHECKING:
    from django.views import View

    _MixinBase = View
else:
    _MixinBase = object

__all__ = ["IdempotencyOptions", "IdempotentMixin", "client_scope", "idempotent"]

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
#: Response headers stored and replayed besides the body; add your own with ``replay_headers=``.
DEFAULT_REPLAY_HEADERS = ("Content-Type", "Content-Language", "Location", "ETag", "Last-Modified")

V = TypeVar("V", bound=Callable[..., HttpResponseBase])

logger = logging.getLogger("django_outbox.idempotency")


def client_scope(request: HttpRequest) -> str:
    """The default scope of a key: the authenticated user, or else the client's address.

    Behind a proxy every anonymous client has the proxy's address; pass ``scope=`` to identify
    anonymous clients better (an API key header, a trusted ``X-Forwarded-For``, the session).
    """
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return f"user:{user.pk}"
    return f"client:{request.META.get('REMOTE_ADDR', '')}"


def _timedelta(what: str, value: dt.timedelta | float) -> dt.timedelta:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        value = dt.timedelta(seconds=value)
    if not isinstance(value, dt.timedelta) or value <= dt.timedelta(0):
        raise ValueError(f"idempotent(): {what} must be a positive timedelta or number of seconds, got {value!r}.")
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class IdempotencyOptions:
    """How an endpoint treats ``Idempotency-Key``; the keyword arguments of ``@idempotent``.

    - ``required``: reject requests without a key (400) instead of running them unprotected.
    - ``ttl``: how long a key's response is replayed (default ``OUTBOX["IDEMPOTENCY_KEY_TTL"]``).
    - ``lock_timeout``: how long a claim protects a request that may have crashed; a retry gets 409
      until then. On PostgreSQL a request that is still running is protected for as long as it runs.
    - ``methods``: the methods the key applies to; others run the view as usual.
    - ``replay_headers``: response headers to store and replay, besides ``DEFAULT_REPLAY_HEADERS``.
    - ``scope``: ``request -> str`` naming whose key it is (default ``client_scope``).
    - ``using``: the database of the view's writes (default ``OUTBOX["DATABASE"]``).
    """

    required: bool = False
    ttl: dt.timedelta | float | None = None
    lock_timeout: dt.timedelta | float = dt.timedelta(seconds=30)
    methods: Iterable[str] = ("POST", "PATCH")
    replay_headers: Iterable[str] = ()
    scope: Callable[[HttpRequest], str] = client_scope
    using: str | None = None
    _methods: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.ttl is not None:
            object.__setattr__(self, "ttl", _timedelta("ttl", self.ttl))
        object.__setattr__(self, "lock_timeout", _timedelta("lock_timeout", self.lock_timeout))
        if isinstance(self.methods, str) or isinstance(self.replay_headers, str):
            raise TypeError("idempotent(): methods and replay_headers take a list of names, not one string.")
        object.__setattr__(self, "_methods", frozenset(m.upper() for m in self.methods))
        object.__setattr__(self, "replay_headers", (*DEFAULT_REPLAY_HEADERS, *self.replay_headers))
        if not callable(self.scope):
            raise TypeError("idempotent(): scope must be a function of the request returning a string.")

    def alias(self) -> str:
        return self.using or get_settings().DATABASE


class _NonAtomicAliases(set[str]):
    """``view._non_atomic_requests`` that also holds the options' database, resolved per request.

    Django's ``ATOMIC_REQUESTS`` asks ``alias in view._non_atomic_requests`` on every request. The
    claim must commit before the view runs, so the request must not be wrapped in a transaction;
    answering lazily keeps settings out of import time and follows ``override_settings``.
    """

    def __init__(self, options: IdempotencyOptions, existing: Iterable[str] = ()) -> None:
        super().__init__(existing)
        self._options = options

    def __contains__(self, alias: object) -> bool:
        return super().__contains__(alias) or alias == self._options.alias()


def _problem(status: int, title: str, detail: str, **headers: str) -> HttpResponse:
    """An RFC 9457 problem response, the format the Idempotency-Key draft uses for its errors."""
    response = JsonResponse(
        {"type": "about:blank", "title": title, "status": status, "detail": detail},
        status=status,
        content_type="application/problem+json",
    )
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def _parse_key(raw: str) -> str | None:
    """The key from the header; the draft makes it a structured-field string (quoted), Stripe sends it bare."""
    value = raw.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    if not value or len(value) > REQUEST_KEY_MAX_LENGTH or not all(" " <= c <= "~" for c in value):
        return None
    return value


def _scope(options: IdempotencyOptions, request: HttpRequest) -> str:
    scope = options.scope(request)
    if not isinstance(scope, str):
        raise TypeError(f"idempotent(): scope() must return a string, not {type(scope).__name__}.")
    if len(scope) > REQUEST_SCOPE_MAX_LENGTH:
        scope = "sha256:" + hashlib.sha256(scope.encode()).hexdigest()
    return scope


def _fingerprint(request: HttpRequest, scope: str) -> str:
    try:
        body = request.body
    except RawPostDataException:  # something read the stream as a form already: hash what it parsed
        form = sorted((k, v) for k, values in request.POST.lists() for v in values)
        files = sorted((k, f.name or "", f.size or 0) for k, fs in request.FILES.lists() for f in fs)
        body = json.dumps([form, files]).encode()
    parts = [request.method or "", request.get_full_path(), scope, hashlib.sha256(body).hexdigest()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _replay(stored: records.Stored) -> HttpResponse:
    response = HttpResponse(stored.body, status=stored.status)
    if "Content-Type" not in stored.headers:
        del response["Content-Type"]
    for name, value in stored.headers.items():
        response[name] = value
    response[REPLAYED_HEADER] = "true"
    return response


class _NotStored(Exception):
    def __init__(self, response: HttpResponseBase) -> None:
        self.response = response


class _ClaimLost(Exception):
    pass


def handle(request: HttpRequest, options: IdempotencyOptions, view: Callable[[], HttpResponseBase]) -> HttpResponseBase:
    """Run ``view()`` under the request's ``Idempotency-Key``, or answer for it."""
    if request.method not in options._methods:
        return view()
    raw = request.headers.get(HEADER)
    if raw is None:
        if options.required:
            return _problem(
                400,
                "Idempotency-Key is missing",
                f"This endpoint requires an {HEADER} header (a unique value per operation).",
            )
        return view()
    key = _parse_key(raw)
    if key is None:
        return _problem(
            400,
            "Idempotency-Key is not valid",
            f"The {HEADER} header must be 1 to {REQUEST_KEY_MAX_LENGTH} printable ASCII characters, e.g. a UUID.",
        )
    scope = _scope(options, request)
    fingerprint = _fingerprint(request, scope)
    alias = options.alias()
    ttl = options.ttl if isinstance(options.ttl, dt.timedelta) else get_settings().IDEMPOTENCY_KEY_TTL
    lock_for = options.lock_timeout if isinstance(options.lock_timeout, dt.timedelta) else dt.timedelta(seconds=30)
    decision = records.claim(alias, scope=scope, key=key, fingerprint=fingerprint, ttl=ttl, lock_for=lock_for)
    if isinstance(decision, records.Stored):
        return _replay(decision)
    if isinstance(decision, records.Mismatch):
        return _problem(
            422,
            "Idempotency-Key reused",
            f"This {HEADER} was used for a different request (method, path or body). Use a new key per operation.",
        )
    if isinstance(decision, records.Busy):
        return _conflict(decision.retry_after)
    return _run(request, options, view, alias=alias, scope=scope, key=key, token=decision.token)


def _conflict(retry_after: float) -> HttpResponse:
    return _problem(
        409,
        "Request in progress",
        f"A request with this {HEADER} is still being processed. Retry later with the same key.",
        Retry_After=str(max(1, math.ceil(retry_after))),
    )


def _run(
    request: HttpRequest,
    options: IdempotencyOptions,
    view: Callable[[], HttpResponseBase],
    *,
    alias: str,
    scope: str,
    key: str,
    token: str,
) -> HttpResponseBase:
    """The view and the stored response in one transaction; a failure forgets the claim."""
    try:
        with transaction.atomic(using=alias):
            if not records.hold(alias, scope=scope, key=key, token=token):
                raise _ClaimLost
            response = view()
            if response.streaming:
                raise TypeError("An @idempotent view returned a streaming response, which cannot be stored for replay.")
            render = getattr(response, "render", None)
            if callable(render) and not getattr(response, "is_rendered", True):
                response = render()
            if response.status_code >= 500:
                # The server failed: undo the view's writes too, so that a retry runs it again.
                raise _NotStored(response)
            assert isinstance(response, HttpResponse)  # streaming ones were refused above
            headers = {name: response[name] for name in options.replay_headers if response.has_header(name)}
            if not records.complete(
                alias,
                scope=scope,
                key=key,
                token=token,
                status=response.status_code,
                headers=headers,
                body=response.content,
            ):
                raise _ClaimLost
    except _ClaimLost:
        return _conflict(1.0)
    except _NotStored as exc:
        _release(alias, scope=scope, key=key, token=token)
        return exc.response
    except BaseException:
        _release(alias, scope=scope, key=key, token=token)
        raise
    return response


def _release(alias: str, *, scope: str, key: str, token: str) -> None:
    """Release the claim; if even that fails (database gone), it lapses after ``lock_timeout`` anyway."""
    try:
        records.release(alias, scope=scope, key=key, token=token)
    except Exception:
        logger.exception("could not release the claim on Idempotency-Key %r (%s); it lapses on its own", key, scope)


@overload
def idempotent(view: V, /) -> V: ...


@overload
def idempotent(
    view: None = None,
    /,
    *,
    required: bool = ...,
    ttl: dt.timedelta | float | None = ...,
    lock_timeout: dt.timedelta | float = ...,
    methods: Iterable[str] = ...,
    replay_headers: Iterable[str] = ...,
    scope: Callable[[HttpRequest], str] = ...,
    using: str | None = ...,
) -> Callable[[V], V]: ...


def idempotent(view: V | None = None, /, **options: Any) -> V | Callable[[V], V]:
    """Make a view honour ``Idempotency-Key``: ``@idempotent`` or ``@idempotent(required=True, ...)``.

    The options are those of ``IdempotencyOptions``. The view runs in a transaction of its own on
    ``using`` (so don't also wrap it in ``atomic``; ``ATOMIC_REQUESTS`` is turned off for it).
    """
    parsed = IdempotencyOptions(**options)

    def decorate(func: V) -> V:
        @functools.wraps(func)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            return handle(request, parsed, lambda: func(request, *args, **kwargs))

        wrapper._non_atomic_requests = _NonAtomicAliases(  # type: ignore[attr-defined]
            parsed, getattr(func, "_non_atomic_requests", ())
        )
        return wrapper  # type: ignore[return-value]

    return decorate(view) if view is not None else decorate


class IdempotentMixin(_MixinBase):
    """The class-based view form of ``@idempotent``; put it before ``View`` in the bases::

    class OrderCreate(IdempotentMixin, View):
        idempotency = IdempotencyOptions(required=True)
    """

    idempotency: ClassVar[IdempotencyOptions] = IdempotencyOptions()

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        parent = super().dispatch
        return handle(request, self.idempotency, lambda: parent(request, *args, **kwargs))

    @classmethod
    def as_view(cls, **initkwargs: Any) -> Callable[..., HttpResponseBase]:
        view = super().as_view(**initkwargs)
        view._non_atomic_requests = _NonAtomicAliases(  # type: ignore[attr-defined]
            cls.idempotency, getattr(view, "_non_atomic_requests", ())
        )
        return view
