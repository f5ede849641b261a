"""One job shape: the columns that make a job's definition, and how a row becomes a value.

The store (the daemon's claim) and the client (``jobs list``/``show``, the admin API)
both read job definitions; they share this list and these decoders, so a new job field
is declared here once for both readers (docs/design.md, "Adding a job field", lists the
other places). JSON columns are selected as text (``::text``), so the reads work
whatever jsonb codec an application has set on its connection.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

from .model import Job, Schedule, Target

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .model import ScheduleKind

#: (field, SQL expression on the ``coordinator.jobs`` row aliased ``j``).
JOB_COLUMNS: Final[tuple[tuple[str, str], ...]] = (
    ("id", "j.id"),
    ("namespace", "j.namespace"),
    ("name", "j.name"),
    ("schedule_kind", "j.schedule_kind"),
    ("schedule", "j.schedule"),
    ("timezone", "j.timezone"),
    ("target", "j.target::text"),
    ("params", "j.params::text"),
    ("timeout", "j.timeout"),
    ("priority", "j.priority"),
    ("idempotent", "j.idempotent"),
    ("paused", "j.paused"),
    ("invalid_reason", "j.invalid_reason"),
    ("next_run_at", "j.next_run_at"),
    ("schedule_version", "j.schedule_version"),
    ("retries", "j.retries"),
    ("retry_backoff", "j.retry_backoff"),
    ("retry_max_delay", "j.retry_max_delay"),
    ("misfire", "j.misfire"),
    ("misfire_grace", "j.misfire_grace"),
    ("recoverable", "j.recoverable"),
    ("alert", "j.alert"),
    ("keep_last", "j.keep_last"),
    ("retention", "j.retention"),
)
_MISSING: Final = object()
#: Fields held as JSON objects.
_JSON_FIELDS: Final = frozenset({"target", "params"})


def select_list() -> str:
    """The columns for a ``SELECT ... FROM coordinator.jobs j``."""
    return ", ".join(f"{sql} AS {field}" for field, sql in JOB_COLUMNS)


def json_object(value: Any) -> dict[str, Any]:
    """A JSON object column, whether it arrives as text or decoded; ``{}`` for NULL."""
    if value is None:
        return {}
    if isinstance(value, str):
        loaded = json.loads(value)
        return loaded if isinstance(loaded, dict) else {}
    return dict(value)


def json_value(text: str) -> Any:
    """A JSON column of any type, selected as text (a jsonb string would be ambiguous if
    a codec decoded it)."""
    return json.loads(text)


#: :func:`json_text`'s encoder, made once (``json.dumps`` with options makes one per call).
_JSON_TEXT: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str)


def json_text(value: Any) -> str:
    """A JSON value as compact text, for a ``$n::text::jsonb`` parameter."""
    return _JSON_TEXT.encode(value)


def job_fields(row: Mapping[str, Any], *, decode: bool = True) -> dict[str, Any]:
    """The definition fields of a row, by field name, the JSON ones decoded unless not
    ``decode`` (missing columns skipped: ``coordinator._claim`` returns the job's id as
    its argument, not as a column)."""
    out: dict[str, Any] = {}
    for field, _sql in JOB_COLUMNS:
        value = row.get(field, _MISSING)  # a dict or an asyncpg Record alike
        if value is _MISSING:
            continue
        out[field] = json_object(value) if decode and field in _JSON_FIELDS else value
    return out


#: Targets and schedules already read, by their stored text: a claim reads its job's
#: definition every time, and most jobs share a handful of these. Bounded (cleared when
#: full); the values are frozen, so sharing them is safe.
_TARGETS: Final[dict[str, tuple[Target, str | None]]] = {}
_SCHEDULES: Final[dict[tuple[ScheduleKind, str | None, str], Schedule]] = {}
_MEMO_LIMIT: Final = 1024


def _target(value: Any) -> tuple[Target, str | None]:
    """A stored target, and why it cannot be called (``None`` when it can)."""
    known = _TARGETS.get(value) if isinstance(value, str) else None
    if known is not None:
        return known
    try:
        found: tuple[Target, str | None] = (Target.from_json(json_object(value)), None)
    except ValueError as exc:
        found = (Target(kind="exec"), str(exc))
    if isinstance(value, str):
        if len(_TARGETS) >= _MEMO_LIMIT:
            _TARGETS.clear()
        _TARGETS[value] = found
    return found


def _schedule(kind: ScheduleKind, expression: str | None, timezone: str) -> Schedule:
    key = (kind, expression, timezone)
    known = _SCHEDULES.get(key)
    if known is None:
        if len(_SCHEDULES) >= _MEMO_LIMIT:
            _SCHEDULES.clear()
        known = Schedule(kind=kind, expression=expression, timezone=timezone)
        _SCHEDULES[key] = known
    return known


#: Jobs already built, by their id and stored definition (every column as read): a claim
#: reads its job's definition every time, and a burst claims the same jobs over and over.
#: Bounded like the memos above; a Job is frozen (and nobody writes its ``params``).
_JOBS: Final[dict[tuple[Any, ...], tuple[Job, str | None]]] = {}
_FIELDS: Final = tuple(field for field, _sql in JOB_COLUMNS)


def job_from_row(row: Mapping[str, Any], *, job_id: int | None = None) -> tuple[Job, str | None]:
    """A :class:`~coordinator.model.Job` from a row with the definition columns, and why
    its stored target cannot be called (``None`` when it can)."""
    key = (job_id, *[row.get(field, _MISSING) for field in _FIELDS])
    try:
        known = _JOBS.get(key)
    except TypeError:  # (a decoded JSON column, as a client's codec may give: not hashable)
        return _job_from_row(row, job_id)
    if known is None:
        if len(_JOBS) >= _MEMO_LIMIT:
            _JOBS.clear()
        known = _JOBS[key] = _job_from_row(row, job_id)
    return known


def _job_from_row(row: Mapping[str, Any], job_id: int | None) -> tuple[Job, str | None]:
    fields = job_fields(row, decode=False)
    target, target_error = _target(fields["target"])
    job = Job(
        id=job_id if job_id is not None else fields["id"],
        namespace=fields["namespace"],
        name=fields["name"],
        schedule=_schedule(fields["schedule_kind"], fields["schedule"], fields["timezone"]),
        target=target,
        params=json_object(fields["params"]),
        timeout=fields["timeout"],
        priority=fields["priority"],
        idempotent=fields["idempotent"],
        paused=fields.get("paused", False),
        invalid_reason=fields.get("invalid_reason"),
        next_run_at=fields["next_run_at"],
        schedule_version=fields["schedule_version"],
        retries=fields["retries"],
        retry_backoff=fields["retry_backoff"],
        retry_max_delay=fields["retry_max_delay"],
        misfire=fields["misfire"],
        misfire_grace=fields["misfire_grace"],
        recoverable=fields.get("recoverable", False),
        alert=fields.get("alert", True),
        keep_last=fields.get("keep_last"),
        retention=fields.get("retention"),
    )
    return job, target_error


__all__ = [
    "JOB_COLUMNS",
    "job_fields",
    "job_from_row",
    "json_object",
    "json_text",
    "json_value",
    "select_list",
]
