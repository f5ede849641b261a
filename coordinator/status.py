"""The daemon as the outside sees it: one typed, SQL-free snapshot.

:meth:`coordinator.daemon.Daemon.status` builds a :class:`DaemonStatus` from memory; the
admin API (``/api/status``, ``/healthz``), the metrics' gauges, systemd's ``STATUS=``
line and ``coordinator status`` read it. Nothing outside the daemon reads its attributes.

Layering: a value module (no I/O); ``admin/`` imports it, the daemon builds it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

import attrs

from .events import iso

#: The state words, and what the API calls each (``ready`` is ``leader``).
STATES: Final = ("starting", "standby", "ready", "degraded", "stopping", "stopped")
_ROLES: Final = {"ready": "leader"}


def status_line(
    state: str,
    *,
    armed: int,
    next_deadline: datetime | None,
    running: int,
    held: int,
    degraded: tuple[str, ...] = (),
) -> str:
    """``ready: 3 armed, next 2026-...Z, 1 running, 0 retained`` (systemd's ``STATUS=``),
    from counts alone: the daemon sends it without building a whole snapshot."""
    text = (
        f"{state}: {armed} armed, next {iso(next_deadline) or 'none'}, {running} running, "
        f"{held} retained"
    )
    if degraded:
        text += f" ({'; '.join(degraded)})"
    return text


@attrs.frozen(kw_only=True)
class RunningCall:
    """A call in progress."""

    #: The job's ``namespace/name`` (``#id`` when the daemon no longer lists it).
    job: str
    job_id: int
    #: The run being served.
    run: int
    #: Seconds since the call started.
    running_s: float


@attrs.frozen(kw_only=True)
class HeldResultView:
    """A result the database has not acknowledged yet."""

    run: int
    job: str
    #: The call's outcome (``succeeded``, ``failed`` ...), kept exactly.
    outcome: str
    #: Attempts to save it so far, and why the last one failed.
    attempts: int
    error: str | None = None


@attrs.frozen(kw_only=True)
class WorkerView:
    """One connected worker."""

    id: str
    types: tuple[str, ...]
    capacity: int
    #: Calls it is running now.
    busy: int
    #: Said ``bye``: finishing its calls, taking no new ones.
    draining: bool
    #: ``unix`` or ``tcp``, and who is on the other end.
    transport: str
    peer: str
    connected_at: datetime
    #: The namespaces whose calls it may receive (its token's scope); ``None``: every one.
    namespaces: tuple[str, ...] | None = None

    def may_run(self, kind: str, namespace: str) -> bool:
        """Whether a call of type ``kind`` in ``namespace`` may go to it (draining aside)."""
        return kind in self.types and (self.namespaces is None or namespace in self.namespaces)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "types": list(self.types),
            "namespaces": None if self.namespaces is None else list(self.namespaces),
            "capacity": self.capacity,
            "busy": self.busy,
            "draining": self.draining,
            "transport": self.transport,
            "peer": self.peer,
            "connected_at": iso(self.connected_at),
        }


@attrs.frozen(kw_only=True)
class ArmedDeadline:
    """One job's armed deadline (listed only when asked: the metrics)."""

    #: ``namespace/name``.
    job: str
    at: datetime
    #: The typical time between two of its deadlines (seconds), if it has one.
    interval_s: float | None = None


@attrs.frozen(kw_only=True)
class DaemonStatus:
    """What ``/api/status`` (and ``coordinator status``) reports. Built without SQL."""

    #: ``starting``, ``standby``, ``ready``, ``degraded``, ``stopping`` or ``stopped``.
    state: str
    #: ``host:pid:random`` of the daemon process.
    instance: str
    #: Seconds since the daemon started.
    uptime_s: float
    #: This daemon holds the single-writer lock.
    leading: bool
    #: The backend pid of the session holding the lock while leading (``None``: not
    #: leading), which the database names too (``pg_locks``): ``coordinator status``
    #: tells by it whether this daemon is the one of the database it asks.
    lock_pid: int | None = None
    #: Jobs the daemon knows (valid ones, from the last refresh), armed deadlines.
    jobs: int
    armed_deadlines: int
    #: The earliest armed deadline and its job, or ``None``.
    next_deadline: datetime | None = None
    next_job: str | None = None
    running: tuple[RunningCall, ...] = ()
    held: tuple[HeldResultView, ...] = ()
    workers: tuple[WorkerView, ...] = ()
    #: Inventory refreshes done, and when the last one ended (``None`` before the first).
    refreshes: int = 0
    last_refresh: datetime | None = None
    #: Why the daemon is degraded, one line per cause (empty when it is not).
    degraded: tuple[str, ...] = ()
    #: Statements the daemon has sent (its own count; proofs use the server's).
    sql_statements: int = 0
    #: Jobs blocked by an unresolved run (as of the last refresh), paused and invalid
    #: ones too.
    unresolved: int = 0
    #: When the next retention prune is armed for (``None``: pruning is off or running).
    next_prune: datetime | None = None
    #: Armed deadlines of some jobs (only when asked for: ``Daemon.status(deadlines=N)``).
    deadlines: tuple[ArmedDeadline, ...] = ()

    @property
    def role(self) -> str:
        """The state as the API names it: ``leader`` for ``ready``."""
        return _ROLES.get(self.state, self.state)

    @property
    def healthy(self) -> bool:
        """Leading and connected: ``/healthz`` answers 200 only then."""
        return self.state == "ready"

    @property
    def served_types(self) -> tuple[str, ...]:
        """Job types some connected (not draining) worker serves."""
        return tuple(sorted({t for w in self.workers if not w.draining for t in w.types}))

    def serves(self, kind: str, namespace: str) -> bool:
        """Some connected (not draining) worker serves ``kind`` and may run jobs of
        ``namespace`` (its token's scope)."""
        return any(not w.draining and w.may_run(kind, namespace) for w in self.workers)

    @property
    def running_calls(self) -> int:
        return len(self.running)

    @property
    def held_results(self) -> int:
        return len(self.held)

    def line(self) -> str:
        """One line for systemd's ``STATUS=``."""
        return status_line(
            self.state,
            armed=self.armed_deadlines,
            next_deadline=self.next_deadline,
            running=len(self.running),
            held=len(self.held),
            degraded=self.degraded,
        )

    def to_json(self) -> dict[str, Any]:
        """The ``/api/status`` body."""
        return {
            "state": self.role,
            "daemon_state": self.state,
            "instance": self.instance,
            "uptime_s": round(self.uptime_s, 3),
            "leading": self.leading,
            "lock_pid": self.lock_pid,
            "jobs": self.jobs,
            "armed_deadlines": self.armed_deadlines,
            "next_deadline": (
                {"at": iso(self.next_deadline), "job": self.next_job}
                if self.next_deadline is not None
                else None
            ),
            "running": [
                {"job": c.job, "job_id": c.job_id, "run": c.run, "running_s": c.running_s}
                for c in self.running
            ],
            "retained": [
                {
                    "run": r.run,
                    "job": r.job,
                    "outcome": r.outcome,
                    "attempts": r.attempts,
                    "error": r.error,
                }
                for r in self.held
            ],
            "workers": list(self.served_types),
            "worker_connections": [w.to_json() for w in self.workers],
            "refreshes": self.refreshes,
            "last_refresh": iso(self.last_refresh),
            "degraded": list(self.degraded),
            "sql_statements": self.sql_statements,
            "unresolved": self.unresolved,
            "next_prune": iso(self.next_prune),
        }


__all__ = [
    "STATES",
    "ArmedDeadline",
    "DaemonStatus",
    "HeldResultView",
    "RunningCall",
    "WorkerView",
    "status_line",
]
