"""The worker protocol's wire format (``docs/worker-protocol.md``), pure: no I/O.

A connection carries newline-delimited JSON (UTF-8) in both directions: one object per
line, at most :data:`MAX_LINE` bytes without the newline. Every object has ``"v": 1``
and a ``"type"``; unknown fields are ignored (room to grow), an unknown type is an
error. Workers send ``hello`` (first), ``declare`` (the schedules their code carries),
``progress``, ``checkpoint``, ``finding``, ``result`` and ``bye``; the daemon sends
``welcome``, ``declared``, ``call``, ``cancel`` and ``error``.

Each message is a frozen attrs value whose validators hold the protocol's limits, so a
message built by the daemon or by the SDK is as valid as one that was parsed.
:func:`parse` (and its one-sided forms :func:`parse_from_worker` and
:func:`parse_from_daemon`) raise :class:`ProtocolError` with a message meant for the
peer; :func:`encode` returns one line ready to send. :class:`LineBuffer` splits a byte
stream into lines and refuses oversized ones.

Layering: imports nothing from the shell (only :mod:`coordinator.errors`).
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, TypeAlias, cast

import attrs
import trio

from .errors import CoordinatorError, InvalidInput
from .text import check_job_name, check_namespace, json_kind, storable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

#: The protocol version every message carries as ``"v"``.
VERSION: Final = 1
#: Longest line (bytes, newline excluded) either side accepts.
MAX_LINE: Final = 64 * 1024
#: Longest progress ``message`` (characters).
MAX_MESSAGE: Final = 500
#: Longest step ``label`` (characters).
MAX_LABEL: Final = 200
#: Longest worker id or job type (characters).
MAX_NAME: Final = 200
#: Most job types one worker may serve.
MAX_TYPES: Final = 256
#: Largest capacity a worker may declare.
MAX_CAPACITY: Final = 1024
#: Largest checkpoint cursor: its compact JSON encoding, in bytes.
MAX_CURSOR: Final = 16 * 1024
#: Most findings in one ``finding`` message.
MAX_FINDINGS: Final = 1000
#: Longest finding ``kind`` (characters).
MAX_KIND: Final = 200
#: Longest finding ``resource_id`` (characters).
MAX_RESOURCE_ID: Final = 1000
#: Largest finding ``detail``: its compact JSON encoding, in bytes.
MAX_DETAIL: Final = 16 * 1024

Severity = Literal["info", "warning", "error", "data_loss"]
#: How bad a finding is, least first.
SEVERITIES: Final[tuple[Severity, ...]] = ("info", "warning", "error", "data_loss")
#: Why the daemon cancels a call: its timeout passed, the daemon is stopping, or an
#: operator paused the run (recoverable jobs).
CANCEL_REASONS: Final = ("timeout", "stopping", "pause")


class _NoCursor:
    """The absence of a cursor in a ``result`` (``None`` is JSON null, a valid cursor)."""

    def __repr__(self) -> str:
        return "NO_CURSOR"


#: ``Result.cursor`` when the result carries none.
NO_CURSOR: Final[Any] = _NoCursor()

ProgressMode = Literal["determinate", "indeterminate", "step"]
PROGRESS_MODES: Final[tuple[ProgressMode, ...]] = ("determinate", "indeterminate", "step")

#: Why a run that did not succeed failed, in the words ``runs.category`` holds (the
#: daemon sets the last four from how a call ended; a worker may report any of them).
Category = Literal[
    "invalid-input",
    "timeout",
    "cancellation",
    "external-dependency",
    "provider-failure",
    "storage",
    "unknown",
]
CATEGORIES: Final[tuple[Category, ...]] = (
    "invalid-input",
    "timeout",
    "cancellation",
    "external-dependency",
    "provider-failure",
    "storage",
    "unknown",
)
#: Longest ``category`` a result may carry (characters): a word from a later version is
#: accepted and recorded as ``unknown``, a paragraph is a malformed message.
MAX_CATEGORY: Final = 64

_BIGINT_MIN, _BIGINT_MAX = -(2**63), 2**63 - 1


def default_socket_path() -> Path:
    """Where the daemon listens for workers unless configured (and where workers look):
    ``$RUNTIME_DIRECTORY/worker.sock`` under systemd, ``/run/coordinator/worker.sock``
    for root, else ``$XDG_RUNTIME_DIR/coordinator/worker.sock`` or
    ``/tmp/coordinator-$UID/worker.sock``."""
    env = os.environ.get("RUNTIME_DIRECTORY")
    if env:
        return Path(env.split(":", 1)[0]) / "worker.sock"
    if os.geteuid() == 0:
        return Path("/run/coordinator/worker.sock")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "coordinator" / "worker.sock"
    return Path(f"/tmp/coordinator-{os.geteuid()}") / "worker.sock"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or ``localhost``) is a loopback address: a TCP
    listener anywhere else serves other hosts, which needs TLS and workers' own tokens."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


#: Most bytes gathered into one write by :func:`gather_lines`.
MAX_WRITE: Final = 256 * 1024


def write_ahead(
    fd: int | None,
    data: bytes,
    outbox: trio.MemorySendChannel[bytes] | trio.MemoryReceiveChannel[bytes],
) -> bytes:
    """Write what the plain socket ``fd`` takes of ``data`` at once, if the writer task
    of ``outbox`` waits for a line (nothing queued, in hand or being written before it);
    returns what is left for the writer (all of it otherwise, or with no ``fd``: TLS).
    A lone line then leaves this scheduler round, not the next; under load lines are
    left to the writer, which sends those of one round in one write."""
    if fd is None or not outbox.statistics().tasks_waiting_receive:
        return data
    try:
        written = os.write(fd, data)
    except OSError:
        written = 0  # (full, or broken: the writer finds out)
    return data[written:]


def gather_lines(first: bytes, outbox: trio.MemoryReceiveChannel[bytes]) -> bytes:
    """``first`` and the lines already queued behind it, as one write: under load many
    calls (or results) go out in one ``send`` (the protocol allows any number of lines
    per write), while a lone line still goes at once."""
    if len(first) >= MAX_WRITE:
        return first
    chunks = [first]
    size = len(first)
    while size < MAX_WRITE:
        try:
            more = outbox.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            break
        chunks.append(more)
        size += len(more)
    return b"".join(chunks) if len(chunks) > 1 else first


class ProtocolError(CoordinatorError, ValueError):
    """A message that breaks the protocol; ``message`` is what the peer is told."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# -- validators ---------------------------------------------------------------------------


def _check_name(what: str) -> Any:
    def check(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, str) or not value.strip():
            raise ProtocolError(f"{what}: '{attr.name}' must be a non-empty string")
        if len(value) > MAX_NAME:
            raise ProtocolError(f"{what}: '{attr.name}' is longer than {MAX_NAME} characters")

    return check


def _check_positive(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if not _is_int(value) or not 1 <= value <= _BIGINT_MAX:  # type: ignore[operator]
        raise ProtocolError(f"'{attr.name}' must be a positive 64-bit integer, not {_shown(value)}")


def _check_types(_inst: object, _attr: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    if not value:
        raise ProtocolError("hello: 'types' must list at least one job type")
    if len(value) > MAX_TYPES:
        raise ProtocolError(f"hello: 'types' lists more than {MAX_TYPES} job types")
    for item in value:
        if not isinstance(item, str) or not item.strip() or len(item) > MAX_NAME:
            raise ProtocolError(
                f"hello: every job type must be a non-empty string of at most {MAX_NAME} "
                f"characters, not {_shown(item)}"
            )
    if len(set(value)) != len(value):
        raise ProtocolError("hello: 'types' lists a job type twice")


def _check_capacity(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    if not _is_int(value) or not 1 <= value <= MAX_CAPACITY:  # type: ignore[operator]
        raise ProtocolError(
            f"hello: 'capacity' must be an integer from 1 to {MAX_CAPACITY}, not {_shown(value)}"
        )


def _check_optional_text(what: str, limit: int) -> Any:
    def check(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
        if value is None:
            return
        if not isinstance(value, str):
            raise ProtocolError(f"{what}: '{attr.name}' must be a string")
        if len(value) > limit:
            raise ProtocolError(f"{what}: '{attr.name}' is longer than {limit} characters")

    return check


def _check_int64(what: str) -> Any:
    def check(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
        if value is None:
            return
        if not _is_int(value) or not _BIGINT_MIN <= value <= _BIGINT_MAX:  # type: ignore[operator]
            raise ProtocolError(
                f"{what}: '{attr.name}' must be a 64-bit integer, not {_shown(value)}"
            )

    return check


_check_count = _check_int64("result")


def _check_cursor_of(what: str) -> Any:
    def check(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
        if value is NO_CURSOR:
            return
        try:
            size = len(_dumps(value))
        except (TypeError, ValueError, RecursionError) as exc:
            raise ProtocolError(f"{what}: 'cursor' is not JSON: {exc}") from None
        if size > MAX_CURSOR:
            raise ProtocolError(
                f"{what}: 'cursor' is {size} bytes as JSON; the limit is {MAX_CURSOR}"
            )

    return check


_check_cursor = _check_cursor_of("checkpoint")


_check_delta = _check_int64("checkpoint")


def _check_text(what: str, limit: int) -> Any:
    def check(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, str) or not value:
            raise ProtocolError(f"{what}: '{attr.name}' must be a non-empty string")
        if len(value) > limit:
            raise ProtocolError(f"{what}: '{attr.name}' is longer than {limit} characters")

    return check


def _check_severity(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    if value not in SEVERITIES:
        raise ProtocolError(
            f"finding: 'severity' must be one of {', '.join(SEVERITIES)}, not {_shown(value)}"
        )


def _check_detail(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, dict):
        raise ProtocolError(f"finding: 'detail' must be a JSON object, not {_shown(value)}")
    try:
        size = len(_dumps(value))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"finding: 'detail' is not JSON: {exc}") from None
    if size > MAX_DETAIL:
        raise ProtocolError(f"finding: 'detail' is {size} bytes as JSON; the limit is {MAX_DETAIL}")


def _check_items(_inst: object, _attr: attrs.Attribute[Any], value: tuple[Any, ...]) -> None:
    if not value:
        raise ProtocolError("finding: 'findings' must list at least one finding")
    if len(value) > MAX_FINDINGS:
        raise ProtocolError(f"finding: 'findings' lists more than {MAX_FINDINGS} findings")
    for item in value:
        if not isinstance(item, FindingItem):
            raise ProtocolError(f"finding: not a finding: {_shown(item)}")


def _check_aware(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ProtocolError(f"call: '{attr.name}' must be an aware datetime or null")


def _as_items(value: Iterable[FindingItem]) -> tuple[FindingItem, ...]:
    return tuple(value)


def _as_tuple(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise ProtocolError("hello: 'types' must be a list of job types")
    return tuple(value)


# -- messages -----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Hello:
    """worker → daemon, first message: who the worker is and what it serves."""

    TYPE: ClassVar[str] = "hello"

    #: The worker's id; a second connection with the same id replaces the first.
    worker: str = attrs.field(validator=_check_name("hello"))
    #: The job types it serves (``Target.worker_type``).
    types: tuple[str, ...] = attrs.field(converter=_as_tuple, validator=_check_types)
    #: How many calls it runs at once (1 to :data:`MAX_CAPACITY`).
    capacity: int = attrs.field(validator=_check_capacity)
    #: The shared secret; required over TCP, ignored on the Unix socket.
    token: str | None = attrs.field(default=None, validator=_check_optional_text("hello", 1024))

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"worker": self.worker, "types": list(self.types)}
        out["capacity"] = self.capacity
        if self.token is not None:
            out["token"] = self.token
        return out


def _check_progress(inst: Progress, _attr: attrs.Attribute[Any], value: object) -> None:
    if inst.mode == "determinate" and value is None:
        raise ProtocolError("progress: mode 'determinate' needs a 'percent'")
    if inst.mode == "indeterminate" and value is not None:
        raise ProtocolError("progress: mode 'indeterminate' takes no 'percent'")
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= 100
    ):
        raise ProtocolError(f"progress: 'percent' must be a number from 0 to 100, not {value!r}")


def _check_label(inst: Progress, attr: attrs.Attribute[Any], value: object) -> None:
    if inst.mode == "step" and (not isinstance(value, str) or not value.strip()):
        raise ProtocolError("progress: mode 'step' needs a non-empty 'label'")
    _check_optional_text("progress", MAX_LABEL)(inst, attr, value)


@attrs.frozen(kw_only=True)
class Progress:
    """worker → daemon: how far a run has got (the latest one wins)."""

    TYPE: ClassVar[str] = "progress"

    #: The run (as given by ``call``).
    run: int = attrs.field(validator=_check_positive)
    #: ``determinate`` (a percent), ``indeterminate`` (busy), ``step`` (a named stage).
    mode: ProgressMode = attrs.field(validator=attrs.validators.in_(PROGRESS_MODES))
    #: 0 to 100: required with ``determinate``, optional with ``step``, absent otherwise.
    percent: float | None = attrs.field(default=None, validator=_check_progress)
    #: The stage's name: required with ``step``, optional otherwise.
    label: str | None = attrs.field(default=None, validator=_check_label)
    #: A short human line (at most :data:`MAX_MESSAGE` characters).
    message: str | None = attrs.field(
        default=None, validator=_check_optional_text("progress", MAX_MESSAGE)
    )

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run": self.run, "mode": self.mode}
        if self.percent is not None:
            out["percent"] = self.percent
        if self.label is not None:
            out["label"] = self.label
        if self.message is not None:
            out["message"] = self.message
        return out


@attrs.frozen(kw_only=True)
class Checkpoint:
    """worker → daemon: a cursor the run could resume from (any JSON, bounded), and how
    much its counter grew since the last checkpoint."""

    TYPE: ClassVar[str] = "checkpoint"

    #: The run (as given by ``call``).
    run: int = attrs.field(validator=_check_positive)
    #: Opaque to the daemon; handed back in ``call.checkpoint`` when the run resumes.
    cursor: Any = attrs.field(validator=_check_cursor)
    #: Added to the run's counter (recoverable jobs), if given.
    count: int | None = attrs.field(default=None, validator=_check_delta)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run": self.run, "cursor": self.cursor}
        if self.count is not None:
            out["count"] = self.count
        return out


@attrs.frozen(kw_only=True)
class FindingItem:
    """One finding of a ``finding`` message."""

    #: What was found (``missing_blob``), 1 to :data:`MAX_KIND` characters.
    kind: str = attrs.field(validator=_check_text("finding", MAX_KIND))
    #: The resource it concerns, 1 to :data:`MAX_RESOURCE_ID` characters.
    resource_id: str = attrs.field(validator=_check_text("finding", MAX_RESOURCE_ID))
    #: ``info`` | ``warning`` | ``error`` | ``data_loss``.
    severity: Severity = attrs.field(validator=_check_severity)
    #: Anything else worth keeping: a JSON object of at most :data:`MAX_DETAIL` bytes.
    detail: dict[str, Any] = attrs.field(factory=dict, validator=_check_detail)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "resource_id": self.resource_id,
            "severity": self.severity,
        }
        if self.detail:
            out["detail"] = self.detail
        return out


@attrs.frozen(kw_only=True)
class Finding:
    """worker → daemon: findings of a run, a batch at a time (recorded once each per
    run, kind and resource id: a batch sent again records nothing twice)."""

    TYPE: ClassVar[str] = "finding"

    #: The run (as given by ``call``).
    run: int = attrs.field(validator=_check_positive)
    #: 1 to :data:`MAX_FINDINGS` findings.
    findings: tuple[FindingItem, ...] = attrs.field(converter=_as_items, validator=_check_items)

    def to_wire(self) -> dict[str, Any]:
        return {"run": self.run, "findings": [item.to_wire() for item in self.findings]}


@attrs.frozen(kw_only=True)
class Result:
    """worker → daemon: how a call ended; frees the worker's slot."""

    TYPE: ClassVar[str] = "result"

    #: The run (as given by ``call``).
    run: int = attrs.field(validator=_check_positive)
    #: Whether the handler succeeded.
    ok: bool = attrs.field(validator=attrs.validators.instance_of(bool))
    #: The run's primary scalar (64-bit), if any.
    count: int | None = attrs.field(default=None, validator=_check_count)
    #: Anything else worth keeping on the run (a JSON object).
    extra: dict[str, Any] | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(dict))
    )
    #: Why it failed (``ok`` false).
    error: str | None = attrs.field(
        default=None, validator=_check_optional_text("result", MAX_LINE)
    )
    #: ``false``: do not retry this failure; ``true``: retry it while attempts remain;
    #: absent: the job's policy decides (``ok`` false only).
    retryable: bool | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(bool))
    )
    #: One of :data:`CATEGORIES` (``ok`` false only).
    category: str | None = attrs.field(
        default=None, validator=_check_optional_text("result", MAX_CATEGORY)
    )
    #: The call stopped at ``cursor`` (or at its last checkpoint) and can be resumed: a
    #: recoverable run becomes ``paused``. Needs ``ok`` true: a paused call did not fail.
    paused: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    #: A last checkpoint's cursor, saved with the result; :data:`NO_CURSOR` when absent.
    cursor: Any = attrs.field(default=NO_CURSOR, validator=_check_cursor_of("result"))

    def __attrs_post_init__(self) -> None:
        if self.paused and not self.ok:
            raise ProtocolError("result: 'paused' needs 'ok': true (a paused call did not fail)")

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run": self.run, "ok": self.ok}
        if self.count is not None:
            out["count"] = self.count
        if self.extra is not None:
            out["extra"] = self.extra
        if self.error is not None:
            out["error"] = self.error
        if self.retryable is not None:
            out["retryable"] = self.retryable
        if self.category is not None:
            out["category"] = self.category
        if self.paused:
            out["paused"] = True
        if self.cursor is not NO_CURSOR:
            out["cursor"] = self.cursor
        return out


#: The schedule keys of a declared job (as in a manifest), exactly one per job.
SCHEDULE_KEYS: Final = ("cron", "every", "at", "manual")
#: Most jobs one ``declare`` may list.
MAX_DECLARED: Final = 1024
#: A declared job's durations and words besides its schedule: text, as in a manifest.
_DECLARED_TEXT: Final = ("timezone", "timeout", "priority", "retry_backoff", "retry_max_delay",
                         "misfire", "misfire_grace", "retention")  # fmt: skip
_DECLARED_KEYS: Final = frozenset(
    {"name", "job_type", *SCHEDULE_KEYS, *_DECLARED_TEXT, "idempotent", "paused", "params",
     "retries", "recoverable", "alert", "keep_last"}
)  # fmt: skip


def _check_declared_name(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    try:
        check_job_name(value, "declare: 'name'")
    except InvalidInput as exc:
        raise ProtocolError(str(exc)) from None


@attrs.frozen(kw_only=True)
class DeclaredJob:
    """One job a worker declares (``declare.jobs``): a manifest entry whose target is
    the worker's own job type."""

    #: The job's name in the namespace (the SDK uses the job type).
    name: str = attrs.field(validator=_check_declared_name)
    #: One of the worker's ``types``: the job's target.
    job_type: str = attrs.field(validator=_check_name("declare"))
    #: ``cron`` | ``every`` | ``at`` | ``manual``, and its expression (``None`` for manual).
    schedule: str = attrs.field(validator=attrs.validators.in_(SCHEDULE_KEYS))
    expression: str | None = attrs.field(
        default=None, validator=_check_optional_text("declare", MAX_NAME)
    )
    #: IANA timezone of a cron expression.
    timezone: str | None = attrs.field(
        default=None, validator=_check_optional_text("declare", MAX_NAME)
    )
    #: A duration with its unit (``10m``), or ``None``.
    timeout: str | None = attrs.field(
        default=None, validator=_check_optional_text("declare", MAX_NAME)
    )
    priority: str | None = attrs.field(
        default=None, validator=_check_optional_text("declare", MAX_NAME)
    )
    idempotent: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    paused: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    params: dict[str, Any] = attrs.field(factory=dict, validator=attrs.validators.instance_of(dict))
    #: The retry policy: attempts after a failure, the first delay and the longest (each
    #: ``None``: the default, as a manifest entry without it).
    retries: int | None = attrs.field(default=None, validator=_check_int64("declare"))
    retry_backoff: str | None = attrs.field(
        default=None, validator=_check_optional_text("declare", MAX_NAME)
    )
    retry_max_delay: str | None = attrs.field(
        default=None, validator=_check_optional_text("declare", MAX_NAME)
    )
    #: ``run-once`` | ``skip`` (with ``misfire_grace``), or ``None``: the default.
    misfire: str | None = attrs.field(
        default=None, validator=_check_optional_text("declare", MAX_NAME)
    )
    misfire_grace: str | None = attrs.field(
        default=None, validator=_check_optional_text("declare", MAX_NAME)
    )
    #: Runs keep a cursor and pause (``ctx.checkpoint``).
    recoverable: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    #: ``False``: never alert on this job's failures.
    alert: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    #: Retention keeps at most the newest ``keep_last`` runs / none finished longer ago
    #: than ``retention`` (``None``: the settings).
    keep_last: int | None = attrs.field(default=None, validator=_check_int64("declare"))
    retention: str | None = attrs.field(
        default=None, validator=_check_optional_text("declare", MAX_NAME)
    )

    def __attrs_post_init__(self) -> None:
        if (self.schedule == "manual") != (self.expression is None):
            raise ProtocolError(
                f"declare: job {self.name!r}: "
                + ("manual takes no expression" if self.schedule == "manual" else
                   f"'{self.schedule}' needs an expression")
            )  # fmt: skip

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "job_type": self.job_type}
        out[self.schedule] = True if self.schedule == "manual" else self.expression
        for key in (*_DECLARED_TEXT, "retries", "keep_last"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        for flag in ("idempotent", "paused", "recoverable"):
            if getattr(self, flag):
                out[flag] = True
        if not self.alert:
            out["alert"] = False
        if self.params:
            out["params"] = self.params
        return out


def _check_declared(_inst: object, _attr: attrs.Attribute[Any], value: tuple[Any, ...]) -> None:
    if len(value) > MAX_DECLARED:
        raise ProtocolError(f"declare: at most {MAX_DECLARED} jobs, not {len(value)}")
    names = [job.name for job in value]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ProtocolError(f"declare: job {twice!r} is declared twice")


def _job_tuple(value: Iterable[DeclaredJob]) -> tuple[DeclaredJob, ...]:
    return tuple(value)


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _check_declared_namespace(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    try:
        check_namespace(value, "declare: 'namespace'")
    except InvalidInput as exc:
        raise ProtocolError(str(exc)) from None


@attrs.frozen(kw_only=True)
class Declare:
    """worker → daemon, after ``hello``: the complete set of jobs the worker's code
    schedules in ``namespace`` (a manifest, sent by the code). The daemon syncs it with
    the manifest's semantics: listed jobs are created or updated when they differ, the
    namespace's other jobs are paused."""

    TYPE: ClassVar[str] = "declare"

    namespace: str = attrs.field(validator=_check_declared_namespace)
    jobs: tuple[DeclaredJob, ...] = attrs.field(converter=_job_tuple, validator=_check_declared)

    def to_wire(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "jobs": [job.to_wire() for job in self.jobs]}


@attrs.frozen(kw_only=True)
class Declared:
    """daemon → worker: what a ``declare`` did (``ok``), or why nothing was applied."""

    TYPE: ClassVar[str] = "declared"

    namespace: str = attrs.field(validator=attrs.validators.instance_of(str))
    #: Applied (or nothing needed applying).
    ok: bool = attrs.field(validator=attrs.validators.instance_of(bool))
    created: int = 0
    updated: int = 0
    paused: int = 0
    #: Nothing differed from what was stored: nothing was written.
    unchanged: bool = False
    #: ``job: field: reason`` for each problem (``ok`` false: nothing applied).
    problems: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    #: Why it could not be applied otherwise (the database...), if so.
    error: str | None = None
    #: Applied, but another connected worker declares this namespace with other jobs:
    #: each declaration pauses the other's (the daemon's ``worker.declare_conflict``).
    conflict: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"namespace": self.namespace, "ok": self.ok}
        if self.ok:
            out.update(created=self.created, updated=self.updated, paused=self.paused)
            out["unchanged"] = self.unchanged
        if self.conflict is not None:
            out["conflict"] = self.conflict
        if self.problems:
            out["problems"] = list(self.problems)
        if self.error is not None:
            out["error"] = self.error
        return out


@attrs.frozen(kw_only=True)
class Bye:
    """worker → daemon: send me nothing new; close once my calls have their results."""

    TYPE: ClassVar[str] = "bye"

    def to_wire(self) -> dict[str, Any]:
        return {}


@attrs.frozen(kw_only=True)
class Welcome:
    """daemon → worker: the ``hello`` was accepted; calls may follow."""

    TYPE: ClassVar[str] = "welcome"

    #: The worker id, echoed.
    worker: str = attrs.field(validator=_check_name("welcome"))

    def to_wire(self) -> dict[str, Any]:
        return {"worker": self.worker}


@attrs.frozen(kw_only=True)
class Call:
    """daemon → worker: run a job now."""

    TYPE: ClassVar[str] = "call"

    #: The run id; every later message about this call names it.
    run: int = attrs.field(validator=_check_positive)
    #: The job's name and namespace.
    job: str = attrs.field(validator=attrs.validators.instance_of(str))
    namespace: str = attrs.field(validator=attrs.validators.instance_of(str))
    #: The job type (one of the worker's ``types``); ``job_type`` on the wire too, since
    #: ``type`` names the message.
    job_type: str = attrs.field(validator=attrs.validators.instance_of(str))
    #: The dispatch arguments (``force`` and friends).
    args: dict[str, Any] = attrs.field(factory=dict, validator=attrs.validators.instance_of(dict))
    #: The job's static parameters.
    params: dict[str, Any] = attrs.field(factory=dict, validator=attrs.validators.instance_of(dict))
    #: When the daemon will cancel the call (the job's timeout), or ``None``.
    deadline: datetime | None = attrs.field(default=None, validator=_check_aware)
    #: 1 for a first attempt.
    attempt: int = attrs.field(default=1, validator=_check_positive)
    #: The cursor to resume from, or ``None`` for a fresh start.
    checkpoint: Any = None
    #: ``schedule`` | ``manual`` | ``retry``, when known.
    trigger: str | None = None
    #: The deadline this run serves (scheduled runs).
    scheduled_for: datetime | None = attrs.field(default=None, validator=_check_aware)
    #: The job is recoverable: stopping (pause, stop, timeout) should end the call with a
    #: paused result at a cursor rather than a failure.
    recoverable: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    #: The run's counter so far (a resumed recoverable run), or ``None``.
    count: int | None = attrs.field(default=None, validator=_check_int64("call"))

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "run": self.run,
            "job": self.job,
            "namespace": self.namespace,
            "job_type": self.job_type,
            "args": self.args,
            "params": self.params,
            "deadline": _iso(self.deadline),
            "attempt": self.attempt,
            "checkpoint": self.checkpoint,
        }
        if self.trigger is not None:
            out["trigger"] = self.trigger
        if self.scheduled_for is not None:
            out["scheduled_for"] = _iso(self.scheduled_for)
        if self.recoverable:
            out["recoverable"] = True
        if self.count is not None:
            out["count"] = self.count
        return out


@attrs.frozen(kw_only=True)
class Cancel:
    """daemon → worker: stop this run (its timeout passed, the daemon is stopping, or an
    operator paused it)."""

    TYPE: ClassVar[str] = "cancel"

    #: The run to stop.
    run: int = attrs.field(validator=_check_positive)
    #: ``timeout``, ``stopping`` or ``pause``: why.
    reason: str = attrs.field(validator=attrs.validators.instance_of(str))

    def to_wire(self) -> dict[str, Any]:
        return {"run": self.run, "reason": self.reason}


@attrs.frozen(kw_only=True)
class Error:
    """daemon → worker: the last message broke the protocol; the connection closes."""

    TYPE: ClassVar[str] = "error"

    #: What was wrong, for a human.
    message: str = attrs.field(validator=attrs.validators.instance_of(str))

    def to_wire(self) -> dict[str, Any]:
        return {"message": self.message}


WorkerMessage: TypeAlias = Hello | Declare | Progress | Checkpoint | Finding | Result | Bye
DaemonMessage: TypeAlias = Welcome | Declared | Call | Cancel | Error
Message: TypeAlias = WorkerMessage | DaemonMessage


# -- encoding -----------------------------------------------------------------------------


def encode(message: Message) -> bytes:
    """One line (newline included). Raises ``TypeError``/``ValueError`` for values that
    are not JSON (the SDK turns that into a failed result); never checks the length:
    compare with :data:`MAX_LINE` where it matters."""
    body = message.to_wire()
    body["v"] = VERSION
    body["type"] = message.TYPE
    return _dumps(body) + b"\n"


#: One encoder for every line (``json.dumps`` with options builds a new one per call).
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _dumps(value: Any) -> bytes:
    return _ENCODER.encode(value).encode()


#: A handler's free-form ``extra``: anything JSON cannot say (datetimes, decimals, ...)
#: becomes its ``str()``.
_LENIENT: Final = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str
)


def encode_success(run: int, count: int | None, extra: dict[str, Any] | None) -> bytes:
    """A successful ``result`` line whose ``extra`` is encoded leniently (values JSON
    cannot say as their ``str()``), and once: the SDK used to encode it to check it,
    decode that, and encode the line again, a third of a no-op call's time. Raises
    like :func:`encode`.

    Written directly, not through a :class:`Result` and its dict: the two numbers are
    checked by ``Result``'s own validators, and the line is the one :func:`encode` would
    write (keys in another order). Building the message object and its dict was more
    than half of this function's time, and this runs once per call in every worker."""
    _check_positive(None, _RESULT.run, run)
    _check_count(None, _RESULT.count, count)
    line = b'{"run":%d,"ok":true' % run
    if count is not None:
        line += b',"count":%d' % count
    if extra:
        try:
            text = _LENIENT.encode(extra)
        except ValueError:  # NaN or an infinity (``default`` is not asked for floats)
            text = _LENIENT.encode(_finite(extra))
        line += b',"extra":' + text.encode()
    return line + _RESULT_TAIL


def _finite(value: Any) -> Any:
    """``value`` with every NaN and infinity written as its ``str()`` (``nan``, ``inf``),
    as :data:`_LENIENT` writes what JSON cannot say. (A cycle recurses until
    :class:`RecursionError`, which the caller reports as a bad return value.)"""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


#: :func:`encode_success`'s view of ``Result``'s fields (their validators name them) and
#: the end of its line.
_RESULT: Final = attrs.fields(Result)
_RESULT_TAIL: Final = b',"v":%d,"type":"%s"}\n' % (VERSION, Result.TYPE.encode())


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


# -- parsing ------------------------------------------------------------------------------


def parse(line: bytes | str) -> Message:
    """Any message, from either side. Raises :class:`ProtocolError`."""
    return _parse(line, None)


def parse_from_worker(line: bytes | str) -> WorkerMessage:
    """A message a worker may send; a daemon-side type is refused."""
    message = _parse(line, _FROM_WORKER)
    assert isinstance(message, Hello | Declare | Progress | Checkpoint | Finding | Result | Bye)
    return message


def parse_from_daemon(line: bytes | str) -> DaemonMessage:
    """A message the daemon may send; a worker-side type is refused."""
    message = _parse(line, _FROM_DAEMON)
    assert isinstance(message, Welcome | Declared | Call | Cancel | Error)
    return message


def _parse(line: bytes | str, allowed: frozenset[str] | None) -> Message:
    obj = _load(line)
    kind = obj["type"]
    reader = _READERS.get(kind)
    if reader is None:
        raise ProtocolError(f"unknown message type {_shown(kind)}")
    if allowed is not None and kind not in allowed:
        if kind in _FROM_WORKER:
            raise ProtocolError(f"message type '{kind}' is sent by a worker, not the daemon")
        raise ProtocolError(f"message type '{kind}' is sent by the daemon, not a worker")
    try:
        return reader(obj)
    except ProtocolError:
        raise
    except (TypeError, ValueError) as exc:  # a validator or converter of ours
        raise ProtocolError(f"{kind}: {exc}") from None


def _load(line: bytes | str) -> dict[str, Any]:
    """One line's JSON object, checked for size, encoding and shape."""
    if isinstance(line, bytes | bytearray):
        if len(line) > MAX_LINE:
            raise ProtocolError(f"line of {len(line)} bytes is longer than {MAX_LINE}")
        try:
            text = bytes(line).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"not UTF-8: {exc.reason} at byte {exc.start}") from None
    else:
        text = line
        if len(text.encode("utf-8", "surrogatepass")) > MAX_LINE:
            raise ProtocolError(f"line is longer than {MAX_LINE} bytes")
    try:
        obj: Any = _DECODER.decode(text)
    except RecursionError:
        raise ProtocolError("malformed JSON: nested too deeply") from None
    except ValueError as exc:
        raise ProtocolError(f"malformed JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"a message must be a JSON object, not {json_kind(obj)}")
    if "\\u" in text:  # only escapes can smuggle in NUL or an unpaired surrogate
        obj = storable(obj)
    version = obj.get("v")
    if version is None:
        raise ProtocolError("missing 'v' (the protocol version)")
    if not _is_int(version) or version != VERSION:
        raise ProtocolError(f"unsupported protocol version {_shown(version)}; expected {VERSION}")
    if not isinstance(obj.get("type"), str):
        raise ProtocolError("missing 'type' (a string)")
    return cast("dict[str, Any]", obj)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


#: One decoder for every line (``json.loads`` with options builds a new one per call).
_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant)


def _field(obj: dict[str, Any], kind: str, name: str, expected: type | tuple[type, ...]) -> Any:
    if name not in obj:
        raise ProtocolError(f"{kind}: missing '{name}'")
    value = obj[name]
    if not isinstance(value, expected) or (isinstance(value, bool) and expected is int):
        raise ProtocolError(f"{kind}: '{name}' must be {_describe(expected)}, not {_shown(value)}")
    return value


def _optional(obj: dict[str, Any], kind: str, name: str, expected: type | tuple[type, ...]) -> Any:
    if obj.get(name) is None:
        return None
    return _field(obj, kind, name, expected)


def _describe(expected: type | tuple[type, ...]) -> str:
    names = {
        int: "an integer",
        str: "a string",
        bool: "true or false",
        dict: "a JSON object",
        list: "a JSON array",
        float: "a number",
    }
    if isinstance(expected, tuple):
        return " or ".join(names.get(t, t.__name__) for t in expected)
    return names.get(expected, expected.__name__)


def _datetime(obj: dict[str, Any], name: str) -> datetime | None:
    value = _optional(obj, "call", name, str)
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ProtocolError(f"call: '{name}' is not an ISO 8601 timestamp: {value!r}") from None
    if parsed.utcoffset() is None:
        raise ProtocolError(f"call: '{name}' needs a UTC offset: {value!r}")
    return parsed


def _read_hello(obj: dict[str, Any]) -> Hello:
    types = _field(obj, "hello", "types", list)
    return Hello(
        worker=_field(obj, "hello", "worker", str),
        types=tuple(types),
        capacity=_field(obj, "hello", "capacity", int),
        token=_optional(obj, "hello", "token", str),
    )


def _read_progress(obj: dict[str, Any]) -> Progress:
    mode = _field(obj, "progress", "mode", str)
    if mode not in PROGRESS_MODES:
        raise ProtocolError(
            f"progress: 'mode' must be one of {', '.join(PROGRESS_MODES)}, not {_shown(mode)}"
        )
    # Progress is advisory: an over-long label or message is cut to its limit, as the
    # SDK cuts it, not a protocol error that drops the connection and every call on it
    # (a raw worker that put an exception's text there lost them all; a tester's finding).
    label = _optional(obj, "progress", "label", str)
    message = _optional(obj, "progress", "message", str)
    return Progress(
        run=_field(obj, "progress", "run", int),
        mode=mode,
        percent=_optional(obj, "progress", "percent", (int, float)),
        label=None if label is None else label[:MAX_LABEL],
        message=None if message is None else message[:MAX_MESSAGE],
    )


def _read_checkpoint(obj: dict[str, Any]) -> Checkpoint:
    if "cursor" not in obj:
        raise ProtocolError("checkpoint: missing 'cursor'")
    return Checkpoint(
        run=_field(obj, "checkpoint", "run", int),
        cursor=obj["cursor"],
        count=_optional(obj, "checkpoint", "count", int),
    )


def _read_finding(obj: dict[str, Any]) -> Finding:
    run = _field(obj, "finding", "run", int)
    items = _field(obj, "finding", "findings", list)
    if len(items) > MAX_FINDINGS:
        raise ProtocolError(f"finding: 'findings' lists more than {MAX_FINDINGS} findings")
    findings = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise ProtocolError(f"finding: findings[{index}] must be a JSON object")
        where = f"finding: findings[{index}]"
        detail = item.get("detail")
        findings.append(
            FindingItem(
                kind=_field(item, where, "kind", str),
                resource_id=_field(item, where, "resource_id", str),
                severity=_field(item, where, "severity", str),
                detail={} if detail is None else detail,
            )
        )
    return Finding(run=run, findings=tuple(findings))


def _read_result(obj: dict[str, Any]) -> Result:
    return Result(
        run=_field(obj, "result", "run", int),
        ok=_field(obj, "result", "ok", bool),
        count=_optional(obj, "result", "count", int),
        extra=_optional(obj, "result", "extra", dict),
        error=_optional(obj, "result", "error", str),
        retryable=_optional(obj, "result", "retryable", bool),
        category=_optional(obj, "result", "category", str),
        paused=_optional(obj, "result", "paused", bool) or False,
        cursor=obj.get("cursor", NO_CURSOR),
    )


def _read_declared_job(index: int, raw: object) -> DeclaredJob:
    where = f"declare: jobs[{index}]"
    if not isinstance(raw, dict):
        raise ProtocolError(f"{where} must be a JSON object")
    unknown = sorted(set(raw) - _DECLARED_KEYS)
    if unknown:
        raise ProtocolError(f"{where}: unknown key {unknown[0]!r}")
    given = [key for key in SCHEDULE_KEYS if raw.get(key) is not None]
    if len(given) != 1:
        raise ProtocolError(f"{where}: give exactly one of {', '.join(SCHEDULE_KEYS)}")
    key = given[0]
    if key == "manual":
        if raw["manual"] is not True:
            raise ProtocolError(f"{where}: 'manual' must be true")
        expression = None
    else:
        expression = _field(raw, where, key, str)
    return DeclaredJob(
        name=_field(raw, where, "name", str),
        job_type=_field(raw, where, "job_type", str),
        schedule=key,
        expression=expression,
        idempotent=_optional(raw, where, "idempotent", bool) or False,
        paused=_optional(raw, where, "paused", bool) or False,
        params=_optional(raw, where, "params", dict) or {},
        retries=_optional(raw, where, "retries", int),
        recoverable=_optional(raw, where, "recoverable", bool) or False,
        alert=_optional(raw, where, "alert", bool) is not False,
        keep_last=_optional(raw, where, "keep_last", int),
        **{key: _optional(raw, where, key, str) for key in _DECLARED_TEXT},
    )


def _read_declare(obj: dict[str, Any]) -> Declare:
    jobs = _field(obj, "declare", "jobs", list)
    if len(jobs) > MAX_DECLARED:
        raise ProtocolError(f"declare: at most {MAX_DECLARED} jobs, not {len(jobs)}")
    return Declare(
        namespace=_field(obj, "declare", "namespace", str),
        jobs=tuple(_read_declared_job(i, raw) for i, raw in enumerate(jobs)),
    )


def _read_declared(obj: dict[str, Any]) -> Declared:
    problems = _optional(obj, "declared", "problems", list) or []
    return Declared(
        namespace=_field(obj, "declared", "namespace", str),
        ok=_field(obj, "declared", "ok", bool),
        created=_optional(obj, "declared", "created", int) or 0,
        updated=_optional(obj, "declared", "updated", int) or 0,
        paused=_optional(obj, "declared", "paused", int) or 0,
        unchanged=_optional(obj, "declared", "unchanged", bool) or False,
        problems=tuple(str(p) for p in problems),
        error=_optional(obj, "declared", "error", str),
        conflict=_optional(obj, "declared", "conflict", str),
    )


def _read_bye(_obj: dict[str, Any]) -> Bye:
    return Bye()


def _read_welcome(obj: dict[str, Any]) -> Welcome:
    return Welcome(worker=_field(obj, "welcome", "worker", str))


def _read_call(obj: dict[str, Any]) -> Call:
    return Call(
        run=_field(obj, "call", "run", int),
        job=_field(obj, "call", "job", str),
        namespace=_field(obj, "call", "namespace", str),
        job_type=_field(obj, "call", "job_type", str),
        args=_optional(obj, "call", "args", dict) or {},
        params=_optional(obj, "call", "params", dict) or {},
        deadline=_datetime(obj, "deadline"),
        attempt=_optional(obj, "call", "attempt", int) or 1,
        checkpoint=obj.get("checkpoint"),
        trigger=_optional(obj, "call", "trigger", str),
        scheduled_for=_datetime(obj, "scheduled_for"),
        recoverable=_optional(obj, "call", "recoverable", bool) or False,
        count=_optional(obj, "call", "count", int),
    )


def _read_cancel(obj: dict[str, Any]) -> Cancel:
    return Cancel(
        run=_field(obj, "cancel", "run", int),
        reason=_optional(obj, "cancel", "reason", str) or "",
    )


def _read_error(obj: dict[str, Any]) -> Error:
    return Error(message=_optional(obj, "error", "message", str) or "")


_FROM_WORKER: Final = frozenset(
    {"hello", "declare", "progress", "checkpoint", "finding", "result", "bye"}
)
_FROM_DAEMON: Final = frozenset({"welcome", "declared", "call", "cancel", "error"})
_READERS: Final[dict[str, Callable[[dict[str, Any]], Message]]] = {
    "hello": _read_hello,
    "declare": _read_declare,
    "declared": _read_declared,
    "progress": _read_progress,
    "checkpoint": _read_checkpoint,
    "finding": _read_finding,
    "result": _read_result,
    "bye": _read_bye,
    "welcome": _read_welcome,
    "call": _read_call,
    "cancel": _read_cancel,
    "error": _read_error,
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: object) -> str:
    """A received value in a refusal: JSON's words for null, true and false (the peer
    wrote those, not Python's ``None``/``True``), a repr cut short for the rest."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "…"


# -- framing ------------------------------------------------------------------------------


@attrs.define(eq=False)
class LineBuffer:
    """Splits received bytes into lines; memory stays bounded by ``limit``."""

    #: Longest line accepted (bytes, newline excluded).
    limit: int = MAX_LINE
    _buf: bytearray = attrs.field(factory=bytearray, init=False)

    def feed(self, data: bytes | bytearray) -> list[bytes]:
        """The complete lines ``data`` finishes (without their newline; blank lines are
        skipped). Raises :class:`ProtocolError` once a line exceeds ``limit``."""
        buf = self._buf
        if b"\n" not in data:
            buf += data
            if len(buf) > self.limit:
                raise ProtocolError(f"line longer than {self.limit} bytes")
            return []
        buf += data
        lines: list[bytes] = []
        start = 0
        while (end := buf.find(b"\n", start)) >= 0:
            if end - start > self.limit:
                raise ProtocolError(f"line of {end - start} bytes is longer than {self.limit}")
            line = bytes(buf[start:end])
            if line.strip():
                lines.append(line)
            start = end + 1
        del buf[:start]
        if len(buf) > self.limit:
            raise ProtocolError(f"line longer than {self.limit} bytes")
        return lines

    @property
    def pending(self) -> int:
        """Bytes of an unfinished line."""
        return len(self._buf)
