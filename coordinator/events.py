"""Typed events: what happened in the daemon, as values.

The daemon and its executors describe what happens as attrs values (a run finished, a
refresh was done, a result is held...) and hand them to one :class:`EventBus`. The bus
writes each one as a log line (its ``NAME`` is the stable log event name scripts and
tests wait for) and passes the value itself to its subscribers: the metrics, and the
live streams of the admin face. A subscriber matches on the type, never on a log
string, so renaming a log field cannot silently break a metric. An event's text is
redacted (:mod:`coordinator.redact`) before anyone sees it.

Layering: a value module. It imports nothing of the daemon; ``admin/`` and the
executors import it freely.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar, Final

import attrs
import trio

from . import redact
from .log import EventLog, Level

#: Events a slow stream subscriber may fall behind by before it is told it missed some.
STREAM_BUFFER: Final = 1024


@attrs.frozen(kw_only=True)
class Event:
    """Base of every event: a log name, a level, and fields."""

    #: The log event name (stable: scripts and tests wait for it).
    NAME: ClassVar[str] = "event"
    #: The log level it is written at.
    LEVEL: ClassVar[Level] = "info"

    def level(self) -> Level:
        """The level of this occurrence (some events are warnings only when they fail)."""
        return self.LEVEL

    def fields(self) -> dict[str, Any]:
        """The log line's fields (``None`` values are left out by the log). Read by
        name, not with ``attrs.asdict``: two of these are built per run, and asdict's
        generality was half of the cost."""
        return {name: getattr(self, name) for name in _field_names(type(self))}


# -- wakes and refreshes -------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class NotificationWake(Event):
    """A NOTIFY from PostgreSQL asked for a refresh (a job or run changed)."""

    NAME: ClassVar[str] = "wake"
    #: The payload as decoded (a hint only: never trusted as an authority).
    payload: dict[str, Any]


@attrs.frozen(kw_only=True)
class DispatchWake(Event):
    """A manual run was committed: it goes straight to admission and the claim."""

    NAME: ClassVar[str] = "wake"
    LEVEL: ClassVar[Level] = "debug"
    #: The queued run.
    dispatch: int
    job_id: int


@attrs.frozen(kw_only=True)
class LifecycleWake(Event):
    """A wake without a database change (workers came or went, the listener reconnected)."""

    NAME: ClassVar[str] = "wake"
    reason: str
    #: Ignore the refresh spacing (notifications may have been missed).
    urgent: bool | None = None


@attrs.frozen(kw_only=True)
class Refreshed(Event):
    """The job inventory was read (all of it, or the jobs a wake named)."""

    NAME: ClassVar[str] = "refresh"
    #: Rows read.
    jobs: int
    #: Deadlines armed after it.
    armed: int
    #: First deadlines computed and saved, jobs found unusable.
    initialised: int | None = None
    invalid: int | None = None
    #: Jobs the wakes named, when only those were read (``None``: a full refresh).
    named: int | None = None
    #: Objects Python's cyclic garbage collector skips from now on, when a full refresh
    #: froze what is alive (``coordinator run``; see daemon/cyclic_gc.py).
    frozen: int | None = None
    #: Wall time it took, milliseconds.
    elapsed_ms: float


# -- claims, runs and results --------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ClaimGranted(Event):
    """The claim boundary granted a dispatch: its run is ``pending`` (then started, failed
    without a call, or given back). Counted as a claim when it is answered, not when its
    run ends (``coordinator_claims_total``)."""

    NAME: ClassVar[str] = "claim.granted"
    LEVEL: ClassVar[Level] = "debug"
    job_id: int
    run: int
    trigger: str


@attrs.frozen(kw_only=True)
class ClaimRejected(Event):
    """The claim boundary refused a dispatch (see ``coordinator._claim`` for reasons)."""

    NAME: ClassVar[str] = "claim.rejected"
    job_id: int
    #: The queued run of a manual dispatch, ``None`` for a deadline.
    run: int | None
    reason: str


@attrs.frozen(kw_only=True)
class RunStarted(Event):
    """A claim was granted: the call starts now."""

    NAME: ClassVar[str] = "run.started"
    LEVEL: ClassVar[Level] = "debug"
    job: str
    job_id: int
    run: int
    trigger: str
    attempt: int


@attrs.frozen(kw_only=True)
class RunFinished(Event):
    """A call ended and its result was saved (or held, after :class:`ResultHeld`)."""

    NAME: ClassVar[str] = "job.run"
    job: str
    job_id: int
    run: int
    trigger: str
    #: ``succeeded`` | ``failed`` | ``timed_out`` | ``cancelled`` | ``paused``.
    outcome: str
    #: Why it did not succeed (``handler`` | ``timeout`` | ``crashed`` | ``lost``).
    cause: str | None = None
    count: int | None = None
    #: Call duration, milliseconds.
    elapsed_ms: float
    #: Actual start minus the deadline served (scheduled runs only), milliseconds.
    lateness_ms: float | None = None
    #: Why it did not succeed, or (``paused``) why it paused.
    error: str | None = None
    #: Which attempt this was (1 for a first one).
    attempt: int | None = None
    #: Why it did not succeed, in seven words (``runs.category``).
    category: str | None = None
    #: The run that retries it, queued until ``retry_at`` (the job's retry policy).
    retry: int | None = None
    retry_at: datetime | None = None
    #: It failed on the job's last allowed attempt: no retry follows.
    exhausted: bool | None = None
    #: A recoverable run walked its whole space (``succeeded``).
    completed: bool | None = None
    #: A paused run's cursor: the size of its JSON text, bytes (0: no cursor yet).
    cursor_bytes: int | None = None
    #: How many times the run had been resumed before this call (recoverable runs).
    resumes: int | None = None

    def level(self) -> Level:
        # Paused is not an error: the run yielded and resumes from its cursor.
        return "info" if self.outcome in ("succeeded", "paused") else "warning"

    @property
    def elapsed_s(self) -> float:
        return self.elapsed_ms / 1000.0

    @property
    def lateness_s(self) -> float | None:
        return None if self.lateness_ms is None else self.lateness_ms / 1000.0


@attrs.frozen(kw_only=True)
class RunGivenBack(Event):
    """A claimed run was never sent and is given back (its result was saved as such, or
    is held like any result): ``queued`` again, or, a run of the schedule, removed so
    that its saved deadline stands. Not a failure: nothing of it ran."""

    NAME: ClassVar[str] = "run.given_back"
    LEVEL: ClassVar[Level] = "warning"
    job: str
    job_id: int
    run: int
    trigger: str
    #: Why it could not be sent.
    reason: str | None
    #: ``queued`` (a manual run or a retry waits again), ``removed`` (a run of the
    #: schedule: its deadline stands), ``paused`` (an operator paused it meanwhile, a
    #: recoverable job's: paused as asked, never started), ``cancelled`` (its job was
    #: removed meanwhile, history kept), ``already`` (settled or swept meanwhile: left as
    #: it was), ``gone`` (its job was deleted); ``None`` while the give-back is held (not
    #: saved yet).
    became: str | None = None


@attrs.frozen(kw_only=True)
class TickSkipped(Event):
    """Ticks of a job's schedule fell while a run of it was going (an overrun, or a chain
    of retries): they were skipped, not queued; the next deadline follows the run's end.
    Told once per run, when its result is saved."""

    NAME: ClassVar[str] = "job.tick_skipped"
    LEVEL: ClassVar[Level] = "warning"
    job: str
    job_id: int
    #: The run that was going.
    run: int
    #: How many ticks were skipped (counting stops at 10,000), the first and the last.
    missed: int
    first: datetime
    last: datetime
    #: How long the run (or the chain of attempts since the deadline it served) lasted.
    running_s: float


@attrs.frozen(kw_only=True)
class MisfireSkipped(Event):
    """An overdue deadline later than its job's misfire grace was not run (``--misfire
    skip``); the next deadline was computed from now."""

    NAME: ClassVar[str] = "job.misfire_skipped"
    LEVEL: ClassVar[Level] = "warning"
    job: str
    job_id: int
    #: The deadline skipped, and how late it was when the daemon came to it (seconds).
    deadline: datetime
    late_s: float
    #: The deadline saved in its place (``None``: a one-shot job, which is done).
    next: datetime | None


@attrs.frozen(kw_only=True)
class RunStopRequested(Event):
    """The daemon asked a running call to stop early: an operator paused its run
    (``pause``), or the daemon is stopping (``stopping``, recoverable calls)."""

    NAME: ClassVar[str] = "run.stop_requested"
    job: str
    run: int
    reason: str


@attrs.frozen(kw_only=True)
class RunProgress(Event):
    """A running call reported progress (worker calls)."""

    NAME: ClassVar[str] = "run.progress"
    LEVEL: ClassVar[Level] = "debug"
    run: int
    percent: float | None = None
    label: str | None = None
    message: str | None = None


@attrs.frozen(kw_only=True)
class ResultHeld(Event):
    """The database refused a result: it is held in memory, exactly, and re-sent."""

    NAME: ClassVar[str] = "settle.retained"
    LEVEL: ClassVar[Level] = "warning"
    job: str
    run: int
    error: str


@attrs.frozen(kw_only=True)
class ResultSaved(Event):
    """A held result was saved after all."""

    NAME: ClassVar[str] = "settle.saved"
    job: str
    run: int
    attempts: int
    #: ``saved`` or ``already`` (saved before: a retry after an unacknowledged commit).
    outcome: str


@attrs.frozen(kw_only=True)
class ResultSpooled(Event):
    """At stop, a held result went to the local spool (the next start replays it)."""

    NAME: ClassVar[str] = "settle.spooled"
    LEVEL: ClassVar[Level] = "error"
    job: str
    run: int
    spool: str


@attrs.frozen(kw_only=True)
class FindingsReported(Event):
    """A running call reported findings of severity ``error`` or ``data_loss`` (the
    others are not told here: they are many and alert no one)."""

    NAME: ClassVar[str] = "run.findings"
    LEVEL: ClassVar[Level] = "debug"
    run: int
    #: (kind, severity, how many) in this report.
    counts: tuple[tuple[str, str, int], ...]
    #: One of them, the worst: (kind, severity, resource id).
    example: tuple[str, str, str]

    def fields(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "findings": ", ".join(f"{k}/{s}:{n}" for k, s, n in self.counts),
            "example": "/".join(self.example),
        }


@attrs.frozen(kw_only=True)
class RunLost(Event):
    """At start, a run left pending or running by a daemon that died was found: it is
    ``unresolved`` (waits for an operator), for an idempotent job ``retried``, for a
    recoverable one ``paused``."""

    NAME: ClassVar[str] = "startup.lost_run"
    LEVEL: ClassVar[Level] = "warning"
    run: int
    job_id: int
    #: ``namespace/name`` (``None``: not read, the job removed meanwhile).
    job: str | None = None
    #: ``unresolved``, ``retried`` or ``paused``.
    action: str
    #: Which attempt of its chain the run was (unknown for a result the spool could not
    #: save).
    attempt: int | None = None


# -- alerts and retention ------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class AlertSent(Event):
    """An alert reached a sink (``email`` or ``webhook``)."""

    NAME: ClassVar[str] = "alert.sent"
    job: str
    job_id: int
    #: ``failed`` | ``unresolved`` | ``findings``.
    kind: str
    run: int
    sink: str
    #: Alerts of this (job, kind) suppressed since the previous one, summarised in it.
    suppressed: int | None = None
    #: Tries it took.
    attempts: int


@attrs.frozen(kw_only=True)
class AlertSuppressed(Event):
    """An alert was not sent: one of the same (job, kind) went out less than
    ``alert_window`` ago (it is counted in the next one)."""

    NAME: ClassVar[str] = "alert.suppressed"
    LEVEL: ClassVar[Level] = "debug"
    job: str
    job_id: int
    kind: str
    run: int
    #: When the window ends.
    until: datetime


@attrs.frozen(kw_only=True)
class AlertFailed(Event):
    """An alert could not be delivered (or its window could not be read); it is tried
    again after ``retry_s``, or given up (``retry_s`` absent) once it is older than the
    alert window."""

    NAME: ClassVar[str] = "alert.failed"
    LEVEL: ClassVar[Level] = "warning"
    job: str
    kind: str
    run: int
    #: ``email``, ``webhook``, or ``window`` (the database step before sending).
    sink: str
    error: str
    attempt: int
    retry_s: float | None = None


@attrs.frozen(kw_only=True)
class RetentionPruned(Event):
    """A retention prune finished (or stopped early: ``complete`` false)."""

    NAME: ClassVar[str] = "retention.pruned"
    #: Runs deleted, removed jobs whose last run went (and themselves with it).
    runs: int
    jobs_removed: int
    #: Statements (batches) it took, and its wall time.
    batches: int
    elapsed_ms: float
    #: Every job was looked at (false: the daemon stopped or the database failed).
    complete: bool
    #: When the next prune is armed for.
    next_at: datetime | None = None


# -- workers and the daemon itself ---------------------------------------------------------


@attrs.frozen(kw_only=True)
class SchedulesDeclared(Event):
    """A worker's declared schedules were synced into a namespace (or found unchanged)."""

    NAME: ClassVar[str] = "worker.declared"
    worker: str
    namespace: str
    jobs: int
    created: int = 0
    updated: int = 0
    paused: int = 0
    #: Nothing differed from what was stored: nothing was written (``None``: it did).
    unchanged: bool | None = None


@attrs.frozen(kw_only=True)
class WorkerConnected(Event):
    """A worker said hello and serves ``types``."""

    NAME: ClassVar[str] = "worker.connected"
    worker: str
    types: tuple[str, ...]
    capacity: int
    transport: str
    peer: str
    #: It replaced an older connection with the same worker id.
    replaced: bool | None = None

    def fields(self) -> dict[str, Any]:
        return {**super().fields(), "types": ",".join(self.types)}


@attrs.frozen(kw_only=True)
class WorkerDisconnected(Event):
    """A worker connection ended; its calls in flight (``crashed``) ended with it."""

    NAME: ClassVar[str] = "worker.disconnected"
    worker: str
    reason: str
    crashed: int | None = None

    def level(self) -> Level:
        return "warning" if self.crashed else "info"


@attrs.frozen(kw_only=True)
class StateChanged(Event):
    """The daemon's state word changed (``standby``, ``ready``, ``degraded``...)."""

    NAME: ClassVar[str] = "daemon.state"
    LEVEL: ClassVar[Level] = "debug"
    state: str
    #: Why it is degraded (one line per cause), when it is.
    reasons: tuple[str, ...] = ()

    def fields(self) -> dict[str, Any]:
        return {"state": self.state, "reasons": "; ".join(self.reasons) or None}


# -- the bus -------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Missed(Event):
    """Put in a stream in place of events it fell too far behind to receive."""

    NAME: ClassVar[str] = "events.missed"
    LEVEL: ClassVar[Level] = "debug"
    count: int


@attrs.define(eq=False)
class EventStream:
    """One subscriber's bounded queue (the web page's live view reads one)."""

    _send: trio.MemorySendChannel[Event]
    receive: trio.MemoryReceiveChannel[Event]
    _missed: int = 0
    closed: bool = False

    def _offer(self, event: Event) -> None:
        if self._missed:
            try:
                self._send.send_nowait(Missed(count=self._missed))
            except trio.WouldBlock:
                self._missed += 1
                return
            self._missed = 0
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:
            self._missed += 1
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self.closed = True

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self.receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None


@attrs.define(eq=False)
class EventBus:
    """Writes each event to the log, then hands the value to every subscriber.

    Subscribers are called synchronously from the emitting task and must be quick (a
    counter, a channel ``send_nowait``). A subscriber that raises is logged and kept.
    """

    log: EventLog
    _subscribers: list[Callable[[Event], None]] = attrs.field(factory=list)
    _streams: list[EventStream] = attrs.field(factory=list)

    def emit(self, event: Event) -> None:
        level = event.level()
        wanted = self.log.wants(level)
        if not wanted and not self._subscribers and not self._streams:
            return  # nobody would see it (a debug event on a hot path): not even redacted
        event = _redacted(event)
        if wanted:
            self.log.write(event.NAME, level, event.fields(), redacted=True)
        for subscriber in self._subscribers:
            try:
                subscriber(event)
            except Exception as exc:  # a subscriber's bug must not stop the daemon
                self.log.error("events.subscriber_failed", error=repr(exc))
        if self._streams:
            for stream in self._streams:
                stream._offer(event)
            if any(s.closed for s in self._streams):
                self._streams = [s for s in self._streams if not s.closed]

    def subscribe(self, subscriber: Callable[[Event], None]) -> None:
        """Call ``subscriber(event)`` for every event from now on."""
        self._subscribers.append(subscriber)

    def open_stream(self, buffer: int = STREAM_BUFFER) -> EventStream:
        """A bounded queue of the events from now on; close it with :meth:`close_stream`.
        Falling more than ``buffer`` events behind yields one :class:`Missed` event."""
        send, receive = trio.open_memory_channel[Event](buffer)
        stream = EventStream(send, receive)
        self._streams.append(stream)
        return stream

    def close_stream(self, stream: EventStream) -> None:
        stream.closed = True
        stream.receive.close()
        if stream in self._streams:
            self._streams.remove(stream)


#: Each event type's field names (``attrs.fields`` on every emit showed in profiles).
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
#: Values that may carry text to redact.
_TEXTUAL: Final = (str, dict, list, tuple)


def _field_names(cls: type[Event]) -> tuple[str, ...]:
    """An event class's field names, in order (looked up once per class)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in attrs.fields(cls))
    return names


def _redacted(event: Event) -> Event:
    """``event`` with its text redacted (:mod:`coordinator.redact`), before the log, the
    metrics, the live streams or an alert see it: a run's error, a progress message, a
    wake's payload. The same object when nothing in it looks secret."""
    rules = redact.default()
    changes: dict[str, Any] = {}
    for name in _field_names(type(event)):
        value = getattr(event, name)
        if value and isinstance(value, _TEXTUAL):
            cleaned = rules.value(value)
            if isinstance(value, tuple):
                cleaned = tuple(cleaned)
            if cleaned != value:
                changes[name] = cleaned
    return attrs.evolve(event, **changes) if changes else event


def milliseconds(seconds: float) -> float:
    """Seconds as milliseconds rounded to 0.1, as every ``*_ms`` field is logged."""
    return round(seconds * 1000, 1) if math.isfinite(seconds) else seconds


def iso(value: datetime | None) -> str | None:
    """An aware datetime as ISO 8601 with milliseconds, for JSON shapes."""
    return value.isoformat(timespec="milliseconds") if value is not None else None


__all__ = [
    "AlertFailed",
    "AlertSent",
    "AlertSuppressed",
    "ClaimRejected",
    "DispatchWake",
    "Event",
    "EventBus",
    "EventStream",
    "FindingsReported",
    "LifecycleWake",
    "Missed",
    "NotificationWake",
    "Refreshed",
    "ResultHeld",
    "ResultSaved",
    "ResultSpooled",
    "RetentionPruned",
    "RunFinished",
    "RunGivenBack",
    "RunLost",
    "RunProgress",
    "RunStarted",
    "RunStopRequested",
    "SchedulesDeclared",
    "StateChanged",
    "WorkerConnected",
    "WorkerDisconnected",
    "iso",
    "milliseconds",
]
