"""Where alerts go: email over SMTP and a webhook (a JSON POST), both optional.

Each sink sends one :class:`~coordinator.alerts.message.Message` and raises
:class:`DeliveryFailed` (one line, no secret in it) when it could not; the
:class:`~coordinator.alerts.alerter.Alerter` retries with backoff. The standard
library's ``smtplib`` and ``urllib`` do the talking, in a worker thread: the trio loop
is never blocked, and a cancelled delivery is abandoned (its thread ends on its own
timeout).

The webhook body is signed when a secret is configured: the header
:data:`SIGNATURE_HEADER` carries ``sha256=`` and the hex HMAC-SHA256 of the exact body
bytes with the secret as key (:func:`signature`; receivers compare it in constant time).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import smtplib
import ssl
import urllib.error
import urllib.request
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs
import trio

if TYPE_CHECKING:
    from .message import Message

#: The header that carries the webhook body's signature.
SIGNATURE_HEADER: Final = "X-Coordinator-Signature"
#: Seconds one delivery may take before it counts as failed.
DEFAULT_TIMEOUT: Final = 30.0


class DeliveryFailed(Exception):
    """A sink could not deliver a message; the text says why in one line."""


class Sink(Protocol):
    """One way out for alerts."""

    #: ``email`` or ``webhook`` (log fields and metrics labels).
    name: str

    async def send(self, message: Message, *, headers: dict[str, str]) -> None:
        """Deliver ``message`` or raise :class:`DeliveryFailed`. ``headers``: a few
        ``X-Coordinator-*`` values for filtering (job, kind, run)."""
        ...


def signature(secret: str, body: bytes) -> str:
    """The value of :data:`SIGNATURE_HEADER` for ``body``: ``sha256=<hex HMAC>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


@attrs.define(eq=False)
class EmailSink:
    """Plain-text email through an SMTP server (STARTTLS, implicit TLS, or neither)."""

    host: str
    port: int
    sender: str
    recipients: tuple[str, ...]
    starttls: bool = False
    tls: bool = False
    user: str | None = None
    password: str | None = attrs.field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT
    #: TLS context (tests pass one that trusts their own certificate).
    context: ssl.SSLContext | None = attrs.field(default=None, repr=False)
    name: str = "email"

    def build(self, message: Message, headers: dict[str, str]) -> EmailMessage:
        """The email as sent (exposed for tests and the README's example)."""
        mail = EmailMessage()
        mail["Subject"] = message.subject
        mail["From"] = self.sender
        mail["To"] = ", ".join(self.recipients)
        mail["Date"] = formatdate(usegmt=True)
        mail["Message-ID"] = make_msgid(domain=self.sender.rpartition("@")[2] or None)
        for key, value in headers.items():
            mail[key] = value
        mail.set_content(message.text)
        return mail

    def _send(self, mail: EmailMessage) -> None:
        context = self.context or ssl.create_default_context()
        smtp: smtplib.SMTP
        if self.tls:
            smtp = smtplib.SMTP_SSL(self.host, self.port, timeout=self.timeout, context=context)
        else:
            smtp = smtplib.SMTP(self.host, self.port, timeout=self.timeout)
        with smtp:
            if self.starttls:
                smtp.starttls(context=context)
            if self.user:
                smtp.login(self.user, self.password or "")
            smtp.send_message(mail)

    async def send(self, message: Message, *, headers: dict[str, str]) -> None:
        mail = self.build(message, headers)
        try:
            await trio.to_thread.run_sync(self._send, mail, abandon_on_cancel=True)
        except (OSError, smtplib.SMTPException, ssl.SSLError) as exc:
            raise DeliveryFailed(f"smtp {self.host}:{self.port}: {_one_line(exc)}") from None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: a POST is never replayed elsewhere (nor turned into GET)."""

    def redirect_request(self, *_args: Any, **_kwargs: Any) -> None:
        return None


@attrs.define(eq=False)
class WebhookSink:
    """A JSON POST to an HTTPS URL (or a loopback HTTP one); any 2xx is delivered."""

    url: str
    secret: str | None = attrs.field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT
    context: ssl.SSLContext | None = attrs.field(default=None, repr=False)
    name: str = "webhook"

    def request(self, message: Message, headers: dict[str, str]) -> urllib.request.Request:
        """The request as sent (exposed for tests)."""
        body = json.dumps(message.payload, separators=(",", ":"), sort_keys=True).encode()
        all_headers = {
            "Content-Type": "application/json",
            "User-Agent": "coordinator-alerts/1",
            **headers,
        }
        if self.secret:
            all_headers[SIGNATURE_HEADER] = signature(self.secret, body)
        return urllib.request.Request(self.url, data=body, headers=all_headers, method="POST")

    def _send(self, request: urllib.request.Request) -> None:
        handlers: list[urllib.request.BaseHandler] = [_NoRedirects()]
        if self.context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=self.context))
        opener = urllib.request.build_opener(*handlers)
        try:
            with opener.open(request, timeout=self.timeout) as response:
                response.read(65536)
        except urllib.error.HTTPError as exc:
            exc.close()  # it holds the response
            raise DeliveryFailed(f"webhook answered {exc.code} {exc.reason}") from None

    async def send(self, message: Message, *, headers: dict[str, str]) -> None:
        request = self.request(message, headers)
        try:
            await trio.to_thread.run_sync(self._send, request, abandon_on_cancel=True)
        except DeliveryFailed:
            raise
        except OSError as exc:  # URLError is an OSError
            raise DeliveryFailed(f"webhook: {_one_line(exc)}") from None
        except ValueError as exc:  # (its text may quote the URL, whose path may be a secret)
            raise DeliveryFailed(f"webhook: the URL was refused ({type(exc).__name__})") from None


__all__ = [
    "DEFAULT_TIMEOUT",
    "SIGNATURE_HEADER",
    "DeliveryFailed",
    "EmailSink",
    "Sink",
    "WebhookSink",
    "signature",
]
