"""The daemon: the pure core wired to the store, the listener and the executors.

:class:`Daemon` owns no policy of its own; it builds the parts and runs their lifecycle
in one trio nursery:

1. **lead** (:mod:`.leadership`): take the single-writer lock, or stand by silently;
2. **start up**, each step logged and retried through the error policy: schema check,
   spool replay (:mod:`.settlement`), crash sweep, LISTEN, the executors' ``serve``
   (a standby must not take the leader's worker socket), the first refresh
   (:mod:`.inventory`);
3. **serve**: the loop (:mod:`.loop`) turns deadlines, wakes and admission into
   dispatches (:mod:`.dispatch`);
4. **stop**: refuse new admissions, detach executors, wait for calls (bounded by the
   stop timeout; a second SIGINT cancels them at once), then flush held results —
   saved, or spooled, or named in the last line. The flush also runs on every other
   way out (an unexpected error, leadership lost): a held result is never lost silently.

The outside sees the daemon through :meth:`Daemon.status` (a typed snapshot) and its
:attr:`Daemon.events` bus; nothing reads its attributes.
"""

from __future__ import annotations

import math
import os
import random
import signal
import socket
import sys
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

import attrs
import trio

from .. import redact
from .. import schedule as schedules
from ..backoff import backoff
from ..clock import WallClock
from ..core.admission import Admission
from ..core.coalescer import RefreshCoalescer
from ..core.deadlines import DeadlineSet
from ..db import one_line
from ..errors import ConfigError, CoordinatorError
from ..events import (
    DispatchWake,
    EventBus,
    LifecycleWake,
    NotificationWake,
    RunLost,
    SchedulesDeclared,
    StateChanged,
)
from ..executors import Executor, ExecutorHooks
from ..executors.worker import WorkerSocketError
from ..listener import Listener
from ..migrate import load_migrations
from ..model import Schedule
from ..protocol import Declare, Declared
from ..spool import Spool
from ..status import ArmedDeadline, DaemonStatus, HeldResultView, RunningCall, status_line
from ..store import ConnectionPool, JobEntry, Store
from . import cyclic_gc, declarations, wakes
from .dispatch import Dispatcher
from .inventory import Inventory
from .leadership import Leadership
from .loop import DispatchLoop
from .policy import ErrorPolicy, Failure, classify
from .retention import Pruner
from .settlement import FlushReport, Settlement

if TYPE_CHECKING:
    from ..log import EventLog
    from ..model import CheckpointWrite

#: Longest a stop waits for the companions (alerts being delivered), seconds.
COMPANION_FINISH: Final = 10.0

#: Least seconds between two STATUS= updates while only counts change.
STATUS_EVERY: Final = 1.0
#: Seconds beyond the refresh spacing a job's definition may precede the refresh that
#: first reads it and still count its first deadline from then (a refresh's own time,
#: the two hosts' clocks: inventory._Firsts).
FIRST_LOOKBACK_SLACK: Final = 60.0

#: Seconds between two looks, on a stepped-down leader, for runs another daemon ended.
SUPERSEDED_POLL: Final = 0.5
#: Seconds the stop gives the statement that queues abandoned idempotent runs again.
REQUEUE_WITHIN: Final = 5.0
#: Seconds a stop waits for abandoned calls to end (their executors record them
#: ``cancelled``); the service manager is told this much more, and a flush's margin.
ABANDON_WAIT: Final = 30.0

#: Exit statuses of ``coordinator run`` (README, "Exit status").
EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_CONFIG: Final = 2
#: Results had to be spooled because the database refused them (the next start replays).
EXIT_SPOOLED: Final = 3
#: Results could be neither saved nor spooled: the last line names their runs.
EXIT_LOST: Final = 4
#: Stopped by SIGHUP, as cleanly as by SIGTERM (128 + SIGHUP, a shell's status for a
#: hangup). Not 0: a `kill -HUP` means "reload", and the daemon has no reload, so a
#: service manager's Restart=on-failure starts it again (it rereads everything).
EXIT_HANGUP: Final = 128 + signal.SIGHUP

T = TypeVar("T")


def default_instance() -> str:
    """``host:pid:random``: unique per process, readable in ``runs.instance``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@attrs.frozen(kw_only=True)
class DaemonSettings:
    """What the daemon needs to know beyond its collaborators."""

    #: Minimum seconds between two inventory refreshes.
    refresh_spacing: float = 30.0
    #: Global limit of concurrent calls (runs claimed ahead of a worker slot count too).
    concurrency: int = 16
    #: Runs of a worker type that may be claimed beyond its workers' free slots.
    claim_ahead: int = 0
    #: Longest the stop sequence waits for running calls before cancelling them; also
    #: how long it keeps trying to save held results.
    stop_timeout: float = 60.0
    #: Where unsaved results go at stop.
    spool_path: Path
    #: Database connections for claims and settlements.
    pool_size: int = 4
    #: Cap of every retry backoff (seconds).
    retry_cap: float = 30.0
    #: Apply pending migrations at start instead of refusing to start.
    migrate: bool = False
    #: Finished runs older than this (seconds) are pruned (a job's own ``retention`` wins).
    retention: float = 30 * 86400.0
    #: When the retention prune runs: a cron expression in ``prune_timezone``
    #: (:func:`~coordinator.schedule.parse_prune_at`); ``None``: never.
    prune_at: str | None = None
    prune_timezone: str = "UTC"


class Companion(Protocol):
    """A task that lives beside the loop (alert delivery): started before the daemon
    seeks the lock (a standby delivers what its outbox kept), given until a deadline to
    finish its work at stop, then cancelled before the daemon's connections close."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled."""
        ...

    async def finish(self, deadline: float) -> None:
        """The daemon stops: do what is pending until trio time ``deadline``."""
        ...


class _Stopped(Exception):
    """A stop was requested while a startup step waited to retry."""


@attrs.define(eq=False)
class Daemon:
    """One daemon process's parts and lifecycle. ``run()`` returns the exit status."""

    dsn: str
    settings: DaemonSettings
    clock: WallClock
    #: Where everything that happens is told (the log is its first subscriber).
    events: EventBus
    executors: Mapping[str, Executor]
    instance: str = attrs.field(factory=default_instance)
    #: Called with systemd-style state updates (``READY=1``, ``STATUS=...``).
    notify: Callable[[str], None] = lambda message: None
    #: Stop on SIGTERM/SIGINT (off when embedded, e.g. in tests).
    handle_signals: bool = True
    #: The daemon owns its process (``coordinator run``): Python's cyclic garbage
    #: collector is tuned for it, and a full refresh freezes what is alive after it out
    #: of the collections (see daemon/cyclic_gc.py). Off when embedded: the host's
    #: collector is not the daemon's to tune.
    owns_process: bool = False
    #: Where retry delays get their jitter (0 to 1 per settled call): injected in tests.
    jitter: Callable[[], float] = random.random
    #: Tasks that live while the daemon leads (see :class:`Companion`).
    companions: list[Companion] = attrs.field(factory=list)

    store: Store = attrs.field(init=False)
    policy: ErrorPolicy = attrs.field(init=False)
    deadlines: DeadlineSet = attrs.field(factory=DeadlineSet, init=False)
    coalescer: RefreshCoalescer = attrs.field(init=False)
    admission: Admission = attrs.field(init=False)
    inventory: Inventory = attrs.field(init=False)
    settlement: Settlement = attrs.field(init=False)
    dispatcher: Dispatcher = attrs.field(init=False)
    leadership: Leadership = attrs.field(init=False)
    loop: DispatchLoop = attrs.field(init=False)
    pruner: Pruner = attrs.field(init=False)
    ready: trio.Event = attrs.field(factory=trio.Event, init=False)
    stopped: trio.Event = attrs.field(factory=trio.Event, init=False)
    _phase: str = attrs.field(default="starting", init=False)
    _state: str = attrs.field(default="starting", init=False)
    _stop: trio.Event = attrs.field(factory=trio.Event, init=False)
    # Starts that a stop cuts short (see _unless_stopped).
    _stoppable: set[trio.CancelScope] = attrs.field(factory=set, init=False)
    _abandon: trio.Event = attrs.field(factory=trio.Event, init=False)
    #: The stop was asked by SIGHUP (exit :data:`EXIT_HANGUP` instead of 0).
    _hangup: bool = attrs.field(default=False, init=False)
    _listener: Listener | None = attrs.field(default=None, init=False)
    _started_at: float | None = attrs.field(default=None, init=False)
    #: Trio time the stop sequence must be done by (set when it begins).
    _stop_deadline: float | None = attrs.field(default=None, init=False)
    #: When systemd's STATUS= was last sent (trio time), and whether one is scheduled.
    _status_sent: float = attrs.field(default=-math.inf, init=False)
    _status_trailing: bool = attrs.field(default=False, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    #: Lines for the person at the terminal, printed after everything else.
    _last_words: list[str] = attrs.field(factory=list, init=False)
    #: Held results were flushed (the stop sequence ran): the way out need not flush.
    _flushed: bool = attrs.field(default=False, init=False)
    #: What the last flush saved, spooled or lost.
    _flushed_report: FlushReport = attrs.field(factory=FlushReport, init=False)
    #: Why the database could not be reached at start (while it cannot).
    _unavailable: str | None = attrs.field(default=None, init=False)
    #: Manual runs of jobs not read yet whose worker type nobody served when their wake
    #: came: offered as soon as a worker serves the type.
    _parked: wakes.Parked = attrs.field(factory=wakes.Parked, init=False)
    #: Runs whose pause wake is being checked against the database (one check each).
    _pause_checks: set[int] = attrs.field(factory=set, init=False)
    #: namespace -> worker id -> the jobs it declared there (connected workers' only).
    _declarers: dict[str, dict[str, frozenset[str]]] = attrs.field(factory=dict, init=False)
    #: The companions were started (once: a re-taken lead keeps them).
    _companions_started: bool = attrs.field(default=False, init=False)
    #: This daemon stood by before it took the lock (a takeover, not a first start).
    _stood_by: bool = attrs.field(default=False, init=False)
    #: Workers' declarations go to the database one at a time (:meth:`_declare`).
    _declaring: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    #: Schedule -> its typical gap between deadlines (seconds), for the metrics.
    _gaps: dict[Schedule, float | None] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        s = self.settings
        self.store = Store(pool=ConnectionPool(self.dsn, size=s.pool_size), instance=self.instance)
        self.policy = ErrorPolicy(log=self.log, retry_cap=s.retry_cap, on_change=self._update)
        self.coalescer = RefreshCoalescer(spacing=s.refresh_spacing)
        self.admission = Admission(slots=s.concurrency, ahead=s.claim_ahead)
        self.settlement = Settlement(
            store=self.store,
            events=self.events,
            policy=self.policy,
            spool=Spool(s.spool_path),
            clock=self.clock,
            on_change=self._update,
        )
        self.inventory = Inventory(
            store=self.store,
            clock=self.clock,
            events=self.events,
            policy=self.policy,
            deadlines=self.deadlines,
            coalescer=self.coalescer,
            collector=cyclic_gc.Collector(freeze=self.owns_process),
            first_lookback=s.refresh_spacing + FIRST_LOOKBACK_SLACK,
        )
        self.loop = DispatchLoop(
            clock=self.clock,
            deadlines=self.deadlines,
            coalescer=self.coalescer,
            admission=self.admission,
            on_due=lambda job_id, at: self.dispatcher.deadline_due(job_id, at),
            refresh=self.inventory.refresh,
            dispatch=lambda ticket, seq: self.dispatcher.dispatch(ticket, seq),
        )
        self.pruner = Pruner(
            store=self.store,
            clock=self.clock,
            events=self.events,
            policy=self.policy,
            cron=s.prune_at,
            timezone=s.prune_timezone,
            retention=timedelta(seconds=s.retention),
            kick=self.loop.kick,
        )
        self.loop.chores.append(self.pruner)
        self.dispatcher = Dispatcher(
            store=self.store,
            clock=self.clock,
            events=self.events,
            policy=self.policy,
            admission=self.admission,
            inventory=self.inventory,
            settlement=self.settlement,
            executors=self.executors,
            abandon=self._abandon,
            kick=self.loop.kick,
            wake=self.loop.wake,
            on_change=self._update,
            jitter=self.jitter,
            others_starting=lambda: self.loop.starting > 0,
        )
        self.inventory.busy = self.dispatcher.busy
        self.inventory.served = self.dispatcher.served
        self.inventory.queued = self._offer_queued
        self.inventory.reading = self._parked.forget
        self.inventory.pausing = lambda run_id: self.dispatcher.request_stop(run_id, "pause")
        self.inventory.reread = lambda: self.loop.wake(urgent=True)
        self.settlement.on_saved = self.dispatcher.saved_later
        self.leadership = Leadership(
            dsn=self.dsn,
            store=self.store,
            log=self.log,
            instance=self.instance,
            retry_cap=s.retry_cap,
        )
        self.dispatcher.fenced = self.leadership.nudge
        hooks = ExecutorHooks(
            changed=self.workers_changed,
            may_send=self.leadership.may_send,
            save_progress=self._save_progress,
            save_checkpoint=self._save_checkpoint,
            declare=self._declare,
        )
        for executor in self.executors.values():
            executor.attach(hooks)

    # -- the outside ----------------------------------------------------------------------

    @property
    def log(self) -> EventLog:
        """Plain log lines (events that nothing subscribes to by type)."""
        return self.events.log

    def request_stop(self) -> None:
        """Begin the stop sequence (SIGTERM, SIGINT and tests call this)."""
        self._stop.set()
        for scope in self._stoppable:
            scope.cancel()

    def abandon_calls(self) -> None:
        """Stop running calls now instead of waiting for them (a second SIGINT)."""
        self._abandon.set()

    @property
    def state(self) -> str:
        """``starting``, ``standby``, ``ready``, ``degraded``, ``stopping`` or ``stopped``."""
        return self._state

    def status(
        self, *, deadlines: int = 0, visible: Callable[[str], bool] | None = None
    ) -> DaemonStatus:
        """The typed snapshot the admin face, the metrics and systemd read. No SQL.
        ``deadlines``: list the armed deadlines of at most that many jobs too.
        ``visible``: the next deadline is that of the earliest job whose key passes (a
        scoped admin token's; the daemon's own, in another namespace, was shown as
        "none armed")."""
        now = trio.current_time()
        earliest = self.deadlines.earliest()
        if earliest is not None and visible is not None:
            earliest = self._earliest_of(visible, earliest)
        next_deadline = next_job = None
        if earliest is not None:
            next_deadline = datetime.fromtimestamp(earliest[0], UTC)
            next_job = self.inventory.key(earliest[1])
        workers = tuple(w for e in self.executors.values() for w in e.connections())
        return DaemonStatus(
            state=self._state,
            instance=self.instance,
            uptime_s=0.0 if self._started_at is None else now - self._started_at,
            # (Not while the lock's session is lost: another daemon may take it meanwhile;
            # /healthz, the page and coordinator_leading said "leading" beside "leadership
            # lock session lost".)
            leading=self._phase in ("ready", "stopping") and self.store.leader_pid != 0,
            lock_pid=self.store.leader_pid or None,
            jobs=len(self.inventory.jobs),
            armed_deadlines=len(self.deadlines),
            next_deadline=next_deadline,
            next_job=next_job,
            running=tuple(
                RunningCall(
                    job=r.job_key, job_id=job_id, run=r.run_id, running_s=round(now - r.since, 3)
                )
                for job_id, r in sorted(self.dispatcher.running.items())
            ),
            held=tuple(
                HeldResultView(
                    run=result.run_id,
                    job=result.job_key,
                    outcome=result.outcome.status,
                    attempts=attempts,
                    error=error,
                )
                for result, attempts, error in self.settlement.held()
            ),
            workers=workers,
            refreshes=self.inventory.refreshes,
            last_refresh=self.inventory.last_refresh,
            degraded=self._problems(),
            sql_statements=self.store.statements,
            unresolved=self.inventory.unresolved(),
            next_prune=self.pruner.next_at,
            deadlines=self._deadlines(deadlines) if deadlines > 0 else (),
        )

    def _earliest_of(
        self, visible: Callable[[str], bool], earliest: tuple[float, int]
    ) -> tuple[float, int] | None:
        """The earliest armed deadline of a job whose key passes ``visible`` (asked by
        scoped tokens only; :meth:`DeadlineSet.first_where` reads only the deadlines
        ahead of it)."""
        if visible(self.inventory.key(earliest[1])):
            return earliest
        jobs = self.inventory.jobs

        def seen(job_id: int) -> bool:
            entry = jobs.get(job_id)
            return entry is not None and visible(entry.key)

        return self.deadlines.first_where(seen)

    def _deadlines(self, limit: int) -> tuple[ArmedDeadline, ...]:
        out: list[ArmedDeadline] = []
        for job_id, at in self.deadlines.items():
            if len(out) >= limit:
                break
            entry = self.inventory.jobs.get(job_id)
            if entry is None:
                continue
            if entry.schedule not in self._gaps:
                self._gaps[entry.schedule] = _gap(entry.schedule, self.clock.now())
            out.append(
                ArmedDeadline(
                    job=entry.key,
                    at=datetime.fromtimestamp(at, UTC),
                    interval_s=self._gaps[entry.schedule],
                )
            )
        return tuple(out)

    def workers_changed(self) -> None:
        """An executor's pools changed (a worker connected, left, changed capacity).

        Capacities are updated at once; deadlines of worker jobs are armed or disarmed
        from memory (an overdue one then runs once), with no SQL; and a lifecycle wake
        asks for a coalesced refresh so queued manual runs for new types are found. The
        runs whose wakes came while nobody served their type, for jobs not read yet, are
        offered at once instead of at that refresh (:meth:`_offer_parked`).
        """
        self.dispatcher.pools_changed()
        self.inventory.workers_changed()
        self._offer_parked()
        self._lifecycle_wake("workers.changed")

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self) -> int:
        """Lead, start up, serve until stopped; returns the exit status."""
        status = EXIT_FAILED
        self._started_at = trio.current_time()
        if self.owns_process:
            cyclic_gc.own_process()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self.log.writer)  # the log's lines, a write per round
                await nursery.start(self.store.serve)  # batched claims and settlements
                self.settlement.start(nursery)
                if self.handle_signals:
                    nursery.start_soon(self._watch_signals)
                status = await self._lead_and_serve(nursery)
                nursery.cancel_scope.cancel()
        except Exception as exc:  # a bug, or a group of them: stop cleanly, say so
            self.log.error("daemon.failed", error=_describe(exc))
            status = EXIT_FAILED
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True):
                if not self._flushed:  # a way out other than a stop: a bug, a cancel
                    status = self._stopped(await self._flush(), status)
                elif len(self.settlement) > len(self._flushed_report.lost):
                    # Results held after the stop's flush: their settlement was still
                    # queued or in flight when the batches stopped (the database hung
                    # past the stop's waits). Saved or spooled now, and said.
                    status = self._late(self._flushed_report, await self._flush(), status)
                await self.store.pool.close()
                await self.leadership.release()
            self._set_phase("stopped")
            for words in self._last_words:  # after the log's last line: what a person reads
                self._print(words)
            self.stopped.set()
        return status

    async def _lead_and_serve(self, nursery: trio.Nursery) -> int:
        # The companions start before the lock is sought: a standby delivers the alerts
        # its last run left in its outbox (a tester's failover lost a webhook retrying at
        # the leader's death: the new leader, with its own state directory, never saw
        # it, and its open window kept that job's next alerts quiet for hours). A
        # standby has no runs: nothing else wakes them, and nothing is sent without an
        # outbox.
        if not self._companions_started:
            self._companions_started = True
            for companion in self.companions:
                await nursery.start(companion.run)
        attempt = 0
        while True:
            try:
                acquired = await self.leadership.acquire(
                    self._stop,
                    on_standby=self._on_standby,
                    on_unavailable=self._on_unavailable,
                    standing_by=self._replay_standing_by,
                )
            except ConfigError as exc:  # a DSN no connection can be made with
                self.log.error("startup.refused", error=str(exc))
                self._last_words.append(str(exc))
                return EXIT_CONFIG
            if not acquired:
                # Stopped while standing by (or before the database answered): the
                # outbox's deliveries get their time, as at a leader's stop.
                await self._finish_companions()
                return EXIT_OK
            try:
                await self._start_up(nursery)
                break
            except _Stopped:
                await self._finish_companions()
                return EXIT_OK
            except ConfigError as exc:
                self.log.error("startup.refused", error=str(exc))
                self._last_words.append(str(exc))
                if isinstance(exc, WorkerSocketError) and self._stood_by:
                    # A standby taking over found the worker socket still served: most
                    # likely by the leader it replaces, cut off from the database but
                    # alive, which takes the lock back. Not a configuration to fix: exit
                    # 1, which the shipped unit restarts (as a standby again), where exit
                    # 2 left the pair a single daemon for good (a tester's finding).
                    return EXIT_FAILED
                return EXIT_CONFIG
            except CoordinatorError as exc:
                # The database went away between two startup steps: give the lock back and
                # begin again from the lock (every step is idempotent).
                if classify(exc) is not Failure.UNAVAILABLE:
                    raise
                await self.leadership.release()
                attempt += 1
                delay = backoff(attempt, cap=self.settings.retry_cap)
                self._on_unavailable(exc, delay)
                with trio.move_on_after(delay):
                    await self._stop.wait()
                if self._stop.is_set():
                    await self._finish_companions()
                    return EXIT_OK
        nursery.start_soon(self._keep_lead)
        self.pruner.arm()
        self._set_phase("ready")
        self.ready.set()
        snapshot = self.status()
        self.log.info(
            "ready",
            instance=self.instance,
            jobs=snapshot.jobs,
            armed=snapshot.armed_deadlines,
            next_deadline=(
                snapshot.next_deadline.isoformat(timespec="seconds")
                if snapshot.next_deadline
                else None
            ),
        )
        self.notify("READY=1")
        self._update()
        async with trio.open_nursery() as calls:
            loop_scope = trio.CancelScope()

            async def loop() -> None:
                with loop_scope:
                    await self.loop.run(calls)

            calls.start_soon(loop)
            await self._stop.wait()
            await self._drain(calls, loop_scope)
        report = await self._flush()
        await self._requeue_abandoned()
        await self._finish_companions()
        return self._stopped(report, EXIT_OK)

    async def _requeue_abandoned(self) -> None:
        """Queue again the runs of idempotent jobs whose calls the stop abandoned, once
        their ``cancelled`` is saved (a result still held or spooled is not: its run is
        skipped, as one a new leader swept meanwhile). Bounded; a failure is said, not
        retried: the runs stay ``cancelled``, as before this existed."""
        runs = self.dispatcher.abandoned
        if not runs or self.leadership.stepped_down or self.store.leader_pid == 0:
            return  # (no lead: the statement is fenced too)
        queued: list[tuple[int, int]] = []
        failed: str | None = None
        with trio.move_on_after(REQUEUE_WITHIN) as bounded:
            try:
                queued = await self.store.requeue_abandoned(runs)
            except CoordinatorError as exc:
                failed = one_line(exc)
        if bounded.cancelled_caught:
            failed = f"no answer within {REQUEUE_WITHIN:g}s (it may still have queued them)"
        if failed is not None:
            self.log.warning(
                "stop.requeue_failed",
                runs=",".join(str(r) for r in runs),
                error=failed,
                consequence="their runs stay cancelled",
            )
            return
        for run_id, retry_id in queued:
            self.log.info("stop.requeued", run=run_id, retry=retry_id)

    async def _start_up(self, nursery: trio.Nursery) -> None:
        """Lock taken: schema, spool replay, crash sweep, LISTEN, first refresh."""
        self.log.info("startup.lock", instance=self.instance)
        await self._step("schema", self._check_schema)
        await self._step("spool", self.settlement.replay)
        lost = await self._step("sweep", self.store.sweep_lost)
        for item in lost:
            self.events.emit(
                RunLost(
                    run=item.run_id,
                    job_id=item.job_id,
                    job=item.job,
                    action=item.action,
                    attempt=item.attempt,
                )
            )
        self.log.info("startup.sweep", lost=len(lost))
        if self._listener is None:
            # LISTEN before the first refresh, so no change can fall between the two.
            self._listener = Listener(
                dsn=self.dsn,
                log=self.log,
                on_notify=self._on_notification,
                on_lost=lambda: self._lifecycle_wake("listener.reconnected", urgent=True),
                on_state=lambda _up: self._update(),
                on_statement=self.store.count,
            )
            await self._unless_stopped(partial(nursery.start, self._listener.run))
            # Executors that accept connections (workers) open only once we lead: a
            # standby must not take the leader's socket. Before the first refresh, so
            # workers that reconnect at once count when deadlines are first armed.
            for executor in self.executors.values():
                await self._unless_stopped(partial(nursery.start, executor.serve))
        await self._step("refresh", lambda: self.inventory.refresh(first=True))

    async def _unless_stopped(self, start: Callable[[], Awaitable[object]]) -> None:
        """Start a task whose start may wait (the worker socket waits up to 45 s for
        another listener to go), cut short by a stop: ``systemctl stop`` then waited
        that long, and the stop ended as a refusal to start (exit 2). A plain cancel
        scope, not a watching nursery: a nursery would wrap the start's own refusal
        (e.g. a socket directory owned by another user) in an exception group, and
        the refusal would no longer end as exit 2."""
        with trio.CancelScope() as scope:
            self._stoppable.add(scope)
            if self._stop.is_set():
                scope.cancel()
            try:
                await start()
            finally:
                self._stoppable.discard(scope)
        if self._stop.is_set():
            raise _Stopped

    async def _step(self, purpose: str, action: Callable[[], Awaitable[T]]) -> T:
        """Run one startup step through the error policy: retried (at once after a
        deadlock, else with backoff) while PostgreSQL refuses it; an unreachable database
        propagates (the startup begins again from the lock); a bug propagates."""
        attempt = 0
        while True:
            try:
                result = await action()
            except CoordinatorError as exc:
                if isinstance(exc, ConfigError) or classify(exc) is Failure.UNAVAILABLE:
                    raise
                attempt += 1
                delay = self.policy.failed(f"startup.{purpose}", exc, attempt)
                self._update()
                with trio.move_on_after(delay):
                    await self._stop.wait()
                if self._stop.is_set():
                    raise _Stopped from None
                continue
            self.policy.recovered(f"startup.{purpose}")
            return result

    async def _check_schema(self) -> None:
        """Refuse to start on a schema that lacks migrations (or apply them, if asked)."""
        expected = [m.name for m in load_migrations()]
        applied = await self.store.applied_migrations()
        pending = [name for name in expected if applied is None or name not in applied]
        if pending and self.settings.migrate:
            for name in await self.store.migrate():
                self.log.info("startup.migrated", migration=name)
            return
        if pending:
            raise ConfigError(
                f"the schema lacks {', '.join(pending)}: run `coordinator migrate` "
                "(or `coordinator run --migrate`)"
            )

    async def _keep_lead(self) -> None:
        await self.leadership.keep(
            on_lost=self._update,
            on_regained=lambda: self._lifecycle_wake("leadership.regained", urgent=True),
            on_stepped_down=self._stepped_down,
        )

    def _stepped_down(self) -> None:
        """Another daemon took the lock: stop, and meanwhile stop the calls whose runs it
        ended otherwise (:meth:`_stop_superseded`)."""
        self.request_stop()
        if self._nursery is not None:
            self._nursery.start_soon(self._stop_superseded)

    async def _stop_superseded(self) -> None:
        """Until the calls in progress end (within the stop timeout), ask the database
        every :data:`SUPERSEDED_POLL` seconds which of their runs the new leader's sweep
        ended otherwise -- an idempotent job's run failed with its retry queued, a
        recoverable one paused -- and stop those calls, which would run beside the new
        leader's retry or resume. Taking the lock does not prove a sweep (the new leader
        may still be replaying its spool, or the lock's holder is this daemon's own
        session, lingering on the server after a cut): a call is stopped only once its
        run shows it. A run left ``unresolved`` keeps its call: its result, saved late,
        resolves it (migrations/0032)."""
        attempt = 0
        with trio.move_on_after(self.settings.stop_timeout):
            while runs := self.dispatcher.unstopped_runs():
                try:
                    ended = await self.store.ended_elsewhere(runs)
                except Exception as exc:
                    attempt += 1
                    await trio.sleep(self.policy.failed("stop_superseded", exc, attempt))
                    continue
                if attempt:
                    attempt = 0
                    self.policy.recovered("stop_superseded")
                asked = self.dispatcher.stop_runs(ended)
                if asked:
                    self.log.warning(
                        "leadership.stopping_calls",
                        calls=asked,
                        runs=",".join(str(r) for r in ended),
                        reason="the new leader ended their runs otherwise (a retry queued, "
                        "a pause): they would run beside its retry or resume",
                    )
                await trio.sleep(SUPERSEDED_POLL)

    # -- wakes ----------------------------------------------------------------------------

    def _on_notification(self, payload: str) -> None:
        hint = wakes.parse(payload)
        if hint is None:
            self.log.debug("wake.ignored", payload=payload[:200])
            return
        if isinstance(hint, wakes.Pause):
            self.events.emit(NotificationWake(payload={"pause": hint.run_id}))
            if self.dispatcher.calling(hint.run_id) and self._nursery is not None:
                if hint.run_id not in self._pause_checks:  # (one check per run at a time)
                    self._pause_checks.add(hint.run_id)
                    self._nursery.start_soon(self._pause_if_asked, hint.run_id)
            else:
                # Not a call of ours right now (or one just claimed, not yet under way):
                # a refresh reads the run's state and asks again if it is ours.
                self.loop.wake()
            return
        if isinstance(hint, wakes.Dispatch):
            if self._dispatch_hint(hint):
                return
            # Read that job (and its queued run) instead: the truth is in the database.
            self.inventory.request((hint.job_id,))
            self.events.emit(NotificationWake(payload={"run": hint.run_id, "job": hint.job_id}))
        else:
            self.inventory.request(hint.job_ids)
            self.events.emit(
                NotificationWake(
                    payload={"job": hint.job_ids[0]}
                    if hint.job_ids and len(hint.job_ids) == 1
                    else {"changed": "many"}
                )
            )
        self.loop.wake()

    def _dispatch_hint(self, hint: wakes.Dispatch) -> bool:
        """Take a manual run straight to admission when the hint agrees with what we know;
        ``False`` sends it the slow way (a coalesced refresh reads the truth)."""
        known = self.inventory.jobs.get(hint.job_id)
        if known is not None and (
            known.worker_type != hint.worker_type or known.priority != hint.priority
        ):
            self.log.debug("wake.inconsistent", run=hint.run_id, job_id=hint.job_id)
            return False
        if (
            known is None
            and hint.worker_type is not None
            and hint.worker_type not in self.dispatcher.served()
        ):
            # Nobody serves it: the refresh offers the run if it is real, or a worker of
            # its type connects first and offers it then.
            self._parked.park(hint, self._due(hint))
            return False
        # (Nothing parked waits for a served type: the served types change only in
        # workers_changed, which offers the parked ones of a type in the same step.)
        self._offer_hint(hint, None if known is None else known.namespace, due=self._due(hint))
        return True

    def _due(self, hint: wakes.Dispatch) -> float:
        """When the hint's run was created (its place among the manual runs of its
        priority), never later than now: a payload is only a hint, and any role may send
        one (one dated in the future would put its run behind every other)."""
        now = self.clock.now().timestamp()
        created = hint.created
        return now if created is None else min(created, now)

    def _offer_hint(
        self, hint: wakes.Dispatch, namespace: str | None, due: float | None = None
    ) -> None:
        self.dispatcher.offer_manual(
            job_id=hint.job_id,
            run_id=hint.run_id,
            priority=hint.priority,
            worker_type=hint.worker_type,
            namespace=namespace,
            due=due,
        )
        self.events.emit(DispatchWake(dispatch=hint.run_id, job_id=hint.job_id))
        self.loop.turn_now()

    def _offer_parked(self) -> None:
        """Offer the parked manual runs whose type a worker serves now, oldest first and
        each due when its run was created, without waiting for the coalesced refresh (up to its
        spacing, 30 s by default). A hint is only a hint: the claim checks the run under
        its row lock, and one gone or no longer queued is refused, at the cost of that
        claim. (Jobs a refresh read since were forgotten then: it offered their runs.)"""
        for hint, came in self._parked.take(self.dispatcher.served()):
            self._offer_hint(hint, None, due=came)

    async def _pause_if_asked(self, run_id: int) -> None:
        """Stop the call of ``run_id`` for a pause wake only if the run's status says an
        operator asked (``cancel_requested``, which only ``coordinator.pause_run`` sets,
        under the caller's row security). Any role may ``NOTIFY coordinator``: a forged
        ``{"pause": N}`` used to stop any namespace's call. One statement per wake of a
        call in progress here; retried by the error policy while the call lasts."""
        attempt = 0
        try:
            while self.dispatcher.calling(run_id):
                attempt += 1
                try:
                    status = await self.store.run_status(run_id)
                except Exception as exc:
                    delay = self.policy.failed("pause_check", exc, attempt, run=run_id)
                    await trio.sleep(delay)
                    continue
                if attempt > 1:
                    self.policy.recovered("pause_check")
                if status == "cancel_requested":
                    self.dispatcher.request_stop(run_id, "pause")
                else:
                    self.log.warning("wake.pause_refused", run=run_id, status=status)
                return
        finally:
            self._pause_checks.discard(run_id)

    def _lifecycle_wake(self, reason: str, *, urgent: bool = False) -> None:
        self.events.emit(LifecycleWake(reason=reason, urgent=urgent or None))
        self.inventory.request(None)  # anything may have changed: read it all
        self.loop.wake(urgent=urgent)

    def _offer_queued(self, entry: JobEntry) -> None:
        assert entry.run_id is not None
        self.dispatcher.offer_manual(
            job_id=entry.id,
            run_id=entry.run_id,
            priority=entry.priority,
            worker_type=entry.worker_type,
            namespace=entry.namespace,
            # First triggered, first served: a queued run waits since it was created.
            due=wakes.epoch(entry.run_created_at) if entry.run_created_at else None,
        )

    async def _save_progress(self, run_id: int, snapshot: dict[str, object]) -> None:
        await self.store.save_progress(run_id, redact.default().value(snapshot))

    async def _save_checkpoint(self, run_id: int, write: CheckpointWrite) -> bool:
        if write.findings:  # what a run found is kept and served: redacted first
            write = attrs.evolve(write, findings=redact.default().findings(write.findings))
        return await self.store.save_checkpoint(run_id, write)

    async def _declare(self, declare: Declare, worker: str) -> Declared:
        """Sync the schedules a worker's code declares (its right to the namespace and
        its types were checked by the executor). A problem refuses the whole declaration;
        a database failure is retried (the error policy) while the worker stays
        connected. A change is read back at once: the daemon's own writes raise no wake."""
        reading = declarations.read(declare)
        namespace = declare.namespace
        if reading.problems:
            self.log.warning(
                "worker.declare_refused",
                worker=worker,
                namespace=namespace,
                problems="; ".join(reading.problems),
            )
            return Declared(namespace=namespace, ok=False, problems=reading.problems)
        attempt, failing = 0, False
        try:
            while True:
                attempt += 1
                try:
                    # One declaration at a time: each may wait for another sync of its
                    # namespace (migrations/0037's lock) holding a pooled connection, and
                    # the claims and settlements share that pool (the review of 5306f72).
                    async with self._declaring:
                        result = await self.store.declare(namespace, reading.entries)
                except Exception as exc:
                    delay = self.policy.failed("declare", exc, attempt, worker=worker)
                    failing = True
                    await trio.sleep(delay)
                    continue
                break
        finally:
            if failing:
                self.policy.recovered("declare")
        self.events.emit(
            SchedulesDeclared(
                worker=worker,
                namespace=namespace,
                jobs=len(reading.entries),
                created=result.created,
                updated=result.updated,
                paused=result.paused,
                unchanged=result.unchanged or None,
            )
        )
        conflict = self._say_rival_declarer(worker, namespace, reading.entries, result.paused)
        if not result.unchanged:
            self._lifecycle_wake("schedules.declared", urgent=True)
        return Declared(
            namespace=namespace,
            ok=True,
            created=result.created,
            updated=result.updated,
            paused=result.paused,
            unchanged=result.unchanged,
            conflict=conflict,
        )

    def _say_rival_declarer(
        self, worker: str, namespace: str, entries: Sequence[Mapping[str, Any]], paused: int
    ) -> str | None:
        """Two worker programs that declare one namespace with different jobs pause each
        other's jobs at every (re)connection, as two manifests synced in turn would: the
        documented semantics, but easy to fall into, and it was said at info only. Said
        in a warning here and returned for the declaring worker's ``declared`` (its own
        log says it too: the one who deploys it may not read the daemon's)."""
        names = frozenset(str(e["name"]) for e in entries)
        connected = {w.id for e in self.executors.values() for w in e.connections()}
        known = self._declarers.setdefault(namespace, {})
        for gone in [w for w in known if w not in connected]:
            del known[gone]
        rivals = sorted(w for w, theirs in known.items() if w != worker and not theirs <= names)
        known[worker] = names
        if not paused or not rivals:
            return None
        other = ", ".join(rivals)
        reason = (
            f"workers {other} and {worker} declare namespace {namespace} with "
            "different jobs: each declaration pauses the jobs the other declared (a "
            "declaration is the namespace's whole set); give each program its own namespace, "
            "or declare the same jobs in both"
        )
        self.log.warning(
            "worker.declare_conflict",
            worker=worker,
            namespace=namespace,
            paused=paused,
            other=other,
            reason=reason,
        )
        return reason

    # -- stop -----------------------------------------------------------------------------

    async def _watch_signals(self) -> None:
        try:
            # SIGHUP (a closed terminal, an operator's `kill -HUP` meaning "reload")
            # stops as SIGTERM does: its default action ended the process at once,
            # results held or not. There is no reload: the stop exits EXIT_HANGUP, not
            # 0, for Restart=on-failure to start the daemon again (a reload by restart).
            stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
            with trio.open_signal_receiver(*stops) as signals:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    self.log.info("signal", signal=name)
                    if not self._stop.is_set():
                        self._hangup = signum == signal.SIGHUP
                        self.request_stop()
                        self._say_what_we_wait_for(signum)
                    elif signum == signal.SIGINT and not self._abandon.is_set():
                        self._print("interrupt: cancelling running calls now")
                        self.abandon_calls()
        except ValueError:
            # Not the main thread (e.g. an embedding test harness): stop via request_stop().
            await trio.sleep_forever()

    def _say_what_we_wait_for(self, signum: int) -> None:
        running = self.dispatcher.running
        if not running:
            self._print("stopping")
            return
        names = ", ".join(f"{r.job_key} (run {r.run_id})" for r in running.values())
        # (Only SIGINT cancels them: a second SIGTERM, from a service manager, does not.)
        now = (
            "press Ctrl-C again to cancel them now"
            if signum == signal.SIGINT
            else f"SIGINT cancels them now: kill -INT {os.getpid()}"
        )
        self._print(
            f"stopping: waiting for {len(running)} running call(s): {names}; up to "
            f"{self.settings.stop_timeout:g}s, then they are cancelled ({now})"
        )

    async def _drain(self, calls: trio.Nursery, loop_scope: trio.CancelScope) -> None:
        """Refuse new admissions and wait for admitted calls, bounded by stop_timeout;
        past it (or on a second SIGINT), abandon them (executors record ``cancelled``)."""
        self._stop_deadline = trio.current_time() + self.settings.stop_timeout
        self.dispatcher.stopping = True
        self.pruner.stopping = True
        self._set_phase("stopping")
        self.notify("STOPPING=1")
        self.admission.close()
        self.coalescer.hold()
        loop_scope.cancel()
        for executor in self.executors.values():
            await executor.detach()  # no new workers; calls in flight and claimed runs go on
        # Recoverable calls pause now, at their cursor, instead of running on.
        pausing = self.dispatcher.stop_recoverable()
        self.log.info(
            "stopping",
            running=len(self.dispatcher.running),
            pausing=pausing or None,
            retained=len(self.settlement),
        )
        with trio.move_on_at(self._stop_deadline) as waited:
            async with trio.open_nursery() as watch:
                watch.start_soon(_cancel_when_set, self._abandon, watch.cancel_scope)
                while self.dispatcher.in_flight:
                    self.notify(
                        f"EXTEND_TIMEOUT_USEC={int((self.settings.stop_timeout + 30) * 1e6)}"
                    )
                    await self.dispatcher.idle.wait()
                watch.cancel_scope.cancel()
        if waited.cancelled_caught or self._abandon.is_set():
            self.log.warning("stop.abandon", running=len(self.dispatcher.running))
            self._abandon.set()
            # (The wait below, then the flush: the service manager is told, not left to
            # kill the process before the spool is written.)
            self.notify(f"EXTEND_TIMEOUT_USEC={int((ABANDON_WAIT + 10) * 1e6)}")
            with trio.move_on_after(ABANDON_WAIT):
                while self.dispatcher.in_flight:
                    await self.dispatcher.idle.wait()
        calls.cancel_scope.cancel()

    async def _finish_companions(self) -> None:
        """Give the companions (alert delivery) what is left of the stop timeout, at
        most :data:`COMPANION_FINISH` seconds, to finish their work."""
        if not self.companions:
            return
        now = trio.current_time()
        deadline = min(max(self._stop_deadline or now, now + 1.0), now + COMPANION_FINISH)
        for companion in self.companions:
            await companion.finish(deadline)

    async def _flush(self) -> FlushReport:
        self._flushed = True
        now = trio.current_time()
        deadline = max(self._stop_deadline or 0.0, now + min(5.0, self.settings.stop_timeout))
        if len(self.settlement):
            self.notify(f"EXTEND_TIMEOUT_USEC={int((deadline - now + 5) * 1e6)}")
        self._flushed_report = await self.settlement.flush(deadline=deadline)
        return self._flushed_report

    def _late(self, before: FlushReport, report: FlushReport, status: int) -> int:
        """A second flush, after the stop's: say what it did with the results held since,
        and choose the exit status again."""
        spooled = sorted(set(report.spooled) - set(before.spooled))
        lost = sorted(set(report.lost) - set(before.lost))
        self.log.error(
            "stop.late_results",
            instance=self.instance,
            spooled=len(spooled) or None,
            lost=", ".join(str(r) for r in lost) or None,
        )
        if lost:
            self._say_lost(lost)
            return EXIT_LOST
        if spooled and status == EXIT_OK:
            return EXIT_SPOOLED
        return status

    def _say_lost(self, runs: Sequence[int]) -> None:
        """The process's last words name the runs whose results are lost."""
        named = ", ".join(str(r) for r in runs)
        self._last_words.append(
            f"could not save or spool the results of runs {named}: they are lost"
        )

    def _stopped(self, report: FlushReport, status: int) -> int:
        """Log the last line and choose the exit status from what the flush kept."""
        if status == EXIT_OK and self._hangup:
            status = EXIT_HANGUP  # (a failure's status says more, and restarts too)
        if report.lost:
            self.log.error(
                "stopped",
                instance=self.instance,
                spooled=len(report.spooled) or None,
                lost=", ".join(str(r) for r in report.lost),
                exit_code=EXIT_LOST,
            )
            self._say_lost(report.lost)
            return EXIT_LOST
        if report.spooled:
            # A clean stop that spooled says so with its own status; a failure keeps its.
            status = EXIT_SPOOLED if status == EXIT_OK else status
            self.log.error(
                "stopped", instance=self.instance, spooled=len(report.spooled), exit_code=status
            )
            return status
        if self.leadership.stepped_down:
            status = EXIT_FAILED
        self.log.info("stopped", instance=self.instance, exit_code=status or None)
        return status

    # -- state ----------------------------------------------------------------------------

    def _on_standby(self) -> None:
        self._stood_by = True
        self._set_phase("standby")
        self.log.info("standby", instance=self.instance)

    async def _replay_standing_by(self) -> None:
        """A standby with a spool saves it while it waits: results a daemon spooled at
        its stop were seen only once it led again, and their runs, swept ``unresolved``
        by the leader meanwhile, were alerted as crashes and might be retried by hand
        (a tester's finding). Each is saved over that mark (``settle.late``: the leader
        is woken and re-arms the job) or said ``settle.superseded``, as an old leader's
        late result is. Nothing is sent without a spool (a standby stays silent)."""
        if not self.settlement.spool.path.exists():
            return
        self.log.info("standby.spool", spool=str(self.settlement.spool.path))
        try:
            # (The schema first, as at a start: a newer daemon standing by beside an
            # older schema would set its records aside as refused.)
            await self._check_schema()
            await self.settlement.replay()
        except Exception as exc:  # the next stand-by, or the start, tries again
            # (Not only the database's refusals: an unreadable spool file raised out of
            # the standby's wait, and the daemon failed, restarted, failed.)
            self.log.warning("standby.spool_failed", error=one_line(exc))

    def _on_unavailable(self, exc: BaseException, delay: float) -> None:
        self.log.warning("startup.database_unavailable", error=one_line(exc), retry_s=delay)
        self._unavailable = one_line(exc)
        self._update()

    def _problems(self) -> tuple[str, ...]:
        problems = list(self.policy.problems)
        if self._phase == "starting" and self._unavailable:
            problems.append(f"database unavailable: {self._unavailable}")
        if self._phase in ("ready", "stopping"):
            if self._listener is not None and not self._listener.connected:
                problems.append("listener disconnected")
            if self.store.leader_pid == 0:
                problems.append("leadership lock session lost")
        if len(self.settlement):
            problems.append(f"{len(self.settlement)} result(s) held")
        return tuple(problems)

    def _set_phase(self, phase: str) -> None:
        self._phase = phase
        if phase != "starting":
            self._unavailable = None
        self._update()

    def _update(self) -> None:
        """Recompute the state word; tell the event stream when it changes, and systemd's
        ``STATUS=`` at once on a change of state, else at most once per
        :data:`STATUS_EVERY` while calls come and go (one trailing update after the
        last change, then silence)."""
        problems = self._problems()
        state = self._phase
        if problems and state in ("starting", "ready"):
            state = "degraded"
        changed = state != self._state
        self._state = state
        if changed:
            self.events.emit(StateChanged(state=state, reasons=problems))
        now = trio.current_time()
        if changed or now >= self._status_sent + STATUS_EVERY or self._nursery is None:
            self._send_status(problems)
        elif not self._status_trailing:
            self._status_trailing = True
            self._nursery.start_soon(self._trailing_status)

    async def _trailing_status(self) -> None:
        await trio.sleep_until(self._status_sent + STATUS_EVERY)
        self._status_trailing = False
        self._send_status(self._problems())

    def _send_status(self, problems: tuple[str, ...]) -> None:
        self._status_sent = trio.current_time()
        earliest = self.deadlines.earliest()
        self.notify(
            "STATUS="
            + status_line(
                self._state,
                armed=len(self.deadlines),
                next_deadline=(
                    datetime.fromtimestamp(earliest[0], UTC) if earliest is not None else None
                ),
                running=len(self.dispatcher.running),
                held=len(self.settlement),
                degraded=problems,
            )
        )

    def _print(self, message: str) -> None:
        """A line for the person at the terminal (stderr), beside the log."""
        if self.handle_signals:
            print(f"coordinator: {message}", file=sys.stderr, flush=True)


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def _gap(schedule: Schedule, now: datetime) -> float | None:
    """The typical time between two deadlines of ``schedule`` (seconds): the interval,
    or the gap between a cron expression's next two firings; ``None`` for the others."""
    try:
        first = schedules.following_deadline(schedule, now)
        second = schedules.following_deadline(schedule, first) if first is not None else None
    except (ValueError, OverflowError, CoordinatorError):
        return None
    if first is None or second is None:
        return None
    return (second - first).total_seconds()


def _describe(exc: BaseException) -> str:
    """One line for an exception or a group of them (groups are unwrapped)."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {one_line(exc)}"


__all__ = [
    "COMPANION_FINISH",
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_HANGUP",
    "EXIT_LOST",
    "EXIT_OK",
    "EXIT_SPOOLED",
    "Companion",
    "Daemon",
    "DaemonSettings",
    "default_instance",
]
