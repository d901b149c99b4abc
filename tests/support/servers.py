"""Real servers on loopback for transport tests: SMTP (aiosmtpd) and HTTP (http.server), each in a thread."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Received:
    mail_from: str
    rcpt_tos: list[str]
    data: bytes


class SMTPHandler:
    """Accepts everything, except recipients listed in ``refuse`` (address to SMTP reply)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.refuse: dict[str, str] = {}
        self.data_delay = 0.0  # seconds to sit on DATA before answering (a slow server)

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: Any) -> str:
        if address in self.refuse:
            return self.refuse[address]
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.data_delay:
            await asyncio.sleep(self.data_delay)
        self.received.append(Received(envelope.mail_from, list(envelope.rcpt_tos), envelope.original_content))
        return "250 Message accepted for delivery"


class SMTPServer:
    def __init__(self, port: int | None = None) -> None:
        from aiosmtpd.controller import Controller

        self.port = port or free_port()
        self.handler = SMTPHandler()
        self.controller = Controller(self.handler, hostname="127.0.0.1", port=self.port)
        self.controller.start()

    @property
    def received(self) -> list[Received]:
        return self.handler.received

    def stop(self) -> None:
        self.controller.stop()


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    client_port: int = 0


@dataclass
class Reply:
    status: int = 200
    body: bytes = b"ok"
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


class HTTPServer:
    """Records every request; ``replies`` (a queue, then ``default``) decide the answers."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.replies: list[Reply] = []
        self.default = Reply()
        self.before_reply: Callable[[Request], None] | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, so connection reuse is visible

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                request = Request("POST", self.path, headers, self.rfile.read(length), self.client_address[1])
                outer.requests.append(request)
                reply = outer.replies.pop(0) if outer.replies else outer.default
                if reply.delay:
                    threading.Event().wait(reply.delay)
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), name="test-http", daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class SlowServer:
    """A TCP server on loopback that misbehaves on purpose, one thread per connection.

    ``mode``:
    - ``"silent"``: accepts the connection and never sends a byte (a hung receiver, SMTP server or broker);
    - ``"drip-headers"``: reads an HTTP request, then sends ``200 OK`` and its headers one byte at a time;
    - ``"drip-body"``: reads an HTTP request, sends the headers at once, then the body one byte at a time;
    - ``"drip-greeting"``: sends an endless line (an SMTP greeting, a broker banner) one byte at a time;
    - ``"drip-tls"``: reads a TLS ClientHello, then answers with a handshake record one byte at a time.

    Bytes go out every ``interval`` seconds, for at most ``limit`` seconds per connection, so a client
    without a whole-request deadline is held for ``limit`` seconds (and then, for the HTTP modes,
    answered 200), long enough for a test to tell.
    """

    HTTP_HEAD = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 4000\r\nX-Padding: " + b"p" * 200 + b"\r\n\r\n"
    )

    def __init__(self, mode: str, *, interval: float = 0.2, limit: float = 30.0) -> None:
        self.mode = mode
        self.interval = interval
        self.limit = limit
        self.accepted = 0
        self.closed_by_client = threading.Event()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self._threads: list[threading.Thread] = []
        self._accept_thread = threading.Thread(target=self._accept, name=f"test-slow-{mode}", daemon=True)
        self._accept_thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _read_request(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data and not self._stop.is_set():
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return
            body += chunk

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(self.limit)
            try:
                if self.mode == "silent":
                    self._wait_for_close(conn)
                    return
                if self.mode in ("drip-headers", "drip-body"):
                    self._read_request(conn)
                if self.mode == "drip-tls":
                    conn.recv(65536)  # the ClientHello
                if self.mode == "drip-body":
                    conn.sendall(self.HTTP_HEAD)
                if self.mode == "drip-headers":
                    data = self.HTTP_HEAD + b"x" * 4000
                elif self.mode == "drip-body":
                    data = b"x" * 4000
                elif self.mode == "drip-tls":
                    data = b"\x16\x03\x03\x40\x00" + b"\x02" * 16384  # a 16 KiB handshake record
                else:
                    data = b"2" * 100_000
                self._drip(conn, data)
            except OSError:
                self.closed_by_client.set()

    def _drip(self, conn: socket.socket, data: bytes) -> None:
        ends = time.monotonic() + self.limit
        for index in range(len(data)):
            if time.monotonic() >= ends:
                conn.sendall(data[index:])  # give up being slow: a client without a deadline then finishes
                return
            conn.sendall(data[index : index + 1])
            if self._stop.wait(self.interval):
                return

    def _wait_for_close(self, conn: socket.socket) -> None:
        ends = time.monotonic() + self.limit
        conn.settimeout(0.1)
        while time.monotonic() < ends and not self._stop.is_set():
            try:
                if not conn.recv(65536):
                    self.closed_by_client.set()
                    return
            except TimeoutError:
                continue

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        self._accept_thread.join(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)
