"""The daemon's events as server-sent events: what live views follow instead of polling.

One bounded stream (:meth:`~coordinator.events.EventBus.open_stream`) per open page or
``coordinator top``, closed when the client goes. Events become small JSON messages that
say *what changed* — a run of job 12 started, run 345 reported 40 %, the jobs in general
changed — so that a view reads the database only for that (or, for progress, not at
all). With nothing happening no event is sent and no SQL; only a comment line
(``: keep-alive``) after :data:`KEEP_ALIVE` seconds of silence, so that a proxy's idle
timeout (nginx's ``proxy_read_timeout``: 60 s) does not drop the stream, after which the
page would read everything it shows again. A browser's ``EventSource`` and ``top`` skip
comments: the keep-alive costs the view nothing, and the one timer exists only while a
client holds a stream open.

=====================  =========  =========================================================
event                  message    data
=====================  =========  =========================================================
``DispatchWake``       ``run``    ``job_id``, ``run``, ``status: queued``
``RunStarted``         ``run``    ``job_id``, ``job``, ``run``, ``status: running``, ...
``RunFinished``        ``run``    ``job_id``, ``job``, ``run``, ``status`` (the outcome:
                                 ``paused`` too), ``attempt``, ``category``, ``retry`` (the
                                 run queued to retry it), ``retry_at``, ``resumes``, ...
``RunGivenBack``       ``run``    ``job_id``, ``job``, ``run``, ``status: queued`` (waits
                                 again) or ``paused`` (paused meanwhile), or ``job`` (a
                                 run of the schedule: removed)
``RunProgress``        progress   ``run``, ``percent``, ``label``, ``message``
``ClaimRejected``      ``job``    ``job_id``, ``run``, ``reason``
``NotificationWake``   ``job``    ``job_id`` (one job changed), ``run`` (a queued run, or
                                 ``status: cancel_requested`` without ``job_id``: an
                                 operator paused it), else ``jobs`` (any may have)
``Refreshed``          ``jobs``   only when it saved first deadlines or found bad schedules
``Worker*``            worker     ``worker``, ``connected``, ``types``
``StateChanged``       status     ``state``, ``reasons``
``Result*``            status     ``run``, ``held``
``Missed``             missed     ``count`` (the view reloads what it shows)
=====================  =========  =========================================================

A stream ends after the daemon says it is stopping (the client reconnects to whatever
serves next).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

import trio
from starlette.responses import Response

from ..events import (
    ClaimRejected,
    DispatchWake,
    Event,
    EventBus,
    Missed,
    NotificationWake,
    Refreshed,
    ResultHeld,
    ResultSaved,
    ResultSpooled,
    RunFinished,
    RunGivenBack,
    RunProgress,
    RunStarted,
    StateChanged,
    WorkerConnected,
    WorkerDisconnected,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from starlette.types import Receive, Scope, Send

#: Events an open view may fall behind by before it is told to reload.
VIEW_BUFFER: Final = 256
#: How long a browser waits before reconnecting a dropped stream (milliseconds).
RETRY_MS: Final = 3000
#: Seconds a stream may stay silent before it sends a comment line (below common proxy
#: idle timeouts: nginx's and AWS ALB's 60 s).
KEEP_ALIVE: Final = 25.0
#: What it sends then: an SSE comment, which clients ignore.
KEEP_ALIVE_LINE: Final = b": keep-alive\n\n"
#: Longest error text carried in a ``run`` message.
MAX_ERROR: Final = 300

_ENDING: Final = frozenset({"stopping", "stopped"})


def message(event: Event) -> tuple[str, dict[str, Any]] | None:
    """The message a live view gets for ``event``, or ``None`` when it concerns none."""
    if isinstance(event, DispatchWake):
        return "run", {"job_id": event.job_id, "run": event.dispatch, "status": "queued"}
    if isinstance(event, RunStarted):
        return "run", {
            "job_id": event.job_id,
            "job": event.job,
            "run": event.run,
            "status": "running",
            "trigger": event.trigger,
            "attempt": event.attempt,
        }
    if isinstance(event, RunFinished):
        error = event.error[:MAX_ERROR] if event.error else None
        return "run", {
            "job_id": event.job_id,
            "job": event.job,
            "run": event.run,
            "status": event.outcome,
            "trigger": event.trigger,
            "cause": event.cause,
            "elapsed_ms": event.elapsed_ms,
            "error": error,
            "attempt": event.attempt,
            "category": event.category,
            "retry": event.retry,
            "retry_at": event.retry_at.isoformat() if event.retry_at is not None else None,
            "exhausted": event.exhausted,
            "resumes": event.resumes,
        }
    if isinstance(event, RunGivenBack):
        if event.became in ("queued", "paused"):
            return "run", {
                "job_id": event.job_id,
                "job": event.job,
                "run": event.run,
                "status": event.became,
            }
        return "job", {"job_id": event.job_id}
    if isinstance(event, RunProgress):
        return "progress", {
            "run": event.run,
            "percent": event.percent,
            "label": event.label,
            "message": event.message,
        }
    if isinstance(event, ClaimRejected):
        return "job", {"job_id": event.job_id, "run": event.run, "reason": event.reason}
    if isinstance(event, NotificationWake):
        job, run, keys = event.payload.get("job"), event.payload.get("run"), set(event.payload)
        if isinstance(job, int) and isinstance(run, int) and keys == {"job", "run"}:
            # A queued run the daemon reads before claiming (e.g. nobody serves its type).
            return "run", {"job_id": job, "run": run, "status": "queued"}
        if isinstance(job, int) and keys == {"job"}:
            return "job", {"job_id": job}
        paused = event.payload.get("pause")
        if isinstance(paused, int) and keys == {"pause"}:
            # An operator paused a running run (coordinator.pause_run): it is pausing.
            return "run", {"run": paused, "status": "cancel_requested"}
        return "jobs", {}
    if isinstance(event, Refreshed):
        return ("jobs", {}) if event.initialised or event.invalid else None
    if isinstance(event, WorkerConnected):
        return "worker", {"worker": event.worker, "connected": True, "types": list(event.types)}
    if isinstance(event, WorkerDisconnected):
        return "worker", {"worker": event.worker, "connected": False, "reason": event.reason}
    if isinstance(event, StateChanged):
        return "status", {"state": event.state, "reasons": list(event.reasons)}
    if isinstance(event, ResultHeld | ResultSaved | ResultSpooled):
        return "status", {"run": event.run, "held": isinstance(event, ResultHeld)}
    if isinstance(event, Missed):
        return "missed", {"count": event.count}
    return None


def encode(kind: str, data: dict[str, Any]) -> bytes:
    """One server-sent event (``event:`` and a one-line ``data:``)."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=True)
    return f"event: {kind}\ndata: {text}\n\n".encode()


class EventSourceResponse(Response):
    """``text/event-stream`` of the bus's events until the client goes or the daemon
    stops; the bus stream is closed however it ends."""

    media_type = "text/event-stream"

    def __init__(
        self,
        bus: EventBus,
        *,
        visible: Callable[[Event], bool] | None = None,
        vague: Callable[[Event], bool] | None = None,
    ) -> None:
        # Not Response.__init__: it would declare an empty body (Content-Length: 0).
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-store"),
            (b"x-accel-buffering", b"no"),
        ]
        self.bus = bus
        #: Which events this client may see (an admin token's scope); ``None``: all.
        self.visible = visible
        #: Which of them it is told only that jobs changed (``access.event_vague``).
        self.vague = vague

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stream = self.bus.open_stream(VIEW_BUFFER)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await send(
                {
                    "type": "http.response.body",
                    "body": f"retry: {RETRY_MS}\n: live\n\n".encode(),
                    "more_body": True,
                }
            )
            gone = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_until_disconnect, receive, nursery.cancel_scope, gone)
                quiet_until = trio.current_time() + KEEP_ALIVE
                while True:
                    event: Event | None = None
                    with trio.move_on_at(quiet_until):
                        try:
                            event = await stream.receive.receive()
                        except (trio.EndOfChannel, trio.ClosedResourceError):
                            break
                    # (None: nothing came in time. A receive cancelled loses no event.)
                    chunk = KEEP_ALIVE_LINE if event is None else self._chunk(event)
                    if chunk is not None:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                        # (Silence is counted from the last thing sent.)
                        quiet_until = trio.current_time() + KEEP_ALIVE
                    if isinstance(event, StateChanged) and event.state in _ENDING:
                        break
                nursery.cancel_scope.cancel()
            if not gone.is_set():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client went while we wrote
        finally:
            self.bus.close_stream(stream)

    def _chunk(self, event: Event) -> bytes | None:
        """What this client is sent for ``event``, if anything."""
        if self.visible is not None and not self.visible(event):
            return None
        found = message(event)
        if found is not None and self.vague is not None and self.vague(event):
            found = ("jobs", {})
        return None if found is None else encode(*found)


async def _until_disconnect(receive: Receive, scope: trio.CancelScope, gone: trio.Event) -> None:
    while True:
        incoming = await receive()
        if incoming["type"] == "http.disconnect":
            gone.set()
            scope.cancel()
            return


__all__ = ["EventSourceResponse", "encode", "message"]
