"""``@idempotent`` on upload endpoints: real multipart bodies, behind the CSRF middleware or exempt from it.

The two orders matter. Behind ``CsrfViewMiddleware`` the form is parsed before the view (the
middleware reads ``request.POST`` on every protected POST), so the raw body is gone by the time the
decorator runs; on an exempt view the body is still unread. In both, uploads the plain view accepts
must be accepted, two uploads that differ in content must never share a replay, and the same upload
again (whatever multipart boundary the client picks this time) must be replayed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import socket
import tracemalloc
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.handlers.asgi import ASGIHandler
from django.test import Client, RequestFactory, override_settings
from hypothesis import given
from hypothesis import strategies as st

from django_outbox.idempotency import endpoints as idempotency
from django_outbox.models import IdempotencyRecord
from testproject.shop.models import Order
from tests.probe import views

pytestmark = pytest.mark.django_db(transaction=True)

MB = 1024 * 1024
#: Django's default DATA_UPLOAD_MAX_MEMORY_SIZE, set explicitly so the tests say what they rely on.
TWO_AND_A_HALF_MB = 2_621_440


def multipart(
    fields: list[tuple[str, str]] = (),  # type: ignore[assignment]
    files: list[tuple[str, str, bytes]] = (),  # type: ignore[assignment]
    *,
    content_type: str = "application/octet-stream",
    boundary: str | None = None,
) -> tuple[bytes, str]:
    """A multipart/form-data body with a fresh random boundary, as browsers and HTTP libraries send it."""
    boundary = boundary or "----form" + secrets.token_hex(12)
    parts = []
    for name, value in fields:
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode())
        parts.append(value.encode() + b"\r\n")
    for field, filename, content in files:
        head = (
            f"--{boundary}\r\n"
            f'Content-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
            f"Content-Type: {content_type}\r\n\r\n"
        )
        parts.append(head.encode() + content + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def two_files(size: int) -> tuple[bytes, bytes]:
    """Two contents of the same size that differ in one byte in the middle."""
    first = os.urandom(size)
    middle = size // 2
    second = first[:middle] + bytes([first[middle] ^ 0xFF]) + first[middle + 1 :]
    return first, second


@dataclass(frozen=True)
class Route:
    """One order of events: ``csrf`` True when the CSRF middleware parses the form before the view."""

    idempotent: str
    plain: str
    csrf: bool


ROUTES = {
    "form-parsed-first-by-csrf-middleware": Route("/probe/upload/", "/probe/upload-plain/", csrf=True),
    "body-unread-csrf-exempt": Route("/probe/upload-exempt/", "/probe/upload-plain-exempt/", csrf=False),
}


@pytest.fixture(params=list(ROUTES))
def route(request: pytest.FixtureRequest) -> Route:
    return ROUTES[request.param]


class CsrfClient:
    """Django's test client with CSRF enforced, holding a real token from the server."""

    def __init__(self) -> None:
        self.client = Client(enforce_csrf_checks=True)
        self.token = self.client.get("/probe/csrf/").json()["token"]

    def post(self, url: str, body: bytes, content_type: str, key: str | None = None, token: bool = True) -> Any:
        headers = {"X-CSRFToken": self.token} if token else {}
        if key is not None:
            headers["Idempotency-Key"] = key
        return self.client.post(url, body, content_type=content_type, headers=headers)


@pytest.fixture
def csrf() -> CsrfClient:
    return CsrfClient()


def created(response: Any) -> dict[str, Any]:
    assert response.status_code == 201, (response.status_code, response.content[:500])
    assert "Idempotent-Replayed" not in response
    reply: dict[str, Any] = json.loads(response.content)
    return reply


def replayed(response: Any, first: dict[str, Any]) -> None:
    assert response.status_code == 201, (response.status_code, response.content[:500])
    assert response["Idempotent-Replayed"] == "true"
    assert json.loads(response.content) == first


def test_the_csrf_middleware_is_really_enforced(csrf):
    body, content_type = multipart(files=[("file", "a.bin", b"x")])
    assert csrf.post("/probe/upload/", body, content_type, key="k", token=False).status_code == 403
    assert csrf.post("/probe/upload-exempt/", body, content_type, key="k", token=False).status_code == 201


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=TWO_AND_A_HALF_MB)
def test_a_3_mb_upload_the_plain_view_accepts_is_accepted_under_idempotent(csrf, route):
    content = os.urandom(3 * MB)
    body, content_type = multipart([("note", "quarterly")], [("file", "report.bin", content)])
    plain = created(csrf.post(route.plain, body, content_type))
    first = created(csrf.post(route.idempotent, body, content_type, key="upload-1"))
    assert first["seen"] == plain["seen"]
    assert first["seen"]["files"]["file"][0]["sha256"] == sha256(content)
    assert first["seen"]["fields"] == {"note": ["quarterly"]}
    replayed(csrf.post(route.idempotent, body, content_type, key="upload-1"), first)
    assert Order.objects.count() == 2  # the plain view and the first idempotent request


def test_a_different_file_of_the_same_name_and_size_with_the_same_key_is_422(csrf, route):
    first_content, second_content = two_files(300_000)
    body, content_type = multipart(files=[("file", "scan.pdf", first_content)])
    first = created(csrf.post(route.idempotent, body, content_type, key="scan-1"))
    other, other_type = multipart(files=[("file", "scan.pdf", second_content)])
    response = csrf.post(route.idempotent, other, other_type, key="scan-1")
    assert response.status_code == 422
    assert response["Content-Type"] == "application/problem+json"
    assert Order.objects.count() == 1
    replayed(csrf.post(route.idempotent, body, content_type, key="scan-1"), first)


def test_the_same_file_again_is_replayed_whatever_boundary_the_client_picks(csrf, route):
    content = os.urandom(200_000)
    body, content_type = multipart([("note", "n")], [("file", "a.bin", content)])
    first = created(csrf.post(route.idempotent, body, content_type, key="same-1"))
    again, again_type = multipart([("note", "n")], [("file", "a.bin", content)])
    assert again_type != content_type  # a new random boundary, as a client's retry sends it
    replayed(csrf.post(route.idempotent, again, again_type, key="same-1"), first)
    assert Order.objects.count() == 1


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"fields": [("note", "m")]}, id="a field value"),
        pytest.param({"fields": [("note", "n"), ("note", "n")]}, id="a repeated field"),
        pytest.param({"files": [("file", "b.bin", b"same")]}, id="the file name"),
        pytest.param({"files": [("attachment", "a.bin", b"same")]}, id="the field of the file"),
        pytest.param({"files": [("file", "a.bin", b"same"), ("file", "a.bin", b"same")]}, id="a second file"),
        pytest.param({"content_type": "text/plain"}, id="the file's content type"),
    ],
)
def test_every_part_of_the_form_the_view_sees_is_in_the_fingerprint(csrf, route, change):
    base: dict[str, Any] = {"fields": [("note", "n")], "files": [("file", "a.bin", b"same")]}
    body, content_type = multipart(**base)
    created(csrf.post(route.idempotent, body, content_type, key="part-1"))
    other, other_type = multipart(**{**base, **change})
    assert csrf.post(route.idempotent, other, other_type, key="part-1").status_code == 422


def test_a_file_without_its_closing_boundary_still_counts_when_the_body_is_unread(csrf):
    """Django drops such a file from the form; the fingerprint falls back to the bytes, which differ."""
    first_content, second_content = two_files(10_000)
    body, content_type = multipart(files=[("file", "a.bin", first_content)])
    cut = body[: -len(b"--\r\n") - 40]  # well inside the file's content: no closing boundary
    first = created(csrf.post("/probe/upload-exempt/", cut, content_type, key="open-1"))
    assert first["seen"]["files"] == {}
    other = body.replace(first_content, second_content)[: len(cut)]
    assert csrf.post("/probe/upload-exempt/", other, content_type, key="open-1").status_code == 422
    replayed(csrf.post("/probe/upload-exempt/", cut, content_type, key="open-1"), first)


def test_the_order_of_a_fields_values_is_in_the_fingerprint(csrf, route):
    body, content_type = multipart([("tag", "a"), ("tag", "b")])
    first = created(csrf.post(route.idempotent, body, content_type, key="order-1"))
    assert first["seen"]["fields"] == {"tag": ["a", "b"]}
    other, other_type = multipart([("tag", "b"), ("tag", "a")])
    assert csrf.post(route.idempotent, other, other_type, key="order-1").status_code == 422


def test_urlencoded_forms(csrf, route):
    first = created(
        csrf.post(route.idempotent, b"email=a%40example.com&qty=1", "application/x-www-form-urlencoded", "f")
    )
    assert first["seen"]["fields"] == {"email": ["a@example.com"], "qty": ["1"]}
    replayed(
        csrf.post(route.idempotent, b"email=a%40example.com&qty=1", "application/x-www-form-urlencoded", "f"), first
    )
    other = csrf.post(route.idempotent, b"email=a%40example.com&qty=2", "application/x-www-form-urlencoded", "f")
    assert other.status_code == 422


def test_json_bodies_are_read_by_the_view_as_usual(csrf, route):
    body = json.dumps({"email": "a@example.com", "item": "mug"}).encode()
    first = created(csrf.post(route.idempotent, body, "application/json", key="json-1"))
    assert first["seen"] == {"body_sha256": sha256(body)}
    replayed(csrf.post(route.idempotent, body, "application/json", key="json-1"), first)
    other = json.dumps({"email": "a@example.com", "item": "pot"}).encode()
    assert csrf.post(route.idempotent, other, "application/json", key="json-1").status_code == 422


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100_000)
def test_a_json_body_over_the_limit_is_refused_as_the_plain_view_refuses_it(csrf, route):
    body = json.dumps({"blob": "x" * 200_000}).encode()
    assert csrf.post(route.plain, body, "application/json").status_code == 400
    assert csrf.post(route.idempotent, body, "application/json", key="big-json").status_code == 400
    assert Order.objects.count() == 0


@override_settings(FILE_UPLOAD_MAX_MEMORY_SIZE=TWO_AND_A_HALF_MB)
def test_the_view_may_still_choose_its_upload_handlers(csrf):
    body, content_type = multipart(files=[("file", "small.txt", b"tiny")])
    first = created(csrf.post("/probe/upload-to-disk/", body, content_type, key="disk-1"))
    assert first["seen"]["files"]["file"][0]["on_disk"] is True  # small, yet on disk: the view's handler
    replayed(csrf.post("/probe/upload-to-disk/", body, content_type, key="disk-1"), first)


def test_middleware_may_read_the_form_after_the_view_and_after_a_replay(settings):
    """The spooled body outlives the view: it is closed with the response, as Django closes its own."""
    settings.MIDDLEWARE = ["tests.probe.middleware.FormAfterViewMiddleware", *settings.MIDDLEWARE]
    csrf = CsrfClient()  # its handler loads the middleware above
    content = os.urandom(300_000)
    body, content_type = multipart([("note", "n")], [("file", "a.bin", content)])
    expected = f"1 fields, files {sha256(content)}"
    first = csrf.post("/probe/upload-exempt/", body, content_type, key="after-1")
    assert (first.status_code, first["X-Form-After-View"]) == (201, expected)
    again = csrf.post("/probe/upload-exempt/", body, content_type, key="after-1")
    assert (again["Idempotent-Replayed"], again["X-Form-After-View"]) == ("true", expected)


def test_a_body_read_off_the_stream_before_the_decorator_is_refused_not_guessed():
    """A middleware that consumed the raw stream leaves nothing to fingerprint: say so, never hash nothing."""
    body, content_type = multipart(files=[("file", "a.bin", b"content")])
    factory = RequestFactory()
    for touch_form_after in (False, True):
        request = factory.post(
            "/probe/upload-exempt/", body, content_type=content_type, headers={"Idempotency-Key": "k"}
        )
        request.read()
        if touch_form_after:
            assert not request.FILES  # Django's answer once the stream is gone: an empty form
        with pytest.raises(ImproperlyConfigured, match="read from the request stream"):
            views.upload_exempt(request)
    assert Order.objects.count() == 0


def _request(body: bytes, content_type: str, *, form_first: bool) -> Any:
    request = RequestFactory().post("/u/", body, content_type=content_type)
    if form_first:
        assert request.FILES is not None  # what the CSRF middleware does
    return request


def test_the_fingerprint_of_a_form_is_the_same_whoever_parses_it_first():
    content = os.urandom(100_000)
    fingerprints = set()
    for form_first in (False, True):
        body, content_type = multipart([("a", "1"), ("a", "2")], [("file", "x.bin", content)])
        request = _request(body, content_type, form_first=form_first)
        with ExitStack() as cleanup:
            fingerprints.add(idempotency._fingerprint(request, "s", cleanup))
            # and the view still finds the whole form afterwards
            assert request.POST.getlist("a") == ["1", "2"]
            assert request.FILES["file"].read() == content
    assert len(fingerprints) == 1


# --- property: what the view sees decides replay or 422 --------------------------------------------------

NAMES = st.sampled_from(["a", "b", "file", "note"])
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
FILENAMES = st.text(st.characters(exclude_categories=["Cs", "Cc"], exclude_characters='"\r\n'), max_size=20)
FORMS = st.tuples(
    st.lists(st.tuples(NAMES, TEXT), max_size=4),
    st.lists(st.tuples(NAMES, FILENAMES, st.binary(max_size=3000)), max_size=3),
)


@given(first=FORMS, second=FORMS, same=st.booleans())
def test_replay_happens_exactly_when_the_view_would_see_the_same_form(csrf, route, first, second, same):
    """The view's own account of each form is the oracle: a different one must never be replayed."""
    if same:
        second = first
    key = "prop-" + secrets.token_hex(8)
    body, content_type = multipart(*first)
    response = csrf.post(route.idempotent, body, content_type, key=key)
    assert response.status_code == 201
    seen_first = json.loads(response.content)["seen"]
    other, other_type = multipart(*second)
    seen_second = json.loads(csrf.post(route.idempotent, other, other_type, key=key + "-fresh").content)["seen"]
    retry = csrf.post(route.idempotent, other, other_type, key=key)
    if seen_second != seen_first:
        assert retry.status_code == 422
    if same:
        assert retry["Idempotent-Replayed"] == "true"
    Order.objects.all().delete()


# --- real HTTP: a live server, a real CSRF token, httpx's own multipart encoder ---------------------------


@pytest.fixture
def http(live_server) -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    with httpx.Client(base_url=live_server.url, timeout=120) as client:
        token = client.get("/probe/csrf/").json()["token"]  # and the csrftoken cookie, kept by the client
        yield client, {"X-CSRFToken": token}


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=TWO_AND_A_HALF_MB)
def test_real_multipart_uploads_over_http_behind_the_csrf_middleware(http, route):
    client, headers = http
    first_content, second_content = two_files(3 * MB)
    files = {"file": ("report.bin", first_content, "application/octet-stream")}
    plain = client.post(route.plain, files=files, data={"note": "q3"}, headers=headers)
    assert plain.status_code == 201, plain.text[:500]
    first = client.post(
        route.idempotent, files=files, data={"note": "q3"}, headers={**headers, "Idempotency-Key": "h1"}
    )
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers, first.text[:500]
    assert first.json()["seen"] == plain.json()["seen"]
    other = {"file": ("report.bin", second_content, "application/octet-stream")}
    clash = client.post(
        route.idempotent, files=other, data={"note": "q3"}, headers={**headers, "Idempotency-Key": "h1"}
    )
    assert clash.status_code == 422
    again = client.post(
        route.idempotent, files=files, data={"note": "q3"}, headers={**headers, "Idempotency-Key": "h1"}
    )
    assert (again.status_code, again.headers["idempotent-replayed"], again.json()) == (201, "true", first.json())
    assert Order.objects.count() == 2
    # Without a token the protected route is refused before anything is claimed.
    if route.csrf:
        assert client.post(route.idempotent, files=files, headers={"Idempotency-Key": "h2"}).status_code == 403


def _cut_short(live_server: Any, path: str, headers: dict[str, str], body: bytes) -> bytes:
    """Send the headers and half the body over a raw socket, then stop sending: a dropped upload."""
    url = urlsplit(live_server.url)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Length: {len(body)}\r\n{head}Connection: close\r\n\r\n"
    )
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(request.encode() + body[: len(body) // 2])
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


@pytest.mark.parametrize("kind", ["multipart", "urlencoded", "json"])
def test_an_upload_cut_short_claims_nothing_so_its_retry_runs(http, route, live_server, kind):
    """The client went away mid-body: the view must not run on half of it and hold the key against the retry."""
    client, headers = http
    if kind == "multipart":
        body, content_type = multipart([("note", "n")], [("file", "a.bin", os.urandom(600_000))])
    elif kind == "urlencoded":
        body, content_type = b"note=" + b"x" * 600_000, "application/x-www-form-urlencoded"
    else:
        body, content_type = json.dumps({"note": "x" * 600_000}).encode(), "application/json"
    raw_headers = {
        "Content-Type": content_type,
        "Idempotency-Key": "cut-1",
        "Cookie": f"csrftoken={client.cookies['csrftoken']}",
        **headers,
    }
    reply = _cut_short(live_server, route.idempotent, raw_headers, body)
    assert reply.startswith(b"HTTP/1.1 400 "), reply[:300]
    assert b"Request body incomplete" in reply
    assert IdempotencyRecord.objects.count() == 0
    assert Order.objects.count() == 0
    retry = client.post(
        route.idempotent, content=body, headers={**headers, "Content-Type": content_type, "Idempotency-Key": "cut-1"}
    )
    assert retry.status_code == 201 and "idempotent-replayed" not in retry.headers, retry.text[:300]
    assert Order.objects.count() == 1


@override_settings(FILE_UPLOAD_MAX_MEMORY_SIZE=64 * 1024)
def test_spooled_bodies_are_closed_with_their_responses(csrf, route):
    def open_files() -> int:
        return len(os.listdir("/proc/self/fd"))

    body, content_type = multipart(files=[("file", "a.bin", os.urandom(MB))])
    csrf.post(route.idempotent, body, content_type, key="fd-0")  # warm up: connections, imports
    before = open_files()
    for i in range(10):
        assert csrf.post(route.idempotent, body, content_type, key=f"fd-{i + 1}").status_code == 201
        assert csrf.post(route.idempotent, body, content_type, key=f"fd-{i + 1}")["Idempotent-Replayed"] == "true"
    assert open_files() <= before


def _write_file(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with path.open("wb") as out:
        for _ in range(size // MB):
            chunk = os.urandom(MB)
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("data_upload_max", "file_upload_max"),
    [(TWO_AND_A_HALF_MB, 256 * 1024), (None, 256 * 1024), (TWO_AND_A_HALF_MB, 0)],
    ids=["default-limit", "no-limit", "files-always-on-disk"],
)
def test_a_20_mb_upload_is_fingerprinted_without_holding_it_in_memory(
    http, route, tmp_path, data_upload_max, file_upload_max
):
    client, headers = http
    path = tmp_path / "big.bin"
    digest = _write_file(path, 20 * MB)
    with override_settings(FILE_UPLOAD_MAX_MEMORY_SIZE=file_upload_max, DATA_UPLOAD_MAX_MEMORY_SIZE=data_upload_max):
        tracemalloc.start()
        try:
            with path.open("rb") as upload:  # httpx streams a file object: the client holds no copy
                response = client.post(
                    route.idempotent,
                    files={"file": ("big.bin", upload, "application/octet-stream")},
                    headers={**headers, "Idempotency-Key": "big-1"},
                )
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert response.status_code == 201, response.text[:500]
        seen = response.json()["seen"]["files"]["file"][0]
        assert (seen["sha256"], seen["size"], seen["on_disk"]) == (digest, 20 * MB, True)
        assert peak < 2 * MB, f"peak {peak / MB:.1f} MB while handling a 20 MB upload"
        with path.open("rb") as upload:
            again = client.post(
                route.idempotent,
                files={"file": ("big.bin", upload, "application/octet-stream")},
                headers={**headers, "Idempotency-Key": "big-1"},
            )
        assert again.headers.get("idempotent-replayed") == "true"
        assert Order.objects.count() == 1


# --- ASGI: the body arrives in pieces, with or without Content-Length -------------------------------------


@dataclass(frozen=True)
class AsgiReply:
    status: int
    headers: dict[str, str]
    body: bytes


def asgi(method: str, path: str, chunks: list[bytes], headers: dict[str, str]) -> AsgiReply:
    """One request through Django's ASGI handler, its body in several ``http.request`` messages."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (k.lower().encode("latin1"), v.encode("latin1")) for k, v in {"host": "testserver", **headers}.items()
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[dict[str, Any]] = []

    async def run() -> None:
        never = asyncio.Event()

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await never.wait()  # the client stays connected
            raise AssertionError

        async def send(message: Mapping[str, Any]) -> None:
            sent.append(dict(message))

        await ASGIHandler()(scope, receive, send)

    asyncio.run(run())
    start = next(m for m in sent if m["type"] == "http.response.start")
    reply_headers: dict[str, str] = {}
    for name, value in start["headers"]:
        reply_headers.setdefault(name.decode("latin1").lower(), value.decode("latin1"))
        if name.lower() == b"set-cookie":
            cookie = SimpleCookie(value.decode("latin1"))
            reply_headers.update({f"cookie:{k}": m.value for k, m in cookie.items()})
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return AsgiReply(start["status"], reply_headers, body)


def asgi_post(path: str, chunks: list[bytes], headers: dict[str, str]) -> AsgiReply:
    return asgi("POST", path, chunks, headers)


def pieces(data: bytes, size: int = 256 * 1024) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=TWO_AND_A_HALF_MB)
def test_asgi_multipart_upload_with_content_length():
    first_content, second_content = two_files(3 * MB)
    body, content_type = multipart(files=[("file", "r.bin", first_content)])
    headers = {"content-type": content_type, "content-length": str(len(body)), "idempotency-key": "a1"}
    first = asgi_post("/probe/upload-exempt/", pieces(body), headers)
    assert first.status == 201, first.body[:500]
    assert json.loads(first.body)["seen"]["files"]["file"][0]["sha256"] == sha256(first_content)
    body2, type2 = multipart(files=[("file", "r.bin", first_content)])
    again = asgi_post("/probe/upload-exempt/", pieces(body2), {**headers, "content-type": type2})
    assert (again.status, again.headers.get("idempotent-replayed"), again.body) == (201, "true", first.body)
    body3, type3 = multipart(files=[("file", "r.bin", second_content)])
    clash = asgi_post("/probe/upload-exempt/", pieces(body3), {**headers, "content-type": type3})
    assert clash.status == 422


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=TWO_AND_A_HALF_MB)
def test_asgi_chunked_bodies_without_content_length():
    """An ASGI server hands Django a chunked body without Content-Length; it is fingerprinted all the same."""
    data = json.dumps({"items": ["mug"] * 1000}).encode()
    headers = {"content-type": "application/json", "transfer-encoding": "chunked", "idempotency-key": "c1"}
    first = asgi_post("/probe/upload-exempt/", pieces(data, 1000), headers)
    assert first.status == 201, first.body[:500]
    assert json.loads(first.body)["seen"] == {"body_sha256": sha256(data)}
    again = asgi_post("/probe/upload-exempt/", pieces(data, 777), headers)
    assert (again.status, again.headers.get("idempotent-replayed")) == (201, "true")
    other = json.dumps({"items": ["pot"] * 1000}).encode()
    assert asgi_post("/probe/upload-exempt/", pieces(other, 1000), headers).status == 422

    # Django parses no form without Content-Length: the plain view runs with an empty form, and so does
    # the @idempotent one, whose fingerprint then covers the raw bytes, so different uploads still differ.
    first_content, second_content = two_files(3 * MB)
    body, content_type = multipart(files=[("file", "r.bin", first_content)])
    chunked = {"content-type": content_type, "transfer-encoding": "chunked"}
    plain = asgi_post("/probe/upload-plain-exempt/", pieces(body), chunked)
    assert plain.status == 201 and json.loads(plain.body)["seen"] == {"fields": {}, "files": {}}
    first = asgi_post("/probe/upload-exempt/", pieces(body), {**chunked, "idempotency-key": "c2"})
    assert first.status == 201, first.body[:500]
    other_body, _ = multipart(files=[("file", "r.bin", second_content)], boundary=content_type.split("=", 1)[1])
    assert asgi_post("/probe/upload-exempt/", pieces(other_body), {**chunked, "idempotency-key": "c2"}).status == 422


def test_asgi_behind_the_csrf_middleware():
    """The CSRF middleware parses the form from Django's ASGI body file before the view, as under WSGI."""
    start = asgi_get_token()
    first_content, second_content = two_files(500_000)
    body, content_type = multipart(files=[("file", "r.bin", first_content)])
    headers = {
        "content-type": content_type,
        "content-length": str(len(body)),
        "idempotency-key": "p1",
        "cookie": start["cookie"],
        "x-csrftoken": start["token"],
    }
    first = asgi_post("/probe/upload/", pieces(body), headers)
    assert first.status == 201, first.body[:500]
    body2, type2 = multipart(files=[("file", "r.bin", second_content)])
    headers2 = {**headers, "content-type": type2, "content-length": str(len(body2))}
    assert asgi_post("/probe/upload/", pieces(body2), headers2).status == 422
    body3, type3 = multipart(files=[("file", "r.bin", first_content)])
    headers3 = {**headers, "content-type": type3, "content-length": str(len(body3))}
    assert asgi_post("/probe/upload/", pieces(body3), headers3).headers.get("idempotent-replayed") == "true"
    assert asgi_post("/probe/upload/", pieces(body3), {**headers3, "x-csrftoken": ""}).status == 403


def asgi_get_token() -> dict[str, str]:
    reply = asgi("GET", "/probe/csrf/", [b""], {})
    return {"token": json.loads(reply.body)["token"], "cookie": f"csrftoken={reply.headers['cookie:csrftoken']}"}
