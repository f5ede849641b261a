"""Settlement: a call's result and its job's next deadline, saved together, never lost.

One value travels the whole way: a :class:`~coordinator.spool.HeldResult`. The
dispatcher hands it to :meth:`Settlement.settle`; if the database refuses it, it is
*held*: kept in memory exactly, re-sent with the error policy's backoff (the executor is
never called again for it) and its job stays out of admission until it is saved. At
stop, :meth:`Settlement.flush` gives every held result its last tries and writes what
the database still refuses to the spool; on the next start :meth:`Settlement.replay`
saves the spool's records before anything else is dispatched.

Failures of the spool itself are loud: a record that cannot be written is named (by run
id) in the daemon's last line and in its exit status.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import attrs
import trio

from ..clock import WallClock
from ..db import one_line
from ..events import EventBus, ResultHeld, ResultSaved, ResultSpooled, RunLost
from ..spool import HeldResult, Spool, SpoolError, Unreadable
from ..store import JobState, Store
from .policy import ErrorPolicy, Failure, classify

if TYPE_CHECKING:
    from ..model import Outcome

#: Tries a spooled record gets at start when PostgreSQL refuses it (not: cannot be
#: reached) before it is set aside and its run marked unresolved.
REPLAY_TRIES: Final = 3
#: Pause between the last tries of a flush (seconds).
FLUSH_PAUSE: Final = 0.5


@attrs.define(eq=False)
class _Held:
    """A held result and how saving it has gone."""

    result: HeldResult
    attempts: int = 0
    error: str | None = None
    #: Seconds to wait before the next attempt (the error policy's pacing).
    delay: float = 0.0
    #: The error the stop's flush last logged for it: a flush tries every
    #: :data:`FLUSH_PAUSE`, and says a failure again only when it changes.
    flush_said: str | None = None


@attrs.frozen(kw_only=True)
class FlushReport:
    """What :meth:`Settlement.flush` could not save to the database."""

    #: Run ids written to the spool (the next start replays them).
    spooled: tuple[int, ...] = ()
    #: Run ids neither saved nor spooled: their results are lost with this process.
    lost: tuple[int, ...] = ()


def _ignore(_result: HeldResult, _state: JobState) -> None:
    return None


def said_late(
    events: EventBus, job_key: str, run_id: int, outcome: Outcome, state: JobState
) -> bool:
    """Say a result that came after another daemon's sweep (migrations/0032): saved over
    its ``unresolved`` mark (``late``), or not saved because the run was ended otherwise
    (``superseded``: a retry queued, a pause, an operator's resolve; their decision
    stands). ``True`` for the latter: the run's end is not this result. The one place
    both are said, whether the result was saved at once, after being held, or at a
    stop's flush."""
    if state.outcome == "late":
        events.log.warning(
            "settle.late",
            job=job_key,
            run=run_id,
            outcome=outcome.status,
            reason="saved over the unresolved mark another daemon's sweep left",
        )
    elif state.outcome == "superseded":
        events.log.warning(
            "settle.superseded",
            job=job_key,
            run=run_id,
            outcome=outcome.status,
            error=outcome.error_message,
            reason="the run was ended otherwise meanwhile (swept by another daemon, "
            "or resolved): this result is not saved",
        )
        return True
    return False


@attrs.define(eq=False)
class Settlement:
    """Saves results; holds, re-sends, flushes, spools and replays those it cannot."""

    store: Store
    events: EventBus
    policy: ErrorPolicy
    spool: Spool
    clock: WallClock
    #: Called once a result is saved (at once or after being held): re-arm its job.
    on_saved: Callable[[HeldResult, JobState], None] = _ignore
    #: Called when the set of held results changes (status).
    on_change: Callable[[], None] = lambda: None
    #: run id -> held result.
    _held: dict[int, _Held] = attrs.field(factory=dict)
    #: job id -> number of its held results (a job with any stays out of admission).
    _held_jobs: dict[int, int] = attrs.field(factory=dict)
    #: Run ids the last flush wrote to the spool.
    _spooled: tuple[int, ...] = ()
    #: The stop's flush has begun: it owns every held result (background retries stop,
    #: and a retry's statement cut short by the stop is not logged as a failure).
    _flushing: bool = False
    _nursery: trio.Nursery | None = None

    def start(self, nursery: trio.Nursery) -> None:
        """Where retry tasks run (the daemon's long-lived nursery)."""
        self._nursery = nursery

    # -- reading ------------------------------------------------------------------------

    def holds_job(self, job_id: int) -> bool:
        """A result of this job waits to be saved: it must not be dispatched again."""
        return job_id in self._held_jobs

    def held(self) -> list[tuple[HeldResult, int, str | None]]:
        """(result, attempts, last error) of every held result, by run id."""
        return [(h.result, h.attempts, h.error) for _, h in sorted(self._held.items())]

    def __len__(self) -> int:
        return len(self._held)

    # -- saving -------------------------------------------------------------------------

    def settle(self, result: HeldResult, then: Callable[[JobState | None], None]) -> None:
        """Save ``result`` with its job's next deadline, with the next batch of
        settlements; ``then(state)`` once saved, ``then(None)`` if it is held instead.
        Nobody waits for it: ``then`` is called by the task that sends the batch.

        A failure that is not a database failure (a bug) holds the result before it is
        re-raised (after ``then(None)``), so that the stop sequence still saves or spools
        it.
        """

        def landed(outcome: JobState | BaseException) -> None:
            if not isinstance(outcome, BaseException):
                then(outcome)
                return
            try:
                self._hold_failed(result, outcome)
            finally:
                then(None)

        self.store.settle_soon(result, landed)

    def _hold_failed(self, result: HeldResult, exc: BaseException) -> None:
        """The first save failed: hold the result and re-send it in a task of its own."""
        entry = self._hold(result)
        self._failed(entry, exc, event="settle.failed")
        self.events.emit(ResultHeld(job=result.job_key, run=result.run_id, error=entry.error or ""))
        assert self._nursery is not None
        self._nursery.start_soon(self._retry, result.run_id)

    async def _retry(self, run_id: int) -> None:
        """Re-send a held result until it is saved (or the stop sequence takes over)."""
        while (entry := self._held.get(run_id)) is not None:
            await trio.sleep(entry.delay)
            if run_id not in self._held or self._flushing:
                return  # saved, or the stop's flush has it now
            state = await self._try_save(entry)
            if state is not None:
                self.on_saved(entry.result, state)
                return

    def _failed(
        self,
        entry: _Held,
        exc: BaseException,
        *,
        event: str,
        say: bool = True,
        pause: float | None = None,
    ) -> None:
        """Count the failed attempt and pace the next; a bug is re-raised by the policy
        (the result stays held: the stop sequence saves or spools it). ``say``: log it;
        ``pause``: the next try comes after this, not the policy's pacing."""
        entry.attempts += 1
        entry.error = one_line(exc)
        entry.delay = self.policy.failed(
            "settle",
            exc,
            entry.attempts,
            event=event,
            log=say,
            pause=pause,
            run=entry.result.run_id,
        )

    async def _try_save(self, entry: _Held, *, flush: bool = False) -> JobState | None:
        """One attempt; ``flush``: one of the stop's, in a statement of its own that the
        stop's deadline cuts short (:meth:`Store.settle_alone`), not with the next batch,
        and logged only when its error differs from the flush's last for this result (it
        tries every :data:`FLUSH_PAUSE`)."""
        try:
            save = self.store.settle_alone if flush else self.store.settle
            state = await save(entry.result)
        except Exception as exc:
            if flush:
                say = one_line(exc) != entry.flush_said
                self._failed(entry, exc, event="settle.retry_failed", say=say, pause=FLUSH_PAUSE)
                entry.flush_said = entry.error
            else:
                # A background retry's failure during a flush, or after one that saved or
                # spooled the result, is the stop cutting it short (the flush tries and
                # says for itself).
                mine = not self._flushing and self._held.get(entry.result.run_id) is entry
                self._failed(entry, exc, event="settle.retry_failed", say=mine)
            return None
        self._release(entry.result)
        result = entry.result
        if not said_late(self.events, result.job_key, result.run_id, result.outcome, state):
            self.events.emit(
                ResultSaved(
                    job=entry.result.job_key,
                    run=entry.result.run_id,
                    attempts=entry.attempts + 1,
                    outcome=state.outcome,
                )
            )
        if not self._held:
            self.policy.recovered("settle")
        return state

    def _hold(self, result: HeldResult) -> _Held:
        entry = self._held.get(result.run_id)
        if entry is None:
            entry = self._held[result.run_id] = _Held(result=result)
            if result.job_id is not None:
                self._held_jobs[result.job_id] = self._held_jobs.get(result.job_id, 0) + 1
            self.on_change()
        return entry

    def _release(self, result: HeldResult) -> None:
        if self._held.pop(result.run_id, None) is None:
            return
        job_id = result.job_id
        if job_id is not None:
            left = self._held_jobs.get(job_id, 1) - 1
            if left > 0:
                self._held_jobs[job_id] = left
            else:
                self._held_jobs.pop(job_id, None)
        self.on_change()

    # -- stop ---------------------------------------------------------------------------

    async def flush(self, *, deadline: float) -> FlushReport:
        """At stop: save held results without calling anything again; spool what the
        database still refuses. Keeps trying until every result is saved or spooled, or
        trio time ``deadline`` passes.

        The deadline bounds the tries themselves, not only the pauses between them: on a
        database that takes connections but does not answer (a lock), each try waited
        for the store's 30 s limit, two of them, and the service manager's SIGKILL
        came before the spool write (a tester's stop took 91 s under a 3 s stop
        timeout). A try cut short may still land; the spooled copy is then found
        already saved at the next start."""
        if not self._held:
            return FlushReport()
        self._flushing = True
        try:
            return await self._flush(deadline)
        finally:
            # (A result held after this flush, by a settlement still in flight, is
            # retried in the background again until the stop's last flush.)
            self._flushing = False

    async def _flush(self, deadline: float) -> FlushReport:
        first = True
        spool_said: str | None = None
        while self._held:
            with trio.move_on_at(deadline):
                for entry in list(self._held.values()):
                    try:
                        await self._try_save(entry, flush=True)
                    except Exception as exc:  # a bug: the result still goes to the spool
                        self.events.log.error(
                            "settle.flush_failed", run=entry.result.run_id, error=repr(exc)
                        )
            if not self._held:
                break
            if first and trio.current_time() < deadline:
                # The database may just be back: one more round shortly, then the spool.
                first = False
                with trio.move_on_at(deadline):
                    await trio.sleep(FLUSH_PAUSE)
                continue
            spooled, spool_said = self._write_spool(said=spool_said)
            if spooled:
                break
            if trio.current_time() >= deadline:
                break
            with trio.move_on_at(deadline):
                await trio.sleep(FLUSH_PAUSE)
        return self._report()

    def _write_spool(self, *, said: str | None = None) -> tuple[bool, str | None]:
        """Spool every held result at once: whether they are all durable, and the error
        logged (``said``: the one logged last time, not repeated)."""
        results = [h.result for h in self._held.values()]
        try:
            self.spool.append(results)
        except SpoolError as exc:
            if str(exc) != said:
                runs = ",".join(str(r.run_id) for r in results)
                self.events.log.error("spool.write_failed", error=str(exc), runs=runs)
            return False, str(exc)
        for result in results:
            self.events.emit(
                ResultSpooled(job=result.job_key, run=result.run_id, spool=str(self.spool.path))
            )
        self._spooled += tuple(r.run_id for r in results)
        for result in results:  # durable now: the next start replays them
            self._release(result)
        return True, None

    def _report(self) -> FlushReport:
        return FlushReport(spooled=tuple(sorted(self._spooled)), lost=tuple(sorted(self._held)))

    # -- start --------------------------------------------------------------------------

    async def replay(self) -> None:
        """Save the spool's records before anything is dispatched (startup).

        A record the database cannot take *now* (unreachable) stops the replay with the
        store's error: the startup sequence begins again and the spool is kept. A record
        PostgreSQL refuses :data:`REPLAY_TRIES` times is set aside beside the spool and
        its run marked ``unresolved`` with the reason; the others are saved.
        """
        contents = self.spool.read()
        log = self.events.log
        if not contents.records and not contents.corrupt:
            log.info("startup.spool", records=0)
            return
        started = trio.current_time()
        for line in contents.corrupt:
            log.error("spool.corrupt", reason=line.reason, line=line.raw[:200])
        saved = already = 0
        refused: list[tuple[HeldResult, str]] = []
        for record in contents.records:
            outcome, problem = await self._replay_one(record)
            if problem is not None:
                refused.append((record, problem))
            elif outcome in ("saved", "paused", "late"):
                # ("paused": a give-back, paused as asked; "late": over the unresolved
                # mark of another daemon's sweep, migrations/0032.)
                saved += 1
                if outcome == "late":
                    log.warning(
                        "settle.late",
                        run=record.run_id,
                        job=record.job_key,
                        outcome=record.outcome.status,
                        reason="replayed from the "
                        "spool over the unresolved mark of another daemon's sweep",
                    )
            elif outcome == "superseded":
                already += 1
                log.warning(
                    "settle.superseded",
                    run=record.run_id,
                    job=record.job_key,
                    outcome=record.outcome.status,
                    reason="replayed from the spool after the run was ended otherwise: not saved",
                )
            else:
                already += 1
        rejected = None
        if refused:
            # Marked first, then set aside: a mark that fails (the database went away)
            # leaves the spool whole for the next attempt, instead of a new rejected file
            # at each attempt and no line saying so.
            for record, why in refused:
                await self.store.mark_unresolved(
                    record.run_id, f"its result could not be saved from the spool: {why}"
                )
            rejected = self.spool.set_aside(
                [Unreadable(raw=r.line().rstrip(b"\n"), reason=why) for r, why in refused],
                self.clock,
                "rejected",
            )
            for record, why in refused:
                log.error("spool.rejected", run=record.run_id, job=record.job_key, error=why)
                if record.job_id is not None:  # left for an operator: alerted like a lost run
                    self.events.emit(
                        RunLost(
                            run=record.run_id,
                            job_id=record.job_id,
                            job=record.job_key,
                            action="unresolved",
                        )
                    )
        # (Set aside only now: a replay the database cut short reads the spool whole
        # again, and each attempt left a copy of its corrupt lines.)
        aside = self.spool.set_aside(contents.corrupt, self.clock, "corrupt")
        self.spool.clear()
        log.info(
            "spool.replayed",
            saved=saved,
            skipped=already,
            corrupt=len(contents.corrupt),
            rejected=len(refused) or None,
            set_aside=str(aside) if aside else None,
            rejected_file=str(rejected) if rejected else None,
            elapsed_ms=round((trio.current_time() - started) * 1000, 1),
        )

    async def _replay_one(self, record: HeldResult) -> tuple[str | None, str | None]:
        """(``saved``/``paused``/``already``, None) or (None, why PostgreSQL refused it)."""
        for attempt in range(1, REPLAY_TRIES + 1):
            try:
                state = await self.store.settle(record)
            except Exception as exc:
                kind = classify(exc)
                if kind is None or kind is Failure.UNAVAILABLE:
                    raise
                delay = self.policy.failed("spool.replay", exc, attempt, run=record.run_id)
                if attempt == REPLAY_TRIES:
                    return None, one_line(exc)
                await trio.sleep(delay)
                continue
            self.policy.recovered("spool.replay")
            return state.outcome, None
        raise AssertionError("unreachable")  # pragma: no cover


__all__ = ["REPLAY_TRIES", "FlushReport", "Settlement", "said_late"]
