"""The loop: deadlines, then the coalescer, then admission, then sleep.

One task decides; every other task only reports to it by calling :meth:`DispatchLoop.kick`
(a wake arrived, a slot freed while work waits for one, a result was saved). Each turn:

1. every armed deadline that has passed (wall time) is handed to ``on_due``, which offers
   its job to admission (or logs the tick as skipped); every :class:`Chore` whose time
   has passed (the retention prune) is fired;
2. if the coalescer grants a refresh, ``refresh()`` runs and the turn starts over;
3. every ticket admission lets start is dispatched as a task in ``calls``;
4. the loop sleeps until the earliest of: the earliest deadline, the earliest chore,
   the coalescer's next grant, or a kick. With neither a deadline, a chore nor a pending
   wake it sleeps with no timer at all (promise 1: no SQL, no wake-up).

A wake that brings work to admit (a manual run's dispatch hint) may take steps 1 and 3
itself, in its own task, while the loop sleeps (:meth:`DispatchLoop.turn_now`): the
claim then starts a scheduler round sooner than after a kick, and nothing else changes,
since a turn's steps are synchronous and trio runs one task at a time.

The loop knows nothing of PostgreSQL: ``refresh`` and ``dispatch`` are given to it, so
unit tests drive this very loop under ``trio.testing.MockClock``.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs
import trio

from ..clock import WallClock
from ..core.admission import Admission, Ticket
from ..core.coalescer import RefreshCoalescer
from ..core.deadlines import DeadlineSet


class Chore(Protocol):
    """An armed time that is not a job's deadline (the retention prune): the loop sleeps
    until it like any deadline and fires it; no claim, no admission, no SQL of its own."""

    def due_at(self) -> float | None:
        """When it is due (wall-clock epoch seconds); ``None``: not armed (e.g. while it
        runs). Read every turn: keep it a lookup."""
        ...

    def fire(self, nursery: trio.Nursery) -> None:
        """Start the work as a task in ``nursery`` (it must not block the loop) and
        disarm until it is done; kick the loop when it arms again."""
        ...


@attrs.define(eq=False)
class DispatchLoop:
    """The daemon's one deciding task (see the module docstring)."""

    clock: WallClock
    deadlines: DeadlineSet
    coalescer: RefreshCoalescer
    admission: Admission
    #: A deadline fell due: ``on_due(job_id, at)`` (``at`` in wall-clock epoch seconds).
    on_due: Callable[[int, float], None]
    #: A refresh the coalescer granted.
    refresh: Callable[[], Awaitable[object]]
    #: One admitted ticket, run as a task in the calls nursery, with its place in the
    #: order admission let tickets start (calls start in that order).
    dispatch: Callable[[Ticket, int], Awaitable[None]]
    #: Other armed times (see :class:`Chore`).
    chores: list[Chore] = attrs.field(factory=list)
    _kicked: trio.Event = attrs.field(factory=trio.Event)
    #: The calls nursery, and whether the loop sleeps between turns (turn_now may act).
    _calls: trio.Nursery | None = None
    _asleep: bool = False
    #: Turns taken (for tests and the curious).
    turns: int = 0
    #: Tickets admitted so far (each one's sequence number).
    admitted: int = 0
    #: Dispatch tasks started whose first step has not run yet (a claim about to be sent
    #: asks: should it wait for them to join its batch?).
    starting: int = 0

    def kick(self) -> None:
        """Something changed: take a turn now. Safe to call from any task or callback."""
        self._kicked.set()

    def wake(self, *, urgent: bool = False) -> None:
        """Ask the coalescer for a refresh (spacing applies unless ``urgent``)."""
        self.coalescer.wake(trio.current_time(), urgent=urgent)
        self._kicked.set()

    def turn_now(self) -> None:
        """Take the steps of a turn that need no refresh (due deadlines and chores, then
        admission) now, in the caller's task, if the loop sleeps between turns and the
        coalescer grants nothing yet; otherwise kick it. For a wake that offered work:
        its claim starts this scheduler round, not the next."""
        refresh_at = self.coalescer.due_at()
        if (
            not self._asleep
            or self._calls is None
            or (refresh_at is not None and refresh_at <= trio.current_time())
        ):
            self.kick()
            return
        self.turns += 1
        self._due(self._calls)
        self._admit(self._calls)

    async def run(self, calls: trio.Nursery) -> None:
        """Turn until cancelled; dispatch tasks are started in ``calls``."""
        self._calls = calls
        try:
            while True:
                self._kicked = trio.Event()
                self.turns += 1
                self._due(calls)
                if self.coalescer.take(trio.current_time()):
                    await self.refresh()
                    continue
                self._admit(calls)
                self._asleep = True
                try:
                    await self._sleep()
                finally:
                    self._asleep = False
        finally:
            self._calls = None

    def _due(self, calls: trio.Nursery) -> None:
        """Step 1: every passed deadline to ``on_due``, every passed chore fired."""
        now = self.clock.now().timestamp()
        for at, job_id in self.deadlines.pop_due(now):
            self.on_due(job_id, at)
        for chore in self.chores:
            chore_at = chore.due_at()
            if chore_at is not None and chore_at <= now:
                chore.fire(calls)

    def _admit(self, calls: trio.Nursery) -> None:
        """Step 3: every ticket admission lets start becomes a dispatch task."""
        for ticket in self.admission.admit():
            self.admitted += 1
            self.starting += 1
            calls.start_soon(self._dispatch, ticket, self.admitted)

    async def _dispatch(self, ticket: Ticket, seq: int) -> None:
        self.starting -= 1
        await self.dispatch(ticket, seq)

    def next_wake_at(self) -> float:
        """The trio time the loop sleeps until, unless kicked (``inf``: no timer)."""
        candidates = [math.inf]
        times = [chore.due_at() for chore in self.chores]
        earliest = self.deadlines.earliest()
        if earliest is not None:
            times.append(earliest[0])
        armed = [at for at in times if at is not None]
        if armed:
            delay = min(armed) - self.clock.now().timestamp()
            candidates.append(trio.current_time() + max(0.0, delay))
        due = self.coalescer.due_at()
        if due is not None:
            candidates.append(due)
        return min(candidates)

    async def _sleep(self) -> None:
        with trio.move_on_at(self.next_wake_at()):
            await self._kicked.wait()


__all__ = ["Chore", "DispatchLoop"]
