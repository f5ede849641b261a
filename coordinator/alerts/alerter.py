"""The alerter: a subscriber of the daemon's typed events that tells people about
failures, at most once per (job, kind) per window, without ever holding the daemon up.

:meth:`Alerter.observe` runs inside :meth:`~coordinator.events.EventBus.emit`, so it only
decides what it can from memory and queues the rest:

- a run that ended ``failed`` or ``timed_out`` with no retry to follow (its job's retries
  exhausted, or none allowed) is a ``failed`` alert; a failed attempt a retry follows is
  none; a run the crash sweep left ``unresolved`` is an ``unresolved`` one; a run whose
  call reported findings of severity ``error`` or ``data_loss`` (recoverable runs'
  consistency checks) is a ``findings`` one, told when the call ends (finished or paused),
  with the findings counted by kind and severity and the worst as an example;
- a (job, kind) whose window is known to be open is suppressed at once (no SQL: the next
  alert counts it from the runs table); a job known to say ``alert = false`` is ignored
  (until a wake says the job changed);
- anything else waits in a bounded queue for :meth:`Alerter.run`, a task of its own.

The task asks the database whether the window is open (``coordinator._alert_open``, one
statement that writes only when an alert is due; the window survives restarts, so a
crash-looping daemon does not mail-bomb), renders the alert once
(:func:`~coordinator.alerts.message.render`, where redaction applies) and hands it to
every sink in a task of its own, retried with capped backoff (``alert.failed`` each time)
until it is delivered or older than the window. A database failure goes through the
daemon's error policy (``alert_window.failed``) and is retried.

With no sink configured no alerter is made at all: no subscriber, no task, nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections import deque
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs
import trio

from ..backoff import backoff
from ..clock import WallClock
from ..events import (
    AlertFailed,
    AlertSent,
    AlertSuppressed,
    Event,
    EventBus,
    FindingsReported,
    LifecycleWake,
    NotificationWake,
    RunFinished,
    RunLost,
)
from ..files import make_state_dir, private_text, write_private
from .message import Alert, Message, render
from .sinks import DeliveryFailed, Sink

if TYPE_CHECKING:
    from ..store import AlertWindow

#: Alerts waiting for their window to be read, at most (beyond: dropped, with a warning).
QUEUE_LIMIT: Final = 1000
#: Outcomes of a finished run that are worth an alert.
_FAILED: Final = frozenset({"failed", "timed_out"})


class WindowStore(Protocol):
    """The one statement the alerter sends (:meth:`coordinator.store.Store.alert_open`)."""

    async def alert_open(
        self, *, job_id: int, kind: str, run_id: int, now: datetime, window: timedelta
    ) -> AlertWindow: ...


def _same(text: str) -> str:
    return text


def _no_url(_run: int) -> str | None:
    return None


@attrs.frozen(kw_only=True)
class _Candidate:
    """A run worth an alert, before its window is known."""

    kind: str
    job_id: int
    #: ``namespace/name`` when the event said it (a lost run's event does not).
    job: str | None
    run: int
    outcome: str
    cause: str | None = None
    category: str | None = None
    error: str | None = None
    attempt: int | None = None
    exhausted: bool | None = None
    elapsed_s: float | None = None
    at: datetime
    event: str
    findings: tuple[tuple[str, str, int], ...] = ()
    example: tuple[str, str, str] | None = None


@attrs.frozen(kw_only=True)
class _Delivery:
    """One alert on its way to one sink: what a stop that abandons it keeps in the
    outbox, and a start sends again."""

    sink: str
    job: str
    job_id: int
    kind: str
    run: int
    #: When the alert was logged: it is retried until ``at`` + the window.
    at: datetime
    suppressed: int
    message: Message

    def headers(self) -> dict[str, str]:
        return {
            "X-Coordinator-Job": self.job,
            "X-Coordinator-Kind": self.kind,
            "X-Coordinator-Run": str(self.run),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "sink": self.sink,
            "job": self.job,
            "job_id": self.job_id,
            "kind": self.kind,
            "run": self.run,
            "at": self.at.isoformat(),
            "suppressed": self.suppressed,
            "subject": self.message.subject,
            "text": self.message.text,
            "payload": self.message.payload,
        }

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> _Delivery:
        """Raises ``KeyError``, ``TypeError`` or ``ValueError`` for a record that is not
        one."""
        at = datetime.fromisoformat(record["at"])
        if at.tzinfo is None:
            raise ValueError("a naive time")
        message = Message(
            subject=str(record["subject"]), text=str(record["text"]), payload=record["payload"]
        )
        if not isinstance(message.payload, dict):
            raise TypeError("payload")
        return cls(
            sink=str(record["sink"]),
            job=str(record["job"]),
            job_id=int(record["job_id"]),
            kind=str(record["kind"]),
            run=int(record["run"]),
            at=at,
            suppressed=int(record["suppressed"]),
            message=message,
        )


@attrs.define(eq=False)
class _Found:
    """Serious findings of one call so far (until its RunFinished)."""

    counts: dict[tuple[str, str], int] = attrs.field(factory=dict)
    example: tuple[str, str, str] | None = None


#: Calls whose findings are remembered at once, at most (a bound on memory).
FOUND_LIMIT: Final = 10_000


@attrs.define(eq=False)
class Alerter:
    """Alerts for failures (see the module docstring). A daemon companion: it runs from
    the daemon's start (a standby delivers its outbox) and gets a bounded time to deliver
    what is pending at stop."""

    store: WindowStore
    events: EventBus
    clock: WallClock
    sinks: list[Sink]
    instance: str
    #: The rate limit: one alert per (job, kind) per window.
    window: timedelta = timedelta(hours=6)
    #: The daemon's error policy for the database step: ``(purpose, exc, attempt)`` ->
    #: seconds to wait (raises for a bug).
    failed: Callable[[str, BaseException, int], float] = lambda _p, _e, attempt: backoff(attempt)
    recovered: Callable[[str], None] = lambda _purpose: None
    #: The run's page on the admin web server (``None``: no page).
    run_url: Callable[[int], str | None] = _no_url
    #: Applied to the output-derived text of every alert (the security issue's redaction).
    redact: Callable[[str], str] = _same
    #: Delivery retries: the first pause and the longest (seconds).
    retry_first: float = 1.0
    retry_cap: float = 300.0
    #: Where the deliveries under way are kept, for the next start to send those a stop
    #: abandons or a crash cuts short (``None``: nowhere; they are lost, logged). The
    #: window was opened for them, so without this the next alert of their (job, kind)
    #: was suppressed too. Written ahead, as each delivery starts and ends: a ``kill -9``
    #: while a sink was failing lost its alert (a tester's finding).
    outbox: Path | None = None
    _queue: deque[_Candidate] = attrs.field(factory=deque)
    _wake: trio.Event = attrs.field(factory=trio.Event)
    #: (job id, kind) -> end of its open window (wall epoch seconds), as last read.
    _open_until: dict[tuple[int, str], float] = attrs.field(factory=dict)
    #: (job id, kind) whose window is being read now: what comes meanwhile is suppressed.
    _deciding: set[tuple[int, str]] = attrs.field(factory=set)
    #: Jobs that said ``alert = false`` (forgotten when a wake says the job changed).
    _opted_out: set[int] = attrs.field(factory=set)
    #: job id -> ``namespace/name`` as last seen.
    _keys: dict[int, str] = attrs.field(factory=dict)
    #: run id -> its serious findings so far (told when its call ends).
    _found: dict[int, _Found] = attrs.field(factory=dict)
    _nursery: trio.Nursery | None = None
    #: Deliveries under way (one per alert and sink), and set when there are none.
    _delivering: int = 0
    #: What they are (``job run N kind (sink)``), for the line that names what a stop
    #: abandons.
    _under_way: dict[int, _Delivery] = attrs.field(factory=dict)
    #: The outbox file is written by one task at a time, in a thread (it is synced: not
    #: on the loop), each write the state of then; ``_outbox_dirty``: a change waits.
    _outbox_lock: trio.Lock = attrs.field(factory=trio.Lock)
    _outbox_dirty: bool = False
    _deliveries: int = 0
    _idle: trio.Event = attrs.field(factory=trio.Event)
    _busy: bool = False
    #: Counts, for tests and the curious (the metrics count the events).
    sent: int = 0
    suppressed: int = 0
    dropped: int = 0

    # -- input: the event bus (synchronous, never blocks) --------------------------------

    def observe(self, event: Event) -> None:
        """An :class:`~coordinator.events.EventBus` subscriber."""
        if isinstance(event, FindingsReported):
            self._note_findings(event)
        elif isinstance(event, RunFinished):
            self._keys[event.job_id] = event.job
            found = self._found.pop(event.run, None)
            if found is not None:
                self._offer(
                    self._finished(
                        event,
                        "findings",
                        findings=tuple(
                            (kind, severity, n)
                            for (kind, severity), n in sorted(found.counts.items())
                        ),
                        example=found.example,
                    )
                )
            if event.outcome not in _FAILED or event.cause == "lost" or event.retry is not None:
                return
            self._offer(self._finished(event, "failed", exhausted=event.exhausted))
        elif isinstance(event, RunLost):
            if event.action != "unresolved":
                return
            self._offer(
                _Candidate(
                    kind="unresolved",
                    job_id=event.job_id,
                    job=event.job or self._keys.get(event.job_id),
                    run=event.run,
                    attempt=event.attempt,
                    outcome="unresolved",
                    cause="lost",
                    error="the daemon that ran it stopped before saving its result",
                    at=self.clock.now(),
                    event=event.NAME,
                )
            )
        elif isinstance(event, NotificationWake):
            job = event.payload.get("job")
            if isinstance(job, int):
                self._opted_out.discard(job)
            else:
                self._opted_out.clear()
        elif isinstance(event, LifecycleWake):
            self._opted_out.clear()  # notifications may have been missed

    def _note_findings(self, event: FindingsReported) -> None:
        found = self._found.get(event.run)
        if found is None:
            if len(self._found) >= FOUND_LIMIT:
                return
            found = self._found[event.run] = _Found()
        for kind, severity, n in event.counts:
            found.counts[(kind, severity)] = found.counts.get((kind, severity), 0) + n
        if found.example is None or (
            event.example[1] == "data_loss" and found.example[1] != "data_loss"
        ):
            found.example = event.example

    def _finished(
        self,
        event: RunFinished,
        kind: str,
        *,
        exhausted: bool | None = None,
        findings: tuple[tuple[str, str, int], ...] = (),
        example: tuple[str, str, str] | None = None,
    ) -> _Candidate:
        """The candidate a finished call makes: its failure, or its serious findings."""
        return _Candidate(
            kind=kind,
            job_id=event.job_id,
            job=event.job,
            run=event.run,
            outcome=event.outcome,
            cause=event.cause,
            category=event.category,
            error=event.error,
            attempt=event.attempt,
            exhausted=exhausted,
            elapsed_s=event.elapsed_s,
            at=self.clock.now(),
            event=event.NAME,
            findings=findings,
            example=example,
        )

    def _offer(self, candidate: _Candidate) -> None:
        key = (candidate.job_id, candidate.kind)
        if candidate.job_id in self._opted_out:
            return
        until = self._open_until.get(key)
        if key in self._deciding or (until is not None and until > candidate.at.timestamp()):
            self._suppress(candidate, until)
            return
        if len(self._queue) >= QUEUE_LIMIT:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                self.events.log.warning(
                    "alert.dropped", run=candidate.run, kind=candidate.kind, dropped=self.dropped
                )
            return
        self._deciding.add(key)
        self._queue.append(candidate)
        self._wake.set()

    def _suppress(self, candidate: _Candidate, until: float | None) -> None:
        self.suppressed += 1
        self.events.emit(
            AlertSuppressed(
                job=candidate.job or self._keys.get(candidate.job_id, f"#{candidate.job_id}"),
                job_id=candidate.job_id,
                kind=candidate.kind,
                run=candidate.run,
                until=datetime.fromtimestamp(until, candidate.at.tzinfo)
                if until is not None
                else candidate.at + self.window,
            )
        )

    # -- the task -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read windows and start deliveries until cancelled (a daemon companion)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._resume_outbox()
            task_status.started()
            while True:
                if not self._queue:
                    self._wake = trio.Event()
                    self._update_idle()
                    await self._wake.wait()
                    continue
                self._busy = True
                candidate = self._queue[0]
                window = await self._open(candidate)
                self._queue.popleft()
                self._busy = False
                self._deciding.discard((candidate.job_id, candidate.kind))
                self._decided(candidate, window)

    async def _open(self, candidate: _Candidate) -> AlertWindow:
        attempt = 0
        while True:
            try:
                window = await self.store.alert_open(
                    job_id=candidate.job_id,
                    kind=candidate.kind,
                    run_id=candidate.run,
                    now=candidate.at,
                    window=self.window,
                )
            except Exception as exc:
                attempt += 1
                await trio.sleep(self.failed("alert_window", exc, attempt))
                continue
            if attempt:
                self.recovered("alert_window")
            return window

    def _decided(self, candidate: _Candidate, window: AlertWindow) -> None:
        key = (candidate.job_id, candidate.kind)
        if window.name is not None:
            self._keys[candidate.job_id] = f"{window.namespace}/{window.name}"
        if window.outcome == "opted_out":
            self._opted_out.add(candidate.job_id)
            return
        if window.outcome == "gone":
            return
        until = window.until.timestamp() if window.until is not None else None
        if until is not None:
            self._open_until[key] = until
        if window.outcome != "due":
            self._suppress(candidate, until)
            return
        alert = Alert(
            kind=candidate.kind,
            job=self._keys.get(candidate.job_id, candidate.job or f"#{candidate.job_id}"),
            job_id=candidate.job_id,
            run=candidate.run,
            attempt=candidate.attempt,
            outcome=candidate.outcome,
            cause=candidate.cause,
            category=candidate.category,
            error=candidate.error,
            exhausted=candidate.exhausted,
            elapsed_s=candidate.elapsed_s,
            at=candidate.at,
            event=candidate.event,
            url=self.run_url(candidate.run),
            instance=self.instance,
            suppressed=window.suppressed,
            since=window.previous,
            window=self.window,
            findings=candidate.findings,
            example=candidate.example,
        )
        message = render(alert, redact=self.redact)
        for sink in self.sinks:
            self._start(
                sink,
                _Delivery(
                    sink=sink.name,
                    job=alert.job,
                    job_id=alert.job_id,
                    kind=alert.kind,
                    run=alert.run,
                    at=alert.at,
                    suppressed=alert.suppressed,
                    message=message,
                ),
            )

    def _start(self, sink: Sink, delivery: _Delivery) -> None:
        assert self._nursery is not None
        self._delivering += 1
        self._deliveries += 1
        key = self._deliveries
        self._under_way[key] = delivery  # (in the outbox's next write, from now on)
        self._nursery.start_soon(self._deliver, sink, delivery, key)

    async def _deliver(self, sink: Sink, alert: _Delivery, key: int) -> None:
        headers = alert.headers()
        message = alert.message
        attempt = 0
        try:
            await self._save_outbox()  # written ahead: a crash from here on loses nothing
            while True:
                attempt += 1
                try:
                    await sink.send(message, headers=headers)
                except DeliveryFailed as exc:
                    delay = backoff(attempt, base=self.retry_first, cap=self.retry_cap)
                    expired = self.clock.now() + timedelta(seconds=delay) > alert.at + self.window
                    self.events.emit(
                        AlertFailed(
                            job=alert.job,
                            kind=alert.kind,
                            run=alert.run,
                            sink=sink.name,
                            error=str(exc),
                            attempt=attempt,
                            retry_s=None if expired else delay,
                        )
                    )
                    if expired:
                        # A newer alert of this (job, kind) may go out by now.
                        await self._done_with(key)
                        return
                    await trio.sleep(delay)
                    continue
                self.sent += 1
                await self._done_with(key)
                self.events.emit(
                    AlertSent(
                        job=alert.job,
                        job_id=alert.job_id,
                        kind=alert.kind,
                        run=alert.run,
                        sink=sink.name,
                        suppressed=alert.suppressed or None,
                        attempts=attempt,
                    )
                )
                return
        finally:
            # (Cancelled by a stop: still in the outbox file, for the next start.)
            self._under_way.pop(key, None)
            self._delivering -= 1
            self._update_idle()

    async def _done_with(self, key: int) -> None:
        """A delivery sent, or past its window: out of the outbox."""
        del self._under_way[key]
        await self._save_outbox()

    def _update_idle(self) -> None:
        if not self._queue and not self._busy and self._delivering == 0:
            self._idle.set()
        elif self._idle.is_set():
            self._idle = trio.Event()

    @property
    def pending(self) -> int:
        """Alerts waiting for their window, plus deliveries under way."""
        return len(self._queue) + self._delivering

    async def finish(self, deadline: float) -> None:
        """At stop: wait (until trio time ``deadline``) for pending alerts to go out."""
        with trio.move_on_at(deadline):
            while self.pending:
                self._update_idle()
                await self._idle.wait()
        if self.pending:
            # Which ones: an operator must be able to tell what never arrived.
            waiting = [
                f"{c.job or self._keys.get(c.job_id, f'#{c.job_id}')} run {c.run} {c.kind} "
                "(not sent yet)"
                for c in self._queue
            ]
            under_way = list(self._under_way.values())
            async with self._outbox_lock:  # (no write of a delivery's in a thread now)
                kept = self._keep(under_way)
            self.events.log.warning(
                "alert.abandoned",
                pending=self.pending,
                alerts="; ".join(
                    [f"{d.job} run {d.run} {d.kind} ({d.sink})" for d in under_way] + waiting
                ),
                kept=kept or None,
                outbox=str(self.outbox) if kept else None,
            )

    # -- the outbox -----------------------------------------------------------------------

    def _keep(self, deliveries: list[_Delivery]) -> int:
        """Keep the deliveries a stop abandons in the outbox (their windows are open: the
        next start sends them, still within their window); how many were kept."""
        if self.outbox is None or not deliveries:
            return 0
        return len(deliveries) if self._said(self._write(deliveries)) else 0

    async def _save_outbox(self) -> None:
        """Write the outbox -- the deliveries under way -- as each starts and ends (a
        private file, replaced whole and synced: a crash leaves the last one whole).
        Returns once a write made after this call's change has ended; changes that come
        while one is being written go together in the next (a burst of alerts is a few
        writes, not one per delivery, none of them on the loop)."""
        if self.outbox is None:
            return
        self._outbox_dirty = True
        async with self._outbox_lock:
            if not self._outbox_dirty:
                return  # written meanwhile, this change with it
            self._outbox_dirty = False
            deliveries = list(self._under_way.values())
            self._said(await trio.to_thread.run_sync(self._write, deliveries))

    def _said(self, error: str | None) -> bool:
        if error is not None:
            self.events.log.error("alert.outbox_failed", path=str(self.outbox), error=error)
        return error is None

    def _write(self, deliveries: list[_Delivery]) -> str | None:
        """Replace the outbox with ``deliveries`` (none: remove it); the error, if any.
        (Run in a thread: it logs nothing itself.)"""
        assert self.outbox is not None
        try:
            if not deliveries:
                with contextlib.suppress(FileNotFoundError):
                    self.outbox.unlink()
                return None
            text = "".join(
                json.dumps(d.to_json(), separators=(",", ":")) + "\n" for d in deliveries
            )
            make_state_dir(self.outbox.parent)
            write_private(self.outbox, text)
        except OSError as exc:
            return exc.strerror or repr(exc)
        return None

    def _resume_outbox(self) -> None:
        """Send again what the last stop kept (or a crash left), if still within its
        window and its sink is still configured. The file stays until the outbox's next
        write (the resumed deliveries' first: only those, the rest named and dropped),
        so that a crash meanwhile loses nothing."""
        if self.outbox is None:
            return
        kept = _read_outbox(self.outbox, self.events)
        if kept is None:
            return
        deliveries, unreadable = kept
        sinks = {sink.name: sink for sink in self.sinks}
        now = self.clock.now()
        resumed = 0
        dropped: list[str] = []  # named, as alert.abandoned named them at the stop
        for delivery in deliveries:
            sink = sinks.get(delivery.sink)
            if sink is None or delivery.at + self.window <= now:
                why = "its sink is no longer configured" if sink is None else "window over"
                dropped.append(_dropped(delivery, why))
                continue
            self._start(sink, delivery)
            resumed += 1
        if not resumed:  # (else the resumed deliveries' first write replaces it)
            assert self._nursery is not None
            self._nursery.start_soon(self._save_outbox)
        self.events.log.info(
            "alert.outbox",
            resumed=resumed,
            expired=len(dropped) or None,
            dropped="; ".join(dropped) or None,
            unreadable=unreadable or None,
        )


def drop_outbox(outbox: Path, events: EventBus) -> None:
    """With no sink configured no alerter runs, so nothing would ever send or remove an
    outbox an earlier start kept: name its deliveries dropped, as a start that lost
    their sinks does, and remove it (it was left for good)."""
    kept = _read_outbox(outbox, events)
    if kept is None:
        return
    deliveries, unreadable = kept
    dropped = [_dropped(d, "its sink is no longer configured") for d in deliveries]
    with contextlib.suppress(FileNotFoundError):
        outbox.unlink()
    events.log.info(
        "alert.outbox",
        resumed=0,
        expired=len(dropped) or None,
        dropped="; ".join(dropped) or None,
        unreadable=unreadable or None,
    )


def _read_outbox(outbox: Path, events: EventBus) -> tuple[list[_Delivery], int] | None:
    """The deliveries an outbox file holds and how many of its lines were unreadable;
    ``None`` if there is none, or it is not a private regular file of this user (said)."""
    text = private_text(outbox)
    if text is None:
        if outbox.exists():
            events.log.warning(
                "alert.outbox_ignored",
                path=str(outbox),
                reason="not a private regular file of this user",
            )
        return None
    deliveries: list[_Delivery] = []
    unreadable = 0
    for line in text.splitlines():
        try:
            deliveries.append(_Delivery.from_json(json.loads(line)))
        except (KeyError, TypeError, ValueError, OverflowError):
            unreadable += 1
    return deliveries, unreadable


def _dropped(delivery: _Delivery, why: str) -> str:
    return f"{delivery.job} run {delivery.run} {delivery.kind} ({delivery.sink}: {why})"


__all__ = ["FOUND_LIMIT", "QUEUE_LIMIT", "Alerter", "WindowStore", "drop_outbox"]
