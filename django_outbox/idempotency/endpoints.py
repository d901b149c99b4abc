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

The body is fingerprinted before the view runs, read in chunks into a spooled file that the view
then reads as usual; forms are fingerprinted by their parsed fields and file contents, so a retry
with a new multipart boundary matches and a different file never does (see ``_body_digest``).
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import io
import json
import logging
import math
import operator
import tempfile
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, overload

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict, UnreadablePostError
from django.http.multipartparser import MultiPartParser, MultiPartParserError
from django.http.response import HttpResponseBase
from django.utils.datastructures import ImmutableList, MultiValueDict

from ..conf import get_settings
from ..limits import REQUEST_KEY_MAX_LENGTH, REQUEST_SCOPE_MAX_LENGTH
from . import records

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


def _fingerprint(request: HttpRequest, scope: str, cleanup: ExitStack) -> str:
    parts = [request.method or "", request.get_full_path(), scope, _body_digest(request, cleanup)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


class _IncompleteBody(Exception):
    """The client sent less than its ``Content-Length`` (it went away mid-upload, or lied).

    Django would hand the view what arrived (its multipart parser drops a file cut short), and the
    stored response would then hold the key against the client's retry of the whole upload. So the
    key is not claimed and the view does not run.
    """

    def __init__(self, received: int, declared: int) -> None:
        super().__init__(received, declared)
        self.received = received
        self.declared = declared


def _declared_length(request: HttpRequest) -> int:
    try:
        return max(0, int(request.META.get("CONTENT_LENGTH") or 0))
    except ValueError:
        return 0


#: How much of a body is read at once while it is fingerprinted: Django's own upload chunk size.
_CHUNK_SIZE = 64 * 1024


def _body_digest(request: HttpRequest, cleanup: ExitStack) -> str:
    """A digest of everything the view can see of the body, read in chunks and never held in memory.

    The fingerprint decides between running the view, replaying and 422, so it must be known before
    the view runs, and the view must then find the body as if nobody had read it. A body still on the
    wire is therefore copied, chunk by chunk, into a spooled temporary file that replaces the
    request's stream (in memory up to ``FILE_UPLOAD_MAX_MEMORY_SIZE``, on disk beyond, as Django's
    ASGI handler buffers every body); a seekable stream (ASGI) is hashed in place and rewound. No
    ``DATA_UPLOAD_MAX_MEMORY_SIZE`` check applies here: that limit is the view's to enforce when it
    reads ``request.body``, exactly as without the decorator.

    A multipart form is fingerprinted by what Django parses from it (fields in order; each file's
    field, name, content type and the SHA-256 of its content), not by its bytes: clients draw a new
    random boundary for every request, retries included. That is also all there is to go on when the
    form was parsed before the view (the CSRF middleware reads ``request.POST`` on every protected
    POST), so both orders give the same fingerprint. Any other body is fingerprinted by its bytes.
    """
    is_form = request.content_type == "multipart/form-data"
    body = getattr(request, "_body", None)
    if isinstance(body, bytes):  # read with request.body already, so it is in memory anyway
        if len(body) < _declared_length(request):
            raise _IncompleteBody(len(body), _declared_length(request))
        form = _parse_for_digest(request, io.BytesIO(body), len(body)) if is_form else None
        return form or hashlib.sha256(body).hexdigest()
    if getattr(request, "_read_started", False):
        return _parsed_form_digest(request)
    stream = getattr(request, "_stream", None)
    if stream is None:  # a bare HttpRequest: no body to read
        return hashlib.sha256(b"").hexdigest()
    digest = hashlib.sha256()
    size = 0
    if _seekable(stream):
        start = stream.tell()
        while chunk := _read(stream):
            digest.update(chunk)
            size += len(chunk)
        stream.seek(start)
    else:
        spool = cleanup.enter_context(
            tempfile.SpooledTemporaryFile(max_size=_spool_in_memory(), dir=settings.FILE_UPLOAD_TEMP_DIR)
        )
        while chunk := _read(stream):
            digest.update(chunk)
            size += len(chunk)
            spool.write(chunk)
        spool.seek(0)
        start = 0
        request._stream = stream = spool  # type: ignore[assignment]
    if size < _declared_length(request):
        raise _IncompleteBody(size, _declared_length(request))
    if is_form:
        form = _parse_for_digest(request, stream, size)
        stream.seek(start)
        if form is not None:
            return form
    return digest.hexdigest()


def _spool_in_memory() -> int:
    """``FILE_UPLOAD_MAX_MEMORY_SIZE`` for the spool: 0 means "always on disk" to Django but "never" to the spool."""
    return max(1, int(settings.FILE_UPLOAD_MAX_MEMORY_SIZE or 0))


def _read(stream: Any) -> bytes:
    try:
        return bytes(stream.read(_CHUNK_SIZE))
    except OSError as exc:  # the client went away mid-body: what request.body raises then
        raise UnreadablePostError(*exc.args) from exc


def _seekable(stream: Any) -> bool:
    try:
        return bool(stream.seekable())
    except (AttributeError, ValueError, OSError):
        return False


def _parse_for_digest(request: HttpRequest, stream: Any, size: int) -> str | None:
    """The form digest of a multipart body, parsed by Django's parser into hashes only; None to use the bytes.

    Django parses nothing when ``Content-Length`` is missing or wrong (a chunked body on ASGI), and a
    malformed body fails in the view's own parse as well; in these cases the raw bytes are the
    fingerprint, so two different bodies still never match.
    """
    declared = _declared_length(request)
    if declared <= 0 or declared != size:
        return None
    handler = _DigestingUploadHandler()
    try:
        post, files = MultiPartParser(request.META, stream, [handler], request.encoding).parse()
    except (MultiPartParserError, SuspiciousOperation, ValueError):
        return None
    if handler.interrupted:  # a file without its closing boundary: Django drops it, the bytes still count
        return None
    return _form_digest(post, files, operator.attrgetter("digest"))  # every file is a _DigestedUpload


def _parsed_form_digest(request: HttpRequest) -> str:
    """The form digest when something parsed the form before the view; the raw body is gone by then."""
    parsed = isinstance(getattr(request, "_upload_handlers", None), ImmutableList)  # parse_file_upload() ran
    if request.content_type == "multipart/form-data" and parsed and hasattr(request, "_files"):
        # Django's WSGI stream counts what it read; the parser reads to the end, so less is a cut body.
        stream = getattr(request, "_stream", None)
        received, limit = getattr(stream, "_pos", None), getattr(stream, "limit", None)
        if isinstance(received, int) and isinstance(limit, int) and received < limit:
            raise _IncompleteBody(received, limit)
        return _form_digest(request.POST, request.FILES, _file_digest)
    raise ImproperlyConfigured(
        f"@idempotent cannot fingerprint this {request.method} to {request.path}: its body was read from the "
        "request stream before the view (request.read() in a middleware?) and nothing parsed it, so two "
        "different bodies would look the same. Read the body with request.body or request.POST there instead."
    )


def _form_digest(
    post: QueryDict, files: MultiValueDict[str, UploadedFile[Any]], content: Callable[[Any], bytes]
) -> str:
    """An unambiguous digest of a parsed form: length-prefixed JSON for the fields and each file's metadata."""
    digest = hashlib.sha256(b"multipart/form-data\n")

    def feed(value: object) -> None:
        data = json.dumps(value, sort_keys=True, default=repr).encode()
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)

    feed(list(post.lists()))
    for field_name, uploads in files.lists():
        for upload in uploads:
            meta = [field_name, upload.name, upload.content_type, upload.charset, upload.content_type_extra]
            feed([*meta, upload.size])
            digest.update(content(upload))  # always 32 bytes
    return "form:" + digest.hexdigest()


def _file_digest(upload: Any) -> bytes:
    """The SHA-256 of an uploaded file's content, read in chunks from wherever the upload handler put it."""
    if not callable(getattr(upload, "chunks", None)):
        raise ImproperlyConfigured(
            f"@idempotent cannot fingerprint the upload {upload!r}: its upload handler returned an object "
            "without chunks(); upload handlers must return django.core.files.uploadedfile.UploadedFile objects."
        )
    digest = hashlib.sha256()
    for chunk in upload.chunks():
        digest.update(chunk)
    upload.seek(0)  # the view reads it from the start
    return digest.digest()


class _DigestedUpload(UploadedFile):  # type: ignore[type-arg]  # generic only in the stubs
    """An upload reduced to its metadata and the digest of its content: what the fingerprint needs."""

    def __init__(self, digest: bytes, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.digest = digest


class _DigestingUploadHandler(FileUploadHandler):
    """Hashes each file as Django's parser streams it, and keeps nothing else of it."""

    _hash: Any = None
    interrupted = False

    def upload_interrupted(self) -> None:
        self.interrupted = True

    def new_file(self, *args: Any, **kwargs: Any) -> None:
        super().new_file(*args, **kwargs)
        self._hash = hashlib.sha256()

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        self._hash.update(raw_data)

    def file_complete(self, file_size: int) -> _DigestedUpload:
        return _DigestedUpload(
            self._hash.digest(),
            name=self.file_name,
            content_type=self.content_type,
            size=file_size,
            charset=self.charset,
            content_type_extra=self.content_type_extra,
        )


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
    cleanup = ExitStack()
    try:
        try:
            fingerprint = _fingerprint(request, scope, cleanup)
        except _IncompleteBody as exc:
            response: HttpResponseBase = _problem(
                400,
                "Request body incomplete",
                f"The request ended after {exc.received} of the {exc.declared} bytes its Content-Length "
                f"announced. Nothing was done; send the whole request again with the same {HEADER}.",
            )
        else:
            response = _decide(request, options, view, scope=scope, key=key, fingerprint=fingerprint)
    except BaseException:
        cleanup.close()
        raise
    _close_with(response, cleanup)
    return response


def _close_with(response: HttpResponseBase, cleanup: ExitStack) -> None:
    """Keep a spooled body until the response is closed, as Django keeps the request's own stream.

    Middleware may still read ``request.POST`` after the view, or after a replay where the view never
    ran (django-debug-toolbar does); the handler closes the response once it has been sent.
    """
    closers = getattr(response, "_resource_closers", None)
    if isinstance(closers, list):
        closers.append(cleanup.close)
    else:
        cleanup.close()


def _decide(
    request: HttpRequest,
    options: IdempotencyOptions,
    view: Callable[[], HttpResponseBase],
    *,
    scope: str,
    key: str,
    fingerprint: str,
) -> HttpResponseBase:
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
