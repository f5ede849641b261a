"""Executors: how a claimed run is called (DESIGN.md §4).

An executor is part of the shell: it does I/O (subprocesses, sockets) and never raises
for anything the job does; whatever happens becomes an :class:`~coordinator.model.Outcome`.
Only ``trio.Cancelled`` may propagate, after the executor has stopped what it started.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from coordinator.executors.exec import ExecExecutor as ExecExecutor

if TYPE_CHECKING:
    import trio

    from coordinator.model import Claim, Outcome, Target

__all__ = ["ExecExecutor", "Executor"]


class Executor(Protocol):
    """Something that can call a run's target."""

    def available(self, target: Target) -> bool:
        """Whether this executor can call ``target`` right now."""
        ...

    async def call(self, claim: Claim, *, abandon: trio.Event) -> Outcome:
        """Call the claimed run and report how it ended.

        Setting ``abandon`` (the daemon's stop timeout ran out) stops the call; it then
        returns a ``cancelled`` outcome. Never raises for anything the job does.
        """
        ...
