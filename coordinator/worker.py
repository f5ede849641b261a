"""The Python worker SDK: serve job types from your own process (``docs/worker-protocol.md``).

::

    from coordinator.worker import Worker

    worker = Worker(capacity=4)

    @worker.job("billing.sweep")
    async def sweep(ctx):
        rows = await load_rows(ctx.params["table"])
        for i, row in enumerate(rows):
            await handle(row)
            await ctx.progress(100 * (i + 1) / len(rows), message=f"row {row.id}")
        return len(rows)                      # or {"count": n, "extra": {...}}, or None

A handler may carry its schedule, next to the code (``Worker(namespace=...)`` is then
required: the worker declares the namespace's complete job set when it connects, and
the daemon syncs it with a manifest's semantics -- new jobs created, changed ones
updated, those no longer declared paused)::

    worker = Worker(namespace="reports")

    @worker.job("reports.daily", cron="0 6 * * *", timezone="Europe/Berlin", timeout="10m")
    async def daily(ctx): ...

    @worker.job("reports.sweep", every="15m")
    async def sweep(ctx): ...

    @worker.job("reports.rebuild", manual=True)
    async def rebuild(ctx): ...

Run it with ``coordinator worker mymodule:worker`` (or ``await worker.run(path)``). The
worker connects to the daemon's socket (or over TCP, TLS for another host), says which
types it serves, runs up to ``capacity`` calls at once, and reconnects with capped
exponential backoff (0.5 s up to 30 s, from 0.5 s again once a connection stayed up)
whenever the connection drops. A handler that raises reports a failure with the
exception's message; a handler whose job times out (or whose daemon stops) sees
``ctx.cancelled`` set and is then cancelled (trio cancellation).

A recoverable job's handler resumes from ``ctx.cursor``, reports ``await
ctx.checkpoint(cursor, count=delta)`` between batches and ``await ctx.finding(...)`` as it
finds things, and when ``ctx.cancelled`` is set (a pause, a stop, its timeout) ends with
``raise Paused()`` at its last checkpoint; one that ignores it is cancelled after
``pause_grace`` seconds and the call ends paused at its last checkpoint all the same.

Written on trio only; it needs nothing from the daemon's side (no database driver).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import logging
import math
import os
import signal
import socket
import ssl
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final, TypeAlias, TypeVar

import attrs
import trio

from .backoff import backoff as _backoff
from .errors import InvalidInput
from .protocol import (
    CATEGORIES,
    MAX_CAPACITY,
    MAX_LABEL,
    MAX_LINE,
    MAX_MESSAGE,
    MAX_NAME,
    NO_CURSOR,
    Bye,
    Call,
    Cancel,
    Category,
    Checkpoint,
    Declare,
    Declared,
    DeclaredJob,
    Error,
    Finding,
    FindingItem,
    Hello,
    LineBuffer,
    Message,
    Progress,
    ProgressMode,
    ProtocolError,
    Result,
    Welcome,
    default_socket_path,
    encode,
    encode_success,
    gather_lines,
    is_loopback,
    parse_from_daemon,
    write_ahead,
)
from .text import ERROR_MESSAGE_LIMIT, check_namespace, clip

__all__ = [
    "Context",
    "Handler",
    "HandlerResult",
    "JobError",
    "Paused",
    "Worker",
    "amain",
    "build_parser",
    "load",
    "main",
    "tls_context",
]

logger = logging.getLogger("coordinator.worker")

#: What a handler may return: a count, ``{"count": .., "extra": {..}}`` (other keys go
#: to ``extra`` too), ``(count, extra)``, or ``None``.
HandlerResult: TypeAlias = int | dict[str, Any] | tuple[int | None, dict[str, Any]] | None
Handler: TypeAlias = Callable[["Context"], Awaitable[HandlerResult]]
_H = TypeVar("_H", bound=Handler)

#: Reconnect backoff: first delay and cap (seconds).
BACKOFF_FIRST: Final = 0.5
BACKOFF_CAP: Final = 30.0
#: Seconds a connection stays up after its welcome to prove itself: only then does the
#: backoff start again from its first delay. A welcome alone proved nothing: a worker
#: the daemon welcomes and then refuses (its declaration, say) or that another process
#: with the same id replaces reconnected every 0.5 s for good. Time up is the test, not a
#: served call: refusals come within milliseconds of the welcome, while a worker of rare
#: job types may wait hours for a call on a perfectly good connection.
PROVEN_AFTER: Final = 10.0
#: Least seconds between two progress messages of one run (a changed step always goes).
PROGRESS_SPACING: Final = 0.1
#: Characters of a failing handler's traceback kept in the result's ``extra``.
TRACEBACK_LIMIT: Final = 8000
#: Characters of a failing handler's error message (the daemon keeps no more).
ERROR_LIMIT: Final = ERROR_MESSAGE_LIMIT
#: Most findings in one ``finding`` message, and most bytes of their encoding (a line
#: holds 64 KiB; one finding at most about 21 KiB).
FINDINGS_BATCH: Final = 200
FINDINGS_BATCH_BYTES: Final = 40 * 1024
#: Longest a reported finding waits for others to share its message (seconds).
FINDINGS_SPACING: Final = 0.5
#: TCP keepalive on a connection over TCP: probes after 30 s of silence, every 10 s, and
#: 3 unanswered end it. A daemon host that vanished without closing (power, network) is
#: noticed in about a minute, not the kernel's two hours; the kernel sends the probes,
#: at no cost to an idle worker. The kernel does not probe while data it sent waits to be
#: acknowledged (a busy worker's progress and results): ``TCP_USER_TIMEOUT`` gives that up
#: after a minute too, not after the ~15 minutes of retransmissions. (Seconds, but the
#: last, in milliseconds; all four are Linux's.)
KEEPALIVE: Final = (
    ("TCP_KEEPIDLE", 30),
    ("TCP_KEEPINTVL", 10),
    ("TCP_KEEPCNT", 3),
    ("TCP_USER_TIMEOUT", 60_000),
)
_READ_SIZE: Final = 64 * 1024
_OUTBOX: Final = 64
_UNSENT: Final = object()


class JobError(Exception):
    """Raise it from a handler to fail the call and say whether to retry it and why.

    ``retryable=False``: the daemon does not retry this failure (the same call would fail
    again); ``True``: it retries it while the job's attempts remain, even where the
    policy would not (an ``invalid-input`` failure); ``None``: the job's policy decides.
    ``category`` is one of ``invalid-input``, ``timeout``, ``cancellation``,
    ``external-dependency``, ``provider-failure``, ``storage`` or ``unknown``.
    Any other exception is a failure the policy decides on, category ``unknown``.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool | None = None,
        category: Category | None = None,
    ) -> None:
        if category is not None and category not in CATEGORIES:
            raise ValueError(f"category must be one of {', '.join(CATEGORIES)}, not {category!r}")
        super().__init__(message)
        self.retryable = retryable
        self.category = category


def backoff(attempt: int) -> float:
    """Reconnect delay: 0.5, 1, 2, 4 ... seconds, at most 30."""
    return _backoff(attempt, base=BACKOFF_FIRST, cap=BACKOFF_CAP)


class Paused(Exception):  # it means "paused", not an error: no "Error" in its name
    """Raise (or return) it from a recoverable job's handler: the call stopped at
    ``cursor`` and its run can be resumed from there. Without a cursor the run pauses at
    its last checkpoint. ``count`` is a last delta of the run's counter, if any."""

    def __init__(self, cursor: Any = NO_CURSOR, *, count: int | None = None) -> None:
        super().__init__("paused")
        self.cursor = cursor
        self.count = count


@attrs.define(eq=False)
class _Session:
    """One connection to the daemon."""

    outbox: trio.MemorySendChannel[bytes]
    #: Calls this connection takes at once: the worker's capacity less the calls still
    #: running from a closed connection when it connected (said in its ``hello``).
    capacity: int
    #: run id -> (context, the handler's cancel scope)
    running: dict[int, tuple[Context, trio.CancelScope]] = attrs.field(factory=dict)
    #: When the daemon welcomed this worker (trio's clock), if it did.
    welcomed_at: float | None = None
    #: The socket's descriptor when lines may be written to it directly (a plain
    #: socket, not TLS).
    fd: int | None = None
    #: The worker declares its jobs on this connection: it is accepted once the daemon
    #: answered the declaration, not at its welcome (a refusal comes after that).
    declaring: bool = False
    #: The id the daemon welcomed, until the worker is accepted (then ``None``).
    welcomed_as: str | None = None
    #: The worker said ``bye``: a recoverable call is asked to pause, even one that
    #: arrives after it (sent before the daemon read the ``bye``).
    leaving: bool = False
    #: The connection closed: nothing more is sent on it (a call still running, an
    #: orphan, drops its messages and its result: the daemon ended its run).
    closed: bool = False
    #: Set once it closed and its last call ended.
    drained: trio.Event = attrs.field(factory=trio.Event)
    #: The watch over its calls that run on after it closed.
    orphans: _Orphans | None = None
    #: Set (and replaced) whenever one of its calls ends.
    call_ended: trio.Event = attrs.field(factory=trio.Event)
    #: It said ``bye`` to be replaced by a connection of more capacity (the calls that
    #: held slots when it connected have ended).
    renewing: bool = False
    #: Set once the daemon welcomed it and, if it declares, answered the declaration.
    accepted: trio.Event = attrs.field(factory=trio.Event)

    @property
    def welcomed(self) -> bool:
        return self.welcomed_at is not None

    def proven(self) -> bool:
        """Whether it stayed up :data:`PROVEN_AFTER` seconds after its welcome."""
        return (
            self.welcomed_at is not None and trio.current_time() - self.welcomed_at >= PROVEN_AFTER
        )

    async def send(self, message: Message | bytes, *, now: bool = False) -> None:
        """Queue a message (or its line, already encoded); a connection that is gone
        swallows it (the handler that sent it is about to be cancelled). ``now``: write
        what the socket takes at once if nothing is queued or being written before it (a
        lone result then leaves without waiting a scheduler round for the writer task;
        under load the writer sends the lines of one round in one write)."""
        if self.closed:
            # (Never on another connection: the daemon ended this call's run when this
            # one closed, and a descriptor written to directly may be a new socket's.)
            await trio.lowlevel.checkpoint()
            return
        data = message if isinstance(message, bytes) else encode(message)
        if now:
            data = write_ahead(self.fd, data, self.outbox)
            if not data:
                await trio.lowlevel.checkpoint()
                return
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self.outbox.send(data)


@attrs.define(eq=False)
class Context:
    """What a handler gets: the call, and ways to report progress and checkpoints."""

    #: The run being executed.
    run_id: int
    #: The job's name and namespace.
    job: str
    namespace: str
    #: The job type this call is for.
    type: str
    #: Dispatch arguments (``force`` and friends).
    args: dict[str, Any]
    #: The job's static parameters.
    params: dict[str, Any]
    #: 1 for a first attempt.
    attempt: int
    #: When the daemon will cancel the call (the job's timeout), or ``None``.
    deadline: datetime | None
    #: ``schedule`` | ``manual`` | ``retry``, when the daemon says.
    trigger: str | None
    #: The deadline this run serves (scheduled runs).
    scheduled_for: datetime | None
    #: Where to resume from: the cursor the daemon handed back (``None`` for a fresh
    #: start); :meth:`checkpoint` updates it.
    cursor: Any
    #: The job is recoverable: its run resumes from ``cursor`` after a pause or a crash.
    recoverable: bool = False
    #: The run's counter so far (recoverable jobs; continued across pauses), updated by
    #: :meth:`checkpoint`; ``None`` until something was counted.
    count: int | None = None
    #: Set when the daemon cancels the call (timeout, stop, or an operator's pause), and
    #: for a recoverable job when the worker stops (:meth:`Worker.stop`); the handler is
    #: then cancelled too (after the worker's ``cancel_delay``; for a recoverable job
    #: after ``pause_grace``, so it can end with :class:`Paused`).
    cancelled: trio.Event = attrs.field(factory=trio.Event)
    #: Why the call was cancelled (``timeout``, ``stopping`` or ``pause``), once it was.
    cancel_reason: str | None = None
    #: What the result of a call the worker's own stop cancelled says (else the reason).
    _cancelled_because: str | None = attrs.field(default=None, repr=False)
    _session: _Session | None = attrs.field(default=None, repr=False)
    #: Orders findings before the checkpoint and the result that follow them.
    _send_lock: trio.Lock = attrs.field(factory=trio.Lock, repr=False)
    _findings: list[FindingItem] = attrs.field(factory=list, repr=False)
    _findings_bytes: int = attrs.field(default=0, repr=False)
    _findings_flushing: bool = attrs.field(default=False, repr=False)
    #: While the call runs: where its delayed sends start (the connection's nursery),
    #: and their cancel scopes, cancelled when the call ends.
    _nursery: trio.Nursery | None = attrs.field(default=None, repr=False)
    _later: list[trio.CancelScope] = attrs.field(factory=list, repr=False)
    _last_label: object = attrs.field(default=_UNSENT, repr=False)
    _next_send_at: float = attrs.field(default=-math.inf, repr=False)
    _pending: Progress | None = attrs.field(default=None, repr=False)
    _flushing: bool = attrs.field(default=False, repr=False)

    async def progress(
        self,
        percent: float | None = None,
        *,
        step: str | None = None,
        message: str | None = None,
    ) -> None:
        """Report progress: a ``percent`` (0-100), a named ``step`` (optionally with a
        percent), or neither (busy, no estimate); ``message`` is a short line.

        Cheap to call often: messages are spaced at least :data:`PROGRESS_SPACING`
        apart (the latest wins; a new step is sent at once; the last one is always sent
        before the result). Raises ``ValueError`` for a percent outside 0-100.
        """
        mode: ProgressMode
        label = None if step is None else str(step)[:MAX_LABEL]
        if label is not None:
            mode = "step"
        elif percent is not None:
            mode = "determinate"
        else:
            mode = "indeterminate"
        text = None if message is None else str(message)[:MAX_MESSAGE]
        update = Progress(run=self.run_id, mode=mode, percent=percent, label=label, message=text)
        now = trio.current_time()
        if label != self._last_label or now >= self._next_send_at:
            self._pending = None
            self._last_label = label
            self._next_send_at = now + PROGRESS_SPACING
            await self._send(update)
            return
        self._pending = update
        if not self._flushing and self._nursery is not None:
            self._flushing = True
            self._start_later(self._flush_later)

    async def checkpoint(self, cursor: Any, *, count: int | None = None) -> None:
        """Report a cursor the run could resume from (any JSON value, at most 16 KiB
        encoded) and, with ``count``, how much the run's counter grew since the last
        checkpoint. A recoverable run saves both (at most one write every couple of
        seconds: a crash replays at most that much); the findings reported before it are
        sent first. Raises ``ValueError`` if the cursor is not JSON or too large, or the
        count not an integer or negative (the counter only grows)."""
        _check_delta(count, "checkpoint")
        message = Checkpoint(run=self.run_id, cursor=cursor, count=count)
        async with self._send_lock:
            await self._send_findings()
            await self._send(message)
        self.cursor = cursor
        if count is not None:
            self.count = (self.count or 0) + count

    async def finding(
        self,
        kind: str,
        resource_id: str | int,
        *,
        severity: str = "info",
        detail: dict[str, Any] | None = None,
    ) -> None:
        """Record that the run found something: ``kind`` (``missing_blob``), the
        ``resource_id`` it concerns, a ``severity`` (``info``, ``warning``, ``error``,
        ``data_loss``) and a ``detail`` object. Recorded once per run, kind and resource
        id (reporting it again, as a resumed run replaying its last batch does, changes
        nothing). Batched: sent with others at most :data:`FINDINGS_SPACING` later, and
        always before the next checkpoint and the result. Raises ``ValueError`` for an
        unknown severity, an empty or too long kind, a resource id that is not a string or
        an integer (``None``: not ``"None"``) or is empty or too long, or a detail that is
        not a JSON object of at most 16 KiB."""
        if not isinstance(resource_id, str | int) or isinstance(resource_id, bool):
            # (str() made None "None": every row whose id a typo lost became one finding.)
            shown = repr(resource_id)[:100]
            raise ValueError(f"finding: 'resource_id' must be a string or an integer, not {shown}")
        item = FindingItem(
            kind=kind,
            resource_id=str(resource_id),
            severity=severity,  # type: ignore[arg-type]  # checked by FindingItem
            detail={} if detail is None else detail,
        )
        size = len(encode(Finding(run=self.run_id, findings=(item,))))
        if self._findings and (
            len(self._findings) >= FINDINGS_BATCH
            or self._findings_bytes + size > FINDINGS_BATCH_BYTES
        ):
            async with self._send_lock:
                await self._send_findings()
        self._findings.append(item)
        self._findings_bytes += size
        if not self._findings_flushing and self._nursery is not None:
            self._findings_flushing = True
            self._start_later(self._send_findings_later)

    async def _send(self, message: Message) -> None:
        if self._session is not None:
            await self._session.send(message)

    def _start_later(self, send: Callable[[], Awaitable[None]]) -> None:
        """Start a delayed send in the connection's nursery, under a cancel scope that
        :meth:`_ended` cancels. (A nursery per call for these was a fifth of a call's
        time in a worker whose handlers report nothing.)"""
        assert self._nursery is not None
        scope = trio.CancelScope()
        self._later.append(scope)

        async def later() -> None:
            try:
                with scope:
                    await send()
            finally:
                if scope in self._later:  # (a call reporting for hours keeps at most two)
                    self._later.remove(scope)

        self._nursery.start_soon(later)

    def _ended(self) -> None:
        """The handler is done: its delayed sends stop (the flush before the result
        sends what they held)."""
        self._nursery = None
        for scope in self._later:
            scope.cancel()
        self._later.clear()

    async def _flush_later(self) -> None:
        try:
            await trio.sleep_until(self._next_send_at)
            await self._flush()
        finally:
            self._flushing = False

    async def _flush(self) -> None:
        """Before the result: the last progress and every finding not sent yet."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._next_send_at = trio.current_time() + PROGRESS_SPACING
            await self._send(pending)
        if self._findings or self._send_lock.locked():
            # (Not otherwise: taking the lock costs a scheduler round even when free.)
            async with self._send_lock:
                await self._send_findings()

    async def _send_findings(self) -> None:
        """Send the buffered findings as one message (call with ``_send_lock`` held)."""
        if not self._findings:
            return
        batch, size = self._findings, self._findings_bytes
        self._findings, self._findings_bytes = [], 0
        try:
            await self._send(Finding(run=self.run_id, findings=tuple(batch)))
        except BaseException:
            # Cancelled before it was queued (a cancelled send delivers nothing): keep
            # them for the flush before the result.
            self._findings[:0] = batch
            self._findings_bytes += size
            raise

    async def _send_findings_later(self) -> None:
        try:
            await trio.sleep(FINDINGS_SPACING)
            async with self._send_lock:
                await self._send_findings()
        finally:
            self._findings_flushing = False


def _check_delta(count: object, what: str) -> None:
    """A recoverable run's counter only grows: a delta may not be negative (the protocol
    takes one, and the counter went down)."""
    if isinstance(count, int) and not isinstance(count, bool) and count < 0:
        raise ValueError(
            f"{what}: 'count' is {count}: it says how much the run's counter grew, and the "
            "counter only grows (0 or more)"
        )


def _check_capacity(_inst: object, _attr: object, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_CAPACITY:
        raise ValueError(f"capacity must be an integer from 1 to {MAX_CAPACITY}, not {value!r}")


def _worker_id(value: str | None) -> str:
    """``hostname-pid`` unless given."""
    return f"{socket.gethostname()}-{os.getpid()}" if value is None else str(value)


def _duration(value: str | timedelta | None, what: str) -> str | None:
    """A duration as the daemon reads it (``10m``, ``90s``); a timedelta in seconds."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, timedelta):
        micros = value // timedelta(microseconds=1)
        if micros % 1000:
            raise ValueError(f"{what}: at most millisecond precision, not {value!r}")
        return f"{micros // 1000}ms" if micros % 1_000_000 else f"{micros // 1_000_000}s"
    raise TypeError(f"{what} must be a duration such as '10m' or a timedelta, not {value!r}")


def _declared(
    job_type: str,
    *,
    name: str | None,
    cron: str | None,
    every: str | timedelta | None,
    at: str | datetime | None,
    manual: bool,
    timezone: str | None,
    timeout: str | timedelta | None,
    priority: str | None,
    idempotent: bool,
    paused: bool,
    params: Mapping[str, Any] | None,
    policies: _Policies,
) -> DeclaredJob | None:
    """The declaration a ``@worker.job`` carries, or ``None`` when it carries none."""
    policies.check(job_type)
    given = [
        key
        for key, value in (("cron", cron), ("every", every), ("at", at), ("manual", manual))
        if value not in (None, False)
    ]
    if not given:
        extras = {"timezone": timezone, "timeout": timeout, "priority": priority,
                  "params": params, "name": name}  # fmt: skip
        if (
            any(v is not None for v in extras.values())
            or idempotent
            or paused
            or policies.declared()
        ):
            raise ValueError(
                f"{job_type!r}: a schedule (cron, every, at or manual=True) is needed to "
                "declare the job"
            )
        return None
    if len(given) > 1:
        raise ValueError(f"{job_type!r}: give one of cron, every, at or manual, not {given}")
    if timezone is not None and cron is None:
        raise ValueError(f"{job_type!r}: timezone only applies to cron")
    if manual is not True and manual is not False:
        raise TypeError(f"{job_type!r}: manual must be True or False")
    expression: str | None
    if cron is not None:
        expression = cron
    elif every is not None:
        expression = _duration(every, "every")
    elif at is not None:
        if isinstance(at, datetime):
            if at.utcoffset() is None:
                raise ValueError(f"{job_type!r}: at needs an aware datetime")
            expression = at.isoformat()
        else:
            expression = at
    else:
        expression = None
    try:
        json.dumps(dict(params or {}), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{job_type!r}: params must be JSON: {exc}") from None
    return DeclaredJob(
        name=name or job_type,
        job_type=job_type,
        schedule=given[0],
        expression=expression,
        timezone=timezone,
        timeout=_duration(timeout, "timeout"),
        priority=priority,
        idempotent=idempotent,
        paused=paused,
        params=dict(params or {}),
        retries=policies.retries,
        retry_backoff=_duration(policies.retry_backoff, "retry_backoff"),
        retry_max_delay=_duration(policies.retry_max_delay, "retry_max_delay"),
        misfire=policies.misfire,
        misfire_grace=_duration(policies.misfire_grace, "misfire_grace"),
        recoverable=policies.recoverable,
        alert=policies.alert,
        keep_last=policies.keep_last,
        retention=_duration(policies.retention, "retention"),
    )


@attrs.frozen(kw_only=True)
class _Policies:
    """What a declared job says besides its schedule: retries, misfire, retention, alerts
    (``None``: the default, as in a manifest entry without the key)."""

    retries: int | None = None
    retry_backoff: str | timedelta | None = None
    retry_max_delay: str | timedelta | None = None
    misfire: str | None = None
    misfire_grace: str | timedelta | None = None
    recoverable: bool = False
    alert: bool = True
    keep_last: int | None = None
    retention: str | timedelta | None = None

    def declared(self) -> bool:
        """Whether any of them is not the default."""
        return self != _Policies()

    def check(self, job_type: str) -> None:
        """Refuse a wrong type now, naming the job (the daemon checks the values)."""
        for flag in ("recoverable", "alert"):
            value = getattr(self, flag)
            if value is not True and value is not False:
                raise TypeError(f"{job_type!r}: {flag} must be True or False, not {value!r}")
        for number in ("retries", "keep_last"):
            value = getattr(self, number)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise TypeError(f"{job_type!r}: {number} must be an integer, not {value!r}")
        if self.misfire is not None and not isinstance(self.misfire, str):
            raise TypeError(f"{job_type!r}: misfire must be a string, not {self.misfire!r}")


#: Exit status of a worker process that ended itself because a cancelled call ran on
#: past :attr:`Worker.orphan_limit` (``EX_SOFTWARE``; the unit restarts on failure).
ORPHAN_EXIT: Final = 70
#: The limit ``coordinator worker`` sets.
ORPHAN_LIMIT: Final = 10.0
#: Seconds ``coordinator worker`` gives the calls a second signal cancelled to send their
#: results before it drops the connection (a third signal drops it at once).
HARD_STOP: Final = 2.0


def _is_eof(cause: BaseException | None) -> bool:
    """The peer closed the TLS connection without its close_notify (an EOF, not a bad
    handshake or a bad record)."""
    return isinstance(cause, ssl.SSLEOFError) or (
        isinstance(cause, ssl.SSLError) and cause.reason == "UNEXPECTED_EOF_WHILE_READING"
    )


@attrs.define(eq=False)
class _Orphans:
    """Watches the calls cancelled because their connection closed: if any still runs
    ``limit`` seconds later, the process exits (:data:`ORPHAN_EXIT`), or with no limit
    (embedded) it is logged once. A thread's timer, not trio's: a handler that blocks
    without checkpoints stops trio's loop too. Disarmed when the connection's last call
    has ended."""

    limit: float | None
    _timer: threading.Timer | None = None
    #: The time was up with calls still running (the line was said).
    expired: bool = False

    def arm(self, running: Mapping[int, object]) -> None:
        """Watch the calls in ``running`` (the session's, which drops each as it ends):
        the line names those still there when the time is up, not all that were there
        when the connection closed (a tester read of a run that had ended 10 s before)."""
        if not running:
            return
        first = sorted(running)
        limit = self.limit

        def still_running() -> str:
            for _ in range(3):  # (read from this thread while trio's may change it)
                try:
                    return ", ".join(str(r) for r in sorted(running)) or "(none)"
                except RuntimeError:
                    continue
            return ", ".join(str(r) for r in first)

        def expired() -> None:
            self.expired = True
            ids = still_running()
            if limit is None:
                logger.error(
                    "run(s) %s still running %gs after their connection closed and their "
                    "cancel: the daemon may start their retry or resume elsewhere "
                    "meanwhile; make the handler honour ctx.cancelled",
                    ids,
                    ORPHAN_LIMIT,
                )
                return
            # Written straight to stderr, not through logging: the loop's thread may hold
            # a handler's lock (a blocked stderr pipe) and the exit must not wait for it.
            line = (
                f"{datetime.now().astimezone():%Y-%m-%d %H:%M:%S,%f} CRITICAL "
                f"coordinator.worker: run(s) {ids} still running {limit:g}s after their "
                f"connection closed and their cancel: exiting (status {ORPHAN_EXIT}) rather "
                "than run beside the retry or resume the daemon may start elsewhere; make "
                "the handler honour ctx.cancelled\n"
            )
            with contextlib.suppress(OSError):
                os.write(2, line.encode(errors="replace"))
            os._exit(ORPHAN_EXIT)

        self._timer = threading.Timer(ORPHAN_LIMIT if limit is None else limit, expired)
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


@attrs.define(eq=False)
class Worker:
    """A set of job handlers served over one connection to the daemon."""

    #: How the daemon knows this worker; a new connection with the same id replaces the
    #: old one. Default: ``hostname-pid``.
    worker_id: str = attrs.field(default=None, converter=_worker_id)
    #: Calls run at once (1 to 1024).
    capacity: int = attrs.field(default=4, validator=_check_capacity)
    #: Seconds between ``ctx.cancelled`` being set and the handler being cancelled.
    cancel_delay: float = attrs.field(default=0.0, kw_only=True)
    #: The same for a recoverable job's handler: time to reach a safe boundary and raise
    #: :class:`Paused` (keep it under the daemon's cancel grace, 10 s by default).
    pause_grace: float = attrs.field(default=5.0, kw_only=True)
    #: The namespace whose jobs this worker's code declares (``@worker.job(...,
    #: cron=...)``): every job of it is the code's; ``None``, or no handler with a
    #: schedule: it declares nothing.
    namespace: str | None = attrs.field(default=None, kw_only=True)
    #: Seconds a handler may run on after its connection to the daemon closed (the
    #: daemon disconnected it for ignoring a cancel, stopped, or the link broke): its
    #: call was cancelled, and the daemon, which counts it as ended, may start the
    #: run's retry or resume elsewhere. Past this the process exits (status 70) rather
    #: than run beside it; ``coordinator worker`` sets 10 s (its service manager starts
    #: it again), and reconnects only once such calls have ended. ``None`` (embedded in
    #: a program of yours): it is logged, not enforced, and the worker reconnects at once
    #: to serve its types with the slots such calls leave free (its capacity less
    #: them; none free: once one ends; once they ended, that connection says ``bye``
    #: when idle and the worker connects again with them); what they return is
    #: dropped, never sent on the new connection (the daemon ended their runs when the
    #: old one closed). It waited for them before: one hung thread kept every type the
    #: worker serves unserved.
    orphan_limit: float | None = attrs.field(
        default=None,
        kw_only=True,
        validator=attrs.validators.optional(attrs.validators.gt(0)),
    )
    #: The daemon's answer to the last declaration (``ok``, or the problems), if any.
    last_declared: Declared | None = attrs.field(default=None, init=False)
    _handlers: dict[str, Handler] = attrs.field(factory=dict, init=False)
    _declared: dict[str, DeclaredJob] = attrs.field(factory=dict, init=False)
    _stop: trio.Event | None = attrs.field(default=None, init=False)
    #: :meth:`stop` was called while no :meth:`run` served: the next one returns at once.
    _stop_early: bool = attrs.field(default=False, init=False)
    #: The connection being served, if any.
    _current: _Session | None = attrs.field(default=None, init=False)
    #: The daemon's last refusal of this worker, said once at ERROR until it changes or
    #: the worker is accepted (welcomed, and its declaration answered); it retried every
    #: 30 s, an ERROR line each time, forever.
    _refused: str | None = attrs.field(default=None, init=False)
    #: SIGINT arrives as a signal here (``coordinator worker`` receives it), never as a
    #: ``KeyboardInterrupt``: one a handler raises is then its own, one call's failure.
    _sigint_received: bool = attrs.field(default=False, init=False)
    #: Where calls run (:meth:`run`'s): they may outlive their connection.
    _calls: trio.Nursery | None = attrs.field(default=None, init=False)
    #: Closed connections whose calls still run (orphans), holding slots.
    _orphaned: set[_Session] = attrs.field(factory=set, init=False)
    #: Set (and replaced) whenever an orphan ends: a slot is free again.
    _orphan_ended: trio.Event = attrs.field(factory=trio.Event, init=False)

    @property
    def types(self) -> list[str]:
        """The job types handled, in registration order."""
        return list(self._handlers)

    @property
    def declared(self) -> list[DeclaredJob]:
        """The jobs this worker declares, in registration order."""
        return list(self._declared.values())

    def job(
        self,
        job_type: str,
        *,
        cron: str | None = None,
        every: str | timedelta | None = None,
        at: str | datetime | None = None,
        manual: bool = False,
        timezone: str | None = None,
        timeout: str | timedelta | None = None,
        priority: str | None = None,
        idempotent: bool = False,
        paused: bool = False,
        params: Mapping[str, Any] | None = None,
        name: str | None = None,
        retries: int | None = None,
        retry_backoff: str | timedelta | None = None,
        retry_max_delay: str | timedelta | None = None,
        misfire: str | None = None,
        misfire_grace: str | timedelta | None = None,
        recoverable: bool = False,
        alert: bool = True,
        keep_last: int | None = None,
        retention: str | timedelta | None = None,
    ) -> Callable[[_H], _H]:
        """Decorator: ``@worker.job("type")`` on ``async def handler(ctx)``.

        With a schedule -- ``cron="0 6 * * *"`` (and ``timezone``), ``every="15m"``,
        ``at="2026-12-24T18:00:00+01:00"`` or ``manual=True`` -- the handler also declares
        the job ``name`` (default: the job type) of the worker's ``namespace``, targeting
        this type, with ``timeout``, ``priority``, ``idempotent``, ``paused``, ``params``,
        the retry policy (``retries``, ``retry_backoff``, ``retry_max_delay``), the misfire
        policy (``misfire``, ``misfire_grace``), ``recoverable``, ``alert`` and retention
        (``keep_last``, ``retention``) as a manifest entry has them: what it leaves out
        is the default. The daemon checks the expression and the policies.
        """
        if not isinstance(job_type, str) or not job_type.strip():
            raise ValueError("a job type must be a non-empty string")
        if len(job_type) > MAX_NAME:
            # (Here, where the decorator names it: it passed every check before, and the
            # daemon's hello refused it at the first connect, in a traceback.)
            raise ValueError(
                f"job type {job_type[:40]!r}... is {len(job_type)} characters long; the "
                f"limit is {MAX_NAME}"
            )
        declared = _declared(
            job_type,
            name=name,
            cron=cron,
            every=every,
            at=at,
            manual=manual,
            timezone=timezone,
            timeout=timeout,
            priority=priority,
            idempotent=idempotent,
            paused=paused,
            params=params,
            policies=_Policies(
                retries=retries,
                retry_backoff=retry_backoff,
                retry_max_delay=retry_max_delay,
                misfire=misfire,
                misfire_grace=misfire_grace,
                recoverable=recoverable,
                alert=alert,
                keep_last=keep_last,
                retention=retention,
            ),
        )

        def register(handler: _H) -> _H:
            func: Any = handler
            if not inspect.iscoroutinefunction(func):
                raise TypeError(f"handler for {job_type!r} must be an async function")
            if job_type in self._handlers:
                raise ValueError(f"job type {job_type!r} already has a handler")
            if declared is not None and any(d.name == declared.name for d in self.declared):
                raise ValueError(f"job {declared.name!r} is declared twice")
            self._handlers[job_type] = handler
            if declared is not None:
                self._declared[job_type] = declared
            return handler

        return register

    def _check(self) -> None:
        """Raise ``ValueError`` if this worker cannot serve as it is: no handlers,
        schedules without a namespace, names the daemon would refuse. (The command checks
        before its trio run, where the error would come wrapped in an exception group.)"""
        if not self._handlers:
            raise ValueError("no job types: register handlers with @worker.job(TYPE)")
        # What the daemon's hello would refuse, refused here: it passed, and the first
        # connect failed in a traceback of 38 lines (exit 1, not 2).
        if not self.worker_id.strip():
            raise ValueError("the worker id must not be empty")
        if len(self.worker_id) > MAX_NAME:
            raise ValueError(
                f"the worker id is {len(self.worker_id)} characters long; the limit is {MAX_NAME}"
            )
        try:
            Hello(worker=self.worker_id, types=self.types, capacity=self.capacity)
        except ProtocolError as exc:  # (more types than a hello may list, say)
            raise ValueError(str(exc)) from None
        if self._declared and self.namespace is None:
            raise ValueError(
                "handlers declare schedules ("
                + ", ".join(d.name for d in self.declared)
                + "): give the worker its namespace, Worker(namespace=...) or --namespace"
            )
        if self.namespace is not None:
            Declare(namespace=self.namespace, jobs=self.declared)  # checks the names

    def stop(self) -> None:
        """Leave cleanly: say ``bye`` (no new calls), ask recoverable calls to pause
        (``ctx.cancelled``, reason ``stopping``, as a daemon stop does), let the others
        finish and every call send its result, then make :meth:`run` return. Called
        while no :meth:`run` serves (a shutdown asked for during start-up), it makes the
        next :meth:`run` return at once, without connecting."""
        if self._stop is not None:
            self._stop.set()
        else:
            # (It did nothing: the run that followed served for good.)
            self._stop_early = True

    async def run(
        self,
        address: str | os.PathLike[str] | tuple[str, int],
        *,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until :meth:`stop` (or cancellation; a :meth:`stop` before it makes it
        return at once, without connecting): a path is the daemon's Unix
        socket, ``(host, port)`` its TCP listener (which needs ``token``), over TLS with
        ``tls`` (a client context: :func:`tls_context`; the certificate must name
        ``server_hostname``, default the host). ``task_status.started()`` once the
        daemon first welcomed this worker."""
        self._check()
        if self.namespace is not None and not self._declared:
            logger.warning(
                "namespace %s given, but no handler carries a schedule: nothing is "
                "declared, and the namespace's jobs are left as they are",
                self.namespace,
            )
        stop = self._stop = trio.Event()
        if self._stop_early:
            self._stop_early = False
            stop.set()
        try:
            # Calls run here, not in their connection's nursery: a call that runs on
            # after its connection closed (a thread) must not hold the next connection
            # back (run() still returns only once every call has ended).
            async with trio.open_nursery() as calls:
                self._calls = calls
                await self._serve(address, stop, token, tls, server_hostname, task_status)
        finally:
            self._stop = None  # (a stop() from now on is for the next run)
            self._calls = None
        logger.info("worker %s stopped", self.worker_id)

    async def _serve(
        self,
        address: str | os.PathLike[str] | tuple[str, int],
        stop: trio.Event,
        token: str | None,
        tls: ssl.SSLContext | None,
        server_hostname: str | None,
        task_status: trio.TaskStatus[None],
    ) -> None:
        """Connect, serve, and reconnect with backoff, until ``stop`` is set."""
        attempt = 0
        started = False
        where = address if isinstance(address, tuple) else os.fspath(address)

        def welcomed() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started()

        while not stop.is_set():
            if not await self._free_slot(stop):
                break
            try:
                stream = await _connect(address, tls, server_hostname)
            except OSError as exc:
                logger.warning("cannot connect to %s: %s", where, exc.strerror or exc)
            else:
                session = await self._session(stream, token, welcomed)
                if session.proven():
                    attempt = 0  # (a daemon restart: back at once)
                if session.renewing and not stop.is_set():
                    attempt = 0
                    continue  # (at once: left on purpose, for its slots)
            if stop.is_set():
                break
            attempt += 1
            delay = backoff(attempt)
            logger.info("reconnecting in %gs", delay)
            with trio.move_on_after(delay):
                await stop.wait()

    def _held(self) -> int:
        """Slots held by calls still running from closed connections."""
        return sum(len(session.running) for session in self._orphaned)

    async def _free_slot(self, stop: trio.Event) -> bool:
        """Wait until a call may run (every slot held by an orphan: until one ends), or
        ``stop``; whether one may."""
        said = False
        while not stop.is_set() and self._held() >= self.capacity:
            if not said:
                said = True
                logger.warning(
                    "all %d slot(s) are held by calls still running after their connection "
                    "closed; connecting again once one of them ends",
                    self.capacity,
                )
            ended = self._orphan_ended
            async with trio.open_nursery() as waiting:

                async def first(event: trio.Event) -> None:
                    await event.wait()
                    waiting.cancel_scope.cancel()

                waiting.start_soon(first, ended)
                waiting.start_soon(first, stop)
        return not stop.is_set()

    # -- one connection ------------------------------------------------------------------

    async def _session(
        self, stream: trio.abc.Stream, token: str | None, welcomed: Callable[[], None]
    ) -> _Session:
        """Serve one connection until it closes; return it, to say how it went."""
        send, recv = trio.open_memory_channel[bytes](_OUTBOX)
        session = self._current = _Session(
            outbox=send,
            capacity=self.capacity - self._held(),
            fd=stream.socket.fileno() if isinstance(stream, trio.SocketStream) else None,
        )
        try:
            await self._serve_session(stream, token, welcomed, session, recv)
        finally:
            self._current = None
        return session

    async def _serve_session(
        self,
        stream: trio.abc.Stream,
        token: str | None,
        welcomed: Callable[[], None],
        session: _Session,
        recv: trio.MemoryReceiveChannel[bytes],
    ) -> None:
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(_write_loop, stream, recv, nursery.cancel_scope)
            nursery.start_soon(self._on_stop, session, nursery)
            if session.capacity < self.capacity:
                nursery.start_soon(self._renew, session)
            hello = Hello(
                worker=self.worker_id, types=self.types, capacity=session.capacity, token=token
            )
            await session.send(hello)
            if self.namespace is not None and self._declared:
                # The namespace's complete job set, as the code says. None at all is not
                # a declaration that every job of the namespace is gone: a worker given
                # its namespace for no schedule paused every job of it, SQL-defined
                # commands included (a helper's finding, 2026-12-02).
                session.declaring = True
                await session.send(Declare(namespace=self.namespace, jobs=self.declared))
            try:
                try:
                    await self._read_loop(stream, session, nursery, welcomed)
                except ProtocolError as exc:
                    logger.error("the daemon sent a bad message (%s); reconnecting", exc)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    if session.welcomed and _is_eof(exc.__cause__):
                        # A TLS connection the daemon closed without close_notify, as a
                        # stop, a kill or a failover does (and our own `bye` ends with):
                        # a lost connection, as on the Unix socket, not a TLS failure.
                        if session.renewing or (self._stop is not None and self._stop.is_set()):
                            logger.info("connection to the daemon closed")
                        else:
                            logger.warning("connection to the daemon lost")
                    elif isinstance(exc.__cause__, ssl.SSLError):
                        hint = (
                            ""
                            if session.welcomed
                            else " (does it want a client certificate this worker has not, "
                            "or not one it trusts? its log says: worker.rejected)"
                        )
                        logger.error("TLS with the daemon failed: %s%s", exc.__cause__, hint)
                    else:
                        logger.warning("connection to the daemon lost")
                if session.running:
                    logger.warning(
                        "connection closed with %d call(s) running; cancelling them",
                        len(session.running),
                    )
            finally:
                # Every way out with calls running cancels them and arms the watch: the
                # read side's end, the write side's failure (it cancels this scope, the
                # read loop with it) and a cancel from outside alike.
                self._close(session)
            nursery.cancel_scope.cancel()
        if self.orphan_limit is not None:
            # Not connected again before they end (or the limit ends the process): calls
            # of a new connection would crash with it.
            await session.drained.wait()

    async def _renew(self, session: _Session) -> None:
        """A connection made while orphans held slots takes fewer calls (the protocol
        has no way to raise a connection's capacity): once some of them have ended and
        it has no call running, it says ``bye`` to connect again at once with the
        slots now free. (Idle, so that no call waits on it; a call the daemon sent
        before it read the ``bye`` runs, and the daemon closes after its result.)"""
        while True:
            ended = self._orphan_ended
            if session.capacity < self.capacity - self._held():
                break
            await ended.wait()
        await session.accepted.wait()
        while session.running:
            await session.call_ended.wait()
        if session.leaving or session.closed:
            return
        session.renewing = True
        logger.info(
            "the calls that held slots have ended: leaving this connection (capacity %d) "
            "to connect again with capacity %d",
            session.capacity,
            self.capacity - self._held(),
        )
        await session.send(Bye())

    def _close(self, session: _Session) -> None:
        """The connection is closing: nothing more is sent on it; its calls are
        cancelled, and those that run on (orphans) hold their slots until they end,
        watched (:class:`_Orphans`)."""
        session.closed = True
        with contextlib.suppress(trio.ClosedResourceError):
            session.outbox.close()
        if not session.running:
            session.drained.set()
            return
        session.orphans = _Orphans(self.orphan_limit)
        session.orphans.arm(session.running)
        self._orphaned.add(session)
        for ctx, scope in session.running.values():
            ctx._nursery = None  # (the connection's, about to close: nothing delayed)
            scope.cancel()

    def _orphan_done(self, session: _Session, ctx: Context) -> None:
        """A call of a closed connection ended: its slot is free; its result dropped."""
        if session.orphans is not None and session.orphans.expired:
            logger.warning(
                "run %d ended after all (its connection had closed): its result is "
                "dropped, the daemon having ended the run; its slot is free again",
                ctx.run_id,
            )
        else:
            logger.debug("run %d ended after its connection closed: result dropped", ctx.run_id)
        if not session.running:
            if session.orphans is not None:
                session.orphans.disarm()
            self._orphaned.discard(session)
            session.drained.set()
        self._orphan_ended.set()
        self._orphan_ended = trio.Event()

    async def _read_loop(
        self,
        stream: trio.abc.Stream,
        session: _Session,
        nursery: trio.Nursery,
        welcomed: Callable[[], None],
    ) -> None:
        lines = LineBuffer()
        while True:
            data = await stream.receive_some(_READ_SIZE)
            if not data:
                if self._stop is not None and self._stop.is_set():
                    return
                if session.renewing:
                    logger.info("connection closed after its bye: connecting again")
                    return
                if session.welcomed:
                    logger.warning("the daemon closed the connection")
                else:
                    # Refused without a word: the daemon's log says why (worker.rejected).
                    logger.error(
                        "the daemon closed the connection before welcoming this worker "
                        "(plain TCP to its TLS listener? a client certificate it does not "
                        "accept?); its log says why (worker.rejected)"
                    )
                return
            for line in lines.feed(data):
                message = parse_from_daemon(line)
                if isinstance(message, Welcome):
                    session.welcomed_at = trio.current_time()
                    session.welcomed_as = message.worker
                    if not session.declaring:
                        self._accepted(session)
                    welcomed()
                elif isinstance(message, Call):
                    self._on_call(session, message, nursery)
                elif isinstance(message, Cancel):
                    self._on_cancel(session, message, nursery)
                elif isinstance(message, Declared):
                    self._accepted(session)
                    self._on_declared(message)
                elif isinstance(message, Error):
                    self._say_error(message.message)
                    return

    def _accepted(self, session: _Session) -> None:
        """The daemon welcomed this worker and, if it declares, answered the declaration:
        connected. (Said at the welcome alone, a worker whose declaration the daemon then
        refused said "connected as" at every retry, and the refusal at ERROR each time:
        the welcome forgot it just before it came again.)"""
        if session.welcomed_as is None:
            return
        held = self.capacity - session.capacity
        logger.info(
            "connected as %s: %s (capacity %d%s)",
            session.welcomed_as,
            ", ".join(self.types),
            session.capacity,
            f" of {self.capacity}: {held} held by call(s) still running after their "
            "connection closed"
            if held
            else "",
        )
        session.welcomed_as = None
        session.accepted.set()
        self._refused = None

    def _say_error(self, said: str) -> None:
        """Log why the daemon ended the connection, as what it is: not every ``error``
        is a refusal of this worker. (Told apart by the daemon's words, in
        ``coordinator/executors/worker.py``; other words read as a refusal.)"""
        if said.startswith("replaced by a new connection"):
            logger.error(
                "another connection with worker id %s replaced this one: is a second "
                "worker running with the same id? (give each its own --id); the daemon "
                "said: %s",
                self.worker_id,
                said,
            )
        elif " ignored cancel " in said:
            logger.error(
                "the daemon disconnected this worker: a call went on after its cancel "
                "(a handler that blocks without trio checkpoints, or a cancel_delay or "
                "pause_grace longer than the daemon's grace); the daemon said: %s",
                said,
            )
        elif said == self._refused:
            logger.info("the daemon refused this worker again: %s", said)
        else:
            self._refused = said
            logger.error("the daemon refused this worker: %s", said)
            logger.info(
                "trying again with backoff (up to every %gs) until the daemon's "
                "configuration or this worker's allows it; the same refusal is said at "
                "info level from now on",
                BACKOFF_CAP,
            )

    def _on_declared(self, declared: Declared) -> None:
        self.last_declared = declared
        if declared.ok and declared.unchanged:
            logger.info("schedules of %s: unchanged", declared.namespace)
        elif declared.ok:
            logger.info(
                "schedules of %s: %d created, %d updated, %d paused",
                declared.namespace,
                declared.created,
                declared.updated,
                declared.paused,
            )
        else:
            why = "; ".join(declared.problems) or declared.error or "refused"
            logger.error("schedules of %s not applied: %s", declared.namespace, why)
        if declared.conflict is not None:
            logger.warning("schedules of %s: %s", declared.namespace, declared.conflict)

    async def _on_stop(self, session: _Session, nursery: trio.Nursery) -> None:
        """On :meth:`stop`: say ``bye`` and let the daemon close the connection once the
        running calls have sent their results (or just hang up if not welcomed yet).
        Recoverable calls are asked to pause, as the daemon's own stop does: a scan of
        hours ran on, and kept the stopping worker up, until a second signal broke the
        connection (``paused: worker W disconnected``, not at a boundary of its own)."""
        assert self._stop is not None
        await self._stop.wait()
        if not session.welcomed:
            nursery.cancel_scope.cancel()
            return
        session.leaving = True
        pausing = [ctx.run_id for ctx, _ in session.running.values() if ctx.recoverable]
        logger.info(
            "stopping: %d call(s) to finish%s",
            len(session.running),
            f" (run(s) {', '.join(map(str, pausing))} asked to pause)" if pausing else "",
        )
        await session.send(Bye())
        for ctx, scope in list(session.running.values()):
            if ctx.recoverable:
                self._cancel_call(ctx, scope, nursery, "stopping")

    def _on_cancel(self, session: _Session, cancel: Cancel, nursery: trio.Nursery) -> None:
        running = session.running.get(cancel.run)
        if running is None:
            return  # finished meanwhile
        ctx, scope = running
        self._cancel_call(ctx, scope, nursery, cancel.reason or "cancelled")

    def _cancel_call(
        self, ctx: Context, scope: trio.CancelScope, nursery: trio.Nursery, reason: str
    ) -> None:
        """Set ``ctx.cancelled`` and cancel the handler after its delay (a recoverable
        one's ``pause_grace``, to pause by itself at a boundary)."""
        if ctx.cancelled.is_set():
            return  # asked before: its clock runs already
        ctx.cancel_reason = reason
        ctx.cancelled.set()
        delay = max(self.cancel_delay, self.pause_grace) if ctx.recoverable else self.cancel_delay
        if delay > 0:
            nursery.start_soon(_cancel_after, scope, delay)
        else:
            scope.cancel()

    def _cancel_running(self, why: str) -> None:
        """Cancel every running call at once (a second signal), each to send its result
        before the connection closes: a recoverable one pauses at its last checkpoint,
        another fails saying ``why`` (category ``cancellation``). Dropping the
        connection instead recorded them ``crashed``, ``worker W disconnected``."""
        session = self._current
        if session is None:
            return
        for ctx, scope in list(session.running.values()):
            if not ctx.cancelled.is_set():
                ctx.cancel_reason = "stopping"
                ctx.cancelled.set()
            ctx._cancelled_because = why
            scope.cancel()

    def _on_call(self, session: _Session, call: Call, nursery: trio.Nursery) -> None:
        """Register the call at once (a ``cancel`` right behind it must find it), then
        run it in its own task."""
        handler = self._handlers.get(call.job_type)
        error = None
        if handler is None:
            error = f"worker {self.worker_id} does not serve {call.job_type!r}"
        elif len(session.running) >= session.capacity or call.run in session.running:
            error = f"worker {self.worker_id} is at capacity ({session.capacity})"
        if handler is None or error is not None:
            nursery.start_soon(session.send, Result(run=call.run, ok=False, error=error))
            return
        ctx = Context(
            run_id=call.run,
            job=call.job,
            namespace=call.namespace,
            type=call.job_type,
            args=call.args,
            params=call.params,
            attempt=call.attempt,
            deadline=call.deadline,
            trigger=call.trigger,
            scheduled_for=call.scheduled_for,
            cursor=call.checkpoint,
            recoverable=call.recoverable,
            count=call.count,
            session=session,
        )
        ctx._nursery = nursery  # (the connection's: the call's delayed sends start there)
        scope = trio.CancelScope()
        session.running[call.run] = (ctx, scope)
        if session.leaving and ctx.recoverable:
            self._cancel_call(ctx, scope, nursery, "stopping")  # (sent before our bye)
        assert self._calls is not None
        self._calls.start_soon(self._serve_call, session, handler, ctx, scope)

    async def _serve_call(
        self, session: _Session, handler: Handler, ctx: Context, scope: trio.CancelScope
    ) -> None:
        try:
            result: Result | bytes = await self._invoke(handler, ctx, scope)
            await ctx._flush()
        finally:
            del session.running[ctx.run_id]
            session.call_ended.set()
            session.call_ended = trio.Event()
            if session.closed:
                self._orphan_done(session, ctx)
        await session.send(result, now=not session.running)  # (closed: dropped)

    async def _invoke(
        self, handler: Handler, ctx: Context, scope: trio.CancelScope
    ) -> Result | bytes:
        """Run the handler; whatever it does becomes a result that fits on one line (a
        returned value's result comes encoded: its size was checked on that line)."""
        result: Result | bytes
        try:
            with scope:
                value = await handler(ctx)
            if scope.cancelled_caught and ctx.recoverable:
                # It did not pause by itself in time: paused at its last checkpoint.
                result = Result(run=ctx.run_id, ok=True, paused=True)
            elif scope.cancelled_caught:
                said = ctx._cancelled_because or f"cancelled ({ctx.cancel_reason})"
                result = Result(run=ctx.run_id, ok=False, error=said, category="cancellation")
            elif isinstance(value, Paused):
                result = _paused(ctx.run_id, value)
            else:
                result = _result(ctx.run_id, value, delta=ctx.recoverable)
        except Paused as paused:
            result = _paused(ctx.run_id, paused)
        except BaseException as exc:
            if not _handler_failure(exc, keyboard=self._sigint_received):
                raise  # the worker's own: cancellation, Ctrl-C, GeneratorExit
            meant = _unwrapped(exc)
            if isinstance(meant, Paused):
                result = _paused(ctx.run_id, meant)
            else:
                result = _failure(ctx.run_id, meant)
        finally:
            ctx._ended()
        return result


async def _write_loop(
    stream: trio.abc.Stream, outbox: trio.MemoryReceiveChannel[bytes], connection: trio.CancelScope
) -> None:
    try:
        async for data in outbox:
            await stream.send_all(gather_lines(data, outbox))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        logger.warning("connection to the daemon lost while sending")
        connection.cancel()


async def _cancel_after(scope: trio.CancelScope, delay: float) -> None:
    await trio.sleep(delay)
    scope.cancel()


async def _connect(
    address: str | os.PathLike[str] | tuple[str, int],
    tls: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
) -> trio.abc.Stream:
    if isinstance(address, tuple):
        host, port = address
        tcp = await trio.open_tcp_stream(host, port)
        _keep_alive(tcp)
        if tls is None:
            return tcp
        stream = trio.SSLStream(
            tcp, tls, server_hostname=server_hostname or host, https_compatible=False
        )
        try:
            await stream.do_handshake()
        except trio.BrokenResourceError as exc:
            await trio.aclose_forcefully(stream)
            cause = exc.__cause__
            raise OSError(f"TLS handshake with {host}:{port} failed: {cause or exc}") from exc
        return stream
    return await trio.open_unix_socket(os.fspath(address))


def _keep_alive(tcp: trio.SocketStream) -> None:
    """Turn on TCP keepalive (:data:`KEEPALIVE`): otherwise a worker waiting for calls
    from a daemon whose host vanished (or rebooted) waits on the dead connection for
    good: it sends nothing until called, so nothing tells it."""
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    options += [
        (socket.IPPROTO_TCP, getattr(socket, name), value)
        for name, value in KEEPALIVE
        if hasattr(socket, name)
    ]
    for level, option, value in options:
        with contextlib.suppress(OSError):  # a platform without it: connect all the same
            tcp.setsockopt(level, option, value)


def tls_context(
    ca: str | os.PathLike[str] | None = None,
    *,
    cert: str | os.PathLike[str] | None = None,
    key: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """A client TLS context for :meth:`Worker.run`: the daemon's certificate checked
    against ``ca`` (else the system's CAs); ``cert``/``key``: this worker's own
    certificate, for a daemon that asks for one (``worker_tls_ca``)."""
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cafile=os.fspath(ca) if ca is not None else None
    )
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        context.load_cert_chain(os.fspath(cert), os.fspath(key) if key is not None else None)
    return context


def _result(run_id: int, value: object, *, delta: bool = False) -> Result | bytes:
    """The result for what a handler returned (a bad value is a failure): a success as
    its line, encoded once to check its size and sent as it is. ``delta``: the count is
    a last delta of a recoverable run's counter, which only grows."""
    try:
        count: Any = None
        extra: Any = None
        if value is None:
            pass
        elif isinstance(value, bool):
            raise TypeError("a handler returns a count, not a bool")
        elif isinstance(value, int):
            count = value
        elif isinstance(value, tuple) and len(value) == 2:
            count, extra = value
            if extra is not None and not isinstance(extra, dict):
                raise TypeError(f"extra must be a dict, not {type(extra).__name__}")
        elif isinstance(value, dict):
            extra = dict(value)
            count = extra.pop("count", None)
            nested = extra.pop("extra", None)
            if isinstance(nested, dict):
                extra.update(nested)
            elif nested is not None:
                extra["extra"] = nested
        else:
            raise TypeError(
                "a handler returns None, a count, (count, extra) or a dict, "
                f"not {type(value).__name__}"
            )
        if delta:
            _check_delta(count, "result")
        # Anything JSON cannot say (datetimes, decimals, ...) in extra becomes its str().
        line = encode_success(run_id, count, extra)
        size = len(line) - 1
    # The handler did its work; only its answer cannot go on the wire, and a retry would
    # do the work again to end the same: not retried, as the daemon's call whose args do
    # not fit (it was, with the job's retries: the work done three times for --retries 2).
    except (TypeError, ValueError, RecursionError) as exc:
        return Result(
            run=run_id,
            ok=False,
            error=_clip(f"bad return value: {exc}; not retried"),
            retryable=False,
            category="invalid-input",
        )
    if size > MAX_LINE:
        return Result(
            run=run_id,
            ok=False,
            count=count,
            error=(
                f"result of {size} bytes exceeds the {MAX_LINE}-byte limit (return large "
                "output by reference); not retried"
            ),
            retryable=False,
            category="invalid-input",
        )
    return line


def _paused(run_id: int, paused: Paused) -> Result:
    """The result of a handler that paused (at its cursor, or at its last checkpoint)."""
    try:
        _check_delta(paused.count, "pause")
        return Result(run=run_id, ok=True, paused=True, cursor=paused.cursor, count=paused.count)
    except ValueError as exc:  # a cursor that is not JSON or too large, a bad count
        return Result(run=run_id, ok=False, error=_clip(f"bad pause: {exc}"))


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


#: What a handler raises that fails its call. ``SystemExit`` too: a handler's
#: ``sys.exit(4)`` ended the whole worker process, failing the calls running beside it
#: (``worker W disconnected``); it is one call's failure, ``SystemExit: 4``. The other
#: base exceptions are not the handler's to report: trio's ``Cancelled`` (the connection
#: is going), ``KeyboardInterrupt`` (Ctrl-C stops the worker; but see
#: :func:`_handler_failure`) and ``GeneratorExit``.
_FAILURES: Final = (Exception, SystemExit)


def _handler_failure(exc: BaseException, *, keyboard: bool = False) -> bool:
    """Whether ``exc`` (or every exception of its group) fails the call. ``keyboard``:
    SIGINT is received as a signal (``coordinator worker``), so a ``KeyboardInterrupt``
    is the handler's own raise, not Ctrl-C, and fails its call only (it ended the whole
    worker, the calls beside it ``crashed``); embedded in a program that lets trio turn
    Ctrl-C into ``KeyboardInterrupt``, it still stops the worker."""
    failures = (*_FAILURES, KeyboardInterrupt) if keyboard else _FAILURES
    return all(isinstance(leaf, failures) for leaf in _leaves(exc))


def _unwrapped(exc: BaseException) -> BaseException:
    """What the handler meant to raise. A nursery (trio's, an asyncio TaskGroup,
    ``trio_asyncio.open_loop()``) wraps what its task raised in an exception group: one
    exception alone in it, or only :class:`Paused` ones, is the handler's own (before,
    README's own example ended "paused by operator; the worker said: ExceptionGroup",
    and a JobError raised in a nursery lost its category and was retried)."""
    leaves = _leaves(exc)
    if len(leaves) == 1:
        return leaves[0]
    if leaves and all(isinstance(leaf, Paused) for leaf in leaves):
        first = leaves[0]
        assert isinstance(first, Paused)
        return first
    return exc


def _failure(run_id: int, exc: BaseException) -> Result:
    if isinstance(exc, BaseExceptionGroup):
        # Several at once: each said, not "Exceptions from Trio nursery (2 sub-exceptions)".
        leaves = _leaves(exc)
        said = "; ".join(_said(leaf) for leaf in leaves[:3])
        more = f" (and {len(leaves) - 3} more)" if len(leaves) > 3 else ""
        return Result(
            run=run_id,
            ok=False,
            error=_clip(f"{len(leaves)} errors: {said}{more}"),
            extra={"traceback": _traceback(exc)},
        )
    text = str(exc)
    if isinstance(exc, JobError):
        # The handler said what failed: its message alone, and how to treat it.
        return Result(
            run=run_id,
            ok=False,
            error=_clip(text or "the handler reported a failure"),
            retryable=exc.retryable,
            category=exc.category,
        )
    return Result(
        run=run_id, ok=False, error=_clip(_said(exc)), extra={"traceback": _traceback(exc)}
    )


def _said(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _traceback(exc: BaseException) -> str:
    tb = "".join(traceback.format_exception(exc))
    if len(tb) > TRACEBACK_LIMIT:
        tb = "…" + tb[-TRACEBACK_LIMIT:]
    return tb


def _clip(text: str) -> str:
    return clip(text, ERROR_LIMIT)


# -- the command ---------------------------------------------------------------------------


def build_parser(prog: str = "coordinator worker") -> argparse.ArgumentParser:
    """The ``coordinator worker`` command line."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run a Python worker: serve the job types of a coordinator.worker.Worker.",
    )
    parser.add_argument(
        "target", metavar="MODULE:OBJECT", help="where the Worker is, e.g. myapp.jobs:worker"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--socket",
        metavar="PATH",
        help="the daemon's worker socket (default: $COORDINATOR_WORKER_SOCKET, else "
        "worker_socket in the configuration file, else the daemon's default runtime path)",
    )
    where.add_argument(
        "--tcp", metavar="HOST:PORT", help="connect over TCP instead (another host: with TLS)"
    )
    where.add_argument(
        "--state-dir",
        metavar="DIR",
        help="a `coordinator demo`'s directory: connect to its worker socket (DIR/worker.sock)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="the daemon's configuration file, for its worker_socket (default: "
        "$COORDINATOR_CONFIG, else /etc/coordinator/coordinator.toml)",
    )
    parser.add_argument(
        "--token",
        help="the token for --tcp (default: $COORDINATOR_WORKER_TOKEN; --token-file keeps it "
        "out of ps)",
    )
    parser.add_argument("--token-file", metavar="FILE", help="read the token from FILE")
    parser.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="connect over TLS, checking the daemon's certificate against this CA bundle",
    )
    parser.add_argument(
        "--tls", action="store_true", help="connect over TLS, trusting the system's CAs"
    )
    parser.add_argument("--tls-cert", metavar="FILE", help="this worker's certificate (mutual TLS)")
    parser.add_argument("--tls-key", metavar="FILE", help="its private key")
    parser.add_argument(
        "--tls-server-name", metavar="NAME", help="the name the daemon's certificate carries"
    )
    parser.add_argument(
        "--namespace", help="the namespace the handlers' schedules go to (overrides the Worker's)"
    )
    parser.add_argument("--id", dest="worker_id", help="worker id (overrides the Worker's)")
    parser.add_argument("--capacity", type=int, help="calls at once (overrides the Worker's)")
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error")
    )
    return parser


def load(target: str) -> Worker:
    """Import ``MODULE:OBJECT`` (the current directory is importable) and return the
    Worker it names. Raises ``ValueError`` saying what is wrong."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected MODULE:OBJECT, not {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{module_name} has no attribute {attr}") from None
    if not isinstance(obj, Worker):
        raise ValueError(f"{target} is a {type(obj).__name__}, not a coordinator.worker.Worker")
    return obj


@attrs.frozen(kw_only=True)
class _Prepared:
    worker: Worker
    address: Path | tuple[str, int]
    token: str | None
    tls: ssl.SSLContext | None
    server_hostname: str | None


def main(argv: Sequence[str] | None = None) -> int:
    """``coordinator worker MODULE:OBJECT [--socket PATH | --tcp HOST:PORT]``: run the
    worker until SIGINT/SIGTERM/SIGHUP (the first leaves cleanly: recoverable calls are
    asked to pause, the others finish; a second one cancels them, each sending its result;
    a third drops the connection). Returns the exit status. Starts its own trio run; from
    inside one (trio or trio-asyncio) use :func:`amain`."""
    prepared = _prepare(argv)
    if isinstance(prepared, int):
        return prepared
    trio.run(_serve_until_signalled, prepared)
    return 0


async def amain(argv: Sequence[str] | None = None) -> int:
    """:func:`main` for a caller already running trio (in the main thread, for signals)."""
    prepared = _prepare(argv)
    if isinstance(prepared, int):
        return prepared
    await _serve_until_signalled(prepared)
    return 0


def _prepare(argv: Sequence[str] | None) -> int | _Prepared:
    """Parse, set up logging and load the worker; an exit status if that fails."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        worker = load(args.target)
        if args.worker_id:
            worker.worker_id = args.worker_id
        if args.capacity is not None:
            worker.capacity = args.capacity
        if args.namespace:
            try:
                check_namespace(args.namespace, "--namespace")
            except InvalidInput as exc:  # (it said "declare: 'namespace': ...")
                raise ValueError(str(exc)) from None
            worker.namespace = args.namespace
        worker._check()  # (here, not in the run: one line, not a traceback)
        address = _address(args)
        token = _token(args)
        tls = _tls(args)
    except (ValueError, OSError, ssl.SSLError) as exc:
        print(f"coordinator worker: {exc}", file=sys.stderr)
        return 2
    if isinstance(address, tuple) and not token:
        print(
            "coordinator worker: --tcp needs --token, --token-file or COORDINATOR_WORKER_TOKEN",
            file=sys.stderr,
        )
        return 2
    if isinstance(address, tuple) and tls is None and not is_loopback(address[0]):
        print(
            f"coordinator worker: --tcp {address[0]} is not a loopback address: connect over "
            "TLS (--tls-ca FILE, or --tls)",
            file=sys.stderr,
        )
        return 2
    return _Prepared(
        worker=worker,
        address=address,
        token=token,
        tls=tls,
        server_hostname=args.tls_server_name,
    )


def _token(args: argparse.Namespace) -> str | None:
    if args.token and args.token_file:
        # (--token-file won without a word; which one was meant?)
        raise ValueError("--token and --token-file: give one of them")
    if args.token_file:
        try:
            text = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise ValueError(f"--token-file: {args.token_file}: {exc.strerror or exc}") from None
        if not text:
            raise ValueError(f"--token-file: {args.token_file} is empty")
        return text
    return args.token or os.environ.get("COORDINATOR_WORKER_TOKEN") or None


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    wanted = args.tls or args.tls_ca or args.tls_cert
    if not wanted:
        return None
    if not args.tcp:
        raise ValueError("--tls-ca, --tls and --tls-cert need --tcp")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    # Each file loaded on its own, so that a refusal names the flag and the file (the
    # daemon's do: worker_tls_cert/worker_tls_key: cannot load X with Y).
    try:
        context = tls_context(args.tls_ca)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"--tls-ca: cannot load {args.tls_ca}: {_why(exc)}") from None
    if args.tls_cert:
        try:
            context.load_cert_chain(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"--tls-cert/--tls-key: cannot load {args.tls_cert} with {args.tls_key}: "
                f"{_why(exc)}"
            ) from None
    return context


def _why(exc: OSError | ssl.SSLError) -> str:
    """``No such file or directory``, ``key values mismatch``: the words, not the codes."""
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc).replace("_", " ").lower()
    return exc.strerror or str(exc)


def _address(args: argparse.Namespace) -> Path | tuple[str, int]:
    if args.tcp:
        host, sep, port = str(args.tcp).rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"--tcp: expected HOST:PORT, not {args.tcp!r}")
        return (host.strip("[]"), int(port))
    if args.socket:
        return Path(args.socket)
    if args.state_dir:
        # Only a demo keeps its socket there (a service's is in its runtime directory).
        state_dir = Path(args.state_dir).expanduser()
        if not (state_dir / "demo.json").is_file():
            raise ValueError(
                f"--state-dir: {state_dir} is not a coordinator demo's directory (no "
                "demo.json); a service's worker socket is its worker_socket: pass --socket"
            )
        return state_dir.absolute() / "worker.sock"
    env = os.environ.get("COORDINATOR_WORKER_SOCKET")
    if env:
        return Path(env)
    from .config import file_setting
    from .errors import ConfigError

    named: dict[str, str] | None = None
    if args.config:  # (every other command takes --config: it was refused here)
        if not Path(args.config).is_file():
            raise ValueError(f"--config: {args.config}: no such file")
        named = {"COORDINATOR_CONFIG": str(args.config)}
    try:  # the daemon's own configuration file, when it names the socket
        configured = file_setting("worker_socket", named)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return Path(configured) if configured is not None else default_socket_path()


async def _serve_until_signalled(prepared: _Prepared) -> None:
    worker = prepared.worker
    if worker.orphan_limit is None:
        # A service manager starts this process again: a call that runs on after its
        # cancel ends it, rather than run beside the daemon's retry or resume.
        worker.orphan_limit = ORPHAN_LIMIT
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_signals, worker, nursery.cancel_scope)
        await worker.run(
            prepared.address,
            token=prepared.token,
            tls=prepared.tls,
            server_hostname=prepared.server_hostname,
        )
        nursery.cancel_scope.cancel()


async def _watch_signals(worker: Worker, everything: trio.CancelScope) -> None:
    # SIGHUP (a closed terminal) leaves cleanly too: its default action ended the
    # process at once, and the daemon failed the calls it was running (crashed).
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        worker._sigint_received = True
        count = 0
        async for signum in signals:
            count += 1
            name = signal.Signals(signum).name
            if count == 1:
                logger.info("%s: leaving cleanly", name)
                worker.stop()
            elif count == 2:
                # Each call sends its result before the connection closes, saying why.
                logger.warning("%s again: cancelling running calls", name)
                worker._cancel_running(
                    f"cancelled: worker {worker.worker_id} was stopped by a second signal ({name})"
                )
                everything.deadline = min(everything.deadline, trio.current_time() + HARD_STOP)
            else:
                logger.warning("%s a third time: leaving at once", name)
                everything.cancel()


if __name__ == "__main__":  # pragma: no cover
    # ``python -m coordinator.worker``: use the importable module, so the application's
    # ``Worker`` and the one ``load`` checks for are the same class.
    from coordinator.worker import main as _main

    sys.exit(_main())
