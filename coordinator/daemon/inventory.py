"""The job inventory: what the daemon keeps in memory about jobs, and their timers.

A refresh reads every job that may need a timer or a dispatch (a page of
``store.REFRESH_PAGE`` rows per statement; paused, manual-only and invalid jobs are not
even loaded), rebuilds the armed deadlines, offers queued manual runs to admission, saves
first deadlines where none is saved (each page's while the next is read) and makes
unusable schedules inert. Between refreshes the inventory is kept current without SQL:
a settlement returns its job's new deadline state (:meth:`Inventory.settled`), a
rejected claim re-arms the job from memory (:meth:`Inventory.rearm`), and workers
arriving or leaving arm or disarm worker jobs (:meth:`Inventory.workers_changed`).

A job is armed only if it can run: a saved deadline and no outstanding run, or a
queued retry (armed on its saved due time instead: waiting for it costs no SQL); no
dispatch under way, no held result, and, for a worker target, a connected worker
serving it.
Deadline arithmetic that cannot be done (an interval too long for a datetime, an
expression that slipped in by plain SQL) makes that job inert with a reason; it never
stops the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

import attrs
import trio

from .. import schedule as schedules
from ..clock import WallClock
from ..core.coalescer import RefreshCoalescer
from ..core.deadlines import DeadlineSet
from ..errors import CoordinatorError, first_error
from ..events import EventBus, Refreshed, milliseconds
from ..model import Schedule
from ..store import FirstDeadlines, JobEntry, RefreshPage, Store
from . import cyclic_gc
from .policy import ErrorPolicy

if TYPE_CHECKING:
    from ..model import Job
    from ..store import JobState


#: Most jobs a refresh re-reads by id; a wake naming more (or none) reads them all.
INCREMENTAL_LIMIT: Final = 1000

#: Statements saving first deadlines at once (each on a pooled connection of its own):
#: on a first start the database's writing sets the pace. A batch is handed to a writer
#: only when one is free, so when the last page is read every batch is being written,
#: and the rebuild (a second at a million jobs) overlaps the last writes instead of
#: holding back the next one.
FIRST_DEADLINE_WRITERS: Final = 2

#: Most first deadlines one statement saves (half a page: the writers start on a page
#: sooner, and the last statements, which nothing overlaps, are shorter).
FIRST_DEADLINE_BATCH: Final = 25_000


def next_deadline(
    compute: Callable[[Schedule, datetime], datetime | None], schedule: Schedule, at: datetime
) -> tuple[datetime | None, str | None]:
    """``(deadline, None)``, or ``(None, reason)`` when the schedule cannot give one."""
    try:
        return compute(schedule, at), None
    except (ValueError, OverflowError, CoordinatorError) as exc:
        return None, str(exc) or type(exc).__name__


def _never(_job_id: int) -> bool:
    return False


def _no_types() -> frozenset[str]:
    return frozenset()


def _drop(_entry: JobEntry) -> None:
    return None


def _not_here(_run_id: int) -> bool:
    return False


def _read_nothing(_ids: frozenset[int] | None) -> None:
    return None


@attrs.define(eq=False)
class Inventory:
    """Jobs known to the daemon, and which of them have an armed deadline."""

    store: Store
    clock: WallClock
    events: EventBus
    policy: ErrorPolicy
    deadlines: DeadlineSet
    coalescer: RefreshCoalescer
    #: The job must not be armed now (a dispatch is under way or its result is held).
    busy: Callable[[int], bool] = _never
    #: Worker types served now.
    served: Callable[[], frozenset[str]] = _no_types
    #: A refresh found a queued manual run: offer it to admission.
    queued: Callable[[JobEntry], None] = _drop
    #: A refresh is about to read these jobs (``None``: every job); called before its
    #: first statement, so what it is told was committed before is what it reads.
    reading: Callable[[frozenset[int] | None], None] = _read_nothing
    #: A refresh found a run an operator asked to pause (``cancel_requested``): ask its
    #: call to stop, if it runs here (its NOTIFY may have been missed).
    pausing: Callable[[int], bool] = _not_here
    #: A settlement found its job changed by another writer: refresh the jobs
    #: :meth:`request` named, at once (the loop's urgent wake).
    reread: Callable[[], None] = lambda: None
    #: Python's cyclic garbage collector around refreshes (a daemon that owns its
    #: process freezes what a full refresh leaves alive: see :mod:`.cyclic_gc`).
    collector: cyclic_gc.Collector = attrs.field(factory=cyclic_gc.Collector)
    #: Seconds a job's definition may precede the refresh that first reads it and still
    #: count its first deadline from then (:class:`_Firsts`): the refresh spacing and
    #: some slack.
    first_lookback: float = 90.0
    jobs: dict[int, JobEntry] = attrs.field(factory=dict)
    #: Paused or invalid jobs (not loaded) that an unresolved run blocks: that run waits
    #: for an operator whatever the job's state, so it is counted (:meth:`unresolved`).
    parked: set[int] = attrs.field(factory=set)
    refreshes: int = 0
    #: When the last refresh ended (wall time).
    last_refresh: datetime | None = None
    #: Consecutive failed refreshes (paces the next attempt).
    _failures: int = 0
    #: What the next refresh must read: the jobs wakes named, or everything.
    _dirty: set[int] = attrs.field(factory=set)
    _full: bool = True

    def unresolved(self) -> int:
        """Jobs blocked by an unresolved run, as of the last refresh (paused and invalid
        ones too: the run waits for an operator all the same). No SQL."""
        loaded = sum(1 for e in self.jobs.values() if e.run_status == "unresolved")
        return loaded + len(self.parked)

    def key(self, job_id: int) -> str:
        """``namespace/name`` of a known job, ``#id`` otherwise."""
        entry = self.jobs.get(job_id)
        return entry.key if entry is not None else f"#{job_id}"

    # -- arming -------------------------------------------------------------------------

    def arm(self, entry: JobEntry, served: frozenset[str] | None = None) -> None:
        """Arm the job's saved deadline (or its waiting retry's due time) if it can run;
        disarm it otherwise. A paused run does not stand in the way: the job's next tick
        resumes it."""
        at = self._arm_time(entry, served if served is not None else self.served())
        if at is None:
            self.deadlines.discard(entry.id)
            return
        self.deadlines.set(entry.id, at.timestamp())

    def _arm_time(self, entry: JobEntry, served: frozenset[str]) -> datetime | None:
        """When to arm ``entry`` (:meth:`arm`'s rules, for one entry or many): its
        armed-at time, unless it has none, is busy, or no worker serves its type."""
        # (armed_at() without the call for the common case, nothing outstanding: a
        # million entries come through here on a start.)
        at = entry.next_run_at if entry.run_id is None else entry.armed_at()
        worker_type = entry.worker_type
        if at is None or (worker_type is not None and worker_type not in served):
            return None
        return None if self.busy(entry.id) else at

    def rearm(self, job_id: int) -> None:
        """Arm the job again from memory (a dispatch ended without a settlement)."""
        entry = self.jobs.get(job_id)
        if entry is not None:
            self.arm(entry)

    def run_gone(self, job_id: int, run_id: int) -> None:
        """A queued run (manual or retry) was refused as gone or no longer queued: forget
        it and arm the job again from memory (its saved deadline)."""
        entry = self.jobs.get(job_id)
        if entry is not None and entry.run_id == run_id:
            entry.run_id = entry.run_status = entry.run_created_at = entry.run_due_at = None
        self.rearm(job_id)

    def deadline_moved(self, job_id: int, next_run_at: datetime | None) -> None:
        """The claim saved another deadline for the job (a misfire was skipped): arm it."""
        entry = self.jobs.get(job_id)
        if entry is None:
            return
        entry.next_run_at = next_run_at
        self.arm(entry)

    def workers_changed(self) -> None:
        """Arm or disarm every worker job for the types served now (no SQL)."""
        served = self.served()
        for entry in self.jobs.values():
            if entry.worker_type is not None:
                self.arm(entry, served)

    def settled(self, state: JobState, job: Job, run_id: int) -> None:
        """Re-arm a job from the state its settlement returned, without a refresh."""
        job_id = job.id
        entry = self.jobs.get(job_id)
        # (The job's one outstanding run was settled: whatever it was, it is not
        # unresolved now.)
        self.parked.discard(job_id)
        if state.outcome == "gone" or state.job_id is None:
            # Removed while the call ran: the run went with the job (remove cascades).
            self.events.log.warning("settle.orphaned", job=job.key, run=run_id)
            self.jobs.pop(job_id, None)
            self.deadlines.discard(job_id)
            return
        if state.outcome == "superseded":
            # The run was ended otherwise meanwhile -- another daemon's sweep failed it
            # and queued its retry, or paused it, or an operator resolved it -- and that
            # writer's wake may never come (a daemon's own sessions send none; a refresh
            # while the call ran left its job alone). What the job has now is not in this
            # state: read it again, at once. (Rare; not idle: a call just ended.)
            self.deadlines.discard(job_id)
            if entry is not None:
                entry.run_id = entry.run_status = entry.run_created_at = entry.run_due_at = None
            self.request([job_id])
            self.reread()
            return
        if state.retry_run_id is not None and not (state.paused or state.invalid):
            # A retry waits: the timer serves its saved due time (the saved deadline
            # does not move until the chain of attempts ends).
            if entry is None:
                entry = _entry_of(job, state)
            entry.next_run_at = state.next_run_at
            entry.schedule_version = state.schedule_version or entry.schedule_version
            entry.run_id, entry.run_status = state.retry_run_id, "queued"
            entry.run_due_at = state.retry_due_at
            self.jobs[job_id] = entry
            self.arm(entry)
            return
        if state.paused or state.invalid or state.next_run_at is None:
            self.deadlines.discard(job_id)
            if entry is not None:
                entry.next_run_at = entry.run_id = entry.run_status = None
                entry.run_due_at = None
            return
        if entry is None:
            if job.schedule.kind == "manual":
                return
            entry = _entry_of(job, state)
        # If the schedule was edited during the run, what is saved now is the editor's
        # deadline (or none yet): arm that; the editor's wake brings the new definition.
        entry.next_run_at = state.next_run_at
        entry.schedule_version = state.schedule_version or entry.schedule_version
        entry.run_id = entry.run_status = entry.run_due_at = None
        self.jobs[job_id] = entry
        self.arm(entry)

    # -- refresh ------------------------------------------------------------------------

    async def refresh(self, *, first: bool = False) -> bool:
        """Read the inventory and re-arm everything; ``True`` when it succeeded.

        A failure goes through the error policy: a bug propagates; a database failure
        is logged with its purpose and the refresh is asked for again after the policy's
        pause (at once after a deadlock). ``first`` (the startup refresh) re-raises
        every failure, for the startup sequence to log and pace.
        """
        started = trio.current_time()
        # What this refresh serves: the jobs wakes named since the last one, or all of
        # them. Wakes that arrive while it reads are kept for the next one.
        # (A refresh nobody named jobs for — any other wake — reads everything.)
        ids = None if (self._full or first or not self._dirty) else frozenset(self._dirty)
        self._full, self._dirty = False, set()
        try:
            with self.collector.building(full=ids is None, now=started):
                counts = await self._refresh(ids)
        except Exception as exc:
            self.request(ids)  # still owed
            if first:
                raise  # the startup sequence logs and paces its own steps
            self._failures += 1
            # The store's message names the statement (refresh, init_deadlines, ...).
            delay = self.policy.failed("refresh", exc, self._failures)
            self.coalescer.refresh_failed(trio.current_time() + delay)
            return False
        self._failures = 0
        self.policy.recovered("refresh")
        self.coalescer.mark_refreshed(started)
        self.refreshes += 1
        self.last_refresh = self.clock.now()
        rows, initialised, invalid = counts
        self.events.emit(
            Refreshed(
                jobs=rows,
                armed=len(self.deadlines),
                initialised=initialised or None,
                invalid=invalid or None,
                named=None if ids is None else len(ids),
                frozen=cyclic_gc.frozen() if self.collector.freeze and ids is None else None,
                elapsed_ms=milliseconds(trio.current_time() - started),
            )
        )
        return True

    def request(self, ids: Iterable[int] | None) -> None:
        """A wake asked for a refresh of the jobs ``ids`` (``None``: possibly any). The
        coalescer decides when; this decides how much: more than :data:`INCREMENTAL_LIMIT`
        named jobs, or any unnamed change, make it a full refresh."""
        if ids is None or self._full:
            self._full = True
            self._dirty = set()
            return
        self._dirty.update(ids)
        if len(self._dirty) > INCREMENTAL_LIMIT:
            self._full = True
            self._dirty = set()

    async def _refresh(self, ids: frozenset[int] | None) -> tuple[int, int, int]:
        # Pages are read by the store (the next one while the last is turned into
        # entries), sorted here, and each page's first deadlines are written (by tasks of
        # their own) while the next page is read. Nothing is armed until everything is
        # read, and a first deadline only once it is saved.
        read = _Read(_Firsts(self.clock.now(), self.first_lookback))
        self.reading(ids)
        try:
            async with trio.open_nursery() as nursery:
                pages_out, pages = trio.open_memory_channel[RefreshPage](0)
                nursery.start_soon(
                    self.store.read_pages, None if ids is None else sorted(ids), pages_out
                )
                send, receive = trio.open_memory_channel[FirstDeadlines](0)
                async with receive:
                    for _ in range(FIRST_DEADLINE_WRITERS):
                        nursery.start_soon(self._write_firsts, receive.clone(), read)
                async with send, pages:
                    async for page in pages:
                        await self._sort(page, read, send)
                self._rebuild(ids, read)
        except BaseExceptionGroup as group:
            # The refresh fails with what the statement raised, for the policy to classify.
            error = first_error(group)
            if error is group:
                raise  # cancelled from outside
            raise error from None
        if read.to_invalidate:
            marked = await self.store.mark_invalid(read.to_invalidate)
            for job_id, reason, _version in read.to_invalidate:
                if job_id in marked:
                    # (By name too, as every other event names a job: job_id alone left
                    # an operator a query to write.)
                    self.events.log.warning(
                        "job.invalid",
                        job=read.invalid_keys.get(job_id),
                        job_id=job_id,
                        reason=reason,
                    )
        # The pages written after the rebuild.
        self._arm_many(self._take_written(read), self.served(), read.stamps)
        return read.rows, read.initialised, len(read.to_invalidate)

    async def _sort(
        self,
        page: RefreshPage,
        read: _Read,
        firsts_out: trio.MemorySendChannel[FirstDeadlines],
    ) -> None:
        """Sort one page into what to load, to initialise (sent on at once, in batches of
        :data:`FIRST_DEADLINE_BATCH`) and to mark invalid. Once per distinct schedule:
        the checks and the first deadline; once per job: a few lookups (a million jobs
        go through here on a first start)."""
        read.rows += len(page.entries)
        read.parked.extend(page.parked)
        defined = page.defined
        recent = read.firsts.recent_us
        firsts = FirstDeadlines()
        ids, ats, versions = firsts.ids, firsts.ats, firsts.versions
        loaded = read.loaded
        verdicts = read.verdicts
        for entry in page.entries:
            schedule = entry.schedule
            # Keyed by identity: the store hands out one object per distinct schedule
            # (and the verdict keeps it alive, so its id is not reused meanwhile).
            verdict = verdicts.get(id(schedule))
            if verdict is None:
                verdict = verdicts[id(schedule)] = read.firsts.verdict(schedule)
            if entry.next_run_at is not None:
                reason, first_at = verdict.reason, None
            elif defined.get(entry.id, 0) > recent:  # defined since the lookback began
                # (To the second: exact for cron, whose ticks fall on whole minutes; an
                # interval's first run is "about" that anyway. Jobs defined one by one
                # then share a computation per second, not one each.)
                reason, first_at = verdict.first_since(defined[entry.id] // 1_000_000)
            elif verdict.first_at is not None:  # computed (the common case: no call)
                reason, first_at = None, verdict.first_at
            else:
                reason, first_at = verdict.first()
            if reason is not None:
                read.to_invalidate.append((entry.id, reason, entry.schedule_version))
                read.invalid_keys[entry.id] = entry.key
                continue
            loaded.append(entry)
            if first_at is not None and verdict.recurring:
                ids.append(entry.id)
                ats.append(first_at)
                versions.append(entry.schedule_version)
        read.initialised += len(ids)
        for start in range(0, len(ids), FIRST_DEADLINE_BATCH):
            end = start + FIRST_DEADLINE_BATCH
            await firsts_out.send(
                firsts
                if len(ids) <= FIRST_DEADLINE_BATCH
                else FirstDeadlines(ids[start:end], ats[start:end], versions[start:end])
            )

    async def _write_firsts(
        self, batches: trio.MemoryReceiveChannel[FirstDeadlines], read: _Read
    ) -> None:
        """Save first deadlines as they come (one statement per batch)."""
        async with batches:
            async for batch in batches:
                refused = await self.store.init_deadlines(batch)
                read.written.append((batch, refused))

    def _rebuild(self, ids: frozenset[int] | None, read: _Read) -> None:
        """Replace what the refresh read (everything, or the named jobs) and arm it; no
        await between the first change and the last, so the loop never sees half. The
        first deadlines already saved are armed with the rest."""
        served = self.served()
        loaded, read.loaded = read.loaded, []
        jobs: dict[int, JobEntry]
        if ids is None:
            # Let the old inventory go before the new one is indexed.
            self.jobs = jobs = {}
            self.deadlines.clear()
            self.parked = set(read.parked)
        else:
            # Only the named jobs are re-read: forget what we knew of them; a job not
            # returned is paused, removed, invalid or manual with nothing queued.
            jobs = self.jobs
            for job_id in ids:
                jobs.pop(job_id, None)
                self.deadlines.discard(job_id)
            self.parked.difference_update(ids)
            self.parked.update(read.parked)
        for entry in loaded:
            jobs[entry.id] = entry
            if entry.run_id is None:
                continue  # nothing outstanding (most jobs): nothing to offer or stop
            if entry.run_status == "queued" and not entry.retry_waiting and not self.busy(entry.id):
                self.queued(entry)  # a manual run: at once (a waiting retry is armed below)
            elif entry.run_status == "cancel_requested":
                self.pausing(entry.run_id)
        self._take_written(read)  # armed below, with the others
        self._arm_many(loaded, served, read.stamps)

    def _arm_many(
        self, entries: list[JobEntry], served: frozenset[str], stamps: dict[datetime, float]
    ) -> None:
        """:meth:`arm` for many entries at once (the same rules), the deadline set filled
        in one step; ``stamps`` caches each distinct deadline's epoch seconds."""
        arm_time = self._arm_time
        discard = self.deadlines.discard
        armed: list[tuple[float, int]] = []
        for entry in entries:
            at = arm_time(entry, served)
            if at is None:
                discard(entry.id)
                continue
            stamp = stamps.get(at)
            if stamp is None:
                stamp = stamps[at] = at.timestamp()
            armed.append((stamp, entry.id))
        self.deadlines.set_many(armed)

    def _take_written(self, read: _Read) -> list[JobEntry]:
        """Give the jobs whose first deadline was saved since the last call that deadline
        (not those refused: changed meanwhile, the next refresh reads them)."""
        jobs = self.jobs
        entries = []
        for batch, refused in read.written:
            for job_id, at in zip(batch.ids, batch.ats, strict=True):
                if refused and job_id in refused:
                    continue
                entry = jobs.get(job_id)
                if entry is not None:
                    entry.next_run_at = at
                    entries.append(entry)
        read.written = []
        return entries


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

#: Kinds whose first deadline the daemon computes and saves (a one-shot job's is its
#: instant, saved by whoever defined it).
_RECURRING: Final = frozenset({"cron", "interval"})


@attrs.define(eq=False)
class _Read:
    """What a refresh read, sorted."""

    firsts: _Firsts
    #: Entries to load (usable schedules).
    loaded: list[JobEntry] = attrs.field(factory=list)
    #: Paused or invalid jobs blocked by an unresolved run (not loaded).
    parked: list[int] = attrs.field(factory=list)
    #: First deadlines sent to be saved.
    initialised: int = 0
    #: Pages of first deadlines saved, with the ids refused (not written), not yet applied
    #: to the inventory.
    written: list[tuple[FirstDeadlines, set[int]]] = attrs.field(factory=list)
    #: (job id, reason, schedule version) to make inert.
    to_invalidate: list[tuple[int, str, int]] = attrs.field(factory=list)
    #: ``namespace/name`` of each job in :attr:`to_invalidate`, for its log line.
    invalid_keys: dict[int, str] = attrs.field(factory=dict)
    rows: int = 0
    #: ``id(schedule)`` -> what the refresh decided for that schedule.
    verdicts: dict[int, _Verdict] = attrs.field(factory=dict)
    #: Epoch seconds of each distinct deadline armed.
    stamps: dict[datetime, float] = attrs.field(factory=dict)


@attrs.define(eq=False)
class _Verdict:
    """One distinct schedule, checked once; its first deadline computed once, when a job
    of it first needs one."""

    firsts: _Firsts
    schedule: Schedule
    #: Why the schedule is unusable, or ``None``.
    reason: str | None
    #: The daemon saves its jobs' first deadlines (cron and interval).
    recurring: bool
    #: The first deadline, once computed (``None`` before, or if there is none).
    first_at: datetime | None = None
    _first: tuple[str | None, datetime | None] | None = None
    _since: dict[int, tuple[str | None, datetime | None]] = attrs.field(factory=dict)

    def first(self) -> tuple[str | None, datetime | None]:
        """``(reason the schedule is unusable, None)`` or ``(None, first deadline)``."""
        if self.reason is not None:
            return self.reason, None
        if self._first is None:
            first_at, reason = self.firsts.first(self.schedule)
            self._first = (reason, first_at)
            self.first_at = first_at if reason is None else None
        return self._first

    def first_since(self, defined_s: int) -> tuple[str | None, datetime | None]:
        """As :meth:`first`, counted from when the job was defined (epoch seconds):
        once per distinct second."""
        if self.reason is not None:
            return self.reason, None
        known = self._since.get(defined_s)
        if known is None:
            first_at, reason = self.firsts.first_from(self.schedule, defined_s)
            known = self._since[defined_s] = (reason, first_at if reason is None else None)
        return known


@attrs.define(eq=False)
class _Firsts:
    """Checks schedules and computes their first deadline: from when the job was defined
    if that was within ``lookback`` seconds, else from ``now``.

    A job's first deadline is counted from its definition (``jobs define`` prints that
    one), but the daemon reads the job at its next refresh, up to a coalescing window
    later: counted from the refresh, a first tick falling in between was lost, and a
    daily job defined shortly before its time first ran a day late (found by a helper,
    2026-12-02). Such a tick is now owed, like any overdue deadline (it runs once, or its
    misfire policy skips it). A definition older than the lookback (a daemon that was
    down, a row whose deadline was cleared by hand without touching ``updated_at``)
    counts from now, as before: ticks that fell while no daemon could read the job are
    not owed."""

    now: datetime
    #: Seconds before ``now`` a definition still counts from (the refresh spacing plus
    #: slack for a refresh's own time and the two hosts' clocks).
    lookback: float = 90.0
    recent_us: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.recent_us = int((self.now.timestamp() - self.lookback) * 1_000_000)

    def first_from(self, schedule: Schedule, defined_s: int) -> tuple[datetime | None, str | None]:
        """The first deadline counted from ``defined_s`` (never from later than now: a
        database clock ahead of the daemon's)."""
        defined = _EPOCH + timedelta(seconds=defined_s)
        return next_deadline(schedules.initial_deadline, schedule, min(defined, self.now))

    def verdict(self, schedule: Schedule) -> _Verdict:
        return _Verdict(
            self,
            schedule,
            schedules.invalid_reason(schedule),
            schedule.kind in _RECURRING,
        )

    def first(self, schedule: Schedule) -> tuple[datetime | None, str | None]:
        return next_deadline(schedules.initial_deadline, schedule, self.now)


def _entry_of(job: Job, state: JobState) -> JobEntry:
    """An inventory entry for a job the last refresh did not load (defined since, or
    manual-only), from its claim and its settlement."""
    return JobEntry(
        id=job.id,
        key=job.key,
        schedule=job.schedule,
        priority=job.priority,
        worker_type=job.target.worker_type,
        next_run_at=state.next_run_at,
        schedule_version=state.schedule_version or job.schedule_version,
    )


__all__ = ["Inventory", "next_deadline"]
