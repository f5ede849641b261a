"""Failure alerts: by email and by webhook, at most once per (job, kind) per window.

:mod:`.message` says what an alert contains and writes it (one function, where redaction
applies); :mod:`.sinks` delivers it; :mod:`.alerter` decides, from the daemon's typed
events, what to send and when.

Layering: a shell package beside the executors. It imports value modules and, for the
one statement it sends, the store's types; never the daemon, the admin face, the
service or the client. ``service.py`` makes one and attaches it to the daemon.
"""

from __future__ import annotations

from .alerter import Alerter, drop_outbox
from .message import KINDS, Alert, Message, render
from .sinks import SIGNATURE_HEADER, DeliveryFailed, EmailSink, Sink, WebhookSink, signature

__all__ = [
    "KINDS",
    "SIGNATURE_HEADER",
    "Alert",
    "Alerter",
    "DeliveryFailed",
    "EmailSink",
    "Message",
    "Sink",
    "WebhookSink",
    "drop_outbox",
    "render",
    "signature",
]
