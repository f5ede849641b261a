"""The ``worker`` executor: long-lived worker processes that connect to the daemon
(docs/design.md, "Executors"; the wire format is :mod:`coordinator.protocol`, documented
in ``docs/worker-protocol.md``).

Workers connect over a Unix socket, or over TCP: on loopback with a shared token, from
other hosts only over TLS with a token of their own (``worker_tokens``: each scoped to
namespaces and job types). They say which job types they serve and how many calls they
take at once, may declare the schedules their code carries (``declare``: synced by the
daemon into a namespace their token reaches), then receive ``call`` messages -- only for
jobs of namespaces their token reaches -- and answer with ``result``; ``progress``,
``checkpoint`` and ``finding`` may come in between. The daemon sees the connected workers
through :meth:`WorkerExecutor.capacities` and :meth:`WorkerExecutor.connections`, and
hears about every change through the ``changed`` hook it attached.

Costs: a connected, quiet worker is one task blocked in ``receive_some`` (and one in the
writer, blocked on its empty outbox): no heartbeat, no timer, no SQL. Timers exist only
while something is owed: a connection that has not said ``hello`` yet, a call's timeout,
a cancel's grace period, and the spacing of progress and checkpoint writes for a running
call. A TCP worker whose host vanishes (no FIN, no RST) is noticed by the kernel's TCP
keepalive (:class:`TcpKeepalive`), not by anything of ours: the blocked read fails and
the connection goes as any lost one.

Recoverable jobs (docs/design.md, "Recoverable runs"): the call carries the run's cursor
and counter; ``checkpoint`` messages update them and ``finding`` messages add findings,
written through the ``save_checkpoint`` hook at most once per ``checkpoint_interval`` per
run (one statement each: cursor, counter total and the findings received since the last
write). Whatever is not written when the result arrives goes with the outcome. A call
that is stopped rather than finished (``cancel`` for a pause, a stop or its timeout, a
lost connection) ends ``paused`` at its last cursor, never ``failed``.

Each connection has one reader task (which handles every message synchronously, so the
bookkeeping needs no locks) and one writer task draining an unbounded outbox: sending
never blocks a caller and a cancelled caller can never leave half a line on the socket.
The outbox stays small because the daemon sends at most a ``call`` and a ``cancel`` per
slot. A worker that breaks the protocol gets an ``error`` line and is disconnected; its
in-flight calls end ``failed``/``crashed``; nothing else is disturbed.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hmac
import itertools
import math
import os
import select
import socket
import ssl
import stat
import struct
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs
import trio

from ..clock import WallClock
from ..core.admission import Coverage
from ..errors import ConfigError, InvalidInput
from ..events import (
    EventBus,
    FindingsReported,
    RunProgress,
    WorkerConnected,
    WorkerDisconnected,
)
from ..model import CheckpointWrite, Cursor
from ..model import Finding as FindingRecord
from ..protocol import (
    CATEGORIES,
    MAX_CAPACITY,
    MAX_LINE,
    NO_CURSOR,
    Bye,
    Call,
    Cancel,
    Checkpoint,
    Declare,
    Declared,
    Error,
    Finding,
    Hello,
    LineBuffer,
    Message,
    Progress,
    ProtocolError,
    Result,
    Welcome,
    default_socket_path,
    encode,
    gather_lines,
    is_loopback,
    parse_from_worker,
    write_ahead,
)
from ..status import WorkerView
from ..tokens import TokenScope, TokenSet
from .base import AT_ONCE, ExecutorHooks, Turn
from .outcomes import (
    CANCELLED_MESSAGE,
    PAUSE_REASONS,
    cancelled,
    ended,
    not_sent,
    timed_out_message,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence
    from datetime import timedelta

    from ..model import Claim, ErrorCause, Outcome, OutcomeStatus, Target
    from ..protocol import Category


#: Finding severities that are told as events (and so may be alerted), worst first.
SERIOUS_SEVERITIES: Final = ("data_loss", "error")


def _report_serious(events: EventBus, run_id: int, message: Finding) -> None:
    """Tell the bus about this report's findings of severity error or data_loss."""
    counts: dict[tuple[str, str], int] = {}
    worst: tuple[str, str, str] | None = None
    for item in message.findings:
        if item.severity not in SERIOUS_SEVERITIES:
            continue
        counts[(item.kind, item.severity)] = counts.get((item.kind, item.severity), 0) + 1
        rank = SERIOUS_SEVERITIES.index(item.severity)
        if worst is None or rank < SERIOUS_SEVERITIES.index(worst[1]):
            worst = (item.kind, item.severity, item.resource_id)
    if worst is not None:
        events.emit(
            FindingsReported(
                run=run_id,
                counts=tuple((k, sev, n) for (k, sev), n in sorted(counts.items())),
                example=worst,
            )
        )


__all__ = [
    "CANCELLED_MESSAGE",
    "FINDINGS_BACKLOG",
    "FINDINGS_PER_WRITE",
    "FINISHED_MEMORY",
    "PROGRESS_LOG_LIMIT",
    "SAVE_LIMIT",
    "TcpKeepalive",
    "WorkerExecutor",
    "WorkerSocketError",
    "default_socket_path",
]
#: Diagnostic progress entries kept per run (the oldest are dropped).
PROGRESS_LOG_LIMIT: Final = 50
#: Finished run ids remembered per connection, so late messages about them are ignored
#: rather than refused as "never given".
FINISHED_MEMORY: Final = 4096
#: Workers gone (disconnected, not replaced) whose last runs are remembered for the
#: connection they come back on (:attr:`WorkerExecutor._gone`), and the finished runs
#: kept for each beside the calls they had in flight.
GONE_MEMORY: Final = 1024
GONE_FINISHED: Final = 64
#: Longest a single progress or checkpoint write may take before it is abandoned (seconds).
SAVE_LIMIT: Final = 10.0
#: Most findings one checkpoint write carries (a larger backlog takes several writes; the
#: cursor goes with the last, so it never gets ahead of the findings before it).
FINDINGS_PER_WRITE: Final = 1000
#: Unwritten findings of one call past which its connection is read no further until some
#: are written (backpressure while the database is slow or away).
FINDINGS_BACKLOG: Final = 10_000
#: When a call's time runs out, scheduler rounds the connection's reader gets first, and
#: at most how many more while bytes wait unread (``WorkerExecutor._came_in_time``).
LATE_LOOK_ROUNDS: Final = 3
LATE_LOOK_MORE: Final = 64
#: Seconds a closing connection gets to flush its last lines (an ``error``).
_FLUSH_LIMIT: Final = 1.0
_READ_SIZE: Final = 64 * 1024
_UNIX_PATH_MAX: Final = 107


@attrs.frozen(kw_only=True)
class TcpKeepalive:
    """How the kernel lets go of a TCP worker whose host vanished (power loss, a cut
    network: no FIN, no RST), since the daemon sends nothing to a quiet worker. A
    connection quiet for ``idle`` seconds is probed every ``interval`` seconds and
    dropped after ``count`` unanswered probes; data written and unacknowledged for as
    long (:attr:`limit`, ``TCP_USER_TIMEOUT``) drops it too, since the kernel does not
    probe while data is unacknowledged and would retransmit a ``call`` sent to a dead
    host for about 15 minutes. Either way the read fails and the connection's calls end
    as for any lost worker. The defaults give up on a silent host after about a minute."""

    #: Seconds a connection is quiet before the first probe.
    idle: int = attrs.field(default=30, validator=attrs.validators.ge(1))
    #: Seconds between two probes.
    interval: int = attrs.field(default=10, validator=attrs.validators.ge(1))
    #: Unanswered probes after which the connection is dropped.
    count: int = attrs.field(default=3, validator=attrs.validators.ge(1))

    @property
    def limit(self) -> int:
        """Seconds of silence after which the peer is given up."""
        return self.idle + self.interval * self.count

    def options(self) -> list[tuple[int, int, int]]:
        """``(level, option, value)`` to set on a socket: the Linux-only ones (all but
        ``SO_KEEPALIVE``) where this platform has them."""
        tcp = socket.IPPROTO_TCP
        wanted = [
            (socket.SOL_SOCKET, "SO_KEEPALIVE", 1),
            (tcp, "TCP_KEEPIDLE", self.idle),
            (tcp, "TCP_KEEPINTVL", self.interval),
            (tcp, "TCP_KEEPCNT", self.count),
            (tcp, "TCP_USER_TIMEOUT", self.limit * 1000),  # milliseconds
        ]
        return [
            (level, getattr(socket, name), value)
            for level, name, value in wanted
            if hasattr(socket, name)
        ]


class WorkerSocketError(ConfigError):
    """The worker socket cannot be opened (path taken by a file, too long, in use...):
    a configuration problem, reported in one line with exit status 2."""


class _Reject(Exception):
    """The peer broke the protocol: tell it why and close the connection."""


@attrs.define(eq=False)
class _Call:
    """One call in flight on one connection."""

    run_id: int
    conn: _Conn
    #: Set when the result arrives or the connection is lost.
    done: trio.Event = attrs.field(factory=trio.Event)
    #: Set with ``done``, or when the daemon abandons every call (stop timeout).
    wake: trio.Event = attrs.field(factory=trio.Event)
    result: Result | None = None
    #: Why the connection went away before the result (``crashed`` message).
    lost: str | None = None
    #: Its line was queued on the connection (it may wait for its turn first).
    sent: bool = False
    cancel_sent: bool = False
    #: The worker did not answer the cancel within the grace and was disconnected.
    cancel_ignored: bool = False
    #: The caller stopped waiting (it was cancelled): a result is accepted and dropped.
    orphaned: bool = False
    #: The result is in (or the call is over): no more progress is kept or written.
    finished: bool = False
    snapshot: dict[str, Any] | None = None
    entries: collections.deque[dict[str, Any]] = attrs.field(
        factory=lambda: collections.deque(maxlen=PROGRESS_LOG_LIMIT)
    )
    entries_total: int = 0
    last_percent: float | None = None
    regressed: bool = False
    cursor: Any = None
    has_cursor: bool = False
    #: The job is recoverable: the cursor and counter are saved; stopping pauses.
    recoverable: bool = False
    #: The run's counter total (recoverable runs), continued from the claim's.
    total: int | None = None
    #: Why the daemon asked the call to stop early (``pause``, ``stopping``), if it did
    #: (``wake`` is set with it).
    stop_reason: str | None = None
    # Progress writes: at most one per interval; never once the call is finished.
    pending: dict[str, Any] | None = None
    next_save_at: float = -math.inf
    saver_idle: trio.Event | None = None
    saver_sleep: trio.CancelScope | None = None
    # Checkpoint writes (cursor, counter, findings): at most one per interval; never once
    # the call is finished (the outcome takes what is left).
    dirty: bool = False
    findings: list[FindingRecord] = attrs.field(factory=list)
    next_checkpoint_at: float = -math.inf
    checkpointer_idle: trio.Event | None = None
    checkpointer_sleep: trio.CancelScope | None = None
    #: Set (and replaced) after every checkpoint write attempt (backpressure).
    written: trio.Event = attrs.field(factory=trio.Event)

    def unwritten(self) -> bool:
        return self.dirty or bool(self.findings)

    def diagnostics(self) -> dict[str, Any]:
        """What the outcome's ``extra`` gets: the final progress snapshot, the bounded
        log of progress entries, and (jobs that are not recoverable, whose cursor has no
        column of its own) the last checkpoint cursor."""
        out: dict[str, Any] = {}
        if self.snapshot is not None:
            out["progress"] = self.snapshot
        if self.entries:
            out["log"] = list(self.entries)
            dropped = self.entries_total - len(self.entries)
            if dropped:
                out["log_dropped"] = dropped
        if self.has_cursor and not self.recoverable:
            out["checkpoint"] = self.cursor
        return out


@attrs.define(eq=False)
class _Conn:
    """One worker connection."""

    stream: trio.abc.Stream
    #: ``unix``, ``tcp`` (loopback, plain) or ``tls``.
    transport: Literal["unix", "tcp", "tls"]
    #: ``pid=.. uid=..`` on the Unix socket, ``host:port`` over TCP (for logs).
    peer: str
    connected_at: datetime
    outbox_send: trio.MemorySendChannel[bytes]
    outbox_recv: trio.MemoryReceiveChannel[bytes]
    reader_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    writer_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    #: Bounds the wait for ``hello``; lifted once it arrives.
    hello_scope: trio.CancelScope | None = None
    worker: str | None = None
    types: tuple[str, ...] = ()
    capacity: int = 0
    #: The worker's own token's scope (``worker_tokens``); ``None``: unscoped (the Unix
    #: socket without a token, or the shared loopback token).
    scope: TokenScope | None = None
    #: Declarations being synced for it (cancelled when it goes).
    declaring: set[trio.CancelScope] = attrs.field(factory=set)
    #: Declarations waiting for the one being synced: applied one at a time, in the
    #: order they came, each answered in that order (two synced at once each missed the
    #: other's rows; a tester's finding).
    declares: collections.deque[Declare] = attrs.field(factory=collections.deque)
    #: run id -> call in flight (its slot is taken until the result).
    calls: dict[int, _Call] = attrs.field(factory=dict)
    finished: collections.OrderedDict[int, None] = attrs.field(factory=collections.OrderedDict)
    #: Said ``bye``: no new calls; closed once the last result is in.
    draining: bool = False
    closing: bool = False
    #: A call whose unwritten findings passed :data:`FINDINGS_BACKLOG`: reading waits.
    backlog: _Call | None = None
    #: The socket's descriptor when lines may be written to it directly (a plain
    #: socket, not TLS).
    fd: int | None = None

    def send(self, message: Message) -> bool:
        """Queue a line for the writer; ``False`` once the connection is closing."""
        if self.closing:
            return False
        return self.send_bytes(encode(message))

    def send_bytes(self, data: bytes, *, now: bool = False) -> bool:
        """Queue ``data`` for the writer; ``now``: a lone call's line, written ahead of
        the writer if it is idle (:func:`~coordinator.protocol.write_ahead`)."""
        if now and not self.closing:
            data = write_ahead(self.fd, data, self.outbox_recv)
            if not data:
                return True
        try:
            self.outbox_send.send_nowait(data)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        return True

    def remember(self, run_id: int) -> None:
        self.finished[run_id] = None
        while len(self.finished) > FINISHED_MEMORY:
            self.finished.popitem(last=False)

    def label(self) -> str:
        return self.worker or f"<{self.peer}>"

    def may_run(self, namespace: str) -> bool:
        """Whether calls of ``namespace`` may go to this worker (its token's scope)."""
        return self.scope is None or self.scope.allows(namespace)

    def serves(self, worker_type: str, namespace: str) -> bool:
        """Whether a call of ``worker_type`` in ``namespace`` may go to this worker."""
        return worker_type in self.types and self.may_run(namespace)


def _reach(conn: _Conn) -> frozenset[str] | None:
    """The namespaces whose calls may go to ``conn`` (its token's); ``None``: every one."""
    return None if conn.scope is None else conn.scope.namespaces


def _namespaces(conn: _Conn) -> tuple[str, ...] | None:
    """:func:`_reach`, sorted, for the status snapshot."""
    reach = _reach(conn)
    return None if reach is None else tuple(sorted(reach))


@attrs.define(eq=False)
class _Waiter:
    """A call waiting in :meth:`WorkerExecutor._reserve` for a free slot on a worker that
    serves its type and may run its namespace."""

    run_id: int
    worker_type: str
    namespace: str
    #: The daemon's "give up on calls" event, as the call was given it.
    abandon: trio.Event
    #: Its place, given when it joins the queue: waiters are served in this order.
    seq: int = -1
    #: In :attr:`WorkerExecutor._waiters` now.
    queued: bool = False
    #: Its call is done waiting (a step that joins the queue, kept for its turn and
    #: taken later, then does nothing).
    gone: bool = False
    #: The worker whose freed slot woke it: if it leaves without that slot, the next
    #: waiting call that may take it is woken in its place.
    woken_for: _Conn | None = None
    #: Set when it should look again: a slot it may take freed, the workers changed,
    #: the daemon gave up on calls (abandon), or its run was asked to stop.
    wake: trio.Event = attrs.field(factory=trio.Event)

    def fits(self, conn: _Conn) -> bool:
        return conn.serves(self.worker_type, self.namespace)

    def wake_up(self, woken_for: _Conn | None = None) -> None:
        """Look again (taken off the queue by the caller); ``woken_for``: the worker
        whose freed slot it is woken for."""
        self.queued = False
        self.woken_for = woken_for
        self.wake.set()


@attrs.define(eq=False, kw_only=True)
class WorkerExecutor:
    """Serves worker connections and calls ``worker`` targets on them."""

    #: Where ``started_at``, ``finished_at`` and progress timestamps come from.
    clock: WallClock
    #: Where ``worker.*`` events go (typed ones, and plain log lines through its log).
    events: EventBus
    #: The Unix socket workers connect to; ``None`` for TCP only.
    socket_path: Path | None = None
    #: ``(host, port)`` to listen on too; a host that is not a loopback address needs
    #: ``tls`` and ``tokens`` (workers on other hosts).
    tcp: tuple[str, int] | None = None
    #: The shared secret TCP workers may send in ``hello`` (a loopback listener only).
    token: str | None = None
    #: Workers' own tokens, each scoped to namespaces and job types.
    tokens: TokenSet = attrs.field(factory=TokenSet)
    #: TLS for the TCP listener (server certificate; a client CA makes it mutual).
    tls: ssl.SSLContext | None = None
    #: Seconds a worker may take to stop a cancelled call before it is disconnected.
    cancel_grace: float = 10.0
    #: Least seconds between two progress writes for one run.
    progress_interval: float = 3.0
    #: Least seconds between two checkpoint writes (cursor, counter, findings) for one
    #: run: a crash replays at most about this much of a recoverable run.
    checkpoint_interval: float = 2.0
    #: Seconds a new connection may take to say ``hello``.
    hello_timeout: float = 10.0
    #: Seconds to wait for another process listening on ``socket_path`` to go before
    #: refusing to take the path (:meth:`_wait_unanswered`). A leader of this database
    #: whose lock session ended learns that it was superseded at its next attempt to
    #: take the lock again (at most 30 s apart: the daemon's ``retry_cap``) and closes
    #: its listener as its stop begins; the rest is margin.
    socket_busy_grace: float = 45.0
    #: When the kernel gives up on a TCP worker that went silent.
    keepalive: TcpKeepalive = attrs.field(factory=TcpKeepalive)

    #: What the daemon attached: the ``changed`` hook (served types or capacities
    #: changed) and progress writes. Until attached nothing is reported or written.
    hooks: ExecutorHooks | None = attrs.field(default=None, init=False)
    #: The TCP address actually bound (port 0 picks one), once serving.
    bound_tcp: tuple[str, int] | None = attrs.field(default=None, init=False)
    #: Registered (not draining) connections by their token's name and worker id.
    _conns: dict[tuple[str | None, str], _Conn] = attrs.field(factory=dict, init=False)
    #: Connections that said ``bye`` and still have calls in flight.
    _draining: set[_Conn] = attrs.field(factory=set, init=False)
    #: A gone connection's place -> the runs it had in flight or just finished: a worker
    #: that comes back with the same id and delivers a result it finished meanwhile is
    #: told nothing (the run ended ``crashed`` when it went), instead of being refused
    #: "never given" and losing every call of its new connection (a tester's finding).
    _gone: collections.OrderedDict[tuple[str | None, str], tuple[int, ...]] = attrs.field(
        factory=collections.OrderedDict, init=False
    )
    #: job type -> total capacity of the registered workers serving it.
    _capacity: dict[str, int] = attrs.field(factory=dict, init=False)
    #: What :meth:`capacities` reports: :attr:`_capacity`, but nothing once detached
    #: (nothing new is claimed then; runs already claimed are still sent).
    _reported: dict[str, int] = attrs.field(factory=dict, init=False)
    #: What :meth:`coverage` reports: the namespaces of the job types some of whose
    #: registered workers' tokens reach only some namespaces.
    _coverage: dict[str, Coverage] = attrs.field(factory=dict, init=False)
    #: Calls waiting for a free slot, in the order they began to wait: a freed slot
    #: wakes the first one that may take it (not all of them, each through a nursery of
    #: two tasks, the first trio ran taking the slot, as before).
    _waiters: collections.deque[_Waiter] = attrs.field(factory=collections.deque, init=False)
    _waiter_seq: Iterator[int] = attrs.field(factory=itertools.count, init=False)
    _detached: bool = attrs.field(default=False, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _accept_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope, init=False)
    _listeners: list[trio.abc.Listener[Any]] = attrs.field(factory=list, init=False)
    #: Abandon events (by id) a watcher task already waits on.
    _watched: set[int] = attrs.field(factory=set, init=False)
    #: (st_dev, st_ino) of the socket file we bound, so we only ever unlink our own.
    _socket_id: tuple[int, int] | None = attrs.field(default=None, init=False)
    #: run id -> call in flight (every connection's), for :meth:`cancel`.
    _calls: dict[int, _Call] = attrs.field(factory=dict, init=False)
    #: Runs whose ``call()`` has begun but whose call is not sent yet, and the stop
    #: requested for them meanwhile (``None``: none).
    _starting: dict[int, str | None] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        if self.socket_path is None and self.tcp is None:
            raise InvalidInput("worker socket", "give a socket path, a TCP address, or both")
        if self.tcp is not None:
            host, port = self.tcp
            if not is_loopback(host):
                if self.tls is None or not self.tokens:
                    raise InvalidInput(
                        "worker_listen",
                        f"{host} is not a loopback address: workers on other hosts need TLS "
                        "(worker_tls_cert, worker_tls_key) and their own tokens (worker_tokens)",
                    )
                if self.token:
                    raise InvalidInput(
                        "worker_token",
                        "a shared token is for a loopback listener only; give each worker "
                        "its own in worker_tokens",
                    )
            if not 0 <= port <= 65535:
                raise InvalidInput("worker tcp", f"port {port} is out of range")
            if not self.token and not self.tokens:
                raise InvalidInput(
                    "worker token", "TCP workers need a token (worker_token or worker_tokens)"
                )

    # -- the Executor protocol ---------------------------------------------------------

    def attach(self, hooks: ExecutorHooks) -> None:
        """Report pool changes to, and write progress through, ``hooks``."""
        self.hooks = hooks

    def capacities(self) -> Mapping[str, int]:
        """Total capacity of the connected workers per job type (none once detached)."""
        return dict(self._reported)

    def coverage(self) -> Mapping[str, Coverage]:
        """The namespaces of each job type served by a worker whose token reaches only
        some namespaces (:class:`~coordinator.core.admission.Coverage`)."""
        return dict(self._coverage)

    def connections(self) -> Sequence[WorkerView]:
        """Connected workers (draining ones included), by worker id."""
        views = [
            WorkerView(
                id=conn.worker or conn.label(),
                types=conn.types,
                capacity=conn.capacity,
                busy=len(conn.calls),
                draining=conn.draining,
                transport=conn.transport,
                peer=conn.peer,
                connected_at=conn.connected_at,
                namespaces=_namespaces(conn),
            )
            for conn in [*self._conns.values(), *self._draining]
        ]
        return sorted(views, key=lambda w: w.id)

    def available(self, target: Target) -> bool:
        """Whether a worker serving ``target.worker_type`` is connected (capacity is
        the daemon's admission's business: see :meth:`capacities`). Still true once
        detached, while :meth:`capacities` reports nothing: a run claimed before the
        stop is sent."""
        return target.kind == "worker" and self._capacity.get(target.worker_type or "", 0) > 0

    async def call(self, claim: Claim, *, abandon: trio.Event, turn: Turn = AT_ONCE) -> Outcome:
        """Call the run on a connected worker and report how it ended; never raises for
        anything the worker does. Only ``trio.Cancelled`` propagates (the worker is sent
        ``cancel`` first). The call's line is queued in ``turn``, without waiting for it."""
        run_id = claim.run_id
        self._starting[run_id] = None
        try:
            return await self._call(claim, abandon, turn)
        finally:
            turn.take(_no_step, starts=False)  # (if nothing was sent: the next may go)
            self._starting.pop(run_id, None)
            self._calls.pop(run_id, None)

    def cancel(self, run_id: int, reason: str) -> bool:
        """Ask the call of ``run_id`` to stop (``pause`` or ``stopping``): the worker is
        sent ``cancel`` with that reason and has ``cancel_grace`` seconds to answer; a
        recoverable call then ends ``paused``. A call not sent yet is not sent at all.
        ``False`` when no call of that run is here."""
        call = self._calls.get(run_id)
        if call is None:
            if run_id not in self._starting:
                return False
            if self._starting[run_id] is None:
                self._starting[run_id] = reason
                for index, waiter in enumerate(self._waiters):
                    if waiter.run_id == run_id:  # waiting for a slot: it ends now, unsent
                        del self._waiters[index]
                        waiter.wake_up()
                        break
            return True
        if call.stop_reason is None and not call.finished:
            call.stop_reason = reason
            call.wake.set()
        return True

    async def _call(self, claim: Claim, abandon: trio.Event, turn: Turn) -> Outcome:
        job = claim.job
        worker_type = job.target.worker_type or ""
        if abandon.is_set():
            return self._abandoned(claim)
        if self._detached and job.recoverable:
            # Claimed as the stop began: it pauses unsent, as stop_recoverable asks of
            # the recoverable calls under way.
            return self._unstarted(claim, "stopping")
        run_id = claim.run_id
        since = trio.current_time()
        conn = await self._reserve(run_id, worker_type, job.namespace, abandon, turn, since)
        stop = self._starting.get(run_id)
        if conn is None or stop is not None:
            if abandon.is_set():
                return self._abandoned(claim)
            if stop is not None:
                return self._unstarted(claim, stop)
            if not self._may_send(since):
                return self._not_sent(claim, "not sent: this daemon lost its leadership")
            if any(worker_type in c.types for c in self._conns.values()):
                # Given back too: admission then keeps it waiting, in its namespace's
                # place, until a worker that may run that namespace connects (coverage).
                return self._not_sent(
                    claim,
                    f"not sent: no worker serving {worker_type!r} may run jobs of namespace "
                    f"{job.namespace!r} (their tokens' scope)",
                )
            return self._not_sent(
                claim, f"not sent: no worker serving {worker_type!r} is connected"
            )
        call = _Call(run_id=run_id, conn=conn, recoverable=job.recoverable)
        if job.recoverable:
            call.total = claim.count
            if claim.cursor is not None:
                call.cursor, call.has_cursor = claim.cursor.value, True
        conn.calls[run_id] = call
        self._calls[run_id] = call
        started_at = self.clock.now()
        timeout = job.timeout
        problem: str | None = None
        try:
            message = Call(
                run=run_id,
                job=job.name,
                namespace=job.namespace,
                job_type=worker_type,
                args=dict(claim.args),
                params=dict(job.params),
                deadline=_deadline(started_at, timeout),
                attempt=max(1, claim.attempt),
                checkpoint=call.cursor if call.has_cursor else None,
                trigger=claim.trigger,
                scheduled_for=claim.scheduled_for,
                recoverable=job.recoverable,
                count=call.total if job.recoverable else None,
            )
            data = encode(message)
        except (TypeError, ValueError) as exc:
            data, problem = b"", f"cannot send the call: {exc}"
        else:
            if len(data) - 1 > MAX_LINE:
                problem = (
                    f"call message of {len(data) - 1} bytes exceeds {MAX_LINE}: the run's "
                    "args, the job's params and its cursor must fit in one protocol line "
                    "(pass large inputs by reference); not sent"
                )
        if problem is not None:
            # Never sent, and never will be (its args or params cannot go on the wire):
            # the run's input, which a retry would send the same.
            self._release(conn, call)
            return ended(
                self.clock,
                started_at,
                "failed",
                "handler",
                problem,
                category="invalid-input",
                retryable=False,
            )

        def send() -> None:
            # Taken in the batch's order: maybe later, by the task that starts the call
            # before this one; by then this one may have been cancelled (orphaned).
            if not call.orphaned:
                conn.send_bytes(data, now=turn.alone())
                call.sent = True

        # The call does not wait for its line to go: the task that passes the turn on
        # sends it (waiting was a task step per call of a batch, most of them). Its time
        # limit counts from ``started_at``, as the deadline the worker is given does.
        turn.take(send)
        try:
            ending = await self._wait(call, abandon, timeout)
            if not call.sent:
                # Ended before its turn came (abandoned, asked to stop, out of time or
                # the worker lost while the calls before it started): never sent, and
                # now never will be.
                call.orphaned = True
                self._release(conn, call)
                if ending == "done" and call.lost is not None:
                    return self._not_sent(claim, f"not sent: {call.lost}")
                if ending in ("timeout", "done"):
                    return self._outcome(call, started_at, ending, timeout)
                stop = "abandon" if ending == "abandon" else call.stop_reason or "stopping"
                return self._unstarted(claim, stop)
            if ending == "timeout" and await self._came_in_time(conn, call):
                ending = "done"
            if ending == "timeout":
                await self._cancel(call, "timeout")
            elif ending == "abandon":
                await self._cancel(call, "stopping")
            elif ending == "stop":
                await self._cancel(call, call.stop_reason or "stopping")
        except BaseException:
            if not call.done.is_set():
                call.orphaned = True
                if not call.sent:
                    self._release(conn, call)  # never sent (nor will be): its slot is free
                elif not call.cancel_sent:
                    conn.send(Cancel(run=run_id, reason="stopping"))
            self._finish_progress(call)
            self._finish_checkpoints(call)
            raise
        await self._settle_progress(call)
        await self._settle_checkpoints(call)
        return self._outcome(call, started_at, ending, timeout)

    def _abandoned(self, claim: Claim) -> Outcome:
        """A call never sent when the daemon stopped waiting for its calls (the stop
        timeout): the run never started, so it is given back (the next daemon sends it);
        a recoverable one pauses."""
        if claim.job.recoverable or not self._detached:
            return self._unstarted(claim, "abandon")
        return self._not_sent(claim, "not sent: the stop timeout passed before a worker slot freed")

    def _not_sent(self, claim: Claim, why: str) -> Outcome:
        """A claimed run that cannot be sent now (no worker serves its type, or may run
        its namespace, any more; the lead was lost; the stop timeout passed): nothing of
        it ran, so it is given back (``queued`` again; a run of the schedule leaves its
        deadline saved), to be claimed again when it can be sent
        (:func:`~.outcomes.not_sent` says which runs pause or fail instead)."""
        return not_sent(self.clock, claim, why)

    def _unstarted(self, claim: Claim, stop: str) -> Outcome:
        """The outcome of a call never sent because it was stopped (``stop``: abandoned,
        asked to stop, the daemon stopping): cancelled; a recoverable run pauses where
        it was."""
        now = self.clock.now()
        if claim.job.recoverable:
            reason = PAUSE_REASONS["unstarted" if stop == "pause" else stop]
            return ended(
                self.clock, now, "paused", None, reason, count=claim.count, cursor=claim.cursor
            )
        return cancelled(self.clock, now)

    # -- serving -------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen for workers until cancelled; ``task_status.started()`` once listening.

        Raises :class:`WorkerSocketError` if the socket cannot be opened; nothing a
        worker does makes it raise.
        """
        unix = await self._open_unix() if self.socket_path is not None else None
        tcp: list[trio.abc.Listener[Any]] = []
        try:
            if self.tcp is not None:
                tcp = await self._open_tcp()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(trio.sleep_forever)  # serve until cancelled
                nursery.start_soon(self._accept, [unix] if unix is not None else [], tcp, nursery)
                self.events.log.info(
                    "worker.listening",
                    socket=str(self.socket_path) if unix is not None else None,
                    tcp=f"{self.bound_tcp[0]}:{self.bound_tcp[1]}" if self.bound_tcp else None,
                    tls=True if self.tls is not None else None,
                )
                task_status.started()
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True):
                await self._close_listeners()

    async def detach(self) -> None:
        """At daemon stop: accept no more workers; nothing new is claimed (admission is
        closed). Calls in flight carry on until their result (or their timeout), and runs
        already claimed that wait for a slot (claimed ahead, or in flight at the stop) are
        still sent as slots free: they are admitted work, and failing a run that never
        started would be worse. The stop timeout bounds both (then abandon)."""
        if self._detached:
            return
        self._detached = True
        self._accept_scope.cancel()
        with trio.CancelScope(shield=True):
            await self._close_listeners()
        self.events.log.info("worker.detached", connected=len(self._conns) + len(self._draining))
        self._inventory_changed()

    async def _open_unix(self) -> trio.SocketListener:
        path = self.socket_path
        assert path is not None
        if len(os.fsencode(path)) > _UNIX_PATH_MAX:
            raise WorkerSocketError(
                f"worker_socket: path is longer than {_UNIX_PATH_MAX} bytes: {path}"
            )
        try:
            path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
            owner = os.stat(path.parent).st_uid
            if owner not in (0, os.geteuid()):
                # e.g. /tmp/coordinator-UID made by someone else to catch our workers
                raise WorkerSocketError(
                    f"worker_socket: {path.parent} belongs to another user (uid {owner}); "
                    "not listening there"
                )
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                pass
            else:
                if not stat.S_ISSOCK(st.st_mode):
                    raise WorkerSocketError(
                        f"worker_socket: {path} exists and is not a socket; not removing it"
                    )
                await self._wait_unanswered(path)
                # Stale, from an earlier daemon (one that stopped meanwhile removed it).
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                await sock.bind(os.fspath(path))
                os.chmod(path, 0o660)
                sock.listen(128)
                st = os.stat(path)
            except BaseException:
                sock.close()
                raise
        except OSError as exc:
            raise WorkerSocketError(
                f"worker_socket: cannot listen on {path}: {exc.strerror or exc}"
            ) from exc
        self._socket_id = (st.st_dev, st.st_ino)
        listener = trio.SocketListener(sock)
        self._listeners.append(listener)
        return listener

    async def _wait_unanswered(self, path: Path) -> None:
        """Return once nothing listens on the socket file at ``path`` (it can be
        replaced); :class:`WorkerSocketError` if something still does after
        :attr:`socket_busy_grace`. A second daemon (of another database: this one's
        lock is ours) given the same path replaced the first's socket and deleted it at
        its stop, cutting the first's workers off until it restarted. A leader of this
        database that stepped down closes its listener as its stop begins, so the wait
        is short then."""
        deadline = trio.current_time() + self.socket_busy_grace
        said = False
        while True:
            probe = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                await probe.connect(os.fspath(path))
            except (ConnectionRefusedError, FileNotFoundError):
                return  # nobody listens: a stale file
            finally:
                probe.close()
            if trio.current_time() >= deadline:
                raise WorkerSocketError(
                    f"worker_socket: {path} is in use: another process listens there "
                    "(this database's last leader, cut off from it but alive? it takes the "
                    "lock back; or a daemon of another database: give each daemon its own "
                    "worker_socket)"
                )
            if not said:
                said = True
                self.events.log.warning(
                    "worker.socket_busy",
                    socket=str(path),
                    reason="another process listens on this worker socket; waiting up to "
                    f"{self.socket_busy_grace:g}s for it to go before refusing to start",
                )
            await trio.sleep(min(0.5, max(0.0, deadline - trio.current_time())))

    async def _open_tcp(self) -> list[trio.abc.Listener[Any]]:
        assert self.tcp is not None
        host, port = self.tcp
        try:
            raw = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise WorkerSocketError(
                f"worker_listen: cannot listen on {host}:{port}: {exc.strerror or exc}"
            ) from exc
        name = raw[0].socket.getsockname()
        self.bound_tcp = (str(name[0]), int(name[1]))
        if self.tls is None:
            self._listeners.extend(raw)
            return list(raw)
        # The handshake happens on the first read, within the wait for hello.
        wrapped = [trio.SSLListener(r, self.tls, https_compatible=False) for r in raw]
        self._listeners.extend(wrapped)
        return list(wrapped)

    async def _close_listeners(self) -> None:
        # Our socket file first, while we still answer on it: nobody replaces a file that
        # answers (_wait_unanswered), so the one unlinked is ours. Unlinked after closing,
        # a new leader could have put its own there meanwhile, on a reused inode number.
        if self._socket_id is not None and self.socket_path is not None:
            with contextlib.suppress(OSError):
                st = os.lstat(self.socket_path)
                if (st.st_dev, st.st_ino) == self._socket_id:
                    os.unlink(self.socket_path)
            self._socket_id = None
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            with contextlib.suppress(OSError, trio.ClosedResourceError):
                await listener.aclose()

    async def _accept(
        self,
        unix: list[trio.SocketListener],
        tcp: list[trio.abc.Listener[Any]],
        handlers: trio.Nursery,
    ) -> None:
        """Accept connections until :meth:`detach` (handlers run in ``handlers``)."""
        with self._accept_scope:
            async with trio.open_nursery() as nursery:
                if unix:
                    handler = functools.partial(self._handle, transport="unix")
                    nursery.start_soon(self._accept_on, handler, unix, handlers)
                if tcp:
                    kind: Literal["tcp", "tls"] = "tls" if self.tls is not None else "tcp"
                    handler = functools.partial(self._handle, transport=kind)
                    nursery.start_soon(self._accept_on, handler, tcp, handlers)

    @staticmethod
    async def _accept_on(
        handler: Callable[[Any], Awaitable[None]],
        listeners: Sequence[trio.abc.Listener[Any]],
        handlers: trio.Nursery,
    ) -> None:
        with contextlib.suppress(trio.ClosedResourceError):
            await trio.serve_listeners(handler, list(listeners), handler_nursery=handlers)

    # -- one connection ------------------------------------------------------------------

    async def _handle(
        self, stream: trio.abc.Stream, *, transport: Literal["unix", "tcp", "tls"]
    ) -> None:
        if transport != "unix":  # (a Unix socket's peer is on this host: it cannot vanish)
            _keep_alive(stream, self.keepalive)
        send, recv = trio.open_memory_channel[bytes](math.inf)
        conn = _Conn(
            stream=stream,
            transport=transport,
            peer=_peer(stream, transport),
            connected_at=self.clock.now(),
            outbox_send=send,
            outbox_recv=recv,
            fd=stream.socket.fileno() if isinstance(stream, trio.SocketStream) else None,
        )
        reason = "disconnected"
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write_loop, conn)
                error: str | None = None
                with conn.reader_scope:
                    try:
                        reason = await self._read_loop(conn)
                    except _Reject as exc:
                        reason, error = "rejected", str(exc)
                    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                        reason = "connection lost"
                        if isinstance(exc.__cause__, ssl.SSLError) and conn.worker is None:
                            # A client that does not speak TLS, or distrusts us.
                            self.events.log.warning(
                                "worker.rejected",
                                peer=conn.peer,
                                error=f"TLS handshake failed: {exc.__cause__}",
                            )
                self._disconnect(conn, reason, error=error)
                conn.writer_scope.deadline = min(
                    conn.writer_scope.deadline, trio.current_time() + _FLUSH_LIMIT
                )
        except Exception as exc:  # a bug of ours: log it, never take serve() down
            self.events.log.error("worker.internal_error", worker=conn.label(), error=repr(exc))
        finally:
            self._disconnect(conn, reason)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    async def _write_loop(self, conn: _Conn) -> None:
        with conn.writer_scope:
            try:
                async for data in conn.outbox_recv:
                    await conn.stream.send_all(gather_lines(data, conn.outbox_recv))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        if not conn.closing:
            self._disconnect(conn, "connection lost")

    async def _read_loop(self, conn: _Conn) -> str:
        """Read and handle messages until the peer closes (``eof``) or is done
        (``bye``). Raises :class:`_Reject` for a protocol violation."""
        lines = LineBuffer()
        with trio.CancelScope(deadline=trio.current_time() + self.hello_timeout) as hello:
            conn.hello_scope = hello
            while True:
                data = await conn.stream.receive_some(_READ_SIZE)
                if not data:
                    return "eof"
                try:
                    batch = lines.feed(data)
                except ProtocolError as exc:
                    raise _Reject(exc.message) from None
                for line in batch:
                    try:
                        message = parse_from_worker(line)
                    except ProtocolError as exc:
                        raise _Reject(exc.message) from None
                    self._on_message(conn, message)
                    if conn.closing:
                        return "bye"
                    if conn.backlog is not None:
                        await self._drain_backlog(conn)
        raise _Reject(f"no hello within {self.hello_timeout:g}s")

    def _on_message(self, conn: _Conn, message: Message) -> None:
        if conn.worker is None:
            if not isinstance(message, Hello):
                raise _Reject(f"expected hello first, got {message.TYPE}")
            self._on_hello(conn, message)
        elif isinstance(message, Result):
            self._on_result(conn, message)
        elif isinstance(message, Progress):
            self._on_progress(conn, message)
        elif isinstance(message, Checkpoint):
            self._on_checkpoint(conn, message)
        elif isinstance(message, Finding):
            self._on_finding(conn, message)
        elif isinstance(message, Declare):
            self._on_declare(conn, message)
        elif isinstance(message, Bye):
            self._on_bye(conn)
        elif isinstance(message, Hello):
            raise _Reject("hello sent twice on one connection")
        else:  # pragma: no cover - parse_from_worker admits nothing else
            raise _Reject(f"unexpected message type {message.TYPE}")

    def _on_hello(self, conn: _Conn, hello: Hello) -> None:
        if self._detached:
            raise _Reject("the daemon is stopping; connect again later")
        conn.scope = self._authenticate(conn, hello)
        if conn.hello_scope is not None:
            conn.hello_scope.deadline = math.inf
        conn.worker, conn.types, conn.capacity = hello.worker, hello.types, hello.capacity
        conn.send(Welcome(worker=hello.worker))  # before any call can be queued
        # A worker coming back replaces its old connection (a half-open one is not
        # noticed otherwise), but only under the same token: ids are per token. Worker
        # ids are listed to admin tokens, and a hello with another tenant's id replaced
        # that tenant's worker and failed its calls.
        old = self._conns.pop(_key(conn), None)
        for run_id in self._gone.pop(_key(conn), ()):
            conn.remember(run_id)  # (a connection that went before this one came)
        if old is not None:
            # Runs the old connection had (or just finished) are not "never given" here.
            for run_id in [*old.finished, *old.calls]:
                conn.remember(run_id)
            self._disconnect(
                old,
                "replaced",
                error="replaced by a new connection with the same worker id",
                lost=f"worker {hello.worker} disconnected (replaced by a new connection)",
            )
        self._conns[_key(conn)] = conn
        self.events.emit(
            WorkerConnected(
                worker=hello.worker,
                types=hello.types,
                capacity=hello.capacity,
                transport=conn.transport,
                peer=conn.peer,
                replaced=True if old is not None else None,
            )
        )
        self._inventory_changed()

    def _authenticate(self, conn: _Conn, hello: Hello) -> TokenScope | None:
        """The scope of the worker's token: its own (``worker_tokens``), or none (the
        shared loopback token; no token on the Unix socket, whose file permissions
        admit it).

        A token given on the Unix socket is checked as over TCP: ignoring a wrong one
        there welcomed a worker that meant to be confined to its namespaces as one that
        reaches every namespace."""
        scope = self.tokens.find(hello.token)
        tokenless = not hello.token and conn.transport == "unix"
        if scope is None and not tokenless and not self._shared_token(hello.token):
            raise _Reject("missing or wrong token")
        if scope is not None:
            refused = [t for t in hello.types if not scope.allows_type(t)]
            if refused:
                raise _Reject(
                    f"token {scope.name} may not serve job type {refused[0]!r} "
                    f"(it may serve {', '.join(sorted(scope.types or ()))})"
                )
        return scope

    def _shared_token(self, given: str | None) -> bool:
        """Whether ``given`` is the shared ``worker_token`` (compared in constant time)."""
        expected = (self.token or "").encode()
        return bool(expected and given) and hmac.compare_digest((given or "").encode(), expected)

    def _on_declare(self, conn: _Conn, declare: Declare) -> None:
        """A worker's declared schedules: checked here against what the worker is
        (its token's namespaces, its own job types), synced by the daemon."""
        namespace = declare.namespace
        if conn.scope is not None and not conn.scope.allows(namespace):
            raise _Reject(
                f'permission denied for namespace "{namespace}": token {conn.scope.name} '
                f"reaches {conn.scope.describe().rsplit(' (', 1)[0]}"
            )
        for job in declare.jobs:
            if job.job_type not in conn.types:
                raise _Reject(
                    f"declare: job {job.name!r} targets job type {job.job_type!r}, which "
                    "this worker does not serve (a worker declares jobs for its own types)"
                )
        if self.hooks is None or self._nursery is None:
            conn.send(Declared(namespace=namespace, ok=False, error="the daemon is starting"))
            return
        conn.declares.append(declare)
        if conn.declaring:
            return  # (its task takes this one after the ones before it)
        scope = trio.CancelScope()
        conn.declaring.add(scope)
        self._nursery.start_soon(self._declare, conn, scope)

    async def _declare(self, conn: _Conn, scope: trio.CancelScope) -> None:
        """Sync the connection's declarations one after the other, in order."""
        assert self.hooks is not None
        assert conn.worker is not None
        try:
            with scope:
                while conn.declares:
                    declare = conn.declares[0]
                    try:
                        reply = await self.hooks.declare(declare, conn.worker)
                    except Exception as exc:  # the daemon's bug; keep serving
                        self.events.log.error(
                            "worker.declare_failed", worker=conn.worker, error=repr(exc)
                        )
                        reply = Declared(
                            namespace=declare.namespace, ok=False, error="internal error"
                        )
                    conn.declares.popleft()
                    conn.send(reply)
        finally:
            conn.declaring.discard(scope)

    def _on_result(self, conn: _Conn, result: Result) -> None:
        call = conn.calls.get(result.run)
        if call is None:
            self._unknown_run(conn, result.run, "result")
            return
        # A cursor in the result is a last checkpoint; a recoverable run's count is a last
        # delta of its counter. Both are saved with the result (the outcome carries them).
        if call.recoverable and result.count is not None:
            total = (call.total or 0) + result.count
            if not -(2**63) <= total < 2**63:
                raise _Reject(f"run {call.run_id}: its counter would leave the 64-bit range")
            call.total = total
        if result.cursor is not NO_CURSOR:
            call.cursor, call.has_cursor = result.cursor, True
        del conn.calls[result.run]
        conn.remember(result.run)
        call.result = result
        call.finished = True
        call.done.set()
        call.wake.set()
        self._slot_freed(conn)
        if conn.draining and not conn.calls:
            self._disconnect(conn, "bye")

    def _on_progress(self, conn: _Conn, progress: Progress) -> None:
        call = conn.calls.get(progress.run)
        if call is None:
            self._unknown_run(conn, progress.run, "progress")
            return
        if call.finished or call.orphaned:
            return
        entry: dict[str, Any] = {"at": self.clock.now().isoformat(), "mode": progress.mode}
        percent = progress.percent
        if percent is not None:
            entry["percent"] = percent
            if call.last_percent is not None and percent < call.last_percent:
                call.regressed = True
                entry["regressed"] = True
                entry["previous"] = call.last_percent
            call.last_percent = percent
        if progress.label is not None:
            entry["label"] = progress.label
        if progress.message is not None:
            entry["message"] = progress.message
        call.entries.append(entry)
        call.entries_total += 1
        snapshot = {k: v for k, v in entry.items() if k not in ("regressed", "previous")}
        if call.regressed:
            snapshot["regressed"] = True
        call.snapshot = snapshot
        self.events.emit(
            RunProgress(
                run=call.run_id, percent=percent, label=progress.label, message=progress.message
            )
        )
        if self.hooks is not None and self._nursery is not None:
            call.pending = snapshot
            if call.saver_idle is None:
                call.saver_idle = trio.Event()
                self._nursery.start_soon(self._save_loop, call)

    def _on_checkpoint(self, conn: _Conn, checkpoint: Checkpoint) -> None:
        call = conn.calls.get(checkpoint.run)
        if call is None:
            self._unknown_run(conn, checkpoint.run, "checkpoint")
            return
        if call.finished or call.orphaned:
            return
        self._advance(call, checkpoint.cursor, checkpoint.count)

    def _advance(self, call: _Call, cursor: Any, delta: int | None) -> None:
        """A new cursor (and counter delta) for the call; a recoverable one is written
        (coalesced), a plain one is only kept for the outcome's ``extra``."""
        call.cursor, call.has_cursor = cursor, True
        if not call.recoverable:
            return
        if delta is not None:
            total = (call.total or 0) + delta
            if not -(2**63) <= total < 2**63:
                raise _Reject(f"run {call.run_id}: its counter would leave the 64-bit range")
            call.total = total
        call.dirty = True
        self._schedule_checkpoint(call)

    def _on_finding(self, conn: _Conn, message: Finding) -> None:
        call = conn.calls.get(message.run)
        if call is None:
            self._unknown_run(conn, message.run, "finding")
            return
        if call.finished or call.orphaned:
            return
        call.findings.extend(
            FindingRecord(
                kind=item.kind,
                resource_id=item.resource_id,
                severity=item.severity,
                detail=item.detail,
            )
            for item in message.findings
        )
        _report_serious(self.events, call.run_id, message)
        if len(call.findings) > FINDINGS_BACKLOG:
            conn.backlog = call
        self._schedule_checkpoint(call)

    def _unknown_run(self, conn: _Conn, run_id: int, what: str) -> None:
        if run_id in conn.finished:
            # Late, after the run's result (or its connection's replacement): ignored.
            self.events.log.debug("worker.late_message", worker=conn.worker, run=run_id, type=what)
            return
        raise _Reject(f"{what} for run {run_id}, which this connection was never given")

    def _on_bye(self, conn: _Conn) -> None:
        assert conn.worker is not None
        if self._conns.get(_key(conn)) is conn:
            del self._conns[_key(conn)]
        conn.draining = True
        self.events.log.info("worker.bye", worker=conn.worker, busy=len(conn.calls))
        if conn.calls:
            self._draining.add(conn)
        else:
            self._disconnect(conn, "bye")
        self._inventory_changed()

    def _disconnect(
        self, conn: _Conn, reason: str, *, error: str | None = None, lost: str | None = None
    ) -> None:
        """Close ``conn`` (idempotent): its calls end ``crashed``, its types stop being
        served; ``error`` is sent first when given."""
        if conn.closing:
            return
        if error is not None:
            conn.send(Error(message=error))
        conn.closing = True
        conn.fd = None  # (the stream is closed next: its number may be reused)
        conn.outbox_send.close()
        conn.reader_scope.cancel()
        for declaring in list(conn.declaring):
            declaring.cancel()
        self._draining.discard(conn)
        registered = conn.worker is not None and self._conns.get(_key(conn)) is conn
        if registered:
            del self._conns[_key(conn)]
        if conn.worker is not None and reason != "replaced":
            # (A replaced one's runs went to its replacement at its hello.)
            finished = list(conn.finished)[-GONE_FINISHED:]
            self._gone[_key(conn)] = (*self._gone.pop(_key(conn), ()), *finished, *conn.calls)[
                -(GONE_FINISHED + MAX_CAPACITY) :
            ]
            while len(self._gone) > GONE_MEMORY:
                self._gone.popitem(last=False)
        calls = list(conn.calls.values())
        conn.calls.clear()
        if lost is None and error is not None and reason == "rejected":
            # What the run's reader needs: not that the worker went, but why it was sent.
            lost = f"worker {conn.label()} was disconnected for breaking the protocol: {error}"
        message = lost or f"worker {conn.label()} disconnected"
        for call in calls:
            call.lost = message
            call.finished = True
            call.done.set()
            call.wake.set()
        if conn.worker is None:
            if error is not None:
                self.events.log.warning("worker.rejected", peer=conn.peer, error=error)
        elif error is not None and reason == "rejected":
            self.events.log.warning(
                "worker.rejected",
                worker=conn.worker,
                peer=conn.peer,
                error=error,
                crashed=len(calls) or None,
            )
        else:
            self.events.emit(
                WorkerDisconnected(worker=conn.worker, reason=reason, crashed=len(calls) or None)
            )
        if registered:
            self._inventory_changed()

    def _inventory_changed(self) -> None:
        capacity: dict[str, int] = {}
        everywhere: dict[str, int] = {}
        scoped: dict[str, dict[str, int]] = {}
        for conn in self._conns.values():
            namespaces = _reach(conn)
            for worker_type in conn.types:
                capacity[worker_type] = capacity.get(worker_type, 0) + conn.capacity
                if namespaces is None:
                    everywhere[worker_type] = everywhere.get(worker_type, 0) + conn.capacity
                    continue
                shares = scoped.setdefault(worker_type, {})
                for namespace in namespaces:
                    shares[namespace] = shares.get(namespace, 0) + conn.capacity
        self._capacity = capacity  # (available(): a run claimed before a stop is still sent)
        self._wake_all_waiters()  # (who serves what, where, changed: all look again)
        reported = {} if self._detached else capacity
        coverage = {
            worker_type: Coverage(everywhere.get(worker_type, 0), shares)
            for worker_type, shares in scoped.items()
            if worker_type in reported
        }
        if reported == self._reported and coverage == self._coverage:
            return
        self._reported, self._coverage = reported, coverage
        if self.hooks is None:
            return
        try:
            self.hooks.changed()
        except Exception as exc:  # the daemon's bug; keep serving
            self.events.log.error("worker.on_change_failed", error=repr(exc))

    def _slot_freed(self, conn: _Conn) -> None:
        """A slot of ``conn`` freed: the first waiting call that may take it looks again
        (a registered worker only: one that said ``bye`` takes no new call)."""
        if (
            self._waiters
            and len(conn.calls) < conn.capacity
            and self._conns.get(_key(conn)) is conn
        ):
            self._wake_first(conn)

    def _wake_all_waiters(self) -> None:
        waiters, self._waiters = self._waiters, collections.deque()
        for waiter in waiters:
            waiter.wake_up()

    # -- calling -------------------------------------------------------------------------

    async def _reserve(
        self,
        run_id: int,
        worker_type: str,
        namespace: str,
        abandon: trio.Event,
        turn: Turn,
        since: float,
    ) -> _Conn | None:
        """The least busy registered worker serving ``worker_type`` with a free slot,
        that may run jobs of ``namespace``, waiting for one if all are busy (the call
        then gives up its turn: the calls after it need not wait too); ``None`` if none
        serves it, on abandon, once the run was asked to stop while it waited, or when it
        may not be sent any more (the lead lost since ``since``: ``may_send``). The
        daemon's stop (detach) does not end the wait: a claimed run is admitted work, sent
        when a slot frees, like a call in flight carries on (the stop timeout bounds both).

        Waiting calls join a queue (the calls of one claim batch in the batch's order, in
        their turns) and each freed slot wakes the first that may take it, so they get
        slots about in the order they began to wait (calls woken together start in the
        order trio runs them, and a call that did not have to wait may take a slot first:
        the one beaten to it waits again in its place). A woken call that leaves without
        the slot it was woken for (it took another, or it stops) wakes the next one that
        may take that slot."""
        waiter: _Waiter | None = None
        taken: _Conn | None = None
        try:
            while True:
                if abandon.is_set():
                    return None
                if waiter is not None and self._starting.get(run_id) is not None:
                    return None  # asked to stop meanwhile: never sent (see _call)
                conn = self._free_slot(worker_type, namespace)
                if conn is not None:
                    if not self._may_send(since):
                        return None  # the lead was lost: another daemon may have swept it
                    taken = conn
                    return conn
                if not self._serves(worker_type, namespace):
                    return None
                if waiter is None:
                    waiter = _Waiter(
                        run_id=run_id, worker_type=worker_type, namespace=namespace, abandon=abandon
                    )
                    # Joins the queue in its turn (and gives the turn up: the calls after
                    # it need not wait too).
                    turn.take(functools.partial(self._enqueue, waiter), starts=False)
                else:
                    waiter.woken_for = None  # (beaten to it: that slot is taken)
                    waiter.wake = trio.Event()
                    self._requeue(waiter)
                self._watch_abandon(abandon)
                await waiter.wake.wait()
        finally:
            if waiter is not None:
                waiter.gone = True
                if waiter.queued:
                    self._waiters.remove(waiter)  # (cancelled while waiting)
                promised = waiter.woken_for
                if promised is not None and promised is not taken:
                    self._slot_freed(promised)  # (if it is still free)

    def _may_send(self, since: float) -> bool:
        return self.hooks is None or self.hooks.may_send(since)

    def _enqueue(self, waiter: _Waiter) -> None:
        """A call joins the queue of calls waiting for a slot (in its turn: maybe later,
        from the task that passes the turn on to it)."""
        if waiter.gone:
            return
        waiter.seq = next(self._waiter_seq)
        if (
            self._free_slot(waiter.worker_type, waiter.namespace) is not None
            or not self._serves(waiter.worker_type, waiter.namespace)
            or waiter.abandon.is_set()
            or self._starting.get(waiter.run_id) is not None
        ):
            # Something it waits for happened before its turn came: look again now.
            waiter.wake.set()
            return
        waiter.queued = True
        self._waiters.append(waiter)

    def _requeue(self, waiter: _Waiter) -> None:
        """Back in its place (a woken call beaten to the slot, or told to look again
        with all the others)."""
        waiter.queued = True
        if not self._waiters or self._waiters[-1].seq < waiter.seq:
            self._waiters.append(waiter)  # (after a wake-all, they come back in order)
            return
        for index, other in enumerate(self._waiters):
            if other.seq > waiter.seq:
                self._waiters.insert(index, waiter)
                return
        self._waiters.append(waiter)

    def _wake_first(self, conn: _Conn) -> None:
        for index, waiter in enumerate(self._waiters):
            if waiter.fits(conn):
                del self._waiters[index]
                waiter.wake_up(conn)
                return

    def _serves(self, worker_type: str, namespace: str) -> bool:
        """Some registered worker serves ``worker_type`` and may run ``namespace``."""
        return any(conn.serves(worker_type, namespace) for conn in self._conns.values())

    def _free_slot(self, worker_type: str, namespace: str) -> _Conn | None:
        """The least busy registered worker serving ``worker_type`` and ``namespace``
        with a free slot, if any; one confined to some namespaces before one reaching
        them all, which stays free for the namespaces only it may run (admission counts
        on that: :class:`~coordinator.core.admission.Coverage`)."""
        best: _Conn | None = None
        best_key: tuple[bool, int, int] | None = None
        for conn in self._conns.values():
            if not conn.serves(worker_type, namespace):
                continue
            busy = len(conn.calls)
            if busy >= conn.capacity:
                continue
            key = (_reach(conn) is None, busy, -conn.capacity)
            if best_key is None or key < best_key:
                best, best_key = conn, key
        return best

    def _release(self, conn: _Conn, call: _Call) -> None:
        """A call that was never sent gives its slot back (a worker that said ``bye`` and
        has no other call is let go, as after its last result)."""
        if conn.calls.get(call.run_id) is call:
            del conn.calls[call.run_id]
            self._slot_freed(conn)
            if conn.draining and not conn.calls:
                self._disconnect(conn, "bye")
        call.finished = True

    async def _came_in_time(self, conn: _Conn, call: _Call) -> bool:
        """The call's time ran out: was its result already here? The deadline may have
        passed while this process did not run (stopped, starved) with the result waiting
        in the socket; trio then wakes this task and the reader in either order, and a
        result sent 2 s into a 4 s limit was recorded ``timed_out`` (a tester's SIGSTOP
        of the daemon, 3 times of 3). So the reader gets a few rounds first, and, on a
        plain socket, more while bytes wait unread. (Over TLS, bytes the TLS layer holds
        already are not seen: those few rounds only.)"""
        for _ in range(LATE_LOOK_ROUNDS):
            if call.done.is_set():
                break
            await trio.lowlevel.checkpoint()
        # Bytes already in a plain socket: the reader gets rounds while they last (what
        # is there now, not a wait for what the worker may still send).
        rounds = 0
        while not call.done.is_set() and conn.fd is not None and rounds < LATE_LOOK_MORE:
            if not _unread(conn.fd):
                break
            await trio.lowlevel.checkpoint()
            rounds += 1
        # A result, not the connection's loss (an EOF is readable too): a worker lost as
        # the time ran out is still timed out.
        return call.done.is_set() and call.lost is None

    async def _wait(
        self, call: _Call, abandon: trio.Event, time_limit: timedelta | None
    ) -> Literal["done", "timeout", "abandon", "stop"]:
        limit = math.inf if time_limit is None else max(time_limit.total_seconds(), 0.0)
        if not abandon.is_set() and call.stop_reason is None:
            # One watcher per abandon event for all calls, not a task pair per call.
            self._watch_abandon(abandon)
            if limit == math.inf:
                await call.wake.wait()  # (no timeout: spare a cancel scope per call)
            else:
                with trio.move_on_after(limit):
                    await call.wake.wait()
        if call.done.is_set():
            return "done"
        if abandon.is_set():
            return "abandon"
        return "stop" if call.stop_reason is not None else "timeout"

    def _watch_abandon(self, abandon: trio.Event) -> None:
        if id(abandon) in self._watched or self._nursery is None:
            return
        self._watched.add(id(abandon))

        async def watch() -> None:
            await abandon.wait()
            for conn in [*self._conns.values(), *self._draining]:
                for call in conn.calls.values():
                    call.wake.set()
            self._wake_all_waiters()

        self._nursery.start_soon(watch)

    async def _cancel(self, call: _Call, reason: str) -> None:
        """Send ``cancel``; disconnect the worker if it does not answer within the grace."""
        conn = call.conn
        call.cancel_sent = True
        conn.send(Cancel(run=call.run_id, reason=reason))
        with trio.move_on_after(self.cancel_grace):
            await call.done.wait()
        if call.done.is_set():
            return
        call.cancel_ignored = True
        self.events.log.warning(
            "worker.cancel_ignored",
            worker=conn.worker,
            run=call.run_id,
            reason=reason,
            grace_s=self.cancel_grace,
        )
        self._disconnect(
            conn,
            "cancel ignored",
            error=f"run {call.run_id} ignored cancel for {self.cancel_grace:g}s; disconnecting",
        )

    def _outcome(
        self,
        call: _Call,
        started_at: datetime,
        ending: Literal["done", "timeout", "abandon", "stop"],
        timeout: timedelta | None,
    ) -> Outcome:
        extra = call.diagnostics()
        result = call.result
        if call.recoverable:
            return self._recoverable_outcome(call, started_at, ending, timeout, extra)
        findings = tuple(call.findings)
        if ending != "done":
            # Stopped by the daemon (its timeout, a stop): the status is the daemon's,
            # but what the worker answered on its way out -- a handler wrapping up within
            # cancel_delay -- is kept: its count and extra, and the words of a failure
            # (a tester's handler returned a partial count and raised a JobError with a
            # category: the run had neither).
            said = ""
            count = None
            if result is not None:
                extra = {**(result.extra or {}), **extra}
                count = result.count
                words = (result.error or "").strip()
                # (Not the acknowledgment of the cancel itself: the SDK's "cancelled
                # (timeout)", a raw worker's "cancelled", category cancellation.)
                if (
                    not result.ok
                    and result.category != "cancellation"
                    and not words.lower().startswith("cancelled")
                ):
                    said = f"; the worker said: {words or 'failed'}"
        if ending == "timeout":
            assert timeout is not None
            message = timed_out_message(timeout)
            if call.cancel_ignored:
                message += f"; worker {call.conn.worker} ignored cancel and was disconnected"
            elif result is None and call.lost is not None:
                message += f"; then {call.lost}"
            return ended(
                self.clock, started_at, "timed_out", "timeout", message + said, extra,
                count=count, findings=findings,
            )  # fmt: skip
        if ending in ("abandon", "stop"):
            # (An abandoned call's message stays exactly CANCELLED_MESSAGE: the stop
            # queues an idempotent job's run again by it.)
            if ending == "abandon":
                message = CANCELLED_MESSAGE
            else:
                message = f"cancelled: {call.stop_reason}{said}"
            return ended(
                self.clock, started_at, "cancelled", None, message, extra,
                count=count, findings=findings,
            )  # fmt: skip
        if result is None:
            lost = call.lost or "worker lost"
            return ended(
                self.clock, started_at, "failed", "crashed", lost, extra, findings=findings
            )
        merged = dict(result.extra or {})
        merged.update(extra)
        if result.paused:
            message = (
                f"worker {call.conn.label()} paused the call, but the job is not "
                "recoverable (define it recoverable to resume from a cursor)"
            )
            return ended(
                self.clock, started_at, "failed", "handler", message, merged,
                count=result.count, findings=findings,
            )  # fmt: skip
        if result.ok:
            return ended(
                self.clock, started_at, "succeeded", None, None, merged,
                count=result.count, findings=findings,
            )  # fmt: skip
        error = (result.error or "").strip() or "the worker reported a failure"
        category = _category(result.category, merged)
        return ended(
            self.clock, started_at, "failed", "handler", error, merged,
            count=result.count, findings=findings, category=category,
            retryable=result.retryable,
        )  # fmt: skip

    def _recoverable_outcome(
        self,
        call: _Call,
        started_at: datetime,
        ending: Literal["done", "timeout", "abandon", "stop"],
        timeout: timedelta | None,
        extra: dict[str, Any],
    ) -> Outcome:
        """A recoverable call's ending: ``succeeded`` when the worker finished,
        ``failed`` when it failed on its own, ``paused`` at the last cursor whenever it
        was stopped (a pause, a stop, its timeout, a lost connection) or paused itself.
        The cursor and the counter total go with it, and the findings not written yet."""
        result = call.result
        if result is not None:
            merged = dict(result.extra or {})
            merged.update(extra)
            extra = merged
        cursor = Cursor(value=call.cursor) if call.has_cursor else None
        findings = tuple(call.findings)
        status: OutcomeStatus
        cause: ErrorCause | None = None
        if result is not None and result.ok and not result.paused:
            status, message = "succeeded", None
        elif result is not None and not result.ok and not call.cancel_sent:
            status, cause = "failed", "handler"
            message = (result.error or "").strip() or "the worker reported a failure"
            return ended(
                self.clock, started_at, status, cause, message, extra,
                count=call.total, cursor=cursor, findings=findings,
                category=_category(result.category, extra), retryable=result.retryable,
            )  # fmt: skip
        else:
            status, message = "paused", self._pause_reason(call, ending, timeout)
        return ended(
            self.clock, started_at, status, cause, message, extra,
            count=call.total, cursor=cursor, findings=findings,
        )  # fmt: skip

    def _pause_reason(
        self,
        call: _Call,
        ending: Literal["done", "timeout", "abandon", "stop"],
        timeout: timedelta | None,
    ) -> str:
        """Why a recoverable call paused, for the run's ``error_message``."""
        result = call.result
        if ending == "timeout":
            assert timeout is not None
            reason = f"paused: {timed_out_message(timeout)}"
        elif ending == "abandon":
            reason = PAUSE_REASONS["abandon"]
        elif ending == "stop":
            reason = PAUSE_REASONS.get(call.stop_reason or "stopping", PAUSE_REASONS["stopping"])
        elif result is None:
            reason = f"paused: {call.lost or 'worker lost'}"
        else:
            reason = PAUSE_REASONS["worker"]
        if call.cancel_ignored:
            reason += (
                f"; worker {call.conn.worker} ignored the cancel for {self.cancel_grace:g}s and "
                "was disconnected"
            )
        elif result is None and call.lost is not None and ending != "done":
            reason += f"; then {call.lost}"
        elif result is not None and not result.ok:
            reason += f"; the worker said: {(result.error or '').strip() or 'failed'}"
        return reason

    # -- progress writes -----------------------------------------------------------------

    async def _save_loop(self, call: _Call) -> None:
        """Write the latest snapshot at most once per ``progress_interval``; stop as
        soon as the call is finished (the outcome carries the final snapshot)."""
        assert self.hooks is not None
        save = self.hooks.save_progress
        assert call.saver_idle is not None
        try:
            while call.pending is not None and not call.finished:
                with trio.CancelScope() as call.saver_sleep:
                    await trio.sleep_until(call.next_save_at)
                call.saver_sleep = None
                if call.finished:
                    return
                snapshot, call.pending = call.pending, None
                call.next_save_at = trio.current_time() + self.progress_interval
                try:
                    with trio.move_on_after(SAVE_LIMIT) as limit:
                        await save(call.run_id, snapshot)
                except Exception as exc:  # the store's failure: the outcome still has it
                    self.events.log.warning("progress.save_failed", run=call.run_id, error=str(exc))
                else:
                    if limit.cancelled_caught:
                        self.events.log.warning(
                            "progress.save_failed", run=call.run_id, error="timeout"
                        )
        finally:
            idle, call.saver_idle = call.saver_idle, None
            idle.set()

    def _finish_progress(self, call: _Call) -> None:
        call.finished = True
        call.pending = None
        if call.saver_sleep is not None:
            call.saver_sleep.cancel()

    async def _settle_progress(self, call: _Call) -> None:
        """Stop progress writes for a finished call; wait for one under way, so no
        write can land after the result is handed to the daemon."""
        self._finish_progress(call)
        idle = call.saver_idle
        if idle is not None:
            await idle.wait()

    # -- checkpoint writes ---------------------------------------------------------------

    def _schedule_checkpoint(self, call: _Call) -> None:
        """Make sure a writer will save what the call reported (at most one write per
        ``checkpoint_interval``; the first at once)."""
        if self.hooks is None or self._nursery is None or call.checkpointer_idle is not None:
            return
        call.checkpointer_idle = trio.Event()
        self._nursery.start_soon(self._checkpoint_loop, call)

    async def _checkpoint_loop(self, call: _Call) -> None:
        """Write the call's cursor, counter total and findings, at most once per
        ``checkpoint_interval`` (a full batch of :data:`FINDINGS_PER_WRITE` findings
        without waiting), until nothing is left unwritten or the call is finished (the
        outcome then takes what is left). A write that fails is kept: its findings go
        back in front, the cursor and counter (the latest, as totals) go with the next
        write, so repeating one changes nothing."""
        assert self.hooks is not None
        save = self.hooks.save_checkpoint
        assert call.checkpointer_idle is not None
        try:
            while call.unwritten() and not call.finished:
                if len(call.findings) < FINDINGS_PER_WRITE:
                    # Coalesce; a full batch of findings goes at once (the interval
                    # bounds the writes of cursors, not the rate findings are taken at).
                    with trio.CancelScope() as call.checkpointer_sleep:
                        await trio.sleep_until(call.next_checkpoint_at)
                    call.checkpointer_sleep = None
                if call.finished:
                    return
                batch = call.findings[:FINDINGS_PER_WRITE]
                del call.findings[: len(batch)]
                # The cursor never gets ahead of the findings reported before it.
                with_cursor = call.dirty and not call.findings
                write = CheckpointWrite(
                    cursor=Cursor(value=call.cursor) if with_cursor else None,
                    count=call.total if with_cursor else None,
                    findings=batch,
                )
                if with_cursor:
                    call.dirty = False
                call.next_checkpoint_at = trio.current_time() + self.checkpoint_interval
                error: str | None = None
                running = True
                try:
                    with trio.move_on_after(SAVE_LIMIT) as limit:
                        running = await save(call.run_id, write)
                    if limit.cancelled_caught:
                        error = "timeout"
                except Exception as exc:  # the store's failure: kept for the next write
                    error = str(exc)
                if error is None and not running:
                    # The run is no longer running (removed meanwhile): nothing to keep.
                    self.events.log.debug("checkpoint.run_gone", run=call.run_id)
                    call.findings.clear()
                    call.dirty = False
                elif error is not None:
                    self.events.log.warning("checkpoint.save_failed", run=call.run_id, error=error)
                    call.findings[:0] = batch
                    call.dirty = call.dirty or with_cursor
                call.written.set()
                call.written = trio.Event()
        finally:
            idle, call.checkpointer_idle = call.checkpointer_idle, None
            idle.set()
            call.written.set()

    def _finish_checkpoints(self, call: _Call) -> None:
        call.finished = True
        if call.checkpointer_sleep is not None:
            call.checkpointer_sleep.cancel()

    async def _settle_checkpoints(self, call: _Call) -> None:
        """Stop checkpoint writes for a finished call; wait for one under way (a failed
        one puts its findings back), so what the outcome carries is exactly what is
        not written."""
        self._finish_checkpoints(call)
        idle = call.checkpointer_idle
        if idle is not None:
            await idle.wait()

    async def _drain_backlog(self, conn: _Conn) -> None:
        """Read no further from ``conn`` while one of its calls has too many unwritten
        findings: the worker's sends block until the database has taken some."""
        call = conn.backlog
        conn.backlog = None
        while (
            call is not None
            and len(call.findings) > FINDINGS_BACKLOG
            and not call.finished
            and call.checkpointer_idle is not None
        ):
            await call.written.wait()


def _category(reported: str | None, extra: dict[str, Any]) -> Category | None:
    """The category a worker reported, if it is one this daemon knows; a word from a later
    protocol version is recorded as ``unknown``, the word itself kept in ``extra``."""
    if reported is None:
        return None
    for known in CATEGORIES:
        if reported == known:
            return known
    extra["category_reported"] = reported
    return "unknown"


def _no_step() -> None:
    """A turn passed with nothing to do in it."""


def _unread(fd: int) -> bool:
    """Bytes wait in the socket ``fd`` (a poll that does not wait; ``poll``, not
    ``select``, which refuses a descriptor past 1023)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    try:
        return bool(poller.poll(0))
    except OSError:
        return False


def _deadline(started_at: datetime, timeout: timedelta | None) -> datetime | None:
    """When the call must end, for the worker's information; ``None`` when there is no
    limit or it lies beyond what a datetime can hold (the limit itself still applies)."""
    if timeout is None:
        return None
    try:
        return started_at + timeout
    except OverflowError:
        return None


def _peer(stream: trio.abc.Stream, transport: str) -> str:
    raw = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    sock = getattr(raw, "socket", None)
    if sock is None:
        return transport
    try:
        if transport == "unix":
            so_peercred = getattr(socket, "SO_PEERCRED", None)
            if so_peercred is None:
                return "unix"
            raw = sock.getsockopt(socket.SOL_SOCKET, so_peercred, struct.calcsize("3i"))
            pid, uid, _gid = struct.unpack("3i", raw)
            return f"pid={pid} uid={uid}"
        name = sock.getpeername()
        return f"{name[0]}:{name[1]}"
    except OSError:
        return transport


def _keep_alive(stream: trio.abc.Stream, keepalive: TcpKeepalive) -> None:
    """Turn on TCP keepalive for an accepted worker connection, plain or TLS."""
    raw = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    if not isinstance(raw, trio.SocketStream):
        return
    for level, option, value in keepalive.options():
        with contextlib.suppress(OSError):  # a kernel without the option
            raw.setsockopt(level, option, value)


def _token_name(scope: TokenScope | None) -> str | None:
    """Which token a connection came with (``None``: the shared token, or the Unix
    socket's file permissions)."""
    return None if scope is None else scope.name


def _key(conn: _Conn) -> tuple[str | None, str]:
    """A registered connection's place: its token's name and its worker id (the same id
    under two tokens is two workers)."""
    return (_token_name(conn.scope), conn.worker or "")
