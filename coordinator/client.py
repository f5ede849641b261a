"""The Python client: the SQL API for asyncpg users, and the CLI's reads.

Every function takes an :class:`asyncpg.Connection` and is a plain asyncio coroutine, so an
application can call it inside its own transaction; the change wakes the daemon when (and
only if) that transaction commits. From trio, wrap the calls with
:func:`coordinator.db.aio`, as the CLI does::

    async with conn.transaction():
        await client.define_job(conn, name="backup", schedule=Schedule(kind="cron",
                                expression="0 3 * * *"), target=Target(kind="exec",
                                argv=("backup.sh",)))
        await client.trigger(conn, "backup")

All SQL that is not the daemon's lives here (the daemon's is in :mod:`coordinator.store`).
asyncpg errors are translated once, in :func:`translate_errors`, into :mod:`coordinator.errors`.

JSON values are sent as text and cast in SQL (``$1::text::jsonb``) and read back as text
(``target::text``), so the functions work whatever jsonb codec the application has set on
its connection.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

import asyncpg
import attrs

from . import buckets as buckets_mod
from . import redact, rows
from . import schedule as schedules
from .buckets import Buckets
from .db import one_line
from .errors import (
    Conflict,
    CoordinatorError,
    DatabaseError,
    DatabaseUnavailable,
    InvalidInput,
    JobNotFound,
    PermissionDenied,
    RunNotFound,
)
from .model import (
    DEFAULT_KEEP_LAST,
    DEFAULT_RETRY_BACKOFF,
    DEFAULT_RETRY_MAX_DELAY,
    ENV_STRING_MAX,
    OUTSTANDING,
    PRIORITIES,
    TERMINAL,
    RunStatus,
    Schedule,
    Target,
    params_env_size,
)
from .policies import check_misfire, check_retention, check_retry_policy
from .protocol import CATEGORIES, SEVERITIES
from .text import check_job_name, check_namespace

if TYPE_CHECKING:
    from asyncpg import Connection

    from .manifest import Manifest

__all__ = [
    "CATEGORIES",
    "RESOLUTIONS",
    "RUN_STATUSES",
    "FindingView",
    "FindingsPage",
    "GrantView",
    "JobView",
    "Leader",
    "PruneReport",
    "PruneView",
    "RunStats",
    "RunView",
    "SyncPlan",
    "SyncResult",
    "Triggered",
    "WaitTimeout",
    "check_retention",
    "daemon_leader",
    "define_job",
    "due_jobs",
    "get_job",
    "get_job_by_id",
    "get_run",
    "grant",
    "job_entry",
    "jobs_stats",
    "list_findings",
    "list_grants",
    "list_jobs",
    "list_runs",
    "pause",
    "pause_run",
    "prune",
    "prune_preview",
    "remove",
    "require_operate",
    "resolve",
    "resume",
    "resume_run",
    "revoke",
    "run_chain",
    "run_json",
    "run_stats",
    "sync",
    "sync_manifest",
    "translate_errors",
    "trigger",
    "trigger_answer",
    "wait_for_run",
]

RUN_STATUSES: Final[tuple[str, ...]] = get_args(RunStatus)
Resolution = Literal["failed", "succeeded", "retry"]
RESOLUTIONS: Final[tuple[str, ...]] = get_args(Resolution)

#: Statuses at which :func:`wait_for_run` stops: terminal ones, ``unresolved`` (which
#: waits for an operator, not for time) and ``paused`` (which waits for a trigger).
_WAIT_ENDS: Final = TERMINAL | {"unresolved", "paused"}
#: Outstanding statuses as SQL (the partial unique index's list, migrations/0012).
_OUTSTANDING_SQL: Final = (
    "('queued', 'pending', 'running', 'unresolved', 'cancel_requested', 'paused')"
)


class WaitTimeout(CoordinatorError):
    """:func:`wait_for_run` gave up before the run finished; ``run`` is its last state,
    ``why`` (when a caller found out) the reason it has not started."""

    def __init__(self, run: RunView, timeout: float, *, why: str | None = None) -> None:
        because = f": {why}" if why else ""
        super().__init__(
            f"run {run.id} is still {run.status} after "
            f"{schedules.format_duration(timedelta(seconds=timeout))}{because}"
        )
        self.run = run
        self.timeout = timeout
        self.why = why


# --------------------------------------------------------------------------- values


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _seconds(value: timedelta | None) -> float | None:
    return value.total_seconds() if value is not None else None


def _json_field(text: str | None) -> Any:
    return json.loads(text) if text is not None else None


@attrs.frozen(kw_only=True)
class JobView:
    """A job as ``jobs list`` / ``jobs show`` present it: the row, plus its runs' state."""

    #: Primary key.
    id: int
    #: Owner of the job.
    namespace: str
    #: Unique within the namespace.
    name: str
    #: ``cron`` | ``interval`` | ``once`` | ``manual``.
    schedule_kind: str
    #: The expression (``None`` for manual jobs).
    schedule: str | None
    #: IANA timezone of a cron expression.
    timezone: str
    #: What a run calls, as stored (``{"kind": "exec", "argv": [...]}`` or a worker).
    target: dict[str, Any]
    #: Static parameters handed to every call.
    params: dict[str, Any]
    #: Longest a call may take, or ``None``.
    timeout: timedelta | None
    #: ``interactive`` | ``background``.
    priority: str
    #: A run lost to a crash may be repeated once.
    idempotent: bool
    #: Paused jobs are never dispatched.
    paused: bool
    #: Why the job is inert, or ``None``.
    invalid_reason: str | None
    #: The saved deadline, or ``None``.
    next_run_at: datetime | None
    #: Bumped whenever the schedule changes.
    schedule_version: int
    #: Row timestamps.
    created_at: datetime
    updated_at: datetime
    #: Attempts after the first that a failed or timed-out run gets.
    retries: int = 0
    #: First retry delay (doubling each attempt) and its cap.
    retry_backoff: timedelta = DEFAULT_RETRY_BACKOFF
    retry_max_delay: timedelta = DEFAULT_RETRY_MAX_DELAY
    #: ``run-once`` or ``skip`` (with ``misfire_grace``).
    misfire: str = "run-once"
    misfire_grace: timedelta | None = None
    #: Runs save a cursor and pause instead of failing when stopped.
    recoverable: bool = False
    #: The latest run (by id) and its status, or ``None`` when it never ran.
    last_run: int | None = None
    last_status: str | None = None
    #: When the latest run last moved: finished, else started, else queued.
    last_run_at: datetime | None = None
    #: The run currently outstanding (queued, pending, running, cancel_requested, paused
    #: or unresolved), if any.
    outstanding_run: int | None = None
    outstanding_status: str | None = None
    #: When the outstanding run may start, if it is a retry waiting for its due time.
    outstanding_due_at: datetime | None = None
    #: The outstanding run's attempt (1 for a first one; a waiting retry's is 2 or more).
    outstanding_attempt: int | None = None
    #: When the outstanding run paused (a paused run of a recoverable job).
    outstanding_paused_at: datetime | None = None
    #: The unresolved run that blocks the job until an operator resolves it, if any.
    blocked_by: int | None = None
    #: Failures are alerted; retention's per-job overrides (``None``: the defaults).
    alert: bool = True
    keep_last: int | None = None
    retention: timedelta | None = None

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def state(self) -> str:
        """One word (or a short phrase) for humans: why the job will or will not run."""
        if self.invalid_reason is not None:
            return "invalid"
        if self.paused:
            return "paused"
        if self.blocked_by is not None:
            return f"blocked by run {self.blocked_by}"
        if self.outstanding_due_at is not None and self.outstanding_status == "queued":
            return "retry waiting"
        if self.outstanding_status == "paused":
            return f"run {self.outstanding_run} paused"
        if self.outstanding_status == "cancel_requested":
            return f"run {self.outstanding_run} pausing"
        if self.outstanding_status is not None:
            return self.outstanding_status
        return "active"

    def to_json(self) -> dict[str, Any]:
        """The ``jobs list --json`` / ``jobs show --json`` and the admin API's shape
        (timeout in seconds; ``key`` and ``state`` as the tables and the page say them:
        the API had them, the CLI's ``--json`` did not)."""
        return {
            "id": self.id,
            "namespace": self.namespace,
            "name": self.name,
            "key": self.key,
            "state": self.state,
            "schedule_kind": self.schedule_kind,
            "schedule": self.schedule,
            "timezone": self.timezone,
            "target": self.target,
            "params": self.params,
            "timeout": self.timeout.total_seconds() if self.timeout is not None else None,
            "priority": self.priority,
            "idempotent": self.idempotent,
            "recoverable": self.recoverable,
            "paused": self.paused,
            "invalid_reason": self.invalid_reason,
            "next_run_at": _iso(self.next_run_at),
            "schedule_version": self.schedule_version,
            "retries": self.retries,
            "retry_backoff": self.retry_backoff.total_seconds(),
            "retry_max_delay": self.retry_max_delay.total_seconds(),
            "misfire": self.misfire,
            "misfire_grace": _seconds(self.misfire_grace),
            "alert": self.alert,
            "keep_last": self.keep_last,
            "retention": self.retention.total_seconds() if self.retention is not None else None,
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "last_run": self.last_run,
            "last_status": self.last_status,
            "last_run_at": _iso(self.last_run_at),
            "outstanding_run": self.outstanding_run,
            "outstanding_status": self.outstanding_status,
            "outstanding_due_at": _iso(self.outstanding_due_at),
            "outstanding_attempt": self.outstanding_attempt,
            "outstanding_paused_at": _iso(self.outstanding_paused_at),
            "blocked_by": self.blocked_by,
        }


@attrs.frozen(kw_only=True)
class RunView:
    """A run as ``runs list`` / ``runs show`` present it, with its job's name."""

    #: Primary key.
    id: int
    #: The job's id, namespace and name.
    job_id: int
    namespace: str
    job: str
    #: ``schedule`` | ``manual`` | ``retry``.
    trigger: str
    #: ``queued`` ... ``unresolved``.
    status: str
    #: The deadline this run serves (scheduled and retried runs).
    scheduled_for: datetime | None
    #: Lifecycle timestamps.
    claimed_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    created_at: datetime
    #: The schedule version it was claimed under, and by which daemon.
    schedule_version: int | None
    instance: str | None
    #: Dispatch arguments (``force`` and friends).
    args: dict[str, Any]
    #: What the call reported.
    count: int | None
    extra: dict[str, Any] | None
    #: Why it did not succeed.
    error_cause: str | None
    error_message: str | None
    #: 1 for a first attempt.
    attempt: int
    #: The latest progress report of a running call.
    progress: Any = None
    #: Why it did not succeed, in seven words (``invalid-input`` ... ``unknown``).
    category: str | None = None
    #: What the worker or command said about retrying it (``None``: nothing).
    retryable: bool | None = None
    #: It failed on its job's last allowed attempt: no retry follows.
    exhausted: bool = False
    #: A queued retry may not start before this (its saved due time).
    due_at: datetime | None = None
    #: The run this one retries, and the run that retries this one.
    retry_of: int | None = None
    retried_by: int | None = None
    #: Where a recoverable run resumes from (``None``: from the start).
    cursor: Any = None
    #: The last checkpoint write of a running call.
    last_progress_at: datetime | None = None
    #: When it paused (a paused run).
    paused_at: datetime | None = None
    #: How many times it was resumed.
    resumes: int = 0
    #: Findings recorded, by severity (``{}``: none).
    finding_counts: dict[str, int] = attrs.field(factory=dict)
    #: Its job is recoverable: the run keeps a cursor and may be paused.
    recoverable: bool = False
    #: Its job was removed, history kept (the name may belong to a new job since).
    job_removed: bool = False

    @property
    def job_key(self) -> str:
        """``namespace/name`` of the run's job."""
        return f"{self.namespace}/{self.job}"

    @property
    def outstanding(self) -> bool:
        return self.status in OUTSTANDING

    @property
    def ongoing(self) -> bool:
        """Queued, pending or running: not ended, not paused."""
        return self.status in ("queued", "pending", "running")

    @property
    def standing_error(self) -> str | None:
        """``error_message``, unless the run is under way again: a paused run queued again
        by a trigger kept its pause's words ("paused by operator") in its row until its
        claim before migrations/0029 (a row queued so before the upgrade still may), and
        they are not its error."""
        return None if self.ongoing else self.error_message

    @property
    def reason(self) -> str | None:
        """Why it did not succeed, as shown to people: redacted, one line, bounded
        (:meth:`coordinator.redact.Redactor.safe_reason`)."""
        return redact.default().safe_reason(self.error_message)

    def to_json(self) -> dict[str, Any]:
        """The ``runs list --json`` / ``runs show --json`` shape."""
        return {
            "id": self.id,
            "job_id": self.job_id,
            "job": self.job,
            "namespace": self.namespace,
            "status": self.status,
            "trigger": self.trigger,
            "scheduled_for": _iso(self.scheduled_for),
            "claimed_at": _iso(self.claimed_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "created_at": _iso(self.created_at),
            "schedule_version": self.schedule_version,
            "instance": self.instance,
            "args": self.args,
            "count": self.count,
            "extra": self.extra,
            "error_cause": self.error_cause,
            "error_message": self.error_message,
            "reason": self.reason,
            "attempt": self.attempt,
            "progress": self.progress,
            "category": self.category,
            "retryable": self.retryable,
            "exhausted": self.exhausted,
            "due_at": _iso(self.due_at),
            "retry_of": self.retry_of,
            "retried_by": self.retried_by,
            "cursor": self.cursor,
            "last_progress_at": _iso(self.last_progress_at),
            "paused_at": _iso(self.paused_at),
            "resumes": self.resumes,
            "finding_counts": self.finding_counts,
            "recoverable": self.recoverable,
            "job_removed": self.job_removed,
        }


@attrs.frozen(kw_only=True)
class FindingView:
    """One finding of a run (``runs findings``)."""

    #: Its id: pages of findings go in this order (``after``).
    id: int
    run_id: int
    #: What was found, and which resource it concerns.
    kind: str
    resource_id: str
    #: ``info`` | ``warning`` | ``error`` | ``data_loss``.
    severity: str
    #: Anything else the worker reported (a JSON object).
    detail: dict[str, Any]
    #: When it was recorded.
    created_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "run": self.run_id,
            "kind": self.kind,
            "resource_id": self.resource_id,
            "severity": self.severity,
            "detail": self.detail,
            "created_at": _iso(self.created_at),
        }


@attrs.frozen(kw_only=True)
class FindingsPage:
    """A page of a run's findings, oldest first (newest first when asked ``before``)."""

    findings: tuple[FindingView, ...]
    #: Pass as ``after`` for the next page; ``None`` when this page is the last.
    next_after: int | None
    #: Newest first: pass as ``before`` for the next (older) page; ``None`` when this
    #: page is the last.
    next_before: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"findings": [f.to_json() for f in self.findings], "next": self.next_after}


@attrs.frozen(kw_only=True)
class SyncResult:
    """What a sync changed."""

    #: Namespace synced.
    namespace: str
    #: Jobs created, updated (every listed job that existed; one whose definition is
    #: unchanged is not written) and paused (missing ones).
    created: int
    updated: int
    paused: int
    #: Of ``updated``, those whose definition was already as listed (not written): a
    #: deploy script tells "nothing changed" from ``changed == 0`` (the dry run's words).
    unchanged: int = 0

    @property
    def changed(self) -> int:
        """Listed jobs that existed and were written (``updated`` less ``unchanged``)."""
        return self.updated - self.unchanged

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "created": self.created,
            "updated": self.updated,
            "changed": self.changed,
            "unchanged": self.unchanged,
            "paused": self.paused,
        }


@attrs.frozen(kw_only=True)
class SyncPlan:
    """What a sync would do, found by doing it in a transaction that is rolled back
    (``coordinator sync --dry-run``): every check of the real one ran."""

    namespace: str
    #: Listed jobs that do not exist yet.
    create: tuple[str, ...]
    #: Listed jobs whose definition (or pause) would change.
    change: tuple[str, ...]
    #: Listed jobs the sync would not write.
    unchanged: tuple[str, ...]
    #: The namespace's jobs the manifest leaves out, running now: they would be paused.
    pause: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "create": list(self.create),
            "change": list(self.change),
            "unchanged": list(self.unchanged),
            "pause": list(self.pause),
        }


# --------------------------------------------------------------------------- errors

#: SQLSTATEs (and classes) that mean the server or the session is gone.
_UNAVAILABLE_CLASSES: Final = ("08", "57")
_SCHEMA_MISSING: Final = frozenset({"3F000", "42P01", "42883"})
_RETRYABLE: Final = frozenset({"40001", "40P01"})


@contextmanager
def translate_errors(
    *,
    namespace: str | None = None,
    name: str | None = None,
    run_id: int | None = None,
    field: str = "value",
) -> Iterator[None]:
    """Turn asyncpg's errors into :mod:`coordinator.errors`, ``raise ... from exc``.

    ``namespace``/``name``/``run_id`` are what the statement was about (for the lookup
    errors); ``field`` names the argument a data error most likely concerns.
    """
    try:
        yield
    except CoordinatorError:
        raise
    except asyncpg.PostgresError as exc:
        raise _from_postgres(exc, namespace, name, run_id, field) from exc
    except asyncpg.InterfaceError as exc:
        if isinstance(exc, asyncpg.ConnectionDoesNotExistError) or "closed" in str(exc):
            raise DatabaseUnavailable(f"connection lost: {one_line(exc)}") from exc
        raise DatabaseError(one_line(exc)) from exc
    except (OSError, ConnectionError) as exc:  # TimeoutError included
        raise DatabaseUnavailable(f"database unreachable: {one_line(exc)}") from exc


def _quoted_namespace(message: str) -> str | None:
    """The namespace a ``permission denied for namespace "x"`` message names."""
    _head, sep, rest = message.partition('namespace "')
    return rest.partition('"')[0] if sep else None


def _invalid(field: str, message: str) -> InvalidInput:
    """``field: message``, without saying the field twice when the message starts with it."""
    return InvalidInput(field, message.removeprefix(f"{field}: "))


def _from_postgres(
    exc: asyncpg.PostgresError,
    namespace: str | None,
    name: str | None,
    run_id: int | None,
    field: str,
) -> CoordinatorError:
    state: str = getattr(exc, "sqlstate", None) or ""
    hint: str = getattr(exc, "hint", None) or ""
    message = one_line(exc)
    if hint == "coordinator.job_not_found":
        return JobNotFound(namespace or "?", name or "?")
    if hint == "coordinator.run_not_found":
        return RunNotFound(run_id if run_id is not None else -1)
    if hint == "coordinator.namespace_denied":
        # The SQL says 'permission denied for namespace "x"'; DETAIL says why.
        return PermissionDenied(
            _quoted_namespace(message) or namespace, getattr(exc, "detail", None)
        )
    if state == "42704":  # undefined_object: grant_namespace's unknown role
        return _invalid(getattr(exc, "column_name", None) or field, message)
    if state == "42501":  # insufficient_privilege: a table or function grant, or RLS
        if message.startswith("permission denied for schema coordinator"):
            # No role of the schema's: PostgreSQL's words said nothing of what to do.
            message += (
                ": this role is in none of coordinator_app, coordinator_admin and "
                "coordinator_daemon; `coordinator grant ROLE NAMESPACE` (run by the "
                "schema's owner or a coordinator_admin member) lets it use a namespace"
            )
            return PermissionDenied(None, message, message=message)
        if message.startswith(
            ("permission denied for function grant_namespace",
             "permission denied for function revoke_namespace")
        ):  # fmt: skip
            # Not about the namespace named: about who may grant.
            message += ": grants are made by the schema's owner or a coordinator_admin member"
            return PermissionDenied(None, message, message=message)
        if namespace is None and message.startswith("permission denied for "):
            # A privilege on an object (a function of the admin's, a table): no namespace
            # is involved, so PostgreSQL's words are the message.
            return PermissionDenied(None, message, message=message)
        return PermissionDenied(namespace, message)
    if state == "55000":  # object_not_in_prerequisite_state
        return Conflict(message)
    if state == "23514":  # check_violation: the constraint names the column
        constraint: str = getattr(exc, "constraint_name", None) or ""
        column = constraint.removeprefix("jobs_").removeprefix("runs_").removesuffix("_check")
        return _invalid(column or field, message)
    if state == "23502":  # not_null_violation
        return InvalidInput(getattr(exc, "column_name", None) or field, "required")
    if state == "22021" and "\x00" in (namespace or "") + (name or ""):
        # A NUL byte, which no text in PostgreSQL can hold: named by the argument it was
        # in, not as "value: invalid byte sequence for encoding UTF8: 0x00".
        where = "namespace" if "\x00" in (namespace or "") else "name"
        return InvalidInput(where, "NUL (U+0000) is not allowed")
    if state.startswith("22"):  # data exceptions, invalid_parameter_value among them
        # The SQL API names the argument at fault in COLUMN (and its messages start with it).
        return _invalid(getattr(exc, "column_name", None) or field, message)
    if state in _SCHEMA_MISSING:
        return DatabaseError(
            f"{message} (is the schema missing or out of date? run `coordinator migrate`)"
        )
    if state in _RETRYABLE:
        return DatabaseError(f"{message} (retry)")
    if state[:2] in _UNAVAILABLE_CLASSES:
        return DatabaseUnavailable(message)
    return DatabaseError(message)


# --------------------------------------------------------------------------- checks


def _require_text(value: object, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(field, "must be a non-empty string")
    return value


def _to_json_text(value: object, field: str) -> str:
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(field, f"not representable as JSON: {exc}") from None
    if "\\u0000" in text and (where := _nul_at(value, field)) is not None:
        # PostgreSQL's jsonb cannot hold it; its own words ("unsupported Unicode escape
        # sequence") dropped the detail that said which character.
        raise InvalidInput(
            field, f"contains the character U+0000 (NUL) at {where}, which PostgreSQL cannot store"
        )
    return text


def _nul_at(value: object, where: str) -> str | None:
    """Where a NUL character is in ``value`` (a key or a string), if anywhere."""
    if isinstance(value, str):
        return where if "\x00" in value else None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if "\x00" in str(key):
                return f"{where} (a key)"
            if (found := _nul_at(item, f"{where}.{key}")) is not None:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if (found := _nul_at(item, f"{where}[{i}]")) is not None:
                return found
    return None


def _object(value: Mapping[str, Any] | None, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInput(field, "must be a mapping (a JSON object)")
    return dict(value)


def _interval_text(value: timedelta) -> str:
    """A timedelta as text PostgreSQL reads as an interval, exactly."""
    return f"{value // timedelta(microseconds=1)} microseconds"


@attrs.frozen(kw_only=True)
class _Prepared:
    name: str
    schedule: Schedule
    target: dict[str, Any]
    params: dict[str, Any]
    timeout: timedelta | None
    priority: str
    idempotent: bool
    paused: bool | None
    invalid_reason: str | None
    retries: int
    retry_backoff: timedelta
    retry_max_delay: timedelta
    misfire: str
    misfire_grace: timedelta | None
    recoverable: bool
    alert: bool
    keep_last: int | None
    retention: timedelta | None


def _prepare(
    *,
    name: str,
    schedule: Schedule,
    target: Target | Mapping[str, Any],
    params: Mapping[str, Any] | None,
    timeout: timedelta | None,
    priority: str,
    idempotent: bool,
    paused: bool | None,
    invalid_reason: str | None,
    retries: int = 0,
    retry_backoff: timedelta = DEFAULT_RETRY_BACKOFF,
    retry_max_delay: timedelta = DEFAULT_RETRY_MAX_DELAY,
    misfire: str = "run-once",
    misfire_grace: timedelta | None = None,
    recoverable: bool = False,
    alert: bool = True,
    keep_last: int | None = None,
    retention: timedelta | None = None,
) -> _Prepared:
    """Check and normalise a definition; an ``invalid_reason`` skips the schedule and
    target checks (the job is stored inert, as given)."""
    check_job_name(name)
    check_retention(keep_last, retention)
    if priority not in PRIORITIES:
        raise InvalidInput("priority", f"must be one of {', '.join(PRIORITIES)}, not {priority!r}")
    if timeout is not None and not isinstance(timeout, timedelta):
        raise InvalidInput("timeout", f"must be a timedelta, not {type(timeout).__name__}")
    if timeout is not None and timeout <= timedelta(0):
        raise InvalidInput("timeout", "must be greater than zero")
    if timeout is not None:
        schedules.check_duration(timeout, "timeout")
    check_retry_policy(retries, retry_backoff, retry_max_delay)
    check_misfire(misfire, misfire_grace)
    # Secrets are never stored (coordinator.redact): pass them by reference.
    params_obj = redact.default().value(_object(params, "params"))
    _to_json_text(params_obj, "params")
    if invalid_reason is None:
        schedules.validate(schedule)
        schedule = schedules.normalize(schedule)
        if not isinstance(target, Target):
            raise InvalidInput("target", "a valid job needs a Target")
        target_json = target.to_json()
        try:
            Target.from_json(target_json)
        except ValueError as exc:
            raise InvalidInput("target", str(exc)) from None
        if target.kind == "exec" and (size := params_env_size(params_obj)) > ENV_STRING_MAX:
            raise InvalidInput(
                "params",
                f"{size - len('COORDINATOR_PARAMS=') - 1:,} bytes as JSON; a command gets its "
                f"params in one environment variable (COORDINATOR_PARAMS), which may hold "
                f"{ENV_STRING_MAX // 1024} KiB at most: pass large input as a run's args "
                "(its stdin), or a reference to it (a path, a key)",
            )
        if recoverable and target.kind != "worker":
            raise InvalidInput(
                "recoverable",
                "only a worker job can be recoverable (a command cannot hand back a cursor)",
            )
    else:
        _require_text(invalid_reason, "invalid_reason")
        target_json = target.to_json() if isinstance(target, Target) else dict(target)
    return _Prepared(
        name=name,
        schedule=schedule,
        target=target_json,
        params=params_obj,
        timeout=timeout,
        priority=priority,
        idempotent=bool(idempotent),
        paused=None if paused is None else bool(paused),
        invalid_reason=invalid_reason,
        retries=retries,
        retry_backoff=retry_backoff,
        retry_max_delay=retry_max_delay,
        misfire=misfire,
        misfire_grace=misfire_grace,
        recoverable=bool(recoverable),
        alert=bool(alert),
        keep_last=keep_last,
        retention=retention,
    )


# --------------------------------------------------------------------------- writes

_DEFINE_JOB: Final = """
SELECT coordinator.define_job(
    name           => $1,
    schedule_kind  => $2,
    schedule       => $3,
    timezone       => $4,
    target         => $5::text::jsonb,
    namespace      => $6,
    params         => $7::text::jsonb,
    timeout        => $8::interval,
    priority       => $9,
    idempotent     => $10,
    paused         => $11,
    invalid_reason => $12,
    retries        => $13,
    retry_backoff  => $14::interval,
    retry_max_delay => $15::interval,
    misfire        => $16,
    misfire_grace  => $17::interval,
    recoverable    => $18,
    alert          => $19,
    keep_last      => $20,
    retention      => $21::interval)
"""


async def define_job(
    conn: Connection,
    *,
    name: str,
    schedule: Schedule,
    target: Target,
    namespace: str = "default",
    params: Mapping[str, Any] | None = None,
    timeout: timedelta | None = None,  # noqa: ASYNC109 - the job's call limit, not this call's
    priority: str = "background",
    idempotent: bool = False,
    paused: bool | None = None,
    invalid_reason: str | None = None,
    retries: int = 0,
    retry_backoff: timedelta = DEFAULT_RETRY_BACKOFF,
    retry_max_delay: timedelta = DEFAULT_RETRY_MAX_DELAY,
    misfire: str = "run-once",
    misfire_grace: timedelta | None = None,
    recoverable: bool = False,
    alert: bool = True,
    keep_last: int | None = None,
    retention: timedelta | None = None,
) -> int:
    """Create or replace the job ``namespace/name``; return its id.

    The schedule is validated (:class:`~coordinator.errors.InvalidSchedule` names the
    field: ``cron``, ``every``, ``at`` or ``timezone``) and stored in its canonical form,
    unless ``invalid_reason`` is given: then it is stored as is and the job is inert.
    Every field of the definition is replaced; ``paused`` is the job's state, not its
    definition: ``None`` keeps it (a new job is not paused), ``True``/``False`` set it
    (un-pausing a recurring job forgets its old deadline). A changed schedule bumps
    ``schedule_version`` and clears the saved deadline. ``retries`` (0 to 100) failed or
    timed-out runs are retried, the first after ``retry_backoff``, doubling up to
    ``retry_max_delay``; ``misfire="skip"`` with ``misfire_grace`` skips an overdue
    deadline later than the grace. Names follow :mod:`coordinator.text`; durations are
    at most :data:`~coordinator.schedule.MAX_DURATION`.
    A ``recoverable`` job (worker targets only) keeps a cursor per run and pauses
    instead of failing when stopped; its ``timeout`` means "pause after this long".
    ``alert=False`` opts the job out of failure alerts; ``keep_last``/``retention``
    override retention's defaults for it.
    """
    check_namespace(namespace)
    job = _prepare(
        name=name,
        schedule=schedule,
        target=target,
        params=params,
        timeout=timeout,
        priority=priority,
        idempotent=idempotent,
        paused=paused,
        invalid_reason=invalid_reason,
        retries=retries,
        retry_backoff=retry_backoff,
        retry_max_delay=retry_max_delay,
        misfire=misfire,
        misfire_grace=misfire_grace,
        recoverable=recoverable,
        alert=alert,
        keep_last=keep_last,
        retention=retention,
    )
    with translate_errors(namespace=namespace, name=name):
        job_id: int = await conn.fetchval(
            _DEFINE_JOB,
            job.name,
            job.schedule.kind,
            job.schedule.expression,
            job.schedule.timezone,
            json.dumps(job.target),
            namespace,
            json.dumps(job.params),
            job.timeout,
            job.priority,
            job.idempotent,
            job.paused,
            job.invalid_reason,
            job.retries,
            job.retry_backoff,
            job.retry_max_delay,
            job.misfire,
            job.misfire_grace,
            job.recoverable,
            job.alert,
            job.keep_last,
            job.retention,
        )
    return job_id


async def trigger(
    conn: Connection,
    name: str,
    *,
    namespace: str = "default",
    args: Mapping[str, Any] | None = None,
) -> int:
    """Ask for a run of ``namespace/name`` now; return the run id.

    While the job has an outstanding run (queued, pending, running, cancel_requested or
    unresolved), that run's id is returned and nothing is inserted. A paused run is
    resumed: queued again, same id, cursor and counter.
    """
    args_text = _to_json_text(redact.default().value(_object(args, "args")), "args")
    with translate_errors(namespace=namespace, name=name, field="args"):
        run_id: int = await conn.fetchval(
            "SELECT coordinator.trigger($1, $2, $3::text::jsonb)", namespace, name, args_text
        )
    return run_id


#: The run :func:`trigger_answer` triggered: its status, whether it was inserted by this
#: transaction (``created_at`` is its ``now()``) and whether its row version is this
#: transaction's. ``xmin`` is 32 bits and ``txid_status`` wants the epoch too: ``xmin`` is
#: read as the 64-bit id nearest to ``b``, the newest id known here (this transaction's,
#: or the snapshot's ``xmax`` if that is newer: a savepoint's id comes after both, by the
#: ids assigned meanwhile and still running, however many the cluster used since the
#: transaction began -- a reviewer's 1M ids between them made the earlier base, the
#: transaction's own id, answer "transaction ID ... is in the future"). An id more than
#: 2^20 past ``b`` is an old one, of before the counter wrapped; one below 0 is asked
#: about as ``NULL`` (no answer, not an error). (txid_*, not PostgreSQL 13's xid8
#: functions: the schema runs on 12.)
_TRIGGERED_RUN: Final = """
SELECT r.status, r.created_at = now() AS new,
       txid_status(
           CASE WHEN w.x64 > w.b + 1048576 THEN nullif(greatest(w.x64 - 4294967296, -1), -1)
                WHEN w.x64 < w.b - 4294967296 + 1048576 THEN w.x64 + 4294967296
                ELSE w.x64 END
       ) = 'in progress' AS mine
  FROM coordinator.runs r
 CROSS JOIN LATERAL (
       SELECT q.b, ((q.b >> 32) << 32) | r.xmin::text::bigint AS x64
         FROM (SELECT greatest(txid_current_if_assigned(),
                               txid_snapshot_xmax(txid_current_snapshot())) AS b) q
       ) w
 WHERE r.id = $1
"""


@attrs.frozen(kw_only=True)
class Triggered:
    """What :func:`trigger_answer` found: the run, whether this call made it outstanding
    (inserted it, or resumed it from ``paused``) and its status right after."""

    run_id: int
    #: This call inserted the run or resumed it; ``False``: it was already outstanding
    #: (another caller's, even one racing this call).
    changed: bool
    #: This call inserted it (its ``created_at``, the transaction's ``now()``).
    created: bool
    status: RunStatus

    @property
    def resumed(self) -> bool:
        """This call resumed a paused run: queued again, same id, cursor and counter."""
        return self.changed and not self.created


async def trigger_answer(
    conn: Connection,
    name: str,
    *,
    namespace: str = "default",
    args: Mapping[str, Any] | None = None,
) -> Triggered:
    """:func:`trigger`, telling whether this call made the run outstanding. Comparing
    the answer with the job as read before is a race: concurrent callers all read "no
    run", and each then said it had created the one run. Here the trigger and a read of
    the run share a transaction, and the run's row version was written by this
    transaction only if this call inserted or resumed it (or, inside a caller's
    transaction, an earlier trigger of the same job in it did).

    "Written by this transaction" is asked as ``txid_status(xmin) = 'in progress'``: a
    row version whose writer is still in progress is visible to that writer alone, and
    PostgreSQL says "in progress" for the current transaction's subtransactions too. So
    it holds inside a caller's transaction, where this call's savepoint gives the row a
    subtransaction's id (comparing ``xmin`` with ``txid_current_if_assigned()``, as
    before, said ``created=False`` there for a run it had just inserted)."""
    async with conn.transaction():
        run_id = await trigger(conn, name, namespace=namespace, args=args)
        row = await conn.fetchrow(_TRIGGERED_RUN, run_id)
    assert row is not None  # (the trigger's transaction sees its own run)
    mine = bool(row["mine"])
    return Triggered(
        run_id=run_id, changed=mine, created=mine and bool(row["new"]), status=row["status"]
    )


async def require_operate(conn: Connection, namespace: str) -> None:
    """Raise :class:`~coordinator.errors.PermissionDenied` in the SQL API's words unless
    the connection's role may operate ``namespace`` (a no-op for an unconfined role). A
    read of a job the role cannot see says only "unknown job"; a command about to write
    asks this first, so that it refuses as ``trigger()`` would."""
    check_namespace(namespace)
    with translate_errors(namespace=namespace):
        await conn.execute("SELECT coordinator._require_namespace($1, true)", namespace)


async def pause(conn: Connection, name: str, *, namespace: str = "default") -> None:
    """Pause the job: it is never dispatched until resumed (a no-op when paused)."""
    with translate_errors(namespace=namespace, name=name):
        await conn.execute("SELECT coordinator.pause($1, $2)", namespace, name)


async def resume(conn: Connection, name: str, *, namespace: str = "default") -> None:
    """Resume the job; a recurring job's deadline is computed afresh (no missed ticks)."""
    with translate_errors(namespace=namespace, name=name):
        await conn.execute("SELECT coordinator.resume($1, $2)", namespace, name)


async def remove(
    conn: Connection, name: str, *, namespace: str = "default", keep_history: bool = False
) -> None:
    """Delete the job and its run history; with ``keep_history``, hide and disarm the job
    but keep its runs until retention takes them (its name is free at once)."""
    with translate_errors(namespace=namespace, name=name):
        await conn.execute(
            "SELECT coordinator.remove($1, $2, $3)", namespace, name, bool(keep_history)
        )


def job_entry(
    *,
    name: str,
    schedule: Schedule,
    target: Target | Mapping[str, Any],
    params: Mapping[str, Any] | None = None,
    timeout: timedelta | None = None,
    priority: str = "background",
    idempotent: bool = False,
    paused: bool | None = None,
    invalid_reason: str | None = None,
    retries: int = 0,
    retry_backoff: timedelta = DEFAULT_RETRY_BACKOFF,
    retry_max_delay: timedelta = DEFAULT_RETRY_MAX_DELAY,
    misfire: str = "run-once",
    misfire_grace: timedelta | None = None,
    recoverable: bool = False,
    alert: bool = True,
    keep_last: int | None = None,
    retention: timedelta | None = None,
) -> dict[str, Any]:
    """One element of :func:`sync`'s ``entries``, checked like :func:`define_job`.

    With ``invalid_reason`` the schedule is kept as given and ``target`` may be any JSON
    object (the job is stored inert); otherwise ``target`` must be a :class:`Target`.
    ``paused`` ``None`` leaves the key out: the job keeps its paused state (one that sync
    paused for being missing is resumed).
    """
    job = _prepare(
        name=name,
        schedule=schedule,
        target=target,
        params=params,
        timeout=timeout,
        priority=priority,
        idempotent=idempotent,
        paused=paused,
        invalid_reason=invalid_reason,
        retries=retries,
        retry_backoff=retry_backoff,
        retry_max_delay=retry_max_delay,
        misfire=misfire,
        misfire_grace=misfire_grace,
        recoverable=recoverable,
        alert=alert,
        keep_last=keep_last,
        retention=retention,
    )
    entry = {
        "name": job.name,
        "schedule_kind": job.schedule.kind,
        "schedule": job.schedule.expression,
        "timezone": job.schedule.timezone,
        "target": job.target,
        "params": job.params,
        "timeout": _interval_text(job.timeout) if job.timeout is not None else None,
        "priority": job.priority,
        "idempotent": job.idempotent,
        "paused": job.paused,
        "invalid_reason": job.invalid_reason,
        "retries": job.retries,
        "retry_backoff": _interval_text(job.retry_backoff),
        "retry_max_delay": _interval_text(job.retry_max_delay),
        "misfire": job.misfire,
        "misfire_grace": (
            _interval_text(job.misfire_grace) if job.misfire_grace is not None else None
        ),
        "recoverable": job.recoverable,
        "alert": job.alert,
        "keep_last": job.keep_last,
        "retention": _interval_text(job.retention) if job.retention is not None else None,
    }
    if job.paused is None:
        del entry["paused"]
    return entry


async def sync(
    conn: Connection, namespace: str, entries: Sequence[Mapping[str, Any]]
) -> SyncResult:
    """Declare the complete job set of ``namespace`` (see ``coordinator.sync`` in SQL).

    ``entries`` are objects in the SQL shape (build them with :func:`job_entry`). Listed
    jobs are created or updated (an unchanged one is not written); the namespace's other
    jobs are paused, history kept; an empty list pauses them all. One statement, one wake
    (none when nothing changed).
    """
    check_namespace(namespace)
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise InvalidInput(f"jobs[{index}]", "must be a mapping")
        entry_name = check_job_name(entry.get("name"), f"jobs[{index}].name")
        if entry_name in seen:
            raise InvalidInput(f"jobs[{index}].name", f"{entry_name!r} is listed twice")
        seen.add(entry_name)
    payload = _to_json_text([dict(e) for e in entries], "jobs")
    with translate_errors(namespace=namespace, field="jobs"):
        async with conn.transaction():
            # (Counted first, in the sync's transaction: sync() itself answers only
            # "updated", the unchanged among them included. An entry the count cannot
            # read is left for sync() to refuse in its own words.)
            try:
                async with conn.transaction():
                    unchanged = await conn.fetchval(_SYNC_UNCHANGED, namespace, payload)
            except asyncpg.PostgresError:
                unchanged = 0
            row = await conn.fetchrow(
                "SELECT created, updated, paused FROM coordinator.sync($1, $2::text::jsonb)",
                namespace,
                payload,
            )
    return SyncResult(
        namespace=namespace,
        created=row["created"],
        updated=row["updated"],
        paused=row["paused"],
        unchanged=min(unchanged or 0, row["updated"]),
    )


#: Listed jobs whose definition is already as listed (the count sync() does not give).
_SYNC_UNCHANGED = """
SELECT count(*) FILTER (WHERE coordinator._job_unchanged($1, e.value))
  FROM jsonb_array_elements($2::text::jsonb) AS e(value)
"""


#: Each listed job as it stands before a sync (in the plan's transaction).
_SYNC_PLAN = """
SELECT e.value->>'name' AS name,
       EXISTS (SELECT 1 FROM coordinator.jobs j
                WHERE j.namespace = $1 AND j.name = e.value->>'name'
                  AND j.removed_at IS NULL) AS known,
       coordinator._job_unchanged($1, e.value) AS unchanged
  FROM jsonb_array_elements($2::text::jsonb) WITH ORDINALITY AS e(value, at)
 ORDER BY e.at
"""
#: The namespace's running jobs a sync leaves out (as sync pauses them).
_SYNC_LEFT_OUT = """
SELECT name FROM coordinator.jobs
 WHERE namespace = $1 AND removed_at IS NULL AND NOT paused AND NOT (name = ANY ($2::text[]))
 ORDER BY name
"""


async def plan_sync(
    conn: Connection, namespace: str, entries: Sequence[Mapping[str, Any]]
) -> SyncPlan:
    """What :func:`sync` would do, without doing it: the sync runs, with every check it
    makes (a refusal is raised as the real one raises it), in a transaction that is then
    rolled back, so nothing is written and no wake is sent."""
    transaction = conn.transaction()
    await transaction.start()
    try:
        # First the refusals, as the real sync words them; then, rolled back to before
        # it, how each listed job stands.
        inner = conn.transaction()
        await inner.start()
        try:
            await sync(conn, namespace, entries)
        finally:
            await inner.rollback()
        names = [str(e.get("name")) for e in entries]
        payload = _to_json_text([dict(e) for e in entries], "jobs")
        with translate_errors(namespace=namespace, field="jobs"):
            listed = await conn.fetch(_SYNC_PLAN, namespace, payload)
            left_out = await conn.fetch(_SYNC_LEFT_OUT, namespace, names)
    finally:
        await transaction.rollback()
    return SyncPlan(
        namespace=namespace,
        create=tuple(r["name"] for r in listed if not r["known"]),
        change=tuple(r["name"] for r in listed if r["known"] and not r["unchanged"]),
        unchanged=tuple(r["name"] for r in listed if r["unchanged"]),
        pause=tuple(r["name"] for r in left_out),
    )


async def sync_manifest(
    conn: Connection, manifest: Manifest, *, strict: bool = False
) -> SyncResult:
    """Apply a parsed manifest (:func:`coordinator.manifest.load`).

    Entries with problems are stored inert (with ``invalid_reason``) and the rest applies;
    with ``strict=True`` any problem raises
    :class:`~coordinator.manifest.ManifestRejected` and nothing is applied.
    """
    from .manifest import ManifestRejected

    if strict and manifest.problems:
        raise ManifestRejected(manifest)
    return await sync(conn, manifest.namespace, manifest.entries)


async def resolve(conn: Connection, run_id: int, outcome: str) -> int:
    """Settle an ``unresolved`` run as ``failed``, ``succeeded`` or ``retry``.

    Returns the id of the run that now represents the work: the new queued run for
    ``retry``, else ``run_id``. A run in another state raises
    :class:`~coordinator.errors.Conflict`.
    """
    if outcome not in RESOLUTIONS:
        raise InvalidInput("outcome", f"must be one of {', '.join(RESOLUTIONS)}, not {outcome!r}")
    with translate_errors(run_id=run_id, field="outcome"):
        result: int = await conn.fetchval("SELECT coordinator.resolve($1, $2)", run_id, outcome)
    return result


async def cancel_run(conn: Connection, run_id: int) -> None:
    """Cancel a ``queued`` run (it never starts) or a ``paused`` one (its job is free
    again; the next trigger starts afresh). A run in any other state raises
    :class:`~coordinator.errors.Conflict`; an unknown one
    :class:`~coordinator.errors.RunNotFound`."""
    with translate_errors(run_id=run_id):
        await conn.execute("SELECT coordinator.cancel($1)", run_id)


async def pause_run(conn: Connection, run_id: int) -> str:
    """Ask a run of a recoverable job to pause; return its status afterwards.

    A running call becomes ``cancel_requested``: once the caller's transaction commits
    the daemon asks the worker to stop, and the run becomes ``paused`` at its cursor. A
    queued run is ``paused`` at once. A run already pausing or paused is left as it is.
    A run of a job that is not recoverable, or one that has finished, raises
    :class:`~coordinator.errors.Conflict`; an unknown one
    :class:`~coordinator.errors.RunNotFound`. A trigger of the job resumes it.
    """
    with translate_errors(run_id=run_id):
        status: str = await conn.fetchval("SELECT coordinator.pause_run($1)", run_id)
    return status


_PAUSED_RUN: Final = """
SELECT r.status, j.namespace, j.name
  FROM coordinator.runs r JOIN coordinator.jobs j ON j.id = r.job_id
 WHERE r.id = $1
   FOR UPDATE OF r
"""


async def resume_run(conn: Connection, run_id: int) -> int:
    """Resume the paused run ``run_id``: trigger its job, which queues that run again
    (same id, cursor and counter); return its id.

    Unlike a plain :func:`trigger`, it never starts a new run: a run that is no longer
    paused (resumed already, cancelled, or never paused) raises
    :class:`~coordinator.errors.Conflict` with its status, so a button on a page that
    was out of date does nothing. The run's row is locked from the check to the trigger,
    which is :func:`trigger` itself (what ``jobs trigger`` and the API's trigger call).
    """
    with translate_errors(run_id=run_id):
        async with conn.transaction():
            row = await conn.fetchrow(_PAUSED_RUN, run_id)
            if row is None:
                raise RunNotFound(run_id)
            if row["status"] != "paused":
                raise Conflict(
                    f"run {run_id} is {row['status']}, not paused: only a paused run resumes"
                )
            # The same front door as ``jobs trigger`` and the API's trigger.
            resumed = await trigger(conn, row["name"], namespace=row["namespace"])
    if resumed != run_id:  # not possible while the row is locked; never hide it
        raise Conflict(f"run {run_id} was not resumed: run {resumed} is its job's run")
    return resumed


# --------------------------------------------------------------------------- grants


@attrs.frozen(kw_only=True)
class GrantView:
    """One namespace granted to one role (``coordinator grants``)."""

    #: The PostgreSQL role (a login role, or a group whose members inherit it).
    role: str
    namespace: str
    #: ``read`` (SELECT only) or ``operate``.
    access: str
    granted_at: datetime
    granted_by: str
    #: Whether the policies confine the role at all: ``False`` for a superuser, a
    #: BYPASSRLS role, the schema's owner and members of coordinator_admin or
    #: coordinator_daemon, who see every namespace whatever their grants.
    confined: bool
    #: Whether the role still exists (a dropped role's grants stay until revoked).
    exists: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "namespace": self.namespace,
            "access": self.access,
            "granted_at": _iso(self.granted_at),
            "granted_by": self.granted_by,
            "confined": self.confined,
            "exists": self.exists,
        }


async def grant(conn: Connection, role: str, namespace: str, *, read_only: bool = False) -> str:
    """Let ``role`` read (``read_only``) or operate ``namespace`` (making it a member of
    ``coordinator_app``); ``granted``, ``changed`` or ``unchanged``. Needs
    ``coordinator_admin`` (or the schema's owner)."""
    _require_text(role, "role")
    check_namespace(namespace)
    with translate_errors(namespace=namespace, field="role"):
        result: str = await conn.fetchval(
            "SELECT coordinator.grant_namespace($1, $2, $3)", role, namespace, read_only
        )
    return result


async def revoke(conn: Connection, role: str, namespace: str) -> bool:
    """Withdraw ``role``'s grant of ``namespace``; whether there was one."""
    _require_text(role, "role")
    with translate_errors(namespace=namespace, field="role"):
        found: bool = await conn.fetchval(
            "SELECT coordinator.revoke_namespace($1, $2)", role, namespace
        )
    return found


_LIST_GRANTS: Final = """
SELECT g.role, g.namespace, g.read_only, g.granted_at, g.granted_by, r.oid IS NOT NULL AS exists,
       r.oid IS NOT NULL
       AND NOT (r.rolsuper OR r.rolbypassrls
                OR pg_has_role(r.oid, c.relowner, 'USAGE')
                OR pg_has_role(r.oid, 'coordinator_admin', 'USAGE')
                OR pg_has_role(r.oid, 'coordinator_daemon', 'USAGE')) AS confined
  FROM coordinator.namespace_grants g
  LEFT JOIN pg_roles r ON r.rolname = g.role
 CROSS JOIN (SELECT relowner FROM pg_class WHERE oid = 'coordinator.jobs'::regclass) c
 WHERE ($1::text IS NULL OR g.role = $1) AND ($2::text IS NULL OR g.namespace = $2)
 ORDER BY g.role, g.namespace
"""


async def list_grants(
    conn: Connection, *, role: str | None = None, namespace: str | None = None
) -> list[GrantView]:
    """Every grant (of ``role``, of ``namespace``), by role and namespace. An application
    role sees its own."""
    with translate_errors(namespace=namespace):
        found = await conn.fetch(_LIST_GRANTS, role, namespace)
    return [
        GrantView(
            role=row["role"],
            namespace=row["namespace"],
            access="read" if row["read_only"] else "operate",
            granted_at=row["granted_at"],
            granted_by=row["granted_by"],
            confined=bool(row["confined"]),
            exists=bool(row["exists"]),
        )
        for row in found
    ]


# --------------------------------------------------------------------------- reads


async def summary(conn: Connection) -> dict[str, Any]:
    """What the database alone says about the scheduler (``coordinator status``): job
    counts, the earliest saved deadline of a job that can run and that job, and
    outstanding runs by status.

    ``loadable`` counts the jobs a daemon loads at a refresh, by the refresh's own rule
    (neither paused nor invalid, and a cron or interval schedule, a saved deadline, or a
    run outstanding that is not paused), so it can be compared with the daemon's own
    count; ``manual`` and ``done`` (one-shot jobs whose instant was served) count the
    other jobs it leaves out. (A manual job with a queued or unresolved run is loaded:
    counted as manual-only, it made `status` say the daemon had run jobs it had not.)
    """
    with translate_errors():
        row = await conn.fetchrow(
            """
            WITH live AS (
                SELECT j.*, EXISTS (
                           SELECT 1 FROM coordinator.runs r
                            WHERE r.job_id = j.id
                              AND r.status IN ('queued', 'pending', 'running', 'unresolved',
                                               'cancel_requested')) AS outstanding
                  FROM coordinator.jobs j WHERE NOT j.paused AND j.invalid_reason IS NULL),
                 loads AS (
                SELECT *, schedule_kind IN ('cron', 'interval') OR next_run_at IS NOT NULL
                          OR outstanding AS loaded
                  FROM live)
            SELECT (SELECT count(*) FROM coordinator.jobs WHERE removed_at IS NULL) AS jobs,
                   (SELECT count(*) FROM coordinator.jobs
                     WHERE paused AND removed_at IS NULL) AS paused,
                   (SELECT count(*) FROM coordinator.jobs
                     WHERE invalid_reason IS NOT NULL AND removed_at IS NULL) AS invalid,
                   (SELECT count(*) FROM loads
                     WHERE NOT loaded AND schedule_kind = 'manual') AS manual,
                   (SELECT count(*) FROM loads
                     WHERE NOT loaded AND schedule_kind <> 'manual') AS done,
                   (SELECT count(*) FROM loads WHERE loaded) AS loadable,
                   n.next_run_at AS next_deadline, n.namespace || '/' || n.name AS next_job,
                   n.target ->> 'type' AS next_worker, b.id AS next_blocked_by,
                   (SELECT json_object_agg(status, n)::text FROM (
                        SELECT status, count(*) AS n FROM coordinator.runs
                         WHERE status IN ('queued', 'pending', 'running', 'unresolved',
                                          'cancel_requested', 'paused')
                         GROUP BY status) s) AS outstanding
              FROM (SELECT 1) one
              LEFT JOIN LATERAL (SELECT * FROM live WHERE next_run_at IS NOT NULL
                                  ORDER BY next_run_at LIMIT 1) n ON true
              LEFT JOIN LATERAL (SELECT r.id FROM coordinator.runs r
                                  WHERE r.job_id = n.id AND r.status = 'unresolved'
                                  LIMIT 1) b ON true
            """
        )
    return {
        "jobs": row["jobs"],
        "paused": row["paused"],
        "invalid": row["invalid"],
        "manual": row["manual"],
        "done": row["done"],
        "loadable": row["loadable"],
        "next_deadline": _iso(row["next_deadline"]),
        "next_job": row["next_job"],
        "next_worker": row["next_worker"],
        "next_blocked_by": row["next_blocked_by"],
        "outstanding": json.loads(row["outstanding"]) if row["outstanding"] else {},
    }


@attrs.frozen(kw_only=True)
class Leader:
    """The PostgreSQL session of the daemon that leads (holds the single-writer lock)."""

    #: Its backend process id.
    pid: int
    #: Its ``application_name`` (``coordinator`` for the daemon).
    application: str | None
    #: When the session started, when this role may see it (else ``None``).
    since: datetime | None


_LEADER: Final = """
SELECT l.pid, a.application_name, a.backend_start
  FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
   AND l.classid::bigint = $1 AND l.objid::bigint = $2
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
 LIMIT 1
"""


async def daemon_leader(conn: Connection) -> Leader | None:
    """The session holding the daemon's single-writer advisory lock, or ``None`` when no
    daemon leads on this database: whether anything will run, without the admin API."""
    from .store import LOCK_CLASS, LOCK_OBJECT

    with translate_errors():
        row = await conn.fetchrow(_LEADER, LOCK_CLASS, LOCK_OBJECT)
    if row is None:
        return None
    return Leader(pid=row["pid"], application=row["application_name"], since=row["backend_start"])


_JOB_COLUMNS: Final = f"""
    {rows.select_list()},
    j.created_at, j.updated_at,
    last.id AS last_run, last.status AS last_status, last.at AS last_run_at,
    o.id AS outstanding_run, o.status AS outstanding_status, o.due_at AS outstanding_due_at,
    o.attempt AS outstanding_attempt, o.paused_at AS outstanding_paused_at
  FROM coordinator.jobs j
  LEFT JOIN LATERAL (SELECT r.id, r.status,
                            coalesce(r.finished_at, r.started_at, r.created_at) AS at
                       FROM coordinator.runs r
                      WHERE r.job_id = j.id ORDER BY r.id DESC LIMIT 1) last ON true
  LEFT JOIN coordinator.runs o
         ON o.job_id = j.id AND o.status IN {_OUTSTANDING_SQL}
"""

_LIST_JOBS: Final = f"""
SELECT {_JOB_COLUMNS}
 WHERE ($1::text IS NULL OR j.namespace = $1) AND j.removed_at IS NULL
   AND ($2::text[] IS NULL OR j.namespace = ANY ($2::text[]))
 ORDER BY j.namespace, j.name
"""

#: The jobs due soonest: a saved deadline, neither paused nor invalid, earliest first
#: (``GET /api/jobs?due=N``: ``coordinator top`` read every job for its eight lines).
_DUE_JOBS: Final = f"""
SELECT {_JOB_COLUMNS}
 WHERE j.removed_at IS NULL AND j.next_run_at IS NOT NULL
   AND NOT j.paused AND j.invalid_reason IS NULL
   AND ($1::text[] IS NULL OR j.namespace = ANY ($1::text[]))
 ORDER BY j.next_run_at, j.id
 LIMIT $2
"""

_GET_JOB: Final = f"""
SELECT {_JOB_COLUMNS}
 WHERE j.namespace = $1 AND j.name = $2 AND j.removed_at IS NULL
"""

_GET_JOB_BY_ID: Final = f"""
SELECT {_JOB_COLUMNS}
 WHERE j.id = $1 AND j.removed_at IS NULL
"""


def _job_view(row: Mapping[str, Any]) -> JobView:
    outstanding_status = row["outstanding_status"]
    fields = rows.job_fields(row)
    # Whoever wrote the row (plain SQL too), a secret is never served.
    rules = redact.default()
    fields["params"] = rules.value(fields["params"])
    fields["target"] = rules.value(fields["target"])
    fields["invalid_reason"] = rules.optional(fields["invalid_reason"])
    return JobView(
        **fields,
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        last_run=row["last_run"],
        last_status=row["last_status"],
        last_run_at=row["last_run_at"],
        outstanding_run=row["outstanding_run"],
        outstanding_status=outstanding_status,
        outstanding_due_at=row["outstanding_due_at"],
        outstanding_attempt=row["outstanding_attempt"],
        outstanding_paused_at=row["outstanding_paused_at"],
        blocked_by=row["outstanding_run"] if outstanding_status == "unresolved" else None,
    )


async def list_jobs(
    conn: Connection,
    *,
    namespace: str | None = None,
    namespaces: Collection[str] | None = None,
) -> list[JobView]:
    """Every job (of ``namespace``, or of all namespaces), by namespace and name; only
    those of ``namespaces`` when given (an admin token's scope). A namespace no job could
    have is refused, not answered with none (``jobs list -n "bad ns"`` said "no jobs")."""
    if namespace is not None:
        check_namespace(namespace)
    scope = sorted(namespaces) if namespaces is not None else None
    with translate_errors(namespace=namespace):
        rows = await conn.fetch(_LIST_JOBS, namespace, scope)
    return [_job_view(row) for row in rows]


async def due_jobs(
    conn: Connection, limit: int, *, namespaces: Collection[str] | None = None
) -> list[JobView]:
    """The ``limit`` jobs due soonest (a saved deadline, not paused, not invalid), earliest
    first; only those of ``namespaces`` when given (an admin token's scope)."""
    scope = sorted(namespaces) if namespaces is not None else None
    with translate_errors():
        rows = await conn.fetch(_DUE_JOBS, scope, limit)
    return [_job_view(row) for row in rows]


_NAMESPACES_OF: Final = """
SELECT namespace FROM coordinator.jobs
 WHERE name = $1 AND namespace <> $2 AND removed_at IS NULL
 ORDER BY namespace
 LIMIT 4
"""


async def namespaces_with(conn: Connection, name: str, *, besides: str) -> list[str]:
    """The namespaces (at most four, besides ``besides``) with a job named ``name``: an
    unknown ``default/hello`` names the ``demo/hello`` that was meant."""
    rows = await conn.fetch(_NAMESPACES_OF, name, besides)
    return [str(r["namespace"]) for r in rows]


_JOBS_BESIDES: Final = """
SELECT count(*) OVER () AS n, namespace || '/' || name AS job
  FROM coordinator.jobs
 WHERE NOT (namespace = $1 AND name = ANY ($2::text[])) AND removed_at IS NULL
 ORDER BY namespace, name
 LIMIT $3
"""


async def jobs_besides(
    conn: Connection, namespace: str, names: Collection[str], *, sample: int = 3
) -> tuple[int, list[str]]:
    """How many jobs the database holds besides ``names`` of ``namespace``, and the
    first ``sample`` of them as ``namespace/name`` (``coordinator demo --dsn`` refuses a
    database whose other jobs its daemon would run). A database not migrated yet holds
    none (asked before migrating it: the demo refuses a database without changing it)."""
    if await conn.fetchval("SELECT to_regclass('coordinator.jobs') IS NULL"):
        return 0, []
    rows = await conn.fetch(_JOBS_BESIDES, namespace, list(names), sample)
    return (int(rows[0]["n"]) if rows else 0), [str(r["job"]) for r in rows]


async def get_job(conn: Connection, name: str, *, namespace: str = "default") -> JobView:
    """The job ``namespace/name``; raises :class:`~coordinator.errors.JobNotFound`, or
    :class:`~coordinator.errors.InvalidInput` for a namespace no job could have (the
    admin API answered ``GET /api/jobs/bad%20ns/x`` 404 for the job)."""
    check_namespace(namespace)
    with translate_errors(namespace=namespace, name=name):
        row = await conn.fetchrow(_GET_JOB, namespace, name)
    if row is None:
        raise JobNotFound(namespace, name)
    return _job_view(row)


async def get_job_by_id(conn: Connection, job_id: int) -> JobView:
    """The job with id ``job_id`` (what the daemon's events name); raises
    :class:`~coordinator.errors.JobNotFound`."""
    with translate_errors():
        row = await conn.fetchrow(_GET_JOB_BY_ID, job_id)
    if row is None:
        raise JobNotFound("?", f"#{job_id}")
    return _job_view(row)


_RUN_COLUMNS: Final = """
    r.id, r.job_id, j.namespace, j.name AS job, r.trigger, r.status, r.scheduled_for,
    r.claimed_at, r.started_at, r.finished_at, r.created_at, r.schedule_version,
    r.instance, r.args::text AS args, r.count, r.extra::text AS extra, r.error_cause,
    r.error_message, r.attempt, r.progress::text AS progress, r.category, r.retryable,
    r.exhausted, r.due_at, r.retry_of,
    (SELECT x.id FROM coordinator.runs x WHERE x.retry_of = r.id
      ORDER BY x.id LIMIT 1) AS retried_by, r.cursor::text AS cursor,
    r.last_progress_at, r.paused_at, r.resumes, r.finding_counts::text AS finding_counts,
    j.recoverable, j.removed_at IS NOT NULL AS job_removed
  FROM coordinator.runs r JOIN coordinator.jobs j ON j.id = r.job_id
"""

_LIST_RUNS: Final = f"""
SELECT {_RUN_COLUMNS}
 WHERE ($1::text IS NULL OR j.namespace = $1)
   AND ($2::text IS NULL OR j.name = $2)
   AND ($3::text IS NULL OR r.status = $3)
   AND ($5::bigint IS NULL OR r.id < $5)
   AND ($6::text IS NULL OR r.category = $6)
   AND ($7::text[] IS NULL OR j.namespace = ANY ($7::text[]))
   AND ($8::bigint IS NULL OR r.job_id = $8)
 ORDER BY r.id DESC
 LIMIT $4
"""

# The attempts a run belongs to: up the retry_of links to the first, then down from it
# (each run is retried at most once: a retry is queued only when no run is outstanding).
_RUN_CHAIN: Final = f"""
WITH RECURSIVE up(id, retry_of, depth) AS (
    SELECT id, retry_of, 0 FROM coordinator.runs WHERE id = $1
    UNION ALL
    SELECT p.id, p.retry_of, up.depth + 1 FROM coordinator.runs p JOIN up ON p.id = up.retry_of
     WHERE up.depth < 1000
), head AS (
    SELECT id FROM up ORDER BY depth DESC LIMIT 1
), down(id, depth) AS (
    SELECT id, 0 FROM head
    UNION ALL
    SELECT c.id, down.depth + 1 FROM coordinator.runs c JOIN down ON c.retry_of = down.id
     WHERE down.depth < 1000
)
SELECT {_RUN_COLUMNS}
 WHERE r.id IN (SELECT id FROM down)
 ORDER BY r.attempt, r.id
"""

_GET_RUN: Final = f"""
SELECT {_RUN_COLUMNS}
 WHERE r.id = $1
"""

_JOB_EXISTS: Final = (
    "SELECT EXISTS (SELECT 1 FROM coordinator.jobs WHERE namespace = $1 AND name = $2)"
    # (a removed job whose history is kept counts: its runs are listed)
)


def _run_view(row: Mapping[str, Any]) -> RunView:
    # Whoever wrote the row (plain SQL too), a secret is never served.
    rules = redact.default()
    return RunView(
        id=row["id"],
        job_id=row["job_id"],
        namespace=row["namespace"],
        job=row["job"],
        trigger=row["trigger"],
        status=row["status"],
        scheduled_for=row["scheduled_for"],
        claimed_at=row["claimed_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        created_at=row["created_at"],
        schedule_version=row["schedule_version"],
        instance=row["instance"],
        args=rules.value(_json_field(row["args"])),
        count=row["count"],
        extra=rules.mapping(_json_field(row["extra"])),
        error_cause=row["error_cause"],
        error_message=rules.optional(row["error_message"]),
        attempt=row["attempt"],
        progress=rules.value(_json_field(row["progress"])),
        category=row["category"],
        retryable=row["retryable"],
        exhausted=row["exhausted"],
        due_at=row["due_at"],
        retry_of=row["retry_of"],
        retried_by=row["retried_by"],
        cursor=_json_field(row["cursor"]),
        last_progress_at=row["last_progress_at"],
        paused_at=row["paused_at"],
        resumes=row["resumes"],
        finding_counts=_json_field(row["finding_counts"]) or {},
        recoverable=row["recoverable"],
        job_removed=bool(row.get("job_removed")),
    )


async def list_runs(
    conn: Connection,
    *,
    namespace: str | None = None,
    job: str | None = None,
    status: str | None = None,
    limit: int = 50,
    before: int | None = None,
    category: str | None = None,
    namespaces: Collection[str] | None = None,
    job_id: int | None = None,
) -> list[RunView]:
    """The newest runs first, at most ``limit``; ``status`` and ``category`` filter; with
    ``before``, only runs older than that run id (the next page of a listing that ended
    there); only runs of ``namespaces`` when given (an admin token's scope).

    ``job`` without ``namespace`` means the job in ``default``; an unknown job raises
    :class:`~coordinator.errors.JobNotFound` (rather than listing nothing). By name, the
    kept runs of a removed job of that name are listed too (``runs list --job``);
    ``job_id`` lists one job's own runs only (its page, its API).
    """
    if status is not None and status not in RUN_STATUSES:
        raise InvalidInput("status", f"must be one of {', '.join(RUN_STATUSES)}, not {status!r}")
    if category is not None and category not in CATEGORIES:
        raise InvalidInput("category", f"must be one of {', '.join(CATEGORIES)}, not {category!r}")
    if limit < 1:
        raise InvalidInput("limit", f"must be at least 1, not {limit}")
    if job is not None and namespace is None:
        namespace = "default"
    if namespace is not None:
        check_namespace(namespace)
    with translate_errors(namespace=namespace, name=job):
        scope = sorted(namespaces) if namespaces is not None else None
        rows = await conn.fetch(
            _LIST_RUNS, namespace, job, status, limit, before, category, scope, job_id
        )
        if not rows and job is not None and not await conn.fetchval(_JOB_EXISTS, namespace, job):
            raise JobNotFound(namespace or "default", job)
    return [_run_view(row) for row in rows]


async def get_run(conn: Connection, run_id: int) -> RunView:
    """The run ``run_id``; raises :class:`~coordinator.errors.RunNotFound`."""
    with translate_errors(run_id=run_id):
        row = await conn.fetchrow(_GET_RUN, run_id)
    if row is None:
        raise RunNotFound(run_id)
    return _run_view(row)


async def run_chain(conn: Connection, run_id: int) -> list[RunView]:
    """Every attempt of the work run ``run_id`` belongs to, first attempt first (the
    run alone when it was never retried); raises
    :class:`~coordinator.errors.RunNotFound`."""
    with translate_errors(run_id=run_id):
        rows = await conn.fetch(_RUN_CHAIN, run_id)
    if not rows:
        raise RunNotFound(run_id)
    return [_run_view(row) for row in rows]


def run_json(run: RunView, chain: Sequence[RunView]) -> dict[str, Any]:
    """A run with its chain of attempts (:func:`run_chain`): ``runs show --json`` and
    ``GET /api/runs/{id}`` alike (the API's lacked the chain)."""
    return {
        **run.to_json(),
        "attempts": [
            {
                "id": r.id,
                "attempt": r.attempt,
                "status": r.status,
                "category": r.category,
                "exhausted": r.exhausted,
                "due_at": _iso(r.due_at),
                "started_at": _iso(r.started_at),
                "finished_at": _iso(r.finished_at),
            }
            for r in chain
        ],
    }


_LIST_FINDINGS: Final = """
SELECT f.id, f.run_id, f.kind, f.resource_id, f.severity, f.detail::text AS detail,
       f.created_at
  FROM coordinator.findings f
 WHERE f.run_id = $1 AND f.id > $2 AND ($3::text IS NULL OR f.severity = $3)
 ORDER BY f.id
 LIMIT $4
"""

# Newest first, below an id (the web page's order): the same index, read backwards.
_LATEST_FINDINGS: Final = """
SELECT f.id, f.run_id, f.kind, f.resource_id, f.severity, f.detail::text AS detail,
       f.created_at
  FROM coordinator.findings f
 WHERE f.run_id = $1 AND ($2::bigint IS NULL OR f.id < $2)
   AND ($3::text IS NULL OR f.severity = $3)
 ORDER BY f.id DESC
 LIMIT $4
"""

_RUN_EXISTS: Final = "SELECT EXISTS (SELECT 1 FROM coordinator.runs WHERE id = $1)"

#: Largest page of findings.
MAX_FINDINGS_PAGE: Final = 1000


async def list_findings(
    conn: Connection,
    run_id: int,
    *,
    after: int | None = None,
    limit: int = 100,
    severity: str | None = None,
    newest_first: bool = False,
    before: int | None = None,
) -> FindingsPage:
    """A page of the run's findings in the order they were recorded: those with an id
    above ``after``, at most ``limit`` (1 to :data:`MAX_FINDINGS_PAGE`), of one
    ``severity`` if given. With ``newest_first`` (the web page), the newest first: those
    with an id below ``before`` if given, the next page's ``before`` in ``next_before``.
    An unknown run raises :class:`~coordinator.errors.RunNotFound`.
    """
    if severity is not None and severity not in SEVERITIES:
        raise InvalidInput("severity", f"must be one of {', '.join(SEVERITIES)}, not {severity!r}")
    if not 1 <= limit <= MAX_FINDINGS_PAGE:
        raise InvalidInput("limit", f"must be from 1 to {MAX_FINDINGS_PAGE}, not {limit}")
    if after is not None and after < 0:
        raise InvalidInput("after", f"must be a finding id (0 or more), not {after}")
    if before is not None and before < 1:
        raise InvalidInput("before", f"must be a finding id (1 or more), not {before}")
    if newest_first and after is not None:
        raise InvalidInput("after", "newest first pages go by before, not after")
    if before is not None and not newest_first:
        raise InvalidInput("before", "only newest first pages go by before")
    with translate_errors(run_id=run_id):
        # One more than asked: whether a next page exists, without counting.
        if newest_first:
            rows = await conn.fetch(_LATEST_FINDINGS, run_id, before, severity, limit + 1)
        else:
            rows = await conn.fetch(_LIST_FINDINGS, run_id, after or 0, severity, limit + 1)
        if not rows and not await conn.fetchval(_RUN_EXISTS, run_id):
            raise RunNotFound(run_id)
    findings = tuple(
        FindingView(
            id=r["id"],
            run_id=r["run_id"],
            kind=r["kind"],
            resource_id=r["resource_id"],
            severity=r["severity"],
            detail=redact.default().value(json.loads(r["detail"])),
            created_at=r["created_at"],
        )
        for r in rows[:limit]
    )
    last = findings[-1].id if len(rows) > limit else None
    if newest_first:
        return FindingsPage(findings=findings, next_after=None, next_before=last)
    return FindingsPage(findings=findings, next_after=last)


# --------------------------------------------------------------------------- statistics

#: One aggregate over ``runs_by_job_created`` (migrations/0008_web.sql): the runs of the
#: given jobs inside the window, counted per job, bucket and status. ``width_bucket``
#: finds each run's bucket in the edges array (a binary search), so calendar months
#: need no arithmetic here.
_RUN_STATS: Final = """
SELECT r.job_id, width_bucket(r.created_at, $2::timestamptz[]) AS bucket, r.status,
       count(*) AS n
  FROM coordinator.runs r
 WHERE r.job_id = ANY($1::bigint[]) AND r.created_at >= $3 AND r.created_at < $4
 GROUP BY 1, 2, 3
"""


@attrs.frozen(kw_only=True)
class RunStats:
    """A job's runs counted per status in each bucket of a span."""

    #: The job's ``namespace/name`` and id.
    job: str
    job_id: int
    #: The buckets (unit, step, edges).
    buckets: Buckets
    #: One mapping per bucket, oldest first: status -> runs created in it.
    counts: tuple[Mapping[str, int], ...]

    @property
    def totals(self) -> dict[str, int]:
        """Runs per status over the whole span."""
        out: dict[str, int] = {}
        for bucket in self.counts:
            for status, n in bucket.items():
                out[status] = out.get(status, 0) + n
        return out

    def to_json(self) -> dict[str, Any]:
        """The ``GET /api/jobs/{ns}/{name}/stats`` body."""
        return {
            "job": self.job,
            "since": _iso(self.buckets.since),
            "until": _iso(self.buckets.until),
            "unit": self.buckets.unit,
            "step": self.buckets.step,
            "buckets": [
                {"start": _iso(start), "end": _iso(end), "counts": dict(counts)}
                for (start, end), counts in zip(self.buckets.spans(), self.counts, strict=True)
            ],
            "totals": self.totals,
        }


async def jobs_stats(
    conn: Connection, jobs: Sequence[JobView], buckets: Buckets
) -> dict[int, RunStats]:
    """Run counts per status in each of ``buckets`` for each of ``jobs`` (by job id): one
    statement however many jobs (the web page's sparklines)."""
    ids = [job.id for job in jobs]
    counts: dict[int, list[dict[str, int]]] = {i: [{} for _ in range(buckets.count)] for i in ids}
    if ids:
        with translate_errors():
            rows = await conn.fetch(
                _RUN_STATS, ids, list(buckets.edges), buckets.edges[0], buckets.edges[-1]
            )
        for row in rows:
            index = row["bucket"] - 1
            if 0 <= index < buckets.count:
                counts[row["job_id"]][index][row["status"]] = row["n"]
    return {
        job.id: RunStats(job=job.key, job_id=job.id, buckets=buckets, counts=tuple(counts[job.id]))
        for job in jobs
    }


async def run_stats(
    conn: Connection,
    name: str,
    *,
    namespace: str = "default",
    since: datetime,
    until: datetime,
) -> RunStats:
    """The runs of ``namespace/name`` created in ``[since, until]``, counted per status in
    8 to 30 buckets of an hour, day, week or month multiple (:func:`buckets.choose`)."""
    chosen = buckets_mod.choose(since, until)
    job = await get_job(conn, name, namespace=namespace)
    return (await jobs_stats(conn, [job], chosen))[job.id]


async def wait_for_run(
    conn: Connection,
    run_id: int,
    *,
    poll: tuple[float, float] = (0.05, 1.0),
    max_wait: float | None = None,
) -> RunView:
    """Poll the run until it is terminal (or ``unresolved``, which waits for an operator,
    or ``paused``, which waits for a trigger).

    ``poll`` is ``(first, longest)`` pause between reads, in seconds: the pause doubles
    from the first up to the longest (50 ms to 1 s by default). ``max_wait`` (seconds)
    bounds the wait: past it :class:`WaitTimeout` carries the run's last state. Only the
    CLI's ``--wait`` uses this; the daemon itself never polls.
    """
    first, longest = poll
    if first <= 0 or longest < first:
        raise InvalidInput("poll", "needs 0 < first <= longest")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_wait if max_wait is not None else None
    pause_for = first
    while True:
        run = await get_run(conn, run_id)
        if run.status in _WAIT_ENDS:
            return run
        sleep_for = pause_for
        if deadline is not None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                assert max_wait is not None
                raise WaitTimeout(run, max_wait)
            sleep_for = min(sleep_for, remaining)
        await asyncio.sleep(sleep_for)
        pause_for = min(pause_for * 2, longest)


# --------------------------------------------------------------------------- retention


@attrs.frozen(kw_only=True)
class PruneView:
    """What retention would delete of one job now (``coordinator prune --dry-run``)."""

    job_id: int
    namespace: str
    name: str
    #: Removed with its history kept (its runs go by age, its latest too).
    removed: bool
    #: Its runs, and how many of them a prune would delete now.
    runs: int
    prunable: int
    #: The rules that apply to it (its own, or the defaults).
    keep_last: int
    retention: timedelta

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "namespace": self.namespace,
            "name": self.name,
            "removed": self.removed,
            "runs": self.runs,
            "prunable": self.prunable,
            "keep_last": self.keep_last,
            "retention": self.retention.total_seconds(),
        }


@attrs.frozen(kw_only=True)
class PruneReport:
    """What a prune run from the command line deleted."""

    runs: int
    jobs_removed: int
    batches: int

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "jobs_removed": self.jobs_removed, "batches": self.batches}


async def prune_preview(
    conn: Connection, *, retention: timedelta, keep_last: int = DEFAULT_KEEP_LAST
) -> list[PruneView]:
    """Every job with runs, and what a prune with these defaults would delete of it now
    (a job's own ``keep_last``/``retention`` win). Reads only."""
    check_retention(keep_last, retention)
    with translate_errors():
        found = await conn.fetch(
            "SELECT * FROM coordinator._prune_preview(now(), $1::interval, $2) WHERE runs > 0",
            retention,
            keep_last,
        )
    return [
        PruneView(
            job_id=r["job_id"],
            namespace=r["namespace"],
            name=r["name"],
            removed=r["removed"],
            runs=r["runs"],
            prunable=r["prunable"],
            keep_last=r["keep_last"],
            retention=r["retention"],
        )
        for r in found
    ]


async def prune(
    conn: Connection,
    *,
    retention: timedelta,
    keep_last: int = DEFAULT_KEEP_LAST,
    batch: int = 2000,
    yield_ratio: float = 1.0,
) -> PruneReport:
    """Prune now, as the daemon does at ``prune_at``: batches of at most ``batch`` runs,
    each its own transaction, pausing ``yield_ratio`` times a batch's duration between."""
    check_retention(keep_last, retention)
    loop = asyncio.get_running_loop()
    resume: tuple[int, int] | None = (0, 0)
    runs = removed = batches = 0
    while resume is not None:
        began = loop.time()
        with translate_errors():
            row = await conn.fetchrow(
                "SELECT * FROM coordinator._prune($1, $2, $3, 500, now(), $4::interval, $5)",
                resume[0],
                resume[1],
                batch,
                retention,
                keep_last,
            )
        batches += 1
        runs += row["deleted"]
        removed += row["removed_jobs"]
        resume = None if row["next_job"] is None else (row["next_job"], row["next_after"])
        if resume is not None:
            await asyncio.sleep((loop.time() - began) * yield_ratio)
    return PruneReport(runs=runs, jobs_removed=removed, batches=batches)
