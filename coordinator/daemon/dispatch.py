"""Dispatch: the one path from "a run is owed" to "its result is saved".

Work reaches admission two ways: a deadline that fell due (:meth:`Dispatcher.deadline_due`)
and a manual run (:meth:`Dispatcher.offer_manual`, from a dispatch wake or a refresh
that found a queued run). Each admitted ticket becomes one :meth:`Dispatcher.dispatch`
task: claim (one statement, under the job's row lock, fenced on leadership), call the
executor outside any transaction, hand the result to the settlement (one statement, with
the next batch) and end; the task that sends that batch ends the dispatch when it lands
(:meth:`Dispatcher._settled`), so no task waits a scheduler round for it. Every claim
failure goes through the error policy; a dispatch that ends without a settlement re-arms
what it may have displaced, so no path drops an armed deadline without arming its
successor or saying why.

A call in progress can be asked to stop early (:meth:`Dispatcher.request_stop`): an
operator paused its run, or the daemon is stopping and the call is recoverable (it then
ends ``paused`` at its cursor instead of running on or being abandoned).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Final

import attrs
import trio

from .. import redact
from .. import schedule as schedules
from ..clock import WallClock
from ..core.admission import Admission, Coverage, Ticket
from ..errors import CoordinatorError
from ..events import (
    ClaimGranted,
    ClaimRejected,
    EventBus,
    MisfireSkipped,
    RunFinished,
    RunGivenBack,
    RunStarted,
    RunStopRequested,
    TickSkipped,
    milliseconds,
)
from ..executors import Executor
from ..executors.outcomes import CANCELLED_MESSAGE, not_sent
from ..model import MIN_MISFIRE_GRACE, Claim, Outcome
from ..rows import json_text
from ..spool import HeldResult
from ..store import Store
from .inventory import Inventory, next_deadline
from .policy import ErrorPolicy
from .settlement import Settlement, said_late

if TYPE_CHECKING:
    from datetime import datetime

    from ..core.admission import Priority
    from ..store import ClaimResult, JobState

#: Claim refusals after which a manual ticket may have displaced a scheduled one: the
#: job's saved deadline is armed again from memory.
_REARM_AFTER: Final = frozenset({"gone", "not_queued"})


@attrs.define(eq=False)
class Turns:
    """A turnstile per claim batch: the calls a batch granted start in the batch's
    order (admission's), one after the other, each as soon as the ones before it have
    started or were refused. Batches do not wait for each other.

    A call whose first step is synchronous (a worker's call: queue its line) does not
    wait for its turn: the step is kept and taken, in order, by whichever task passes
    the turn on to it (:meth:`_Turn.take`). Waiting tasks were the old way for every
    call, and trio runs woken tasks in reverse order half the time, at random: a batch
    of 60 claims then took up to 60 scheduler rounds to start its calls. A call that
    must wait (a process to spawn: :meth:`_Turn.reached`) still waits, and a pass wakes
    every waiting task of the batch to check again.
    """

    #: batch -> its state (see :class:`_Batch`).
    _batches: dict[int, _Batch] = attrs.field(factory=dict)

    def _batch(self, place: tuple[int, int, int]) -> _Batch:
        batch, _rank, size = place
        state = self._batches.get(batch)
        if state is None:
            state = self._batches[batch] = _Batch(size=size)
        return state

    async def wait_for(self, place: tuple[int, int, int]) -> None:
        """Until every call before ``place`` in its batch has started."""
        while True:
            state = self._batch(place)  # (never done with: this call has not started)
            if place[1] <= state.next:
                return
            await state.changed.wait()

    def take(self, place: tuple[int, int, int], step: Callable[[], None]) -> None:
        """Take ``step`` (synchronous; must not raise) in ``place``'s turn and pass the
        turn: now, or later from the task that passes the turn on to it."""
        state = self._batch(place)
        rank = place[1]
        if rank != state.next:
            state.kept[rank] = step
            return
        step()
        self.passed(place)

    def passed(self, place: tuple[int, int, int]) -> None:
        """``place``'s call started (or never will): the next ones may go."""
        state = self._batch(place)
        state.early.add(place[1])
        moved = False
        while True:
            if state.next in state.early:
                state.early.discard(state.next)
            elif state.next in state.kept:
                state.kept.pop(state.next)()
            else:
                break
            state.next += 1
            moved = True
        if state.next >= state.size:
            del self._batches[place[0]]
        if moved:
            state.changed.set()
            state.changed = trio.Event()


@attrs.define(eq=False)
class _Batch:
    """One claim batch in the turnstile."""

    #: Items in the batch.
    size: int
    #: The next rank allowed to start.
    next: int = 0
    #: Ranks that passed before their turn (refused, or nothing to start).
    early: set[int] = attrs.field(factory=set)
    #: Ranks whose first step waits for their turn, and the step.
    kept: dict[int, Callable[[], None]] = attrs.field(factory=dict)
    #: Set (and replaced) whenever ``next`` moves: waiting tasks check again.
    changed: trio.Event = attrs.field(factory=trio.Event)


@attrs.define(eq=False)
class _Turn:
    """One dispatch's place in its batch's turnstile, passed exactly once (the
    :class:`~coordinator.executors.base.Turn` an executor is given). The call's
    ``run.started`` event is told in turn too, so that the events show the order."""

    turns: Turns
    place: tuple[int, int, int] | None = None
    done: bool = False
    #: Called once, in turn, as the call starts (before its first step that starts it:
    #: a call that waits for a worker's slot is told when its line goes).
    on_start: Callable[[], None] = attrs.field(default=lambda: None)
    told: bool = False

    def take(self, first_step: Callable[[], None], *, starts: bool = True) -> None:
        if self.done:
            if starts:
                self._tell()
            first_step()
            return
        self.done = True

        def step() -> None:
            # (Read when taken: a call that ended before its turn came is not told as
            # started; see Dispatcher._run.)
            if starts:
                self._tell()
            first_step()

        if self.place is None:
            step()
        else:
            self.turns.take(self.place, step)

    async def reached(self) -> None:
        # The turn is this call's now, and stays so until its step that starts it (or
        # pass_, if it stops first): the calls after it are not told started before it.
        if not self.done and self.place is not None:
            await self.turns.wait_for(self.place)

    def _tell(self) -> None:
        if not self.told:
            self.told = True
            self.on_start()

    def alone(self) -> bool:
        return self.place is None or self.place[2] == 1

    def pass_(self) -> None:
        """Give the turn up without starting (an error before the call)."""
        if self.place is not None and not self.done:
            self.done = True
            self.turns.passed(self.place)


def _no_step() -> None:
    """A turn taken with nothing to do in it."""


@attrs.frozen(kw_only=True)
class Running:
    """A call in progress."""

    run_id: int
    job_key: str
    #: Trio time the call started.
    since: float
    #: The target kind (which executor has the call).
    kind: str = "exec"
    #: The job is recoverable (stopping it pauses it).
    recoverable: bool = False


@attrs.define(eq=False)
class Dispatcher:
    """Offers owed work to admission and carries each admitted ticket to its settlement."""

    store: Store
    clock: WallClock
    events: EventBus
    policy: ErrorPolicy
    admission: Admission
    inventory: Inventory
    settlement: Settlement
    executors: Mapping[str, Executor]
    #: Set to stop calls in flight (stop timeout, or a second Ctrl-C).
    abandon: trio.Event
    #: Take a loop turn (a slot freed, a result saved).
    kick: Callable[[], None]
    #: Ask for a coalesced refresh.
    wake: Callable[[], None]
    #: Status changed (running calls).
    on_change: Callable[[], None] = lambda: None
    #: Jitter of retry delays: a number from 0 to 1 per settled call (injected so that
    #: tests are deterministic; see ``coordinator._settle``).
    jitter: Callable[[], float] = random.random
    #: Other dispatches admitted with this one have yet to send their claims: a claim
    #: lets them join its batch (one scheduler round); alone on an idle daemon, it goes
    #: at once.
    others_starting: Callable[[], bool] = lambda: True
    #: A claim came back fenced: the database answers, but this daemon does not hold the
    #: lock (``Leadership.nudge``).
    fenced: Callable[[], None] = lambda: None
    #: Runs of idempotent jobs whose calls this stop abandoned: queued again once their
    #: ``cancelled`` is saved (``Store.requeue_abandoned``).
    abandoned: list[int] = attrs.field(factory=list)
    #: job id -> the call in progress.
    running: dict[int, Running] = attrs.field(factory=dict)
    #: Admitted tickets whose dispatch has not ended (claimed, called, and its result
    #: saved or held: :meth:`_done`).
    in_flight: int = 0
    #: Set whenever ``in_flight`` drops to zero.
    idle: trio.Event = attrs.field(factory=trio.Event)
    stopping: bool = False
    #: Manual runs that arrived while their job was being dispatched, by job id.
    _after: dict[int, Ticket] = attrs.field(factory=dict)
    #: Worker types admission knows the capacity of.
    _pools: set[str] = attrs.field(factory=set)
    #: Pools and capacities as the executors last reported them (pools_changed).
    _capacities: dict[str, int] = attrs.field(factory=dict)
    _served: frozenset[str] = frozenset()
    _workers: tuple[str, ...] = ()
    #: Calls granted together start in admission order.
    _turns: Turns = attrs.field(factory=lambda: Turns())
    #: Consecutive claim failures (paces re-arming while the database refuses claims).
    _claim_failures: int = 0
    #: run id -> claim and outcome, for results held by the settlement (re-armed and
    #: told once saved).
    _held: dict[int, tuple[Claim, Outcome]] = attrs.field(factory=dict)
    #: Runs of calls in progress that were asked to stop (asked once each).
    _stop_asked: set[int] = attrs.field(factory=set)

    # -- pools --------------------------------------------------------------------------

    def capacities(self) -> dict[str, int]:
        """Every executor's pools and their capacities, as last reported."""
        return self._capacities

    def served(self) -> frozenset[str]:
        """Pools (worker types) some executor serves now."""
        return self._served

    def pools_changed(self) -> None:
        """An executor's pools changed: admission learns the new capacities, and which
        namespaces each pool's workers may run (no SQL)."""
        merged: dict[str, int] = {}
        for executor in self.executors.values():
            for pool, capacity in executor.capacities().items():
                merged[pool] = merged.get(pool, 0) + capacity
        self._capacities, self._served = merged, frozenset(merged)
        self._workers = tuple(sorted(merged))
        capacities = merged
        self._pools |= set(capacities)
        coverage = self._coverage()
        for pool in self._pools:
            self.admission.set_capacity(pool, capacities.get(pool, 0))
            self.admission.set_coverage(pool, coverage.get(pool))

    def _coverage(self) -> dict[str, Coverage]:
        """The executors' coverages of each pool, added up (an executor that does not
        list a pool lends it all its capacity, every namespace)."""
        covers = [(executor, executor.coverage()) for executor in self.executors.values()]
        merged: dict[str, Coverage] = {}
        for pool in {pool for _executor, cover in covers for pool in cover}:
            everywhere = 0
            scoped: dict[str, int] = {}
            for executor, cover in covers:
                part = cover.get(pool)
                if part is None:
                    everywhere += executor.capacities().get(pool, 0)
                    continue
                everywhere += part.everywhere
                for namespace, slots in part.scoped.items():
                    scoped[namespace] = scoped.get(namespace, 0) + slots
            merged[pool] = Coverage(everywhere, scoped)
        return merged

    # -- stopping calls early -----------------------------------------------------------

    def calling(self, run_id: int) -> bool:
        """A call of ``run_id`` is in progress here."""
        return any(running.run_id == run_id for running in self.running.values())

    def request_stop(self, run_id: int, reason: str) -> bool:
        """Ask the call of ``run_id`` to stop (``pause``: an operator paused the run;
        ``stopping``: the daemon is stopping). ``False`` when no call of that run is in
        progress here; no SQL either way."""
        for running in self.running.values():
            if running.run_id == run_id:
                if run_id in self._stop_asked:
                    return True
                executor = self.executors.get(running.kind)
                if executor is None or not executor.cancel(run_id, reason):
                    return False
                self._stop_asked.add(run_id)
                self.events.emit(RunStopRequested(job=running.job_key, run=run_id, reason=reason))
                return True
        return False

    def stop_recoverable(self) -> int:
        """At stop: ask every recoverable call in progress to pause (``stopping``) rather
        than run on until the stop timeout; how many were asked."""
        asked = 0
        for running in list(self.running.values()):
            if running.recoverable and self.request_stop(running.run_id, "stopping"):
                asked += 1
        return asked

    def unstopped_runs(self) -> list[int]:
        """The runs of the calls in progress here not yet asked to stop."""
        return [r.run_id for r in self.running.values() if r.run_id not in self._stop_asked]

    def stop_runs(self, run_ids: Iterable[int]) -> int:
        """Ask the calls of ``run_ids`` to stop (``stopping``); how many were asked. A
        stepped-down leader stops so the calls whose runs the new leader ended otherwise
        (a retry queued, a pause), rather than run them beside it until the stop
        timeout."""
        return sum(1 for run_id in run_ids if self.request_stop(run_id, "stopping"))

    def _ensure_pool(self, pool: str | None) -> None:
        """Admission learns a worker type's capacity before its first ticket: 0 (wait,
        no claim, no SQL) until a worker serving it connects."""
        if pool is not None and pool not in self._pools:
            self._pools.add(pool)
            self.admission.set_capacity(pool, self.capacities().get(pool, 0))

    # -- offering -----------------------------------------------------------------------

    def busy(self, job_id: int) -> bool:
        """A call of the job is running or its result is held: do not arm it."""
        return job_id in self.running or self.settlement.holds_job(job_id)

    def deadline_due(self, job_id: int, at: float) -> None:
        """The loop found the job's armed time passed (its saved deadline, or its waiting
        retry's due time): offer it to admission.

        A deadline that falls while a call of the job runs (a manual run took the slot)
        is skipped, not queued: the settlement counts the ticks the call made the job
        skip and tells them (``job.tick_skipped``), and saves the next deadline.
        """
        entry = self.inventory.jobs.get(job_id)
        if entry is None or entry.armed_at() is None:
            return
        if job_id in self.running or self.settlement.holds_job(job_id):
            return
        self._ensure_pool(entry.worker_type)
        if entry.retry_waiting:
            # A retry: its queued run is claimed like a manual one, at its saved due time.
            ticket = Ticket(
                job_id=job_id,
                priority=_priority(entry.priority),
                due=at,
                pool=entry.worker_type,
                namespace=entry.namespace,
                run_id=entry.run_id,
                scheduled_for=entry.run_due_at,
            )
        else:
            ticket = Ticket(
                job_id=job_id,
                priority=_priority(entry.priority),
                due=at,
                pool=entry.worker_type,
                namespace=entry.namespace,
                scheduled_for=entry.next_run_at,
                schedule_version=entry.schedule_version,
            )
        self.admission.offer(ticket)

    def offer_manual(
        self,
        *,
        job_id: int,
        run_id: int,
        priority: str,
        worker_type: str | None,
        namespace: str | None = None,
        due: float | None = None,
    ) -> None:
        """A queued manual run: straight to admission (no refresh needed). ``due`` (epoch
        seconds; default now) orders it among its priority: when it was triggered.
        ``namespace``: the job's, when known (admission keeps a namespace no connected
        worker may run waiting; unknown, the run is claimed, and given back if so)."""
        self._ensure_pool(worker_type)
        ticket = Ticket(
            job_id=job_id,
            priority=_priority(priority),
            due=self.clock.now().timestamp() if due is None else due,
            pool=worker_type,
            namespace=namespace,
            run_id=run_id,
        )
        if self.admission.is_running(job_id):
            # A dispatch of this job is under way (its claim may be refused because of
            # this very run): offer the run when that dispatch ends.
            self._after[job_id] = ticket
            return
        if self.admission.is_waiting(job_id):
            # A scheduled ticket already waits for this job: the queued manual run takes
            # its place (the claim would refuse the deadline while the run is queued). If
            # the manual claim is refused, the deadline is armed again (_REARM_AFTER).
            self.admission.withdraw(job_id)
        self.admission.offer(ticket)

    # -- one dispatch -------------------------------------------------------------------

    async def dispatch(self, ticket: Ticket, seq: int) -> None:
        """Claim, call, settle one admitted ticket (a task in the calls nursery). ``seq``
        is its place in admission's order: claims sent together go in that order, and
        those granted together start their calls in that order, whatever order trio
        wakes their tasks in."""
        self.in_flight += 1
        turn = _Turn(self._turns)
        settling = False
        try:
            if self.stopping:
                return
            result = await self._claim(ticket, seq)
            if result is None:
                return
            claim, place, refused = result
            if refused is None:
                turn.place = place  # (a refused one passed its place already)
                outcome = await self._run(claim, turn)
            else:
                outcome = refused
            # The task ends here: the settlement's batch finishes the dispatch
            # (:meth:`_settled`), without a task step of this one's.
            settling = True
            self._settle(ticket, claim, outcome)
        finally:
            turn.pass_()  # if it has not (an error before the call started)
            if not settling:
                self._done(ticket)

    def _done(self, ticket: Ticket) -> None:
        """The dispatch is over (settled, held, or never claimed): the job may be
        admitted again, and the loop takes a turn."""
        job_id = ticket.job_id
        self.admission.release(job_id)
        follow = self._after.pop(job_id, None)
        if follow is not None and follow.run_id != ticket.run_id and not self.stopping:
            self.admission.offer(follow)
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()
            self.idle = trio.Event()
        self.kick()

    async def _claim(
        self, ticket: Ticket, seq: int
    ) -> tuple[Claim, tuple[int, int, int], Outcome | None] | None:
        """The claim, its place in its batch, and the outcome to settle at once when it
        must not be called; ``None`` when it was refused or failed (handled here)."""
        now = self.clock.now()
        try:
            result = await self.store.claim(
                ticket,
                workers=self._workers,
                order=seq,
                now=now,
                skip_next=self._skip_next(ticket, now),
                # Alone on an idle daemon: nothing else in flight or about to claim.
                # Under load a claim still waits a round for company (bigger batches).
                alone=self.in_flight == 1 and not self.others_starting(),
            )
        except Exception as exc:
            self._claim_failures += 1
            delay = self.policy.failed(
                "claim", exc, self._claim_failures, job_id=ticket.job_id, run=ticket.run_id
            )
            self._claim_failed(ticket, delay)
            return None
        if self._claim_failures:
            self._claim_failures = 0
            self.policy.recovered("claim")
        if result.claim is not None:
            # (Counted as a claim now, not when its run ends: coordinator_claims_total.)
            self.events.emit(
                ClaimGranted(
                    job_id=ticket.job_id, run=result.claim.run_id, trigger=result.claim.trigger
                )
            )
            if result.target_error is not None:
                self._turns.passed(result.place)  # granted, but nothing to start: next one
        if result.claim is None:
            reason = result.reason or "unknown"
            if reason == "misfire":
                self._misfired(ticket, result, now)
                return None
            self.events.emit(ClaimRejected(job_id=ticket.job_id, run=ticket.run_id, reason=reason))
            if reason == "fenced":
                # The lock session is gone; leadership takes it again or steps down. The
                # claim reached the database: leadership need not wait out its backoff.
                self.fenced()
                self._claim_failed(ticket, self.policy.retry_cap)
            elif ticket.run_id is not None and reason in _REARM_AFTER:
                self.inventory.run_gone(ticket.job_id, ticket.run_id)
            elif reason == "not_due":
                # An application moved the retry's due time: a refresh arms the saved one.
                self.inventory.request((ticket.job_id,))
                self.wake()
            return None
        if result.target_error is not None:
            # Granted, but the stored target cannot be called: fail without calling.
            now = self.clock.now()
            outcome = Outcome(
                status="failed",
                started_at=now,
                finished_at=now,
                error_cause="handler",
                error_message=f"bad target: {result.target_error}",
            )
            return result.claim, result.place, outcome
        return result.claim, result.place, None

    def _skip_next(self, ticket: Ticket, now: datetime) -> datetime | None:
        """For a scheduled claim: the deadline to save instead, should the claim find that
        the job's misfire policy skips this one (computed from now). Not computed for a
        claim less late than the shortest grace: no policy can skip it."""
        entry = self.inventory.jobs.get(ticket.job_id)
        if (
            ticket.run_id is not None
            or ticket.scheduled_for is None
            or now - ticket.scheduled_for <= MIN_MISFIRE_GRACE
            or entry is None
        ):
            return None
        next_at, _problem = next_deadline(schedules.following_deadline, entry.schedule, now)
        return next_at

    def _misfired(self, ticket: Ticket, result: ClaimResult, now: datetime) -> None:
        """The claim skipped an overdue deadline (``--misfire skip``) and saved the next
        one: say so and arm it."""
        skipped = result.skipped or ticket.scheduled_for
        if skipped is not None:  # (always, for the scheduled claims that can misfire)
            self.events.emit(
                MisfireSkipped(
                    job=self.inventory.key(ticket.job_id),
                    job_id=ticket.job_id,
                    deadline=skipped,
                    late_s=round((now - skipped).total_seconds(), 3),
                    next=result.next_run_at,
                )
            )
        self.inventory.deadline_moved(ticket.job_id, result.next_run_at)

    def _claim_failed(self, ticket: Ticket, delay: float) -> None:
        """The claim could not be made. The deadline is still owed: re-arm it after the
        policy's pause (a timer only while the database refuses); a manual run stays
        queued in the database and the next refresh offers it again."""
        if ticket.run_id is not None:
            self.inventory.request((ticket.job_id,))
            self.wake()
            return
        entry = self.inventory.jobs.get(ticket.job_id)
        if entry is not None and entry.next_run_at is not None:
            retry_at = self.clock.now().timestamp() + max(delay, 0.5)
            self.inventory.deadlines.set(entry.id, max(entry.next_run_at.timestamp(), retry_at))

    async def _run(self, claim: Claim, turn: _Turn) -> Outcome:
        """Call the claimed run (it is ``running`` meanwhile); how it ended."""
        job = claim.job
        # A deadline still armed (a manual run took the slot) stays armed: when it falls
        # during this run it is logged as skipped, and the settlement moves it.
        self.running[job.id] = Running(
            run_id=claim.run_id,
            job_key=job.key,
            since=trio.current_time(),
            kind=job.target.kind,
            recoverable=job.recoverable,
        )
        self.on_change()
        started = RunStarted(
            job=job.key,
            job_id=job.id,
            run=claim.run_id,
            trigger=claim.trigger,
            attempt=claim.attempt,
        )
        turn.on_start = lambda: self.events.emit(started)
        try:
            return await self._call(claim, turn)
        finally:
            # A step still kept for its turn (a line never sent) no longer tells a start.
            turn.on_start = _no_step
            self.running.pop(job.id, None)
            self._stop_asked.discard(claim.run_id)
            # The call is over: its slot may start other work while the result is saved
            # (the job itself stays busy until the dispatch ends). A turn of the loop
            # only if work waits for a slot: nothing else changed (the dispatch's end
            # kicks it anyway, once the result is saved).
            self.admission.free_slot(job.id)
            if self.admission.waiting_count:
                self.kick()
            self.on_change()

    async def _call(self, claim: Claim, turn: _Turn) -> Outcome:
        executor = self.executors.get(claim.job.target.kind)
        now = self.clock.now()
        if executor is None or not executor.available(claim.job.target):
            # Nothing to start: the next call of the batch may go.
            turn.take(_no_step, starts=False)
            # Its last worker left after the claim: nothing ran, so the run is given back
            # (claimed again once a worker serves it: admission waits for one). With no
            # executor for its kind at all it would only be claimed again at once: failed.
            problem = f"no executor available for {claim.job.target.describe()}"
            return not_sent(
                self.clock, claim, f"not sent: {problem}", give_back=executor is not None
            )
        try:
            # The executor takes its first step in the batch's order (``turn``), and
            # passes the turn on whatever it does.
            return await executor.call(claim, abandon=self.abandon, turn=turn)
        except Exception as exc:  # an executor's bug: the run fails, the daemon goes on
            self.events.log.error("executor.failed", run=claim.run_id, error=repr(exc))
            return Outcome(
                status="failed",
                started_at=now,
                finished_at=self.clock.now(),
                error_cause="crashed",
                error_message=f"internal error in the {claim.job.target.kind} executor: {exc!r}",
            )

    def _settle(self, ticket: Ticket, claim: Claim, outcome: Outcome) -> None:
        """Hand the result to the settlement; :meth:`_settled` ends the dispatch once its
        batch lands. The dispatch is ended exactly once whatever happens here."""
        job = claim.job
        try:
            # Redacted here, once: the held result, the spool, the database and the
            # run's event only ever see this (docs/design.md, "Redaction").
            outcome = redact.default().outcome(outcome)
            next_at, problem = next_deadline(
                schedules.following_deadline, job.schedule, outcome.finished_at
            )
            if problem is not None:
                self.events.log.warning("job.invalid", job=job.key, reason=problem)
            held = HeldResult(
                run_id=claim.run_id,
                job_id=job.id,
                job_key=job.key,
                schedule_version=job.schedule_version,
                next_run_at=next_at,
                outcome=outcome,
                retry_jitter=self.jitter(),
                claimed_at=claim.claimed_at,
            )
        except BaseException:
            self._done(ticket)
            raise
        redacted = outcome
        if (
            self.stopping
            and outcome.status == "cancelled"
            and outcome.error_message == CANCELLED_MESSAGE
            and job.idempotent
            and not job.recoverable
            and claim.trigger != "retry"
        ):
            # (As the crash sweep would have had it run again after a kill -9.)
            self.abandoned.append(claim.run_id)
        self.settlement.settle(held, lambda state: self._settled(ticket, claim, redacted, state))

    def _settled(
        self, ticket: Ticket, claim: Claim, outcome: Outcome, state: JobState | None
    ) -> None:
        """The result is saved (``state``) or held (``None``): re-arm the job, tell the
        run's end, and end the dispatch (called by the task that sent the batch)."""
        try:
            self._tell_settled(claim, outcome, state)
        finally:
            self._done(ticket)
        self._offer_given_back(claim, outcome, state, ticket.due)

    def _offer_given_back(
        self, claim: Claim, outcome: Outcome, state: JobState | None, due: float | None
    ) -> None:
        """A manual run given back (never sent) is offered again, in its place (``due``):
        it waits in admission for a worker's slot, as a queued run a refresh finds. (A
        retry's due time is armed by the inventory; a run of the schedule left its
        deadline, armed likewise.)"""
        if (
            outcome.status == "queued"
            and state is not None
            and state.retry_run_id == claim.run_id
            and state.retry_due_at is None
            and not (state.paused or state.invalid)  # (un-pausing dispatches it: 0022)
            and not self.stopping
        ):
            self.offer_manual(
                job_id=claim.job.id,
                run_id=claim.run_id,
                priority=claim.job.priority,
                worker_type=claim.job.target.worker_type,
                namespace=claim.job.namespace,
                due=due,
            )

    def _tell_settled(self, claim: Claim, outcome: Outcome, state: JobState | None) -> None:
        job = claim.job
        if state is not None:
            self.inventory.settled(state, job, claim.run_id)
        else:
            self._held[claim.run_id] = (claim, outcome)
            self.inventory.deadlines.discard(job.id)
        if outcome.status == "queued":
            # Given back, never sent: not a run's end (no job.run, no alert, no metric of
            # runs); its line says why and what became of it.
            self.events.emit(
                RunGivenBack(
                    job=job.key,
                    job_id=job.id,
                    run=claim.run_id,
                    trigger=claim.trigger,
                    reason=outcome.error_message,
                    became=_became(claim, state),
                )
            )
            return
        if state is not None and said_late(self.events, job.key, claim.run_id, outcome, state):
            return  # superseded: not this run's end
        # Logged once the result is saved (or held, after settle.retained): when an
        # operator reads job.run, `runs show` already agrees with it.
        self.events.emit(_finished(claim, outcome, state))
        if state is not None:
            self._tell_skipped(claim, outcome, state)

    def saved_later(self, held: HeldResult, state: JobState) -> None:
        """A held result was saved after all: re-arm its job (the settlement calls this)."""
        found = self._held.pop(held.run_id, None)
        if found is not None:
            claim, outcome = found  # (a late or superseded one was said when saved)
            self.inventory.settled(state, claim.job, held.run_id)
            self._tell_skipped(claim, outcome, state)
            self._offer_given_back(claim, outcome, state, None)
        self.kick()

    def _tell_skipped(self, claim: Claim, outcome: Outcome, state: JobState) -> None:
        """Ticks of the job's schedule that fell while this run went on were skipped, not
        queued (its settlement saved one next deadline, after its end): say how many."""
        if outcome.status == "queued":
            return  # given back, never sent
        if state.outcome not in ("saved", "late") or state.retry_run_id is not None:
            return  # a retry waits: the attempt that ends the chain tells the whole span
        if state.schedule_version != claim.job.schedule_version:
            return  # the schedule was edited meanwhile: its ticks are not this run's
        job = claim.job
        finished = outcome.finished_at
        if claim.trigger == "retry" and claim.scheduled_for is not None:
            since = claim.scheduled_for  # the chain of attempts serving that deadline
        elif claim.trigger == "schedule":
            # (Ticks before the start fell while nothing ran: the overdue deadline ran
            # once for them all, promise 2; they are not this run's overrun.)
            since = outcome.started_at
        elif job.next_run_at is not None and outcome.started_at < job.next_run_at <= finished:
            since = outcome.started_at  # a manual run outlasted the saved deadline
        else:
            return
        try:
            missed, first, last = schedules.firings_between(job.schedule, since, finished)
        except (ValueError, OverflowError, CoordinatorError):
            return
        if job.schedule.kind != "cron" and job.next_run_at is not None and since < job.next_run_at:
            missed, first, last = 1, job.next_run_at, job.next_run_at  # interval, once
        if missed == 0 or first is None or last is None:
            return
        self.events.emit(
            TickSkipped(
                job=job.key,
                job_id=job.id,
                run=claim.run_id,
                missed=missed,
                first=first,
                last=last,
                running_s=round((finished - since).total_seconds(), 3),
            )
        )


def _became(claim: Claim, state: JobState | None) -> str | None:
    """What a give-back made of the run (``RunGivenBack.became``)."""
    if state is None:
        return None  # held: saved later, or spooled
    if state.retry_run_id == claim.run_id:
        return "queued"  # (or was, by a first try whose answer was lost)
    if state.outcome == "paused":
        return "paused"  # an operator's pause asked meanwhile (migrations/0025)
    if state.outcome == "saved":
        # (Only a cancelled run has a category: its job was removed, history kept.)
        return "cancelled" if state.category is not None else "removed"
    return "gone" if state.outcome == "gone" else "already"


def _finished(claim: Claim, outcome: Outcome, state: JobState | None) -> RunFinished:
    lateness = None
    if claim.scheduled_for is not None and claim.trigger == "schedule":
        lateness = milliseconds((outcome.started_at - claim.scheduled_for).total_seconds())
    recoverable = claim.job.recoverable
    cursor_bytes = None
    if outcome.status == "paused":
        cursor = outcome.cursor or claim.cursor
        cursor_bytes = 0 if cursor is None else len(json_text(cursor.value).encode())
    return RunFinished(
        attempt=claim.attempt,
        category=state.category if state is not None else outcome.category,
        retry=state.retry_run_id if state is not None else None,
        retry_at=state.retry_due_at if state is not None else None,
        exhausted=(state.exhausted or None) if state is not None else None,
        job=claim.job.key,
        job_id=claim.job.id,
        run=claim.run_id,
        trigger=claim.trigger,
        outcome=outcome.status,
        cause=outcome.error_cause,
        count=outcome.count,
        elapsed_ms=milliseconds(outcome.elapsed.total_seconds()),
        lateness_ms=lateness,
        error=outcome.error_message,
        completed=True if recoverable and outcome.status == "succeeded" else None,
        cursor_bytes=cursor_bytes,
        resumes=claim.resumes or None,
    )


def _priority(value: str) -> Priority:
    return "interactive" if value == "interactive" else "background"


__all__ = ["Dispatcher", "Running"]
