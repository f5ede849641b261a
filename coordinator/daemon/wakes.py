"""Wake payloads: what a NOTIFY says changed, read as a hint and never as an authority.

Any role may ``NOTIFY coordinator`` with any text, so a payload is only a hint: it can
make the daemon look sooner (a coalesced refresh, or a claim that PostgreSQL itself
rechecks under the row lock), never make it believe something. This module turns the
text into a typed hint, or ``None`` for anything that is not one of the shapes the
triggers send (``migrations/0001``); it is pure and never raises.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import attrs

from ..core.admission import Priority

#: Longest payload read (PostgreSQL's own limit is 8000 bytes).
MAX_PAYLOAD: Final = 8000
_MAX_ID: Final = 2**63 - 1
_PRIORITIES: Final = ("interactive", "background")
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)


@attrs.frozen(kw_only=True)
class Dispatch:
    """A manual run was committed: claim it directly (the claim rechecks everything)."""

    run_id: int
    job_id: int
    priority: Priority
    #: The job's worker type, or ``None`` for a command.
    worker_type: str | None
    #: When the run was created (its ``created_at``, epoch microseconds, the database's
    #: clock), which orders it among the manual runs of its priority as a refresh orders
    #: them; ``None`` from a schema before migrations/0027.
    created_us: int | None = None

    @property
    def created(self) -> float | None:
        """:attr:`created_us` in epoch seconds, as :func:`epoch` gives a refresh's."""
        return None if self.created_us is None else self.created_us / 1_000_000


@attrs.frozen(kw_only=True)
class Pause:
    """An operator asked a running call to pause (``coordinator.pause_run``): tell its
    executor. Only ever a request to stop a call this daemon runs; unknown runs are
    ignored, and the run's state in the database is what a refresh acts on."""

    run_id: int


@attrs.frozen(kw_only=True)
class Changed:
    """Jobs or runs changed: a coalesced refresh. ``job_ids`` names the jobs when the
    payload did (a hint for a refresh of just those), ``None`` when it could be any."""

    job_ids: tuple[int, ...] | None = None


Hint = Dispatch | Pause | Changed


def parse(text: str) -> Hint | None:
    """The hint in a payload, or ``None`` when it is not one the triggers send."""
    if len(text) > MAX_PAYLOAD:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    if data.get("dispatch") is True:
        return _dispatch(data)
    keys = set(data)
    if keys == {"job"} and _is_id(data["job"]):
        return Changed(job_ids=(data["job"],))
    if keys == {"run"} and _is_id(data["run"]):
        return Changed()
    if keys == {"pause"} and _is_id(data["pause"]):
        return Pause(run_id=data["pause"])
    if keys in ({"jobs"}, {"runs"}) and data.get("jobs", data.get("runs")) == "many":
        return Changed()
    if keys == {"sync"} and isinstance(data["sync"], str):
        return Changed()
    return None


def _dispatch(data: dict[str, Any]) -> Dispatch | None:
    if set(data) - {"dispatch", "run", "job", "priority", "worker", "at"}:
        return None
    run_id, job_id, at = data.get("run"), data.get("job"), data.get("at")
    priority, worker = data.get("priority"), data.get("worker")
    if not (isinstance(run_id, int) and _is_id(run_id)):
        return None
    if not (isinstance(job_id, int) and _is_id(job_id)) or priority not in _PRIORITIES:
        return None
    if worker is not None and (not isinstance(worker, str) or not worker or len(worker) > 200):
        return None
    if at is not None and not (isinstance(at, int) and not isinstance(at, bool)):
        return None
    if at is not None and not 0 <= at <= _MAX_ID:  # (a huge one overflowed the division)
        return None
    return Dispatch(
        run_id=run_id, job_id=job_id, priority=priority, worker_type=worker, created_us=at
    )


def epoch(moment: datetime) -> float:
    """``moment`` in epoch seconds, through whole microseconds: the same float as
    :attr:`Dispatch.created` for the same instant, so that a run ordered by its wake and
    one ordered by a refresh compare exactly (ties go to admission's sequence)."""
    return ((moment - _EPOCH) // _MICROSECOND) / 1_000_000


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= _MAX_ID


#: Dispatch hints parked at most (see :class:`Parked`): beyond it the oldest is dropped
#: and left to the coalesced refresh.
PARKED_LIMIT: Final = 10_000


@attrs.define
class Parked:
    """Dispatch hints of manual runs the daemon could not offer when they came: their job
    not read yet, their worker type served by nobody. A worker of the type connecting
    takes them (in the order they came, each due when its run was created), so that the
    run starts then instead of at the next coalesced refresh; a refresh that reads their
    jobs forgets them (it offers what is really queued). Bounded: the oldest goes first.
    Pure: the daemon decides when."""

    limit: int = PARKED_LIMIT
    #: job id -> (hint, its due time, epoch seconds); in the order they came.
    _hints: dict[int, tuple[Dispatch, float]] = attrs.field(factory=dict)
    #: worker type -> how many of ``_hints`` wait for it.
    _types: dict[str, int] = attrs.field(factory=dict)

    def __len__(self) -> int:
        return len(self._hints)

    def park(self, hint: Dispatch, came: float) -> None:
        """Keep ``hint``. A newer one for the same job replaces the older (and goes last),
        unless it names the same run: that run keeps the place it came first."""
        before = self._hints.get(hint.job_id)
        if before is not None and before[0].run_id == hint.run_id:
            return
        self._drop(hint.job_id)
        if self._hints and len(self._hints) >= self.limit:
            self._drop(next(iter(self._hints)))
        self._hints[hint.job_id] = (hint, came)
        kind = hint.worker_type or ""
        self._types[kind] = self._types.get(kind, 0) + 1

    def take(self, served: frozenset[str]) -> list[tuple[Dispatch, float]]:
        """Remove and return the hints whose type is in ``served``, oldest first."""
        if not any(kind in served for kind in self._types):
            return []
        taken = [
            (hint, came)
            for hint, came in self._hints.values()
            if (hint.worker_type or "") in served
        ]
        for hint, _ in taken:
            self._drop(hint.job_id)
        return taken

    def forget(self, job_ids: frozenset[int] | None) -> None:
        """A refresh is about to read these jobs (``None``: all of them)."""
        if job_ids is None:
            self._hints.clear()
            self._types.clear()
            return
        for job_id in job_ids:
            self._drop(job_id)

    def _drop(self, job_id: int) -> None:
        found = self._hints.pop(job_id, None)
        if found is None:
            return
        kind = found[0].worker_type or ""
        left = self._types[kind] - 1
        if left:
            self._types[kind] = left
        else:
            del self._types[kind]


__all__ = ["PARKED_LIMIT", "Changed", "Dispatch", "Hint", "Parked", "Pause", "parse"]
