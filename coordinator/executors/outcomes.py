"""Outcome building shared by the executors: the words and shapes of how a call ended.

Every executor ends a call the same few ways (it finished, timed out, was abandoned at
stop, could not start); the messages operators read and scripts match on are built
here once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from ..model import Outcome
from ..text import clip, seconds_text

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import datetime, timedelta

    from ..clock import WallClock
    from ..model import Claim, Cursor, ErrorCause, Finding, OutcomeStatus
    from ..protocol import Category

#: Message of an outcome whose call was abandoned because the daemon is stopping.
CANCELLED_MESSAGE: Final = "cancelled: daemon stopping"
#: Why a recoverable run paused, by what stopped it (``Executor.cancel`` reasons first).
PAUSE_REASONS: Final = {
    "pause": "paused by operator",
    "stopping": "paused: the daemon is stopping",
    "abandon": "paused: the daemon stopped waiting for it (stop timeout)",
    "worker": "paused by the worker",
    "unstarted": "paused by operator before the call started",
}


def ended(
    clock: WallClock,
    started_at: datetime,
    status: OutcomeStatus,
    cause: ErrorCause | None,
    message: str | None,
    extra: dict[str, Any] | None = None,
    *,
    count: int | None = None,
    finished_at: datetime | None = None,
    category: Category | None = None,
    retryable: bool | None = None,
    cursor: Cursor | None = None,
    findings: Iterable[Finding] = (),
) -> Outcome:
    """An outcome finishing now (or at ``finished_at``), its message bounded.
    ``category`` and ``retryable``: see :class:`~coordinator.model.Outcome`."""
    return Outcome(
        status=status,
        started_at=started_at,
        finished_at=clock.now() if finished_at is None else finished_at,
        count=count,
        extra=extra or {},
        error_cause=cause,
        error_message=None if message is None else clip(message),
        category=category,
        retryable=retryable,
        cursor=cursor,
        findings=tuple(findings),
    )


def cancelled(
    clock: WallClock, started_at: datetime, extra: dict[str, Any] | None = None
) -> Outcome:
    """The call was abandoned because the daemon is stopping."""
    return ended(clock, started_at, "cancelled", None, CANCELLED_MESSAGE, extra)


def given_back(clock: WallClock, why: str) -> Outcome:
    """The call was never sent and the run is given back (``why``: never saved, told in
    the daemon's ``run.given_back`` line): nothing of it ran, so it is not a failure."""
    now = clock.now()
    return ended(clock, now, "queued", None, why, finished_at=now)


def not_sent(clock: WallClock, claim: Claim, why: str, *, give_back: bool = True) -> Outcome:
    """A claimed run whose call was never sent and cannot be now (``why``), for every
    executor and the dispatcher alike: a run that never started is given back (``queued``
    again, or a run of the schedule removed so that its deadline stands), a recoverable
    job's too. A run resumed before keeps its first start, so it cannot be
    ``queued`` again: a recoverable one pauses where it was (a trigger or its next tick
    resumes it), any other fails (``crashed``). So does one whose give-back would only be
    claimed again at once (``give_back=False``).

    (An operator's pause asked while the run was claimed leaves it ``cancel_requested``;
    the give-back then ends it ``paused``, as asked: migrations/0025.)"""
    now = clock.now()
    if give_back and not claim.resumes:
        # (A recoverable job's retry is a new run, never started, that carries the failed
        # attempt's cursor: given back, cursor kept, as the database allows.)
        return given_back(clock, why)
    if claim.job.recoverable:
        return ended(
            clock, now, "paused", None, f"paused: {why}", count=claim.count, cursor=claim.cursor
        )
    return ended(clock, now, "failed", "crashed", why)


def timed_out_message(timeout: timedelta) -> str:
    """``timed out after 2s``."""
    return f"timed out after {seconds_text(timeout)}s"


__all__ = [
    "CANCELLED_MESSAGE",
    "PAUSE_REASONS",
    "cancelled",
    "ended",
    "given_back",
    "not_sent",
    "timed_out_message",
]
