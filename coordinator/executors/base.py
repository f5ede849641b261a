"""The executor contract, lifecycle hooks included.

The daemon holds a mapping ``target kind -> Executor`` and uses nothing but this
protocol: it starts every executor's :meth:`Executor.serve` once it leads (a standby
must not take the leader's worker socket), asks :meth:`Executor.capacities` which pools
exist and how many calls each takes, checks :meth:`Executor.available` before a call,
and at stop calls :meth:`Executor.detach`. An executor reports changes of its pools
through the :class:`ExecutorHooks` it is attached to.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    import trio

    from ..model import Claim, Outcome, Target
    from ..status import WorkerView


def _nothing() -> None:
    return None


async def _save_nothing(_run_id: int, _snapshot: dict[str, Any]) -> None:
    return None


@attrs.frozen(kw_only=True)
class ExecutorHooks:
    """What an executor may ask of the daemon."""

    #: The pools or their capacities changed (a worker came, left or said ``bye``).
    changed: Callable[[], None] = _nothing
    #: Save a running call's latest progress snapshot (``runs.progress``).
    save_progress: Callable[[int, dict[str, Any]], Awaitable[None]] = _save_nothing


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
        """At stop: accept nothing new and send no new calls; calls in flight go on."""
        ...

    def capacities(self) -> Mapping[str, int]:
        """Capacity of each pool (a worker type) this executor serves now; pools it does
        not list have capacity 0. Targets that need no pool (commands) are not listed."""
        ...

    def connections(self) -> Sequence[WorkerView]:
        """What is connected to it, for the status snapshot (workers)."""
        ...

    def available(self, target: Target) -> bool:
        """Whether this executor can call ``target`` right now."""
        ...

    async def call(self, claim: Claim, *, abandon: trio.Event) -> Outcome:
        """Call the claimed run and report how it ended.

        Setting ``abandon`` (the daemon's stop timeout ran out, or a second Ctrl-C) stops
        the call; it then returns a ``cancelled`` outcome. Never raises for anything the
        job does.
        """
        ...


__all__ = ["Executor", "ExecutorHooks"]
