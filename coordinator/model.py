"""Value types shared by the daemon, the CLI and the client.

They mirror the rows of ``coordinator.jobs`` and ``coordinator.runs`` (see
``migrations/``) and carry no behaviour beyond validation: schedule arithmetic lives in
:mod:`coordinator.schedule`, SQL in :mod:`coordinator.store` and :mod:`coordinator.client`.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, cast

import attrs

from .core.admission import Priority
from .protocol import CATEGORIES, SEVERITIES, Category, Severity

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

ScheduleKind = Literal["cron", "interval", "once", "manual"]
SCHEDULE_KINDS: tuple[ScheduleKind, ...] = ("cron", "interval", "once", "manual")

PRIORITIES: tuple[Priority, ...] = ("interactive", "background")

RunStatus = Literal[
    "queued",
    "pending",
    "running",
    "cancel_requested",
    "paused",
    "succeeded",
    "failed",
    "timed_out",
    "cancelled",
    "unresolved",
]
#: A job has at most one run in these states (the partial unique index enforces it).
OUTSTANDING: frozenset[str] = frozenset(
    {"queued", "pending", "running", "unresolved", "cancel_requested", "paused"}
)
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "timed_out", "cancelled"})

#: Retention keeps at most this many of a job's newest runs, unless the job says otherwise
#: (``jobs.keep_last``).
DEFAULT_KEEP_LAST = 100

#: How a call ended (the statuses an :class:`Outcome` may carry). ``paused``: a
#: recoverable run stopped at a cursor; it stays outstanding until resumed or cancelled.
#: ``queued``: the run was never sent and is given back (``queued`` again, or, a run of
#: the schedule, removed so that its saved deadline stands; migrations/0023).
OutcomeStatus = Literal["succeeded", "failed", "timed_out", "cancelled", "paused", "queued"]
Trigger = Literal["schedule", "manual", "retry"]
ErrorCause = Literal["handler", "timeout", "crashed", "lost"]
#: What a job does with a deadline found overdue (docs/design.md, "Misfires").
Misfire = Literal["run-once", "skip"]
MISFIRE_POLICIES: tuple[Misfire, ...] = ("run-once", "skip")
#: The retry policy's defaults (``coordinator.define_job``'s too).
DEFAULT_RETRY_BACKOFF: timedelta = timedelta(seconds=30)
DEFAULT_RETRY_MAX_DELAY: timedelta = timedelta(hours=1)
#: The shortest misfire grace (a claim is that late only after a restart or a wait).
MIN_MISFIRE_GRACE: timedelta = timedelta(seconds=1)
#: Most retries a job may ask for.
MAX_RETRIES: int = 100
#: A command's exit status that means "temporary failure, retry" (sysexits' EX_TEMPFAIL).
EXIT_TEMPFAIL: int = 75


def _frozen_mapping(value: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(value or {})


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _findings(value: Iterable[Finding]) -> tuple[Finding, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True, cache_hash=True)
class Schedule:
    """When a job is due, as its definition says."""

    #: ``cron`` | ``interval`` | ``once`` | ``manual``.
    kind: ScheduleKind = attrs.field(validator=attrs.validators.in_(SCHEDULE_KINDS))
    #: The cron expression, the interval (``90s``, ``5m``, ``1h30m``), the ISO 8601 instant,
    #: or ``None`` for a manual job.
    expression: str | None = None
    #: IANA timezone in which a cron expression is read.
    timezone: str = "UTC"


#: The most bytes one environment string (``NAME=value`` and its NUL) may have on Linux
#: (MAX_ARG_STRLEN, 32 pages): a command job's params travel as one,
#: ``COORDINATOR_PARAMS``, so they are refused at definition beyond it.
ENV_STRING_MAX: Final = 131072


def params_env(params: object) -> str:
    """``COORDINATOR_PARAMS``: a command job's params as JSON, non-ASCII text as UTF-8
    (escaped as ``\\uXXXX`` it took up to three times the bytes of the 128 KiB the
    variable holds: a tester's 50 KB of "é" was refused as 150,009 bytes)."""
    return json.dumps(params, default=str, ensure_ascii=False)


def params_env_size(params: object) -> int:
    """Bytes of ``COORDINATOR_PARAMS=<params as JSON>`` and its NUL, as a command gets it."""
    return len(b"COORDINATOR_PARAMS=") + len(params_env(params).encode()) + 1


@attrs.frozen(kw_only=True)
class Target:
    """What a run calls: a command (``exec``) or a connected worker serving ``worker_type``."""

    #: ``exec`` or ``worker``.
    kind: Literal["exec", "worker"] = attrs.field(
        validator=attrs.validators.in_(("exec", "worker"))
    )
    #: The command and its arguments (``exec`` only).
    argv: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    #: Extra environment for the command (``exec`` only).
    env: dict[str, str] = attrs.field(factory=dict, converter=_frozen_mapping)
    #: Working directory for the command (``exec`` only); ``None`` keeps the daemon's.
    cwd: str | None = None
    #: The job type a worker must serve (``worker`` only).
    worker_type: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The shape stored in ``jobs.target``."""
        if self.kind == "worker":
            return {"kind": "worker", "type": self.worker_type}
        out: dict[str, Any] = {"kind": "exec", "argv": list(self.argv)}
        if self.env:
            out["env"] = dict(self.env)
        if self.cwd is not None:
            out["cwd"] = self.cwd
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Target:
        """Read ``jobs.target``; raises ``ValueError`` naming what is wrong."""
        kind = data.get("kind")
        if kind == "worker":
            worker_type = data.get("type")
            if not isinstance(worker_type, str) or not worker_type:
                raise ValueError("worker target needs a non-empty 'type'")
            return cls(kind="worker", worker_type=worker_type)
        if kind == "exec":
            argv = data.get("argv")
            if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
                raise ValueError("exec target needs 'argv', a non-empty list of strings")
            env = data.get("env") or {}
            if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()
            ):
                raise ValueError("exec target 'env' must map strings to strings")
            cwd = data.get("cwd")
            if cwd is not None and not isinstance(cwd, str):
                raise ValueError("exec target 'cwd' must be a string")
            return cls(kind="exec", argv=tuple(argv), env=cast("dict[str, str]", env), cwd=cwd)
        raise ValueError(f"target kind must be 'exec' or 'worker', not {kind!r}")

    def describe(self) -> str:
        """One short human line: ``worker:billing`` or the command."""
        if self.kind == "worker":
            return f"worker:{self.worker_type}"
        return " ".join(self.argv)


@attrs.frozen(kw_only=True)
class Job:
    """A job definition, as stored."""

    #: Primary key.
    id: int
    #: Owner of the job (a service or plugin).
    namespace: str
    #: Unique within the namespace.
    name: str
    #: When it is due.
    schedule: Schedule
    #: What it calls.
    target: Target
    #: Static parameters handed to every call.
    params: dict[str, Any] = attrs.field(factory=dict, converter=_frozen_mapping)
    #: Longest a call may take; ``None`` means no limit.
    timeout: timedelta | None = None
    #: ``interactive`` work is admitted before ``background`` work.
    priority: Priority = "background"
    #: A run lost to a crash may be repeated once without asking an operator.
    idempotent: bool = False
    #: Paused jobs are never dispatched.
    paused: bool = False
    #: Set when the schedule cannot be used; such a job is inert.
    invalid_reason: str | None = None
    #: The saved deadline, or ``None``.
    next_run_at: datetime | None = None
    #: Bumped whenever the schedule changes.
    schedule_version: int = 1
    #: Attempts after the first that a failed or timed-out run gets (0: none).
    retries: int = 0
    #: Delay before the first retry; it doubles with each attempt, up to
    #: ``retry_max_delay``, less up to a quarter of it at random.
    retry_backoff: timedelta = DEFAULT_RETRY_BACKOFF
    retry_max_delay: timedelta = DEFAULT_RETRY_MAX_DELAY
    #: ``run-once``: an overdue deadline runs once; ``skip``: one later than
    #: ``misfire_grace`` is skipped and the next deadline computed from now.
    misfire: Misfire = "run-once"
    misfire_grace: timedelta | None = None
    #: Runs save a cursor and pause instead of failing when stopped (worker targets only).
    recoverable: bool = False
    #: Failures of the job are alerted (when alerts are configured).
    alert: bool = True
    #: Retention keeps at most this many of the job's newest runs (``None``: the default).
    keep_last: int | None = None
    #: How long the job's finished runs are kept (``None``: the ``retention`` setting).
    retention: timedelta | None = None

    @property
    def key(self) -> str:
        """``namespace/name``, as logs and messages print it."""
        return f"{self.namespace}/{self.name}"


@attrs.frozen(kw_only=True)
class Cursor:
    """Where a recoverable run resumes from: any JSON value (``None`` is JSON null, a
    fresh start). Wrapped so that "no cursor to save" (``Outcome.cursor is None``) and
    "the cursor null" stay apart."""

    #: The JSON value, as the worker sent it.
    value: Any = None


@attrs.frozen(kw_only=True)
class Finding:
    """One thing a run found, recorded once per (run, kind, resource id)."""

    #: What was checked or found (``missing_blob``).
    kind: str
    #: Which resource it concerns (a key, a path, an id).
    resource_id: str
    #: ``info`` | ``warning`` | ``error`` | ``data_loss``.
    severity: Severity = attrs.field(validator=attrs.validators.in_(SEVERITIES))
    #: Anything else worth keeping (a JSON object).
    detail: dict[str, Any] = attrs.field(factory=dict, converter=_frozen_mapping)

    def to_json(self) -> dict[str, Any]:
        """The shape stored (``coordinator.findings``) and spooled."""
        return {
            "kind": self.kind,
            "resource_id": self.resource_id,
            "severity": self.severity,
            "detail": dict(self.detail),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        return cls(
            kind=str(data["kind"]),
            resource_id=str(data["resource_id"]),
            severity=data["severity"],
            detail=data.get("detail") or {},
        )


@attrs.frozen(kw_only=True)
class CheckpointWrite:
    """One coalesced write of a running call: what changed since the last one."""

    #: The latest cursor (``None``: unchanged).
    cursor: Cursor | None = None
    #: The run's counter total (``None``: unchanged). A total, not a delta: a write
    #: repeated after an unknown outcome changes nothing.
    count: int | None = None
    #: Findings received since the last write.
    findings: tuple[Finding, ...] = attrs.field(default=(), converter=_findings)


@attrs.frozen(kw_only=True)
class Outcome:
    """The result of one call, exactly as it will be saved.

    Kept whole in memory (and in the spool) until PostgreSQL has acknowledged it, so a
    failed write is retried with the same values and the executor is never called again.
    """

    #: ``succeeded`` | ``failed`` | ``timed_out`` | ``cancelled`` | ``paused`` |
    #: ``queued`` (never sent: given back; ``error_message`` says why, and is not saved).
    status: OutcomeStatus
    #: When the call started and finished (wall time, aware).
    started_at: datetime
    finished_at: datetime
    #: The primary scalar the job reports (rows swept, files sent, ...); for a recoverable
    #: run, its counter's total (every checkpoint's delta since it first started).
    count: int | None = None
    #: Anything else the job reports, plus the bounded output tail.
    extra: dict[str, Any] = attrs.field(factory=dict, converter=_frozen_mapping)
    #: Why it did not succeed: ``handler`` | ``timeout`` | ``crashed`` | ``lost``.
    error_cause: ErrorCause | None = None
    #: A human-readable reason: why it did not succeed, or why it paused.
    error_message: str | None = None
    #: The category when the executor knows better than the default for the status and
    #: cause (``coordinator._category``): a worker's report, a command's exit status 75,
    #: a command killed by a signal. ``None``: the default.
    category: Category | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(CATEGORIES))
    )
    #: What the worker or command said about retrying: ``False`` stops retries, ``True``
    #: asks for one while attempts remain, ``None`` leaves it to the job's policy.
    retryable: bool | None = None
    #: The cursor saved with the result (recoverable runs); ``None``: leave the run's as is.
    cursor: Cursor | None = None
    #: Findings not yet written when the call ended: saved with the result.
    findings: tuple[Finding, ...] = attrs.field(default=(), converter=_findings)

    @property
    def elapsed(self) -> timedelta:
        return self.finished_at - self.started_at


@attrs.frozen(kw_only=True)
class Claim:
    """A run that the claim boundary granted: what the executor needs, and what settles it."""

    #: The run being executed.
    run_id: int
    #: The job, as it was under the row lock.
    job: Job
    #: ``schedule`` | ``manual`` | ``retry``.
    trigger: Trigger
    #: The deadline this run serves (scheduled runs), else ``None``.
    scheduled_for: datetime | None
    #: Dispatch arguments (``force`` and friends).
    args: dict[str, Any] = attrs.field(factory=dict, converter=_frozen_mapping)
    #: 1 for a first attempt.
    attempt: int = 1
    #: When the claim committed.
    claimed_at: datetime
    #: The saved cursor a resumed recoverable run continues from (``None``: from the start).
    cursor: Cursor | None = None
    #: The run's counter so far (a resumed recoverable run continues it).
    count: int | None = None
    #: How many times the run was resumed (0: its first call).
    resumes: int = 0
