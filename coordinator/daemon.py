"""The daemon: the pure core wired to the store, the listener and the executors.

Layering: ``coordinator.core`` (deadline set, refresh coalescer, admission) is pure and
imports nothing from here; this module owns every side effect and runs it in one trio
nursery. One loop task decides; other tasks only report to it (by setting ``_kick``):

* the loop sleeps until the earliest of: the earliest saved deadline, the coalescer's
  next grant, a retained result's next retry — or forever when there is none of these.
  With no due work it sends no SQL and arms no timer (promise 1);
* a wake (a notification, a worker coming or going, a freed slot) goes to the coalescer,
  which grants at most one inventory refresh per ``refresh_spacing`` (promise 4); a
  manual dispatch skips it and goes straight to admission and the claim;
* due work waits in admission for a slot; each admitted ticket is one task: claim (one
  statement), call the executor outside any transaction, settle (one statement);
* a settlement that cannot be written is retained with its exact result and retried with
  backoff; its job stays out of admission until it is saved (promise 6); at stop it is
  flushed, and spooled if the database still refuses (promise 7).
"""

from __future__ import annotations

import math
import os
import signal
import socket
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import attrs
import trio
from asyncpg import Connection

from . import schedule as schedule_mod
from .backoff import backoff
from .clock import WallClock
from .core.admission import Admission, Ticket
from .core.coalescer import RefreshCoalescer
from .core.deadlines import DeadlineSet
from .db import APP_DAEMON, close_quietly, connect
from .errors import CoordinatorError
from .executors import Executor
from .listener import Listener
from .log import EventLog
from .model import Claim, Outcome
from .spool import Spool, SpooledResult
from .store import ConnectionPool, JobEntry, JobState, Store, StoreUnavailable

#: Exit status when results had to be spooled because the database refused them.
EXIT_SPOOLED: Final = 3


def default_instance() -> str:
    """``host:pid:random``: unique per process, readable in ``runs.instance``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@attrs.frozen(kw_only=True)
class DaemonSettings:
    """What the daemon needs to know beyond its collaborators."""

    #: Minimum seconds between two inventory refreshes.
    refresh_spacing: float = 30.0
    #: Global limit of concurrent calls.
    concurrency: int = 16
    #: Longest the stop sequence waits for running calls before cancelling them.
    stop_timeout: float = 60.0
    #: Where unsaved results go at stop.
    spool_path: Path
    #: Database connections for claims and settlements.
    pool_size: int = 4
    #: Cap for the settlement retry backoff.
    retry_cap: float = 30.0


@attrs.define(eq=False)
class Retained:
    """A result the database has not acknowledged yet. Never recomputed, only re-sent."""

    run_id: int
    job_id: int
    job_key: str
    schedule_version: int
    next_run_at: datetime | None
    outcome: Outcome
    attempts: int = 0

    def spooled(self) -> SpooledResult:
        return SpooledResult(
            run_id=self.run_id,
            job_key=self.job_key,
            schedule_version=self.schedule_version,
            next_run_at=self.next_run_at,
            outcome=self.outcome,
        )


@attrs.define(eq=False)
class Daemon:
    """One daemon process's state and tasks. ``run()`` returns the exit status."""

    dsn: str
    settings: DaemonSettings
    clock: WallClock
    log: EventLog
    executors: Mapping[str, Executor]
    instance: str = attrs.field(factory=default_instance)
    #: Called with systemd-style state updates (``READY=1``, ``STATUS=...``).
    notify: Callable[[str], None] = lambda message: None
    #: Stop on SIGTERM/SIGINT (off when embedded, e.g. in tests).
    handle_signals: bool = True

    store: Store = attrs.field(init=False)
    deadlines: DeadlineSet = attrs.field(factory=DeadlineSet)
    coalescer: RefreshCoalescer = attrs.field(init=False)
    admission: Admission = attrs.field(init=False)
    jobs: dict[int, JobEntry] = attrs.field(factory=dict)
    #: job id -> (run id, trio time the call started)
    running: dict[int, tuple[int, float]] = attrs.field(factory=dict)
    #: run id -> retained result
    retained: dict[int, Retained] = attrs.field(factory=dict)
    state: str = "starting"
    ready: trio.Event = attrs.field(factory=trio.Event)
    stopped: trio.Event = attrs.field(factory=trio.Event)
    _kick: trio.Event = attrs.field(factory=trio.Event)
    _stop_requested: trio.Event = attrs.field(factory=trio.Event)
    _abandon: trio.Event = attrs.field(factory=trio.Event)
    _calls_done: trio.Event = attrs.field(factory=trio.Event)
    #: Admitted tickets whose dispatch task has not finished (claim, call, settle).
    _in_flight: int = 0
    #: Manual runs that arrived while their job was being dispatched, by job id.
    _after_dispatch: dict[int, Ticket] = attrs.field(factory=dict)
    #: Worker types admission knows the capacity of.
    _pools: set[str] = attrs.field(factory=set)
    _nursery: trio.Nursery | None = None
    _lock_conn: Connection | None = None
    _listener: Listener | None = None
    _stopping: bool = False
    refreshes: int = 0
    #: Another daemon took the lock while ours was lost: exit non-zero.
    lost_leadership: bool = False

    def __attrs_post_init__(self) -> None:
        self.store = Store(
            pool=ConnectionPool(self.dsn, size=self.settings.pool_size), instance=self.instance
        )
        self.coalescer = RefreshCoalescer(spacing=self.settings.refresh_spacing)
        self.admission = Admission(slots=self.settings.concurrency)

    # -- public surface -------------------------------------------------------------------

    def request_stop(self) -> None:
        """Begin the stop sequence (SIGTERM, SIGINT and tests call this)."""
        self._stop_requested.set()

    def wake(self, reason: str, *, urgent: bool = False) -> None:
        """A lifecycle wake (worker arrived or left, ...): goes through the coalescer."""
        self.log.info("wake", reason=reason, urgent=urgent or None)
        self.coalescer.wake(trio.current_time(), urgent=urgent)
        self._kick.set()

    def worker_types(self) -> list[str]:
        """Worker types currently served (empty until a worker executor is attached)."""
        worker = self.executors.get("worker")
        types: Callable[[], list[str]] | None = getattr(worker, "served_types", None)
        return types() if types is not None else []

    def _pool_capacity(self, pool: str) -> int:
        worker = self.executors.get("worker")
        capacity: Callable[[str], int] | None = getattr(worker, "capacity", None)
        return capacity(pool) if capacity is not None else 0

    def _ensure_pool(self, pool: str | None) -> None:
        """Admission learns a worker type's capacity before its first ticket: 0 (wait,
        no claim, no SQL) until a worker serving it connects."""
        if pool is not None and pool not in self._pools:
            self._pools.add(pool)
            self.admission.set_capacity(pool, self._pool_capacity(pool))

    def workers_changed(self) -> None:
        """A worker connected, left or changed capacity (the worker executor calls this).

        Capacities are updated at once; deadlines of worker jobs are armed or disarmed
        from the in-memory inventory (an overdue one then runs once), with no SQL; and
        a lifecycle wake asks for a coalesced refresh so queued manual runs for the
        newly served types are found.
        """
        served = set(self.worker_types())
        self._pools |= served
        for pool in self._pools:
            self.admission.set_capacity(pool, self._pool_capacity(pool))
        for entry in self.jobs.values():
            if entry.worker_type is not None:
                self._arm(entry, served)
        self.wake("workers.changed")

    async def run(self) -> int:
        """Lead, reconcile, serve until stopped; returns the exit status."""
        status = 1
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self.handle_signals:
                    nursery.start_soon(self._watch_signals)
                status = await self._lead_and_serve(nursery)
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self.store.pool.close()
                await close_quietly(self._lock_conn)
            self.stopped.set()
        return status

    # -- startup ----------------------------------------------------------------------

    async def _lead_and_serve(self, nursery: trio.Nursery) -> int:
        attempt = 0
        while True:
            if not await self._lead():
                return 0  # stopped while standing by (or before the database answered)
            try:
                await self._start_up(nursery)
                break
            except StoreUnavailable as exc:
                # Lost the database between two startup steps: give the lock back and
                # begin again from the lock (every step is idempotent).
                attempt += 1
                delay = backoff(attempt, cap=self.settings.retry_cap)
                self.state = "degraded"
                self.log.warning("startup.database_unavailable", error=str(exc), retry_s=delay)
                await close_quietly(self._lock_conn, within=1.0)
                self._lock_conn = None
                with trio.move_on_after(delay):
                    await self._stop_requested.wait()
                if self._stop_requested.is_set():
                    return 0
        nursery.start_soon(self._keep_lead)
        self.state = "ready"
        self.ready.set()
        self.log.info(
            "ready",
            instance=self.instance,
            jobs=len(self.jobs),
            armed=len(self.deadlines),
            next_deadline=self._next_deadline_iso(),
        )
        self.notify("READY=1")
        self._notify_status()
        async with trio.open_nursery() as calls:
            loop_scope = trio.CancelScope()
            calls.start_soon(self._loop, calls, loop_scope)
            await self._stop_requested.wait()
            await self._drain(calls, loop_scope)
        return await self._flush()

    async def _start_up(self, nursery: trio.Nursery) -> None:
        """Lock taken: spool replay, crash sweep, LISTEN, first refresh; each logged."""
        self.log.info("startup.lock", instance=self.instance)
        await self._replay_spool()
        lost = await self.store.sweep_lost()
        for item in lost:
            self.log.warning(
                "startup.lost_run", run=item.run_id, job_id=item.job_id, action=item.action
            )
        self.log.info("startup.sweep", lost=len(lost))
        if self._listener is None:
            # LISTEN before the first refresh, so no change can fall between the two.
            self._listener = Listener(
                dsn=self.dsn,
                log=self.log,
                on_notify=self._on_notification,
                on_lost=lambda: self.wake("listener.reconnected", urgent=True),
                on_state=self._on_listener_state,
            )
            await nursery.start(self._listener.run)
            # Executors that accept connections (workers) open only once we lead: a
            # standby must not take the leader's socket. Before the first refresh, so
            # workers that reconnect at once count when deadlines are first armed.
            for executor in self.executors.values():
                serve = getattr(executor, "serve", None)
                if serve is not None:
                    await nursery.start(serve)
        await self._refresh(first=True)

    async def _lead(self) -> bool:
        """Take the single-writer lock, waiting silently as a standby if another daemon
        holds it. Returns False if a stop was requested while standing by."""
        attempt = 0
        while True:
            try:
                self._lock_conn = await connect(self.dsn, application_name=APP_DAEMON, daemon=True)
                if await self.store.try_lead(self._lock_conn):
                    return True
                self.state = "standby"
                self.log.info("standby", instance=self.instance)
                self.notify("STATUS=standby: another coordinator holds the lock")
                with trio.CancelScope() as scope:
                    async with trio.open_nursery() as n:

                        async def stop_watch() -> None:
                            await self._stop_requested.wait()
                            scope.cancel()

                        n.start_soon(stop_watch)
                        await self.store.wait_lead(self._lock_conn)
                        n.cancel_scope.cancel()
                return not scope.cancelled_caught
            except (StoreUnavailable, CoordinatorError) as exc:
                await close_quietly(self._lock_conn, within=1.0)
                self._lock_conn = None
                attempt += 1
                delay = backoff(attempt, cap=self.settings.retry_cap)
                self.state = "degraded"
                self.log.warning("startup.database_unavailable", error=str(exc), retry_s=delay)
                with trio.move_on_after(delay):
                    await self._stop_requested.wait()
                if self._stop_requested.is_set():
                    return False

    async def _keep_lead(self) -> None:
        """Watch the lock session. When it ends, claims are fenced at once (the claim
        checks that the lock holder's pid still holds it); we take the lock again as soon
        as the database answers. If another daemon took it meanwhile, it leads: stop."""
        attempt = 0
        while True:
            conn = self._lock_conn
            lost = trio.Event()
            if conn is None or conn.is_closed():
                lost.set()
            else:
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
            await lost.wait()
            self.store.leader_pid = 0  # no backend has pid 0: every claim is refused
            self.log.warning("leadership.connection_lost", instance=self.instance)
            while True:
                attempt += 1
                await trio.sleep(backoff(attempt, cap=self.settings.retry_cap))
                new_conn: Connection | None = None
                try:
                    new_conn = await connect(self.dsn, application_name=APP_DAEMON, daemon=True)
                    led = await self.store.try_lead(new_conn)
                except (StoreUnavailable, CoordinatorError):
                    await close_quietly(new_conn, within=1.0)
                    continue
                if not led:
                    await close_quietly(new_conn, within=1.0)
                    self.log.error("leadership.lost", instance=self.instance)
                    self.lost_leadership = True
                    self.request_stop()
                    return
                old, self._lock_conn = self._lock_conn, new_conn
                await close_quietly(old, within=1.0)
                attempt = 0
                self.log.info("leadership.regained", instance=self.instance)
                self.wake("leadership.regained", urgent=True)
                break

    async def _replay_spool(self) -> None:
        spool = Spool(self.settings.spool_path)
        contents = spool.read()
        if not contents.records and not contents.corrupt:
            self.log.info("startup.spool", records=0)
            return
        started = trio.current_time()
        for line, reason in contents.corrupt:
            self.log.error("spool.corrupt", reason=reason, line=line[:200])
        aside = spool.set_aside(contents.corrupt)
        saved = already = 0
        for rec in contents.records:
            state = await self.store.settle_raw(
                run_id=rec.run_id,
                schedule_version=rec.schedule_version,
                outcome=rec.outcome,
                next_run_at=rec.next_run_at,
            )
            if state.outcome == "saved":
                saved += 1
            else:
                already += 1
        spool.clear()
        self.log.info(
            "spool.replayed",
            saved=saved,
            skipped=already,
            corrupt=len(contents.corrupt),
            set_aside=str(aside) if aside else None,
            elapsed_ms=round((trio.current_time() - started) * 1000, 1),
        )

    # -- notifications ------------------------------------------------------------------

    def _on_listener_state(self, up: bool) -> None:
        if self.state in ("ready", "degraded"):
            self.state = "ready" if up else "degraded"
            self._notify_status()

    def _on_notification(self, payload: dict[str, Any]) -> None:
        if payload.get("dispatch") and isinstance(payload.get("run"), int):
            job_id = payload.get("job")
            if isinstance(job_id, int):
                self._offer_manual(
                    job_id=job_id,
                    run_id=payload["run"],
                    priority=str(payload.get("priority") or "background"),
                    worker_type=payload.get("worker"),
                )
                self.log.debug("wake", dispatch=payload["run"])
                self._kick.set()
                return
        self.log.info("wake", payload=payload)
        self.coalescer.wake(trio.current_time())
        self._kick.set()

    # -- the loop -----------------------------------------------------------------------

    async def _loop(self, calls: trio.Nursery, scope: trio.CancelScope) -> None:
        with scope:
            while True:
                self._kick = trio.Event()
                now_wall = self.clock.now()
                for at, job_id in self.deadlines.pop_due(now_wall.timestamp()):
                    self._deadline_due(job_id, at)
                if self.coalescer.take(trio.current_time()):
                    await self._refresh()
                    continue
                for ticket in self.admission.admit():
                    calls.start_soon(self._dispatch, ticket)
                await self._sleep_until_next()

    async def _sleep_until_next(self) -> None:
        candidates = [math.inf]
        earliest = self.deadlines.earliest()
        if earliest is not None:
            delay = earliest[0] - self.clock.now().timestamp()
            candidates.append(trio.current_time() + max(0.0, delay))
        due = self.coalescer.due_at()
        if due is not None:
            candidates.append(due)
        with trio.move_on_at(min(candidates)):
            await self._kick.wait()

    def _deadline_due(self, job_id: int, at: float) -> None:
        entry = self.jobs.get(job_id)
        if entry is None or entry.next_run_at is None:
            return
        if job_id in self.running:
            run_id, since = self.running[job_id]
            self.log.info(
                "job.tick_skipped",
                job=entry.key,
                run=run_id,
                running_s=round(trio.current_time() - since, 3),
                deadline=entry.next_run_at,
            )
            return
        if self._blocked(job_id):
            return
        self._ensure_pool(entry.worker_type)
        self.admission.offer(
            Ticket(
                job_id=job_id,
                priority=_priority(entry.priority),
                due=at,
                pool=entry.worker_type,
                run_id=None,
                scheduled_for=entry.next_run_at,
                payload=entry.schedule_version,
            )
        )

    def _offer_manual(
        self, *, job_id: int, run_id: int, priority: str, worker_type: str | None
    ) -> None:
        self._ensure_pool(worker_type)
        ticket = Ticket(
            job_id=job_id,
            priority=_priority(priority),
            due=self.clock.now().timestamp(),
            pool=worker_type,
            run_id=run_id,
        )
        if self.admission.is_running(job_id):
            # A dispatch of this job is under way (its claim may be refused because of
            # this very run): offer the run when that dispatch ends.
            self._after_dispatch[job_id] = ticket
            return
        if self.admission.is_waiting(job_id):
            # A scheduled ticket already waits for this job: the queued manual run takes
            # its place (the claim would refuse the deadline while the run is queued).
            self.admission.withdraw(job_id)
        self.admission.offer(ticket)

    def _blocked(self, job_id: int) -> bool:
        return any(r.job_id == job_id for r in self.retained.values())

    # -- refresh ------------------------------------------------------------------------

    async def _refresh(self, *, first: bool = False) -> None:
        started = trio.current_time()
        try:
            entries = await self.store.refresh()
        except StoreUnavailable as exc:
            if first:
                raise
            self.log.warning("refresh.failed", error=str(exc))
            # Ask again later; the coalescer keeps the spacing.
            self.coalescer.wake(trio.current_time())
            return
        self.coalescer.mark_refreshed(started)
        self.refreshes += 1
        now = self.clock.now()
        workers = set(self.worker_types())
        jobs: dict[int, JobEntry] = {}
        to_init: list[tuple[int, datetime, int]] = []
        to_invalidate: list[tuple[int, str, int]] = []
        self.deadlines.clear()
        for entry in entries:
            reason = schedule_mod.invalid_reason(entry.schedule)
            if reason is not None:
                to_invalidate.append((entry.id, reason, entry.schedule_version))
                continue
            jobs[entry.id] = entry
            if entry.run_status == "queued" and entry.id not in self.running:
                assert entry.run_id is not None
                self._offer_manual(
                    job_id=entry.id,
                    run_id=entry.run_id,
                    priority=entry.priority,
                    worker_type=entry.worker_type,
                )
            if entry.next_run_at is None and entry.schedule.kind in ("cron", "interval"):
                first_at = schedule_mod.initial_deadline(entry.schedule, now)
                if first_at is not None:
                    to_init.append((entry.id, first_at, entry.schedule_version))
            self._arm(entry, workers)
        self.jobs = jobs
        if to_invalidate:
            marked = await self._best_effort(self.store.mark_invalid(to_invalidate), "mark_invalid")
            for job_id, reason, _version in to_invalidate:
                if marked is not None and job_id in marked:
                    self.log.warning("job.invalid", job_id=job_id, reason=reason)
        if to_init:
            written = await self._best_effort(self.store.init_deadlines(to_init), "init_deadlines")
            for job_id, at in (written or {}).items():
                known = jobs.get(job_id)
                if known is not None:
                    jobs[job_id] = attrs.evolve(known, next_run_at=at)
                    self._arm(jobs[job_id], workers)
        self.log.info(
            "refresh",
            jobs=len(entries),
            armed=len(self.deadlines),
            initialised=len(to_init) or None,
            invalid=len(to_invalidate) or None,
            elapsed_ms=round((trio.current_time() - started) * 1000, 1),
        )
        self._notify_status()

    async def _best_effort(self, call: Any, what: str) -> Any:
        try:
            return await call
        except StoreUnavailable as exc:
            self.log.warning(f"{what}.failed", error=str(exc))
            self.coalescer.wake(trio.current_time())
            return None

    def _arm(self, entry: JobEntry, workers: set[str]) -> None:
        """Arm the job's saved deadline if it can run: no outstanding run (its settlement,
        or an operator's resolution, re-arms the job), no retained result, and, for a
        worker target, a connected worker serving it (otherwise it is inert: no timer)."""
        if (
            entry.next_run_at is None
            or entry.run_id is not None
            or entry.id in self.running
            or self._blocked(entry.id)
        ):
            self.deadlines.discard(entry.id)
            return
        if entry.worker_type is not None and entry.worker_type not in workers:
            self.deadlines.discard(entry.id)
            return
        self.deadlines.set(entry.id, entry.next_run_at.timestamp())

    def _apply_job_state(self, state: JobState, claim: Claim) -> None:
        """Re-arm a job from the state its settlement returned, without a refresh."""
        job_id = claim.job.id
        entry = self.jobs.get(job_id)
        if state.outcome == "gone" or state.job_id is None:
            # Removed while the call ran: the run went with the job (remove cascades).
            self.log.warning("settle.orphaned", job=claim.job.key, run=claim.run_id)
            self.jobs.pop(job_id, None)
            self.deadlines.discard(job_id)
            return
        if state.paused or state.invalid or state.next_run_at is None:
            self.deadlines.discard(job_id)
            if entry is not None:
                self.jobs[job_id] = attrs.evolve(
                    entry, next_run_at=None, run_id=None, run_status=None
                )
            return
        if entry is None:
            if claim.job.schedule.kind == "manual":
                return
            entry = JobEntry(
                id=job_id,
                key=claim.job.key,
                schedule=claim.job.schedule,
                priority=claim.job.priority,
                worker_type=claim.job.target.worker_type,
                next_run_at=state.next_run_at,
                schedule_version=state.schedule_version or claim.job.schedule_version,
            )
        entry = attrs.evolve(
            entry,
            next_run_at=state.next_run_at,
            schedule_version=state.schedule_version or entry.schedule_version,
            run_id=None,
            run_status=None,
        )
        # If the schedule was edited during the run, what is saved now is the editor's
        # deadline (or none yet): arm that; the editor's wake brings the new definition.
        self.jobs[job_id] = entry
        self._arm(entry, set(self.worker_types()))

    # -- dispatch -----------------------------------------------------------------------

    async def _dispatch(self, ticket: Ticket) -> None:
        job_id = ticket.job_id
        self._in_flight += 1
        try:
            if self._stopping:
                return
            try:
                result = await self.store.claim(
                    job_id=job_id,
                    run_id=ticket.run_id,
                    scheduled_for=_as_datetime(ticket.scheduled_for),
                    schedule_version=_as_int(ticket.payload),
                    workers=self.worker_types(),
                )
            except (StoreUnavailable, CoordinatorError) as exc:
                self.log.warning("claim.failed", job_id=job_id, error=str(exc))
                self._claim_failed(ticket)
                return
            if result.claim is None:
                self.log.info(
                    "claim.rejected", job_id=job_id, run=ticket.run_id, reason=result.reason
                )
                if result.reason == "fenced":
                    # The lock session is gone; _keep_lead takes the lock again or stops.
                    self._claim_failed(ticket)
                return
            claim = result.claim
            # A deadline still armed (a manual run took the slot) stays armed: when it
            # falls during this run it is logged as skipped, and the settlement moves it.
            self.running[job_id] = (claim.run_id, trio.current_time())
            self._notify_status()
            try:
                if result.target_error is not None:
                    now = self.clock.now()
                    outcome = Outcome(
                        status="failed",
                        started_at=now,
                        finished_at=now,
                        error_cause="handler",
                        error_message=f"bad target: {result.target_error}",
                    )
                else:
                    outcome = await self._call(claim)
            finally:
                self.running.pop(job_id, None)
            await self._settle(claim, outcome)
            # Logged once the result is saved (or retained, after settle.retained): when an
            # operator reads job.run, `runs show` already agrees with it.
            self._log_run(claim, outcome, ticket)
        finally:
            self.admission.release(job_id)
            follow = self._after_dispatch.pop(job_id, None)
            if follow is not None and follow.run_id != ticket.run_id and not self._stopping:
                self.admission.offer(follow)
            self._in_flight -= 1
            if self._in_flight == 0:
                self._calls_done.set()
            self._kick.set()

    def _claim_failed(self, ticket: Ticket) -> None:
        """The claim could not be sent. The deadline is still owed: re-arm it after a
        backoff (a timer only while the database is away); a manual run stays queued in
        the database and the next refresh finds it."""
        if ticket.run_id is not None:
            self.coalescer.wake(trio.current_time())
            return
        entry = self.jobs.get(ticket.job_id)
        if entry is not None and entry.next_run_at is not None:
            retry_at = self.clock.now().timestamp() + backoff(2, cap=self.settings.retry_cap)
            self.deadlines.set(entry.id, max(entry.next_run_at.timestamp(), retry_at))

    async def _call(self, claim: Claim) -> Outcome:
        executor = self.executors.get(claim.job.target.kind)
        if executor is None or not executor.available(claim.job.target):
            now = self.clock.now()
            return Outcome(
                status="failed",
                started_at=now,
                finished_at=now,
                error_cause="crashed",
                error_message=f"no executor available for {claim.job.target.describe()}",
            )
        return await executor.call(claim, abandon=self._abandon)

    def _log_run(self, claim: Claim, outcome: Outcome, ticket: Ticket) -> None:
        lateness = None
        if claim.scheduled_for is not None and claim.trigger == "schedule":
            lateness = round((outcome.started_at - claim.scheduled_for).total_seconds() * 1000, 1)
        self.log.event(
            "job.run",
            "info" if outcome.status == "succeeded" else "warning",
            job=claim.job.key,
            run=claim.run_id,
            trigger=claim.trigger,
            outcome=outcome.status,
            cause=outcome.error_cause,
            count=outcome.count,
            elapsed_ms=round(outcome.elapsed.total_seconds() * 1000, 1),
            lateness_ms=lateness,
            error=outcome.error_message,
        )

    # -- settlement ---------------------------------------------------------------------

    def _next_deadline(self, claim: Claim, outcome: Outcome) -> datetime | None:
        try:
            return schedule_mod.following_deadline(claim.job.schedule, outcome.finished_at)
        except (ValueError, CoordinatorError) as exc:
            self.log.warning("job.invalid", job=claim.job.key, reason=str(exc))
            return None

    async def _settle(self, claim: Claim, outcome: Outcome) -> None:
        retained = Retained(
            run_id=claim.run_id,
            job_id=claim.job.id,
            job_key=claim.job.key,
            schedule_version=claim.job.schedule_version,
            next_run_at=self._next_deadline(claim, outcome),
            outcome=outcome,
        )
        try:
            state = await self.store.settle_raw(
                run_id=retained.run_id,
                schedule_version=retained.schedule_version,
                outcome=outcome,
                next_run_at=retained.next_run_at,
            )
        except (StoreUnavailable, CoordinatorError) as exc:
            retained.attempts = 1
            self.retained[claim.run_id] = retained
            self.deadlines.discard(claim.job.id)
            self.log.warning("settle.retained", job=claim.job.key, run=claim.run_id, error=str(exc))
            self._notify_status()
            assert self._nursery is not None
            self._nursery.start_soon(self._retry_retained, retained, claim)
            return
        self._apply_job_state(state, claim)

    async def _retry_retained(self, retained: Retained, claim: Claim) -> None:
        """Re-send a retained result until it is saved. Never calls the executor."""
        while retained.run_id in self.retained:
            delay = backoff(retained.attempts, cap=self.settings.retry_cap)
            await trio.sleep(delay)
            if retained.run_id not in self.retained:
                return  # the stop sequence flushed it
            state = await self._try_save(retained)
            if state is not None:
                self._apply_job_state(state, claim)
                self._kick.set()
                return

    async def _try_save(self, retained: Retained) -> JobState | None:
        try:
            state = await self.store.settle_raw(
                run_id=retained.run_id,
                schedule_version=retained.schedule_version,
                outcome=retained.outcome,
                next_run_at=retained.next_run_at,
            )
        except (StoreUnavailable, CoordinatorError) as exc:
            retained.attempts += 1
            self.log.debug(
                "settle.retry_failed",
                run=retained.run_id,
                error=str(exc),
                attempts=retained.attempts,
            )
            return None
        self.retained.pop(retained.run_id, None)
        self.log.info(
            "settle.saved",
            job=retained.job_key,
            run=retained.run_id,
            attempts=retained.attempts + 1,
            outcome=state.outcome,
        )
        self._notify_status()
        return state

    # -- stop ---------------------------------------------------------------------------

    async def _watch_signals(self) -> None:
        try:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    self.log.info("signal", signal=signal.Signals(signum).name)
                    self.request_stop()
        except ValueError:
            # Not the main thread (e.g. an embedding test harness): stop via request_stop().
            await trio.sleep_forever()

    async def _drain(self, calls: trio.Nursery, loop_scope: trio.CancelScope) -> None:
        """Refuse new admissions and wait for admitted calls, bounded by stop_timeout;
        past it, abandon them (executors record ``cancelled``) and wait for that."""
        self._stopping = True
        self.state = "stopping"
        self.notify("STOPPING=1")
        self.admission.close()
        self.coalescer.hold()
        loop_scope.cancel()
        for executor in self.executors.values():
            detach = getattr(executor, "detach", None)
            if detach is not None:
                await detach()  # no new workers, nothing new sent; calls in flight go on
        self.log.info("stopping", running=len(self.running), retained=len(self.retained))
        with trio.move_on_after(self.settings.stop_timeout) as waited:
            while self._in_flight:
                self._calls_done = trio.Event()
                self.notify(f"EXTEND_TIMEOUT_USEC={int((self.settings.stop_timeout + 30) * 1e6)}")
                await self._calls_done.wait()
        if waited.cancelled_caught:
            self.log.warning("stop.abandon", running=len(self.running))
            self._abandon.set()
            with trio.move_on_after(30):
                while self._in_flight:
                    self._calls_done = trio.Event()
                    await self._calls_done.wait()
        calls.cancel_scope.cancel()

    async def _flush(self) -> int:
        """Save retained results without calling anything again; spool what the database
        still refuses. Returns the exit status."""
        # Each retained result gets a final try (its retry task may be sleeping).
        for retained in list(self.retained.values()):
            await self._try_save(retained)
        if self.retained:
            await trio.sleep(0.5)
            for retained in list(self.retained.values()):
                await self._try_save(retained)
        if not self.retained:
            self.log.info("stopped", instance=self.instance)
            return 1 if self.lost_leadership else 0
        spool = Spool(self.settings.spool_path)
        for retained in list(self.retained.values()):
            spool.append(retained.spooled())
            self.log.error(
                "settle.spooled", job=retained.job_key, run=retained.run_id, spool=str(spool.path)
            )
        self.log.error(
            "stopped", instance=self.instance, spooled=len(self.retained), exit_code=EXIT_SPOOLED
        )
        return EXIT_SPOOLED

    # -- status -------------------------------------------------------------------------

    def _next_deadline_iso(self) -> str | None:
        earliest = self.deadlines.earliest()
        if earliest is None:
            return None
        return datetime.fromtimestamp(earliest[0], UTC).isoformat(timespec="seconds")

    def status_line(self) -> str:
        return (
            f"{self.state}: {len(self.deadlines)} armed, next "
            f"{self._next_deadline_iso() or 'none'}, {len(self.running)} running, "
            f"{len(self.retained)} retained"
        )

    def _notify_status(self) -> None:
        self.notify(f"STATUS={self.status_line()}")


def _priority(value: str) -> Any:
    return "interactive" if value == "interactive" else "background"


def _as_datetime(value: object) -> datetime | None:
    return value if isinstance(value, datetime) else None


def _as_int(value: object) -> int | None:
    return value if isinstance(value, int) else None


__all__ = ["EXIT_SPOOLED", "Daemon", "DaemonSettings", "default_instance"]
