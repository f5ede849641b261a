"""Retention: the run history pruned on a deadline of its own, in bounded batches.

The prune is a :class:`~coordinator.daemon.loop.Chore`: the loop sleeps until the next
prune time (``prune_at``, daily at 03:17 local time by default) like it sleeps until a
job's deadline, and between prunes nothing is sent (promise 1). When it falls due, the
:class:`Pruner` runs as a task of its own: each batch is one statement and one short
transaction (``coordinator._prune``: at most :attr:`Pruner.batch` runs deleted, at most
:attr:`Pruner.max_jobs` jobs looked at), and between batches it pauses for as long as
the batch took times :attr:`Pruner.yield_ratio`, so claims and settlements keep their
share of the database and of the machine however large the backlog. A failing batch goes
through the error policy and is retried; a stop ends the prune between two batches.

What goes (``migrations/0013``): finished runs beyond their job's ``keep_last`` newest or
finished before now minus the job's ``retention``; never an outstanding, unresolved or
paused run, nor a job's latest run (unless the job was removed: then its runs go by age
and the job's row goes with its last run).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Final

import attrs
import trio

from .. import schedule as schedules
from ..clock import WallClock
from ..events import EventBus, RetentionPruned, milliseconds
from ..model import DEFAULT_KEEP_LAST, Schedule
from ..store import Store
from .policy import ErrorPolicy

#: Most runs one batch deletes (one transaction).
DEFAULT_BATCH: Final = 2000
#: Most jobs one batch looks at (a batch over many jobs with nothing to delete).
DEFAULT_MAX_JOBS: Final = 500
#: Failed batches in a row after which a prune gives up until its next time.
GIVE_UP_AFTER: Final = 10


@attrs.define(eq=False)
class Pruner:
    """The retention prune: armed by the loop, run in batches (see the module docstring)."""

    store: Store
    clock: WallClock
    events: EventBus
    policy: ErrorPolicy
    #: When prunes run (a cron expression in ``timezone``, from
    #: :func:`~coordinator.schedule.parse_prune_at`); ``None``: never.
    cron: str | None
    timezone: str
    #: Finished runs older than this go (a job's own ``retention`` wins).
    retention: timedelta
    #: At most this many of a job's newest runs are kept (a job's own ``keep_last`` wins).
    keep_last: int = DEFAULT_KEEP_LAST
    batch: int = DEFAULT_BATCH
    max_jobs: int = DEFAULT_MAX_JOBS
    #: The pause after each batch, as a multiple of the time the batch took.
    yield_ratio: float = 1.0
    #: Take a loop turn (the next prune time is armed).
    kick: Callable[[], None] = lambda: None
    #: The next prune (wall-clock epoch seconds), ``None`` while one runs or when off.
    _next: float | None = None
    running: bool = False
    stopping: bool = False
    #: Prunes finished so far (tests, status).
    prunes: int = 0

    def arm(self) -> None:
        """Arm the next prune time after now (no SQL)."""
        if self.cron is None:
            self._next = None
            return
        at = schedules.following_deadline(
            Schedule(kind="cron", expression=self.cron, timezone=self.timezone), self.clock.now()
        )
        self._next = None if at is None else at.timestamp()

    @property
    def next_at(self) -> datetime | None:
        """The armed prune time, for status and the log."""
        return None if self._next is None else datetime.fromtimestamp(self._next, UTC)

    # -- the Chore protocol ---------------------------------------------------------------

    def due_at(self) -> float | None:
        return None if self.running or self.stopping else self._next

    def fire(self, nursery: trio.Nursery) -> None:
        self.running = True
        self._next = None
        nursery.start_soon(self.prune)

    # -- the work ---------------------------------------------------------------------------

    async def prune(self) -> RetentionPruned:
        """One whole prune, batch after batch; then the next one is armed."""
        started = trio.current_time()
        now = self.clock.now()
        resume: tuple[int, int] | None = (0, 0)
        runs = jobs_removed = batches = failures = 0
        try:
            while resume is not None and not self.stopping:
                began = trio.current_time()
                try:
                    done = await self.store.prune_batch(
                        resume=resume,
                        limit=self.batch,
                        max_jobs=self.max_jobs,
                        now=now,
                        retention=self.retention,
                        keep_last=self.keep_last,
                    )
                except Exception as exc:
                    failures += 1
                    delay = self.policy.failed("prune", exc, failures)
                    if failures >= GIVE_UP_AFTER:
                        break
                    await trio.sleep(delay)
                    continue
                if failures:
                    failures = 0
                    self.policy.recovered("prune")
                batches += 1
                runs += done.deleted
                jobs_removed += done.removed_jobs
                resume = done.resume
                if resume is not None:
                    # Yield: claims and settlements get the database (and the CPU) back.
                    await trio.sleep(max(0.0, (trio.current_time() - began) * self.yield_ratio))
        finally:
            self.running = False
            self.prunes += 1
            self.arm()
            self.kick()
        event = RetentionPruned(
            runs=runs,
            jobs_removed=jobs_removed,
            batches=batches,
            elapsed_ms=milliseconds(trio.current_time() - started),
            complete=resume is None,
            next_at=self.next_at,
        )
        self.events.emit(event)
        return event


__all__ = ["DEFAULT_BATCH", "DEFAULT_KEEP_LAST", "DEFAULT_MAX_JOBS", "Pruner"]
