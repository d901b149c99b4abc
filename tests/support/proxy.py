"""A TCP proxy on loopback that can cut and refuse connections: broker outages for tests and tests/chaos/run.py.

Needs nothing but the standard library, so the chaos runner can use it before Django is set up.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class FlakyProxy:
    """A TCP proxy on loopback in front of a broker; ``down()`` cuts every connection and refuses new ones.

    Refusing means accepting and closing at once, so the port stays ours while the "broker" is away.
    ``freeze()`` keeps every connection open but forwards nothing more either way (a hung broker, or a
    network that silently drops packets) until ``thaw()``. ``hold_answers()`` forwards every request to
    the broker but none of its answers until ``release_answers()``: a broker that acts and answers late.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._up = threading.Event()
        self._up.set()
        self._flowing = threading.Event()
        self._flowing.set()
        self._answering = threading.Event()
        self._answering.set()
        self._closed = False
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="flaky-proxy", daemon=True)
        self._thread.start()

    def down(self) -> None:
        self._up.clear()
        self._drop_all()

    def up(self) -> None:
        self._up.set()

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def hold_answers(self) -> None:
        self._answering.clear()

    def release_answers(self) -> None:
        self._answering.set()

    def close(self) -> None:
        self._closed = True
        self._drop_all()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(timeout=5)

    def _drop_all(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._up.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.update((client, upstream))
            for source, sink, answers in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pipe, args=(source, sink, answers), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                while not (self._flowing.wait(0.1) and (not answers or self._answering.wait(0.1))):
                    if self._closed:
                        return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with self._lock:
                    self._sockets.discard(sock)
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
