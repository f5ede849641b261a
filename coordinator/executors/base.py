"""The executor contract, lifecycle hooks included.

The daemon holds a mapping ``target kind -> Executor`` and uses nothing but this
protocol: it starts every executor's :meth:`Executor.serve` once it leads (a standby
must not take the leader's worker socket), asks :meth:`Executor.capacities` which pools
exist and how many calls each takes (and :meth:`Executor.coverage` which namespaces
each may run), checks :meth:`Executor.available` before a call,
and at stop calls :meth:`Executor.detach`. An executor reports changes of its pools,
and writes what a running call reports (progress, checkpoints, findings), through the
:class:`ExecutorHooks` it is attached to. :meth:`Executor.cancel` asks one call to stop
early: an operator paused its run, or the daemon is stopping (a recoverable call then
ends ``paused`` at its cursor).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs

from ..model import CheckpointWrite
from ..protocol import Declare, Declared

if TYPE_CHECKING:
    import trio

    from ..core.admission import Coverage
    from ..model import Claim, Outcome, Target
    from ..status import WorkerView


def _nothing() -> None:
    return None


def _always(_since: float) -> bool:
    return True


async def _save_nothing(_run_id: int, _snapshot: dict[str, Any]) -> None:
    return None


async def _checkpoint_nothing(_run_id: int, _write: CheckpointWrite) -> bool:
    return False


async def _declare_nothing(declare: Declare, _worker: str) -> Declared:
    return Declared(namespace=declare.namespace, ok=False, error="declarations are not accepted")


@attrs.frozen(kw_only=True)
class ExecutorHooks:
    """What an executor may ask of the daemon."""

    #: The pools or their capacities changed (a worker came, left or said ``bye``).
    changed: Callable[[], None] = _nothing
    #: Whether a claimed run whose call began at trio time ``since`` may be sent now:
    #: ``False`` while the daemon's lead is lost and once it was lost after ``since``,
    #: when another daemon may have swept that run (it then fails unsent rather than
    #: maybe run twice).
    may_send: Callable[[float], bool] = _always
    #: Save a running call's latest progress snapshot (``runs.progress``).
    save_progress: Callable[[int, dict[str, Any]], Awaitable[None]] = _save_nothing
    #: Save what a running call reported since the last write: its cursor and counter
    #: (recoverable runs) and findings; one statement. ``False`` when the run is no
    #: longer running. An executor coalesces these (at most one write every couple of
    #: seconds per run) and never calls it once the call's result is handed back: what
    #: is left goes with the outcome (``Outcome.cursor``, ``Outcome.findings``).
    save_checkpoint: Callable[[int, CheckpointWrite], Awaitable[bool]] = _checkpoint_nothing
    #: Sync the schedules a worker declared (``declare``, already checked against the
    #: worker's scope) and say what it did; the second argument names the worker.
    declare: Callable[[Declare, str], Awaitable[Declared]] = _declare_nothing


class Turn(Protocol):
    """A call's place among the calls one claim statement granted: they start in
    admission's order (docs/design.md, "Claims"). An executor passes it exactly once,
    by one of the two methods, before its call first waits for anything long."""

    def take(self, first_step: Callable[[], None], *, starts: bool = True) -> None:
        """Take ``first_step`` (synchronous, must not raise: queue the call's line) in
        this call's turn: now, or as soon as the calls granted before it have started,
        from whichever task starts the last of them. Never waits. ``starts=False``: the
        step does not start the call (it joins a queue of calls waiting for a slot, or
        nothing was sent): the call is told as started by a later ``take`` that does, if
        any (a take after the turn's first runs its step at once)."""
        ...

    async def reached(self) -> None:
        """Wait until the calls granted before this one have started; the caller starts
        its own with a :meth:`take` before it next yields (spawns the process). The turn
        stays this call's until then: if it stops first (it never started), the
        dispatcher passes the turn on."""
        ...

    def alone(self) -> bool:
        """No other call was granted with this one: its first step may take a shortcut
        meant for a lone call (a worker line written at once rather than by the
        connection's writer task). Under load a batch's calls keep going out together:
        one call sent ahead of its batch comes back ahead of it too, and splits the next
        claim batch in two."""
        ...


@attrs.frozen
class AtOnce:
    """The turn of a call granted on its own: every step at once."""

    def take(self, first_step: Callable[[], None], *, starts: bool = True) -> None:
        first_step()

    async def reached(self) -> None:
        return None

    def alone(self) -> bool:
        return True


#: For calls made outside a claim batch (tests, tools).
AT_ONCE: Final = AtOnce()


class Executor(Protocol):
    """Something that can call a run's target."""

    def attach(self, hooks: ExecutorHooks) -> None:
        """Called once by the daemon before :meth:`serve`."""
        ...

    async def serve(self, *, task_status: trio.TaskStatus[None] = ...) -> None:
        """Open what the executor needs (a listening socket...) once the daemon leads;
        ``task_status.started()`` when ready. May return at once if it serves nothing;
        otherwise runs until cancelled."""
        ...

    async def detach(self) -> None:
        """At stop: accept nothing new (nothing new is claimed); calls in flight go on,
        and runs already claimed are still called (a claimed run is admitted work)."""
        ...

    def capacities(self) -> Mapping[str, int]:
        """Capacity of each pool (a worker type) this executor serves now; pools it does
        not list have capacity 0. Targets that need no pool (commands) are not listed."""
        ...

    def coverage(self) -> Mapping[str, Coverage]:
        """For each pool some of whose workers may run only some namespaces (their
        tokens' scope), which namespaces it covers, with how many slots: admission keeps
        a namespace none of them may run waiting. Pools it does not list run every
        namespace up to their capacity."""
        ...

    def connections(self) -> Sequence[WorkerView]:
        """What is connected to it, for the status snapshot (workers)."""
        ...

    def available(self, target: Target) -> bool:
        """Whether this executor can call ``target`` right now."""
        ...

    async def call(self, claim: Claim, *, abandon: trio.Event, turn: Turn = AT_ONCE) -> Outcome:
        """Call the claimed run and report how it ended. The call's first step is taken
        in ``turn`` (:class:`Turn`).

        Setting ``abandon`` (the daemon's stop timeout ran out, or a second Ctrl-C) stops
        the call; it then returns a ``cancelled`` outcome (``paused`` for a recoverable
        job). Never raises for anything the job does. A recoverable job's call hands the
        claim's cursor and counter on, and its outcome carries the cursor and counter
        total to save (``paused`` whenever it was stopped rather than finished).
        """
        ...

    def cancel(self, run_id: int, reason: str) -> bool:
        """Ask the call of ``run_id`` to stop early; ``reason`` is ``pause`` (an operator
        paused the run) or ``stopping`` (the daemon is stopping). The call then ends as
        usual, through :meth:`call`'s outcome. Returns whether this executor has that
        call (or is about to start it). Executors whose targets cannot be recoverable
        (commands) have none to stop and return ``False``."""
        ...


__all__ = ["AT_ONCE", "AtOnce", "Executor", "ExecutorHooks", "Turn"]
