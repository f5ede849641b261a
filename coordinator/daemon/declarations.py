"""Schedules declared by a worker's code (the ``declare`` message), made into the entries
``coordinator.sync`` stores: a manifest sent by the code (docs/worker-protocol.md,
"Schedules declared in code").

Pure: the wire form was checked by :mod:`coordinator.protocol` (shapes, names, one
schedule key per job); what is read here is what the manifest reads from a file -- a
cron expression and its timezone, an interval, an instant, a timeout, a priority -- with
the same functions and the same words. Any problem refuses the whole declaration
(nothing applied, as ``coordinator sync`` without ``--allow-invalid``): a typo in the
code must not pause or make inert what runs today. ``params`` are redacted
(:mod:`coordinator.redact`): secrets are never stored. The retry and misfire policies
are not declared (``coordinator.sync`` gives a listed job the defaults).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

import attrs

from .. import redact
from .. import schedule as schedules
from ..errors import InvalidInput
from ..model import PRIORITIES, Schedule, ScheduleKind, Target

if TYPE_CHECKING:
    from ..protocol import Declare, DeclaredJob

__all__ = ["Declaration", "read"]

_KINDS: Final[dict[str, ScheduleKind]] = {
    "cron": "cron",
    "every": "interval",
    "at": "once",
    "manual": "manual",
}


@attrs.frozen(kw_only=True)
class Declaration:
    """A ``declare`` read: the entries to sync, or the problems that refuse it."""

    namespace: str
    #: ``coordinator.sync``'s entries (empty when there are problems).
    entries: tuple[dict[str, Any], ...] = ()
    #: ``job: field: reason``, in the order declared.
    problems: tuple[str, ...] = ()


def read(declare: Declare) -> Declaration:
    """The entries of ``declare``, or its problems (none applied if any)."""
    entries: list[dict[str, Any]] = []
    problems: list[str] = []
    for job in declare.jobs:
        try:
            entries.append(_entry(job))
        except InvalidInput as exc:
            problems.append(f"{job.name}: {exc.field}: {exc.reason}")
    if problems:
        return Declaration(namespace=declare.namespace, problems=tuple(problems))
    return Declaration(namespace=declare.namespace, entries=tuple(entries))


def _entry(job: DeclaredJob) -> dict[str, Any]:
    kind = _KINDS[job.schedule]
    if job.timezone is not None and kind != "cron":
        raise InvalidInput("timezone", "only applies to cron schedules")
    schedule = Schedule(kind=kind, expression=job.expression, timezone=job.timezone or "UTC")
    if kind == "interval" and job.expression is not None:
        schedules.parse_duration(job.expression, field="every", unit_required=True)
    schedules.validate(schedule)
    timeout: timedelta | None = None
    if job.timeout is not None:
        timeout = schedules.parse_duration(job.timeout, field="timeout", unit_required=True)
        schedules.check_duration(timeout, "timeout")
    priority = job.priority or "background"
    if priority not in PRIORITIES:
        raise InvalidInput("priority", f"must be one of {', '.join(PRIORITIES)}, not {priority!r}")
    entry: dict[str, Any] = {
        "name": job.name,
        "schedule_kind": kind,
        "schedule": schedules.normalize(schedule).expression,
        "timezone": schedule.timezone,
        "target": Target(kind="worker", worker_type=job.job_type).to_json(),
        "params": redact.default().value(job.params),
        "timeout": _interval_text(timeout) if timeout is not None else None,
        "priority": priority,
        "idempotent": job.idempotent,
        "invalid_reason": None,
    }
    # Without "paused" a job keeps an operator's pause and loses a sync's (0007's sync):
    # the code pauses a job only by saying so.
    if job.paused:
        entry["paused"] = True
    return entry


def _interval_text(value: timedelta) -> str:
    """A timedelta as text PostgreSQL reads as an interval, exactly (as the client's)."""
    return f"{value // timedelta(microseconds=1)} microseconds"
