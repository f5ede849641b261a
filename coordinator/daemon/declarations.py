"""Schedules declared by a worker's code (the ``declare`` message), made into the entries
``coordinator.sync`` stores: a manifest sent by the code (docs/worker-protocol.md,
"Schedules declared in code").

Pure: the wire form was checked by :mod:`coordinator.protocol` (shapes, names, one
schedule key per job); what is read here is what the manifest reads from a file -- a
cron expression and its timezone, an interval, an instant, a timeout, a priority -- with
the same functions and the same words. Any problem refuses the whole declaration
(nothing applied, as ``coordinator sync`` without ``--allow-invalid``): a typo in the
code must not pause or make inert what runs today. ``params`` are redacted
(:mod:`coordinator.redact`): secrets are never stored. The retry, misfire and retention
policies, ``recoverable`` and ``alert`` are checked by :mod:`coordinator.policies`, as
``define_job`` checks them; what a job does not declare is the default, as for a
manifest entry without it (a declaration is the job's whole definition).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

import attrs

from .. import redact
from .. import schedule as schedules
from ..errors import InvalidInput
from ..model import (
    DEFAULT_RETRY_BACKOFF,
    DEFAULT_RETRY_MAX_DELAY,
    PRIORITIES,
    Schedule,
    ScheduleKind,
    Target,
)
from ..policies import check_misfire, check_retention, check_retry_policy

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
    timezone = "UTC" if job.timezone is None else job.timezone
    schedule = Schedule(kind=kind, expression=job.expression, timezone=timezone)
    if kind == "interval" and job.expression is not None:
        schedules.parse_duration(job.expression, field="every", unit_required=True)
    schedules.validate(schedule)
    timeout = _duration(job.timeout, "timeout")
    if timeout is not None:
        schedules.check_duration(timeout, "timeout")
    priority = "background" if job.priority is None else job.priority
    if priority not in PRIORITIES:
        raise InvalidInput("priority", f"must be one of {', '.join(PRIORITIES)}, not {priority!r}")
    retries = 0 if job.retries is None else job.retries
    backoff = _duration(job.retry_backoff, "retry_backoff") or DEFAULT_RETRY_BACKOFF
    max_delay = _duration(job.retry_max_delay, "retry_max_delay") or DEFAULT_RETRY_MAX_DELAY
    check_retry_policy(retries, backoff, max_delay)
    misfire = "run-once" if job.misfire is None else job.misfire
    grace = _duration(job.misfire_grace, "misfire_grace")
    check_misfire(misfire, grace)
    retention = _duration(job.retention, "retention")
    check_retention(job.keep_last, retention)
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
        "retries": retries,
        "retry_backoff": _interval_text(backoff),
        "retry_max_delay": _interval_text(max_delay),
        "misfire": misfire,
        "misfire_grace": _interval_text(grace) if grace is not None else None,
        "recoverable": job.recoverable,
        "alert": job.alert,
        "keep_last": job.keep_last,
        "retention": _interval_text(retention) if retention is not None else None,
    }
    # Without "paused" a job keeps an operator's pause and loses a sync's (0007's sync):
    # the code pauses a job only by saying so.
    if job.paused:
        entry["paused"] = True
    return entry


def _duration(text: str | None, field: str) -> timedelta | None:
    """A declared duration (text with its unit, as in a manifest), or ``None``."""
    if text is None:
        return None
    return schedules.parse_duration(text, field=field, unit_required=True)


def _interval_text(value: timedelta) -> str:
    """A timedelta as text PostgreSQL reads as an interval, exactly (as the client's)."""
    return f"{value // timedelta(microseconds=1)} microseconds"
