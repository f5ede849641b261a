"""``coordinator sync MANIFEST.toml``: a namespace's complete job set, read from TOML.

Format::

    namespace = "billing"          # required: the namespace this file declares

    [[jobs]]
    name = "invoice-run"           # required, unique in the file
    cron = "0 3 * * *"             # exactly one of cron / every / at / manual = true
    timezone = "Europe/Berlin"     # cron only; default UTC
    timeout = "15m"                # a duration with its unit: 90s, 5m, 1h30m
    priority = "background"        # or "interactive"
    idempotent = false
    paused = false                 # absent: a job keeps its paused state (see below)
    retries = 3                    # attempts after a failed or timed-out run; default 0
    retry_backoff = "30s"          # first retry delay, doubling; default 30s
    retry_max_delay = "1h"         # longest delay between attempts; default 1h
    misfire = "skip"               # or "run-once" (default: an overdue deadline runs once)
    misfire_grace = "5m"           # with misfire = "skip": how late it may still run
    recoverable = false            # worker jobs only: runs keep a cursor and pause
    alert = true                   # false: never alert on this job's failures
    keep_last = 100                # retention keeps at most the newest 100 runs
    retention = "90d"              # none finished longer ago than this (default: the setting)
    params = { region = "eu" }     # any table; TOML dates become ISO 8601 strings
    command = ["/usr/local/bin/invoice", "--all"]   # exactly one of command / worker
    env = { LANG = "C.UTF-8" }     # command only
    cwd = "/srv/billing"           # command only

    [[jobs]]
    name = "reindex"
    every = "6h"
    worker = "search"

``paused`` is the job's state rather than its definition: absent, a job keeps the state
it has (one that ``jobs pause`` paused stays paused), except that a job a previous sync
paused because the file no longer listed it is resumed; ``paused = false`` resumes any.

``every``, ``timeout``, ``retention`` and the retry and misfire durations take a duration with its
unit (``every = 6`` or ``"6"`` is refused: six seconds or six hours?); ``at`` an ISO 8601
instant with an offset, quoted or as a TOML offset date-time. A file without ``jobs``
(or with ``jobs = []``) is an empty declaration: every job of the namespace is paused.

Parsing is pure (no database). The file-level mistakes that would make the whole sync
mean something else (TOML syntax, a missing ``namespace``, an unknown top-level key such as
a misspelt ``[[job]]``) raise :class:`~coordinator.errors.InvalidInput`. Mistakes inside an
entry are *problems* ``(job, field, reason)``: the entry is kept, in the SQL shape, with
``invalid_reason`` saying what is wrong, so ``sync`` stores it inert while the rest applies
(``--strict`` applies nothing instead). An entry without a usable name (see
:mod:`coordinator.text`) cannot be stored and is dropped; a name listed twice keeps its
first entry, made inert.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from datetime import date, datetime, time, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import attrs

from . import schedule as schedules
from .client import job_entry
from .errors import InvalidInput
from .model import (
    DEFAULT_RETRY_BACKOFF,
    DEFAULT_RETRY_MAX_DELAY,
    MAX_RETRIES,
    MIN_MISFIRE_GRACE,
    MISFIRE_POLICIES,
    PRIORITIES,
    Schedule,
    ScheduleKind,
    Target,
)
from .policies import check_retention
from .text import check_job_name, check_namespace, json_kind

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["Manifest", "ManifestRejected", "Problem", "load", "parse"]

_TOP_LEVEL: Final = ("namespace", "jobs")
_SCHEDULE_KEYS: Final[dict[str, ScheduleKind]] = {
    "cron": "cron",
    "every": "interval",
    "at": "once",
    "manual": "manual",
}
_JOB_KEYS: Final = (
    "name",
    *_SCHEDULE_KEYS,
    "timezone",
    "timeout",
    "priority",
    "idempotent",
    "recoverable",
    "paused",
    "retries",
    "retry_backoff",
    "retry_max_delay",
    "misfire",
    "misfire_grace",
    "alert",
    "keep_last",
    "retention",
    "params",
    "command",
    "worker",
    "env",
    "cwd",
)
_COMMAND_ONLY: Final = ("env", "cwd")


class Problem(NamedTuple):
    """Something wrong with one entry."""

    #: The entry's name, or ``jobs[i]`` when it has none.
    job: str
    #: The key at fault (``cron``, ``timezone``, ``command``, ...) or ``schedule``.
    field: str
    #: What is wrong, for humans.
    reason: str
    #: The line of the file holding the field (else the entry's ``[[jobs]]``), if known.
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.job}: {self.field}: {self.reason}"

    def located(self, source: str) -> str:
        """``FILE:LINE: job: field: reason``, the way compilers point at a line."""
        return f"{source}:{self.line}: {self}" if self.line is not None else f"{source}: {self}"


@attrs.frozen(kw_only=True)
class Manifest:
    """A parsed manifest, ready for :func:`coordinator.client.sync`."""

    #: Where it was read from (for messages).
    source: str
    #: The namespace it declares completely.
    namespace: str
    #: One object per storable entry, in the shape ``coordinator.sync`` expects; entries
    #: with problems carry ``invalid_reason``.
    entries: tuple[dict[str, Any], ...]
    #: Everything wrong, in file order.
    problems: tuple[Problem, ...]

    @property
    def invalid(self) -> tuple[str, ...]:
        """Names of the entries that will be stored inert."""
        return tuple(e["name"] for e in self.entries if e["invalid_reason"] is not None)


class ManifestRejected(InvalidInput):
    """The manifest has problems, so nothing was applied (``sync`` without
    ``--allow-invalid``)."""

    def __init__(self, manifest: Manifest) -> None:
        count = len(manifest.problems)
        super().__init__(
            manifest.source,
            f"{count} problem{'s' if count != 1 else ''} in the manifest; nothing applied "
            "(fix them, or store those entries inert with --allow-invalid)",
        )
        self.manifest = manifest


# --------------------------------------------------------------------------- file level

_TOML_POSITION: Final = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


def load(path: str | Path) -> Manifest:
    """Read and parse the manifest at ``path``."""
    source = str(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise InvalidInput(source, "no such file") from None
    except OSError as exc:
        raise InvalidInput(source, exc.strerror or str(exc)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(source, f"not UTF-8 text (byte {exc.start})") from None
    return parse(text, source=source)


def parse(text: str, *, source: str = "<manifest>") -> Manifest:
    """Parse manifest ``text``; ``source`` names it in messages."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = _TOML_POSITION.search(message)
        if found is None:
            raise InvalidInput(source, f"TOML syntax error: {message}") from None
        line, column = found.groups()
        reason = message[: found.start()]
        raise InvalidInput(f"{source}:{line}:{column}", f"TOML syntax error: {reason}") from None

    for key in document:
        if key not in _TOP_LEVEL:
            raise InvalidInput(f"{source}: {key}", _unknown_key(key, _TOP_LEVEL, "top-level"))
    namespace = document.get("namespace")
    if namespace is None:
        raise InvalidInput(
            f"{source}: namespace",
            'required: the namespace this file declares, e.g. namespace = "billing"',
        )
    check_namespace(namespace, f"{source}: namespace")
    jobs = document.get("jobs", [])
    if not isinstance(jobs, list):
        raise InvalidInput(f"{source}: jobs", "must be an array of tables ([[jobs]])")

    entries: list[dict[str, Any]] = []
    problems: list[Problem] = []
    first_index: dict[str, int] = {}  # name -> position in `entries`
    lines = _Lines(text, len(jobs))
    for index, raw in enumerate(jobs):
        entry, entry_problems = _entry(index, raw)
        entry_problems = sorted(
            (p._replace(line=lines.of(index, p.field)) for p in entry_problems),
            # (In the order of the file's lines, as one reads them: they came in the
            # order the fields are checked, :52 before :49.)
            key=lambda p: (p.line is None, p.line or 0),
        )
        if entry is not None and entry["name"] in first_index:
            name = entry["name"]
            problem = Problem(
                name,
                "name",
                f"defined more than once (again as jobs[{index}])",
                lines.of(index, "name"),
            )
            problems.append(problem)
            kept = first_index[name]
            entries[kept] = _make_inert(entries[kept], [problem])
            continue
        problems.extend(entry_problems)
        if entry is not None:
            first_index[entry["name"]] = len(entries)
            entries.append(entry)
    return Manifest(
        source=source, namespace=namespace, entries=tuple(entries), problems=tuple(problems)
    )


_JOBS_HEADER: Final = re.compile(r"^\s*\[\[\s*jobs\s*\]\]")
_TABLE_HEADER: Final = re.compile(r"^\s*\[")


class _Lines:
    """Finds the line of an entry's field in the manifest's text (tomllib keeps none).

    Entries written as ``[[jobs]]`` tables are found by their headers; inside one, a field
    is the line where its key is assigned. Entries written inline (``jobs = [{...}]``)
    point at the ``jobs`` line.
    """

    def __init__(self, text: str, count: int) -> None:
        self.lines = text.splitlines()
        headers = [i for i, line in enumerate(self.lines) if _JOBS_HEADER.match(line)]
        self.spans: list[tuple[int, int]] = []
        if len(headers) == count:
            for start in headers:
                end = next(
                    (
                        i
                        for i in range(start + 1, len(self.lines))
                        if _TABLE_HEADER.match(self.lines[i])
                    ),
                    len(self.lines),
                )
                self.spans.append((start, end))
        self.jobs_line = next(
            (i for i, line in enumerate(self.lines) if re.match(r"^\s*jobs\s*=", line)), None
        )

    def of(self, index: int, field: str) -> int | None:
        """The 1-based line of ``field`` in entry ``index`` (its header if the field is
        not written there), or the ``jobs = [...]`` line."""
        if index >= len(self.spans):
            return self.jobs_line + 1 if self.jobs_line is not None else None
        start, end = self.spans[index]
        key = re.compile(rf"^\s*(?:{re.escape(field)}|\"{re.escape(field)}\")\s*[=.]")
        for i in range(start + 1, end):
            if key.match(self.lines[i]):
                return i + 1
        return start + 1


def _unknown_key(key: str, known: tuple[str, ...], where: str) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
    return f"unknown {where} key ({hint})"


def _make_inert(entry: dict[str, Any], problems: list[Problem]) -> dict[str, Any]:
    reasons = "; ".join(f"{p.field}: {p.reason}" for p in problems)
    previous = entry.get("invalid_reason")
    return {**entry, "invalid_reason": f"{previous}; {reasons}" if previous else reasons}


# --------------------------------------------------------------------------- entries


class _Entry:
    """Reads one ``[[jobs]]`` table, collecting problems instead of stopping at the first."""

    def __init__(self, label: str, raw: Mapping[str, Any]) -> None:
        self.label = label
        self.raw = raw
        self.problems: list[Problem] = []

    def problem(self, field: str, reason: str) -> None:
        self.problems.append(Problem(self.label, field, reason))

    def typed(self, key: str, kind: type | tuple[type, ...], what: str, default: Any) -> Any:
        value = self.raw.get(key, default)
        wrong_type = not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool)
        if key in self.raw and wrong_type:
            self.problem(key, f"must be {what}, not {_describe(value)}")
            return default
        return value


def _describe(value: object) -> str:
    """A TOML value's kind in TOML's words (a table, a date/time; the rest as JSON's)."""
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, datetime | date | time):
        return "a date/time"
    return json_kind(value)


def _entry(index: int, raw: object) -> tuple[dict[str, Any] | None, list[Problem]]:
    """The SQL-shaped entry (``None`` when it cannot be stored) and its problems."""
    label = f"jobs[{index}]"
    if not isinstance(raw, dict):
        return None, [Problem(label, "jobs", f"each entry must be a table, not {_describe(raw)}")]
    name = raw.get("name")
    if name is None:
        return None, [Problem(label, "name", "required; the entry was skipped")]
    try:
        check_job_name(name)
    except InvalidInput as exc:  # PostgreSQL would refuse it: nothing can be stored
        return None, [Problem(label, "name", f"{exc.reason}; the entry was skipped")]
    e = _Entry(name, raw)

    for key in raw:
        if key not in _JOB_KEYS:
            e.problem(key, _unknown_key(key, _JOB_KEYS, "job"))

    sched = _schedule(e)
    timeout = _timeout(e)
    priority = e.typed("priority", str, "a string", "background")
    if priority not in PRIORITIES:
        e.problem("priority", f"must be one of {', '.join(PRIORITIES)}, not {priority!r}")
        priority = "background"
    idempotent = e.typed("idempotent", bool, "true or false", False)
    paused = e.typed("paused", bool, "true or false", None)
    policies = _policies(e)
    recoverable = e.typed("recoverable", bool, "true or false", False)
    alert = e.typed("alert", bool, "true or false", True)
    keep_last = _keep_last(e)
    retention = _duration(e, "retention")
    params = e.typed("params", dict, "a table", {})
    for where, number in _non_finite(params, "params"):
        # (Stored as the strings "nan" and "inf" without a word, where the client and
        # the protocol refuse them.)
        e.problem(where, f"{number} is not a JSON number (JSON has no NaN or infinity)")
    target = _target(e)
    if recoverable and "command" in raw:
        e.problem(
            "recoverable",
            "only a worker job can be recoverable (a command cannot hand back a cursor)",
        )
        recoverable = False

    if not e.problems and isinstance(target, Target):
        try:
            return job_entry(
                name=name,
                schedule=sched,
                target=target,
                params=_jsonable(params),
                timeout=timeout,
                priority=priority,
                idempotent=idempotent,
                paused=paused,
                **policies,
                recoverable=recoverable,
                alert=alert,
                keep_last=keep_last,
                retention=retention,
            ), []
        except InvalidInput as exc:  # (what only the client checks: a NUL in params)
            e.problem(exc.field, exc.reason)
    reason = "; ".join(f"{p.field}: {p.reason}" for p in e.problems)
    entry = job_entry(
        name=name,
        schedule=sched,
        target=target.to_json() if isinstance(target, Target) else target,
        params=_jsonable(params),
        timeout=timeout,
        priority=priority,
        idempotent=idempotent,
        paused=paused,
        invalid_reason=reason,
        **policies,
        recoverable=recoverable,
        alert=alert,
        keep_last=keep_last,
        retention=retention,
    )
    return entry, e.problems


def _policies(e: _Entry) -> dict[str, Any]:
    """The retry and misfire policies of an entry; what has a problem falls back to its
    default (the entry is stored inert anyway)."""
    retries = e.typed("retries", int, "an integer", 0)
    if not 0 <= retries <= MAX_RETRIES:
        e.problem("retries", f"must be 0 to {MAX_RETRIES}, not {retries}")
        retries = 0
    backoff = _duration(e, "retry_backoff") or DEFAULT_RETRY_BACKOFF
    max_delay = _duration(e, "retry_max_delay") or DEFAULT_RETRY_MAX_DELAY
    misfire = e.typed("misfire", str, "a string", "run-once")
    grace = _duration(e, "misfire_grace")
    if misfire not in MISFIRE_POLICIES:
        e.problem("misfire", f"must be one of {', '.join(MISFIRE_POLICIES)}, not {misfire!r}")
        misfire, grace = "run-once", None
    elif misfire == "skip" and grace is None:
        if "misfire_grace" not in e.raw:
            e.problem("misfire_grace", 'required with misfire = "skip" (e.g. "5m")')
        misfire = "run-once"
    elif misfire != "skip" and grace is not None:
        e.problem("misfire_grace", 'only applies with misfire = "skip"')
        grace = None
    elif grace is not None and grace < MIN_MISFIRE_GRACE:
        e.problem("misfire_grace", "must be at least 1s")
        misfire, grace = "run-once", None
    return {
        "retries": retries,
        "retry_backoff": backoff,
        "retry_max_delay": max_delay,
        "misfire": misfire,
        "misfire_grace": grace,
    }


def _schedule(e: _Entry) -> Schedule:
    """The entry's schedule: normalised when valid, else as given (for an inert row)."""
    given = [key for key in _SCHEDULE_KEYS if key in e.raw]
    timezone = e.typed("timezone", str, "a string", "UTC")
    if not given:
        e.problem("schedule", "give exactly one of cron, every, at or manual = true")
        return Schedule(kind="manual", timezone=timezone)
    if len(given) > 1:
        e.problem(
            "schedule", f"give exactly one of cron, every, at or manual, not {' and '.join(given)}"
        )
    key = given[0]
    kind = _SCHEDULE_KEYS[key]
    value = e.raw[key]
    expression: str | None
    if kind == "manual":
        if value is not True:
            e.problem("manual", "must be true (for a scheduled job use cron, every or at instead)")
        expression = None
    elif kind == "once" and isinstance(value, datetime | date):
        expression = value.isoformat()
    elif kind == "interval" and isinstance(value, int | float) and not isinstance(value, bool):
        e.problem(key, _unit_required(value))
        expression = str(value)
    elif isinstance(value, str):
        expression = value
    else:
        e.problem(key, f"must be a string, not {_describe(value)}")
        expression = str(value)
    if "timezone" in e.raw and kind != "cron":
        e.problem("timezone", "only applies to cron schedules")
    schedule = Schedule(kind=kind, expression=expression, timezone=timezone)
    if len(given) > 1 or any(p.field in (key, "timezone") for p in e.problems):
        return schedule
    try:
        if kind == "interval" and expression is not None:
            schedules.parse_duration(expression, field="every", unit_required=True)
        schedules.validate(schedule)
    except InvalidInput as exc:
        e.problem(exc.field, exc.reason)
        return schedule
    return schedules.normalize(schedule)


def _unit_required(value: float) -> str:
    return f'a unit is required: "{value}s" or "{value}m"? (use ms, s, m, h, d, w)'


def _timeout(e: _Entry) -> timedelta | None:
    return _duration(e, "timeout")


def _duration(e: _Entry, key: str) -> timedelta | None:
    """A duration key (with its unit), or ``None`` when absent or wrong (a problem)."""
    if key not in e.raw:
        return None
    value = e.raw[key]
    if isinstance(value, int | float) and not isinstance(value, bool):
        e.problem(key, _unit_required(value))
        return None
    if not isinstance(value, str):
        e.problem(key, f'must be a duration such as "15m", not {_describe(value)}')
        return None
    try:
        return schedules.parse_duration(value, field=key, unit_required=True)
    except InvalidInput as exc:
        e.problem(exc.field, exc.reason)
        return None


def _keep_last(e: _Entry) -> int | None:
    if "keep_last" not in e.raw:
        return None
    value = e.raw["keep_last"]
    try:
        check_retention(value, None)
    except InvalidInput as exc:
        e.problem(exc.field, exc.reason)
        return None
    return int(value)


def _target(e: _Entry) -> Target | dict[str, Any]:
    """A :class:`Target` when valid, else the best JSON object for an inert row."""
    has_command, has_worker = "command" in e.raw, "worker" in e.raw
    if has_command and has_worker:
        e.problem("command", "give either command or worker, not both")
    elif not has_command and not has_worker:
        e.problem("command", 'give command = ["program", "arg", ...] or worker = "type"')
        return {"kind": "none"}
    if has_worker and not has_command:
        for key in _COMMAND_ONLY:
            if key in e.raw:
                e.problem(key, "only applies to command jobs")
        worker = e.raw["worker"]
        if not isinstance(worker, str) or not worker.strip():
            e.problem("worker", "must be a non-empty string (the job type a worker serves)")
            return {"kind": "worker", "type": str(worker)}
        return Target(kind="worker", worker_type=worker)

    command = e.raw["command"]
    argv_ok = (
        isinstance(command, list)
        and bool(command)
        and all(isinstance(a, str) for a in command)
        and bool(command[0])
    )
    if not argv_ok:
        e.problem("command", 'must be a non-empty array of strings, e.g. ["backup.sh", "--full"]')
    env = e.typed("env", dict, "a table of strings", {})
    if not all(isinstance(v, str) for v in env.values()):
        e.problem("env", "values must be strings")
        env = {}
    cwd = e.typed("cwd", str, "a string", None)
    if not argv_ok:
        return {
            "kind": "exec",
            "argv": [str(a) for a in command] if isinstance(command, list) else [],
        }
    return Target(kind="exec", argv=tuple(command), env=env, cwd=cwd)


def _non_finite(value: Any, where: str) -> list[tuple[str, float]]:
    """Where ``value`` holds NaN or an infinity (TOML's ``nan``, ``inf``, ``1e400``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return [(where, value)]
    if isinstance(value, dict):
        return [f for k, v in value.items() for f in _non_finite(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [f for i, v in enumerate(value) for f in _non_finite(v, f"{where}[{i}]")]
    return []


def _jsonable(value: Any) -> Any:
    """TOML values as JSON values: dates and times become ISO 8601 strings."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN or infinity
    return value
