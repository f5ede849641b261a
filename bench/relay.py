"""A TCP relay standing for one host's network path to PostgreSQL (bench/hosts.py, and
the cross-host acceptance test).

``cut()`` is the host falling off the network as the server finally sees it: every
connection through the relay ends and new ones are refused (what PostgreSQL's TCP
keepalive does to a vanished host's sessions, after ``tcp_keepalives_idle`` +
``tcp_keepalives_interval`` x ``tcp_keepalives_count``); ``restore()`` brings the path
back. Threads, not an event loop: it serves processes, whatever the caller runs.
"""

from __future__ import annotations

import contextlib
import socket
import threading

import attrs


@attrs.define(eq=False)
class Relay:
    """Listens on 127.0.0.1 (``port``) and forwards to ``target``."""

    target: tuple[str, int]
    listener: socket.socket = attrs.field(init=False)
    port: int = attrs.field(init=False)
    up: bool = True
    _pairs: list[tuple[socket.socket, socket.socket]] = attrs.field(factory=list)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def __attrs_post_init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """End every connection through the relay and refuse new ones."""
        self.up = False
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in pair:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self.cut()
        self.listener.close()

    def dsn(self, dsn: str) -> str:
        """``dsn`` (a ``postgresql://user@host:port/db`` URL) through this relay."""
        from urllib.parse import urlsplit

        parts = urlsplit(dsn)
        return parts._replace(netloc=f"{parts.username}@127.0.0.1:{self.port}").geturl()
