"""Real servers on loopback for transport tests: SMTP (aiosmtpd) and HTTP (http.server), each in a thread."""

from __future__ import annotations

import socket
import threading
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

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: Any) -> str:
        if address in self.refuse:
            return self.refuse[address]
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
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
