"""Answers to "why is nothing happening?": pure sentences from what a command knows.

Every function takes the job or run as the database shows it and the
:class:`~coordinator.probe.Facts` about the daemon, and returns words for a person. No
I/O here: the facts are gathered by :mod:`coordinator.probe`.
"""

from __future__ import annotations

import shlex
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from . import schedule as schedules
from .errors import CoordinatorError
from .model import Schedule, Target

if TYPE_CHECKING:
    from .client import JobView, RunView
    from .probe import Facts

#: How to start a daemon.
START_HINT = "`coordinator run`, or `systemctl start coordinator`"


def when(value: datetime | None) -> str:
    """An instant as the CLI prints it (UTC, to the second), ``-`` for none."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _within(facts: Facts) -> str:
    return schedules.format_duration(timedelta(seconds=facts.refresh_spacing))


def no_daemon(facts: Facts) -> str | None:
    """The note every command adds when no daemon leads on its database."""
    if facts.daemon_running is not False:
        return None
    return (
        "no daemon is running on this database (no session holds its lock): nothing runs "
        f"until one starts ({facts.start_hint})"
    )


def worker_type(target: dict[str, Any] | Target) -> str | None:
    """The worker type a job's target names, or ``None`` for a command."""
    if isinstance(target, Target):
        return target.worker_type if target.kind == "worker" else None
    if target.get("kind") == "worker":
        return str(target.get("type"))
    return None


def unserved(target: dict[str, Any] | Target, facts: Facts) -> str | None:
    """The worker type of a worker job that no connected worker serves (known only from
    the daemon's admin API), else ``None``."""
    kind = worker_type(target)
    served = facts.served
    if kind is None or served is None or kind in served:
        return None
    return kind


def waiting_for_worker(kind: str, namespace: str | None = None) -> str:
    """What a worker job waits for: a worker serving its type (``namespace``: one whose
    token reaches that namespace, when the type's connected workers may not run it)."""
    if namespace is None:
        return f"waiting for a worker serving {kind}"
    return f"waiting for a worker serving {kind} that may run namespace {namespace}"


def job_state(job: JobView, facts: Facts) -> str:
    """The STATE column: the job's own state, or what it waits for."""
    state = job.state
    if state in ("active", "queued", "retry waiting"):
        kind = unserved(job.target, facts)
        if kind is not None:
            return waiting_for_worker(kind)
        kind = worker_type(job.target)
        if kind is not None and facts.may_run(kind, job.namespace) is False:
            return waiting_for_worker(kind, job.namespace)
    return state


def next_run(job: JobView, facts: Facts) -> str:
    """The NEXT RUN column: a waiting retry's due time, the saved deadline, or why
    there is none yet."""
    if job.paused or job.invalid_reason is not None:
        return "-"  # (a saved deadline stays saved, but it does not run; resuming forgets it)
    if job.outstanding_due_at is not None and job.outstanding_status == "queued":
        return f"retry {when(job.outstanding_due_at)}"
    if job.next_run_at is not None:
        return when(job.next_run_at)
    if job.schedule_kind == "manual":
        return "-"
    if one_shot_done(job):
        return "done"
    if unserved(job.target, facts) is not None:
        return "-"
    running = facts.daemon_running
    if running is False:
        return "no daemon"
    return "next refresh"


def one_shot_done(job: JobView) -> bool:
    """A one-shot job whose instant was served: its saved deadline is spent, and nothing
    arms it again until it is defined with another instant (a daemon's refresh reads a
    one-shot job only while it has a deadline or a run to offer)."""
    return (
        job.schedule_kind == "once"
        and job.next_run_at is None
        and not job.paused
        and job.invalid_reason is None
    )


def command(verb: str, namespace: str, name: str) -> str:
    """``coordinator jobs VERB NAME`` as a shell takes it, with the namespace unless it is
    the default: a hint that can be pasted as it is."""
    where = "" if namespace == "default" else f" -n {shlex.quote(namespace)}"
    if name.startswith("-"):  # not to be read as an option
        return f"coordinator jobs {verb}{where} -- {shlex.quote(name)}"
    return f"coordinator jobs {verb} {shlex.quote(name)}{where}"


def after_define(
    schedule: Schedule,
    target: Target,
    *,
    namespace: str,
    name: str,
    paused: bool,
    facts: Facts,
    now: datetime,
    done: bool = False,
    saved: datetime | None = None,
    retry: tuple[int, datetime] | None = None,
) -> str:
    """The line ``jobs define`` prints after ``defined ...``: when it will first run.
    ``retry``: a retry of the job waits (its run and due time): it comes first.
    ``done``: a one-shot job left as it was, whose instant was served already. ``saved``:
    the job's saved deadline after the define (a changed cron or interval schedule clears
    it; one still there is the deadline that stands, not a new estimate)."""
    if paused:
        return f"paused: it runs once resumed ({command('resume', namespace, name)})"
    if retry is not None:
        # (A retry's due time, not the schedule's next tick: it said "next run about"
        # the define-time estimate while the retry waited.)
        run_id, due = retry
        after = "; the schedule goes on after it" if schedule.kind in ("cron", "interval") else ""
        return f"next run: retry run {run_id}, due {when(due)}{after}"
    if schedule.kind == "manual":
        return f"manual: it runs when triggered ({command('trigger', namespace, name)})"
    if done:
        return (
            f"done: its instant {when(initial_deadline_or_none(schedule, now))} was served "
            "(run, or skipped by its misfire policy); it runs again only if defined with "
            f"another --at, or triggered ({command('trigger', namespace, name)})"
        )
    kept = saved is not None and schedule.kind in ("cron", "interval")
    first = saved if kept else initial_deadline_or_none(schedule, now)
    # (An interval counts from the definition's commit, by the database's clock: about.)
    about = "about " if schedule.kind == "interval" and not kept else ""
    text = f"next run {about}{when(first)}"
    if schedule.kind == "once" and first is not None and first < now:
        text += " (past: it runs once, late, unless its misfire policy skips it)"
    missing = []
    if facts.daemon_running is False:
        missing.append("a daemon runs")
    kind = unserved(target, facts)
    if kind is not None:
        missing.append(f"a worker serving {kind} connects")
    if missing:
        start = f" ({facts.start_hint})" if facts.daemon_running is False else ""
        return f"{text}, once {' and '.join(missing)}: none does now{start}"
    if kept:
        return f"{text} (unchanged: its saved deadline stands)"
    # (The daemon counts a first deadline from the definition too: one that falls before
    # that refresh still runs, late by at most the wait.)
    return f"{text}, armed at the daemon's next refresh (within {_within(facts)})"


def initial_deadline_or_none(schedule: Schedule, now: datetime) -> datetime | None:
    try:
        return schedules.initial_deadline(schedule, now)
    except (CoordinatorError, ValueError):
        return None


def still_waiting(job: JobView, run: RunView, facts: Facts, *, now: datetime) -> str:
    """Why run ``run`` of ``job`` has not finished (``jobs trigger --wait`` gave up)."""
    if facts.daemon_running is False:
        return (
            f"the daemon is not running (no session holds its lock): start it ({facts.start_hint})"
        )
    # (claimed_at: this call's start; started_at stays a resumed run's first start.)
    began = run.claimed_at or run.started_at
    if began is not None and run.status in ("running", "cancel_requested"):
        # (To the second: "20s477.873ms" reads as noise.)
        seconds = max(0, round((now - began).total_seconds()))
        ran = schedules.format_duration(timedelta(seconds=seconds))
        limit = (
            f" (its timeout: {schedules.format_duration(job.timeout)})"
            if job.timeout is not None
            else ""
        )
        return f"it started {ran} ago and has not finished{limit}; `coordinator runs show {run.id}`"
    if job.invalid_reason is not None:
        return f"the job is invalid ({job.invalid_reason}); fix its definition"
    if job.paused:
        return f"the job is paused; `{command('resume', job.namespace, job.name)}` lets it run"
    if job.blocked_by is not None and job.blocked_by != run.id:
        return f"blocked by unresolved run {job.blocked_by}; {resolve_hint(job.blocked_by)}"
    kind = worker_type(job.target)
    if kind is not None:
        served = facts.served
        if served is None:
            api = facts.api.label if facts.api is not None else "the admin API was not asked"
            return f"perhaps no worker serves {kind}: only the daemon knows, and {api}"
        if kind not in served:
            return f"no worker serves {kind}; start one (coordinator worker MODULE:OBJECT)"
        if facts.may_run(kind, job.namespace) is False:
            # (Claimed and given back: "not claimed yet" was not so.)
            return (
                f"{waiting_for_worker(kind, job.namespace)}: the workers serving {kind} "
                f"have tokens that do not reach namespace {job.namespace} (their runs are "
                "given back unsent)"
            )
    status = facts.status
    if status is not None:
        running = len(status.get("running") or ())
        return (
            f"the daemon has not claimed it yet ({running} calls running); see `coordinator status`"
        )
    return "the daemon has not claimed it yet; see `coordinator status`"


def resolve_hint(run_id: int) -> str:
    return f"resolve it with `coordinator runs resolve {run_id} --as failed|succeeded|retry`"


def blocked(job: JobView, run_id: int) -> str:
    """A trigger answered with the unresolved run that blocks the job."""
    return (
        f"{job.key} is blocked by unresolved run {run_id} (its outcome is unknown); "
        f"no new run starts until an operator decides: {resolve_hint(run_id)}"
    )


def status_differences(
    live: dict[str, Any], database: dict[str, Any], *, refresh_spacing: float
) -> list[str]:
    """Why the daemon's view (``/api/status``) and the database's (``client.summary``)
    disagree on the job count or the next deadline; empty when they agree."""
    notes: list[str] = []
    loaded, total, loadable = live.get("jobs"), database["jobs"], database["loadable"]
    if isinstance(loaded, int) and loaded != total:
        left_out = [
            f"{database[key]} {word}"
            for key, word in (
                ("paused", "paused"),
                ("invalid", "invalid"),
                ("manual", "manual"),
                ("done", "one-shot done"),
            )
            if database.get(key)
        ]
        text = (
            f"the database holds {total} jobs and the daemon has loaded {loaded}: it loads "
            "only jobs that can fall due"
        )
        if left_out:
            text += f" ({', '.join(left_out)} not loaded)"
        spacing = schedules.format_duration(timedelta(seconds=refresh_spacing))
        last = live.get("last_refresh") or "none yet"
        if loaded > loadable and database["manual"]:
            # A manual job read for its run stays loaded until a full refresh: no change
            # is needed for the counts to differ (it said "changed", which never passed).
            text += (
                f"; {loaded - loadable} more: manual jobs it ran since its last full "
                f"refresh ({last}) stay loaded until the next, or jobs changed since (read "
                f"within {spacing} of a change)"
            )
        elif loaded != loadable:
            text += (
                f"; {abs(loadable - loaded)} changed since its last refresh "
                f"({last}; one comes within {spacing} of a change)"
            )
        notes.append(text)
    armed = live.get("next_deadline") or {}
    db_job = database.get("next_job")
    if db_job is not None and db_job != armed.get("job"):
        worker = database.get("next_worker")
        served = {str(t) for t in live.get("workers") or ()}
        blocker = database.get("next_blocked_by")
        if blocker is not None:
            # (It said "running now, or changed after its last refresh".)
            reason = (
                f"not armed: it is blocked by unresolved run {blocker}; {resolve_hint(blocker)}"
            )
        elif worker is not None and worker not in served:
            reason = f"not armed: no worker serves {worker}"
        else:
            reason = "not armed by the daemon: it is running now, or changed after its last refresh"
        notes.append(
            f"the database's earliest saved deadline, {database['next_deadline']} for "
            f"{db_job}, is {reason}"
        )
    return notes
