"""Real receivers for the alert tests: an SMTP server (aiosmtpd, in its own thread) and
an HTTP server (the standard library's, in its own thread), and a wall clock a test can
move forward (alert windows are wall time)."""

from __future__ import annotations

import asyncio
import email
import email.policy
import threading
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
from aiosmtpd.controller import Controller

from coordinator.embedded import free_port


@attrs.define(eq=False)
class OffsetClock:
    """The real wall clock plus an offset the test moves (a window passes at once)."""

    offset: timedelta = timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset


class _Mailbox:
    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []
        self.envelopes: list[tuple[str, list[str]]] = []

    async def handle_DATA(self, _server: Any, _session: Any, envelope: Any) -> str:
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        self.messages.append(message)
        self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        return "250 OK"


@attrs.define(eq=False)
class SmtpServer:
    """An SMTP server on 127.0.0.1 that keeps every message it receives."""

    port: int = attrs.field(factory=free_port)
    box: _Mailbox = attrs.field(factory=_Mailbox)
    _controller: Controller | None = None

    @property
    def messages(self) -> list[EmailMessage]:
        return self.box.messages

    def start(self) -> None:
        # A plain asyncio loop of its own: the test process's policy is trio-asyncio's.
        self._controller = Controller(
            self.box, hostname="127.0.0.1", port=self.port, loop=asyncio.SelectorEventLoop()
        )
        self._controller.start()

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller.loop.close()
            self._controller = None


@attrs.frozen
class Request:
    path: str
    headers: dict[str, str]
    body: bytes


@attrs.define(eq=False)
class HttpReceiver:
    """An HTTP server on 127.0.0.1 that records every POST and answers ``status``."""

    port: int = attrs.field(factory=free_port)
    status: int = 200
    requests: list[Request] = attrs.field(factory=list)
    #: Every answer, accepted or not (status, body).
    answers: list[int] = attrs.field(factory=list)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    @property
    def accepted(self) -> list[Request]:
        return [r for r, code in zip(self.requests, self.answers, strict=True) if code < 300]

    def start(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                owner.requests.append(Request(self.path, dict(self.headers.items()), body))
                owner.answers.append(owner.status)
                self.send_response(owner.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
