"""Words and pictures for the web page: cadences in words, ages, job states, sparklines.

Pure functions (the clock is an argument), so the unit tests read them directly and the
templates stay free of logic. Every piece of text that comes from a job or a run goes
through :func:`markupsafe.escape` here or through Jinja's autoescape: a job named
``<script>alert(1)</script>`` is text wherever it is shown.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from markupsafe import Markup, escape

from .. import why
from ..errors import InvalidInput
from ..protocol import SEVERITIES
from ..schedule import parse_duration
from ..text import clip, printable

if TYPE_CHECKING:
    from ..client import JobView, RunStats
    from ..status import DaemonStatus

#: Outcomes in the order they are stacked in a sparkline bar (bottom first) and listed.
OUTCOMES: Final = (
    "succeeded", "failed", "timed_out", "cancelled", "unresolved", "paused", "cancel_requested",
    "running", "pending", "queued",
)  # fmt: skip

_MONTHS: Final = ("January", "February", "March", "April", "May", "June", "July", "August",
                   "September", "October", "November", "December")  # fmt: skip
_WEEKDAYS: Final = ("Sundays", "Mondays", "Tuesdays", "Wednesdays", "Thursdays", "Fridays",
                    "Saturdays", "Sundays")  # fmt: skip
_NUMBER: Final = re.compile(r"[0-9]{1,2}")
_STEP: Final = re.compile(r"\*/([0-9]{1,2})")
_ALIASES: Final = {
    "@hourly": "hourly",
    "@daily": "daily at 00:00",
    "@midnight": "daily at 00:00",
    "@weekly": "Sundays at 00:00",
    "@monthly": "monthly on day 1 at 00:00",
    "@yearly": "yearly on 1 January at 00:00",
    "@annually": "yearly on 1 January at 00:00",
}


# --------------------------------------------------------------------------- cadence


def duration_words(value: timedelta) -> str:
    """``10 min``, ``1 h 30 min``, ``2 days``, ``45 s``, ``250 ms``."""
    total_ms = round(value.total_seconds() * 1000)
    if total_ms < 1000:
        return f"{total_ms} ms"
    parts = []
    seconds = total_ms // 1000
    for size, singular, plural in ((86400, "day", "days"), (3600, "h", "h"), (60, "min", "min")):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {singular if count == 1 else plural}")
    if seconds or not parts:
        parts.append(f"{seconds} s")
    return " ".join(parts)


def cadence(job: JobView) -> str:
    """How often a job runs, in words: ``every 10 min``, ``at 02:30 Europe/Berlin``,
    ``manual``; a cron expression without a simple reading is shown as it is."""
    if job.schedule_kind == "manual":
        return "manual"
    expression = job.schedule or ""
    if job.schedule_kind == "interval":
        try:
            return f"every {_every(parse_duration(expression, field='every'))}"
        except InvalidInput:
            return f"every {expression}"
    if job.schedule_kind == "once":
        return f"once at {expression}"
    return _cron_words(expression, job.timezone)


def _every(value: timedelta) -> str:
    words = duration_words(value)
    return {"1 day": "day", "1 h": "hour", "1 min": "minute", "1 s": "second"}.get(words, words)


def _cron_words(expression: str, zone: str) -> str:
    fields = expression.split()
    if len(fields) == 1 and fields[0] in _ALIASES:
        words = _ALIASES[fields[0]]
        return words if fields[0] == "@hourly" else f"{words} {zone}"
    if len(fields) != 5:
        return f"cron {expression} {zone}"
    minute, hour, day, month, weekday = fields
    if (day, month, weekday) == ("*", "*", "*") and hour == "*":
        if minute == "*":
            return "every minute"
        step = _STEP.fullmatch(minute)
        if step:
            return f"every {int(step.group(1))} min"
        if _NUMBER.fullmatch(minute):
            return f"hourly at :{int(minute):02d}"
    if month == "*" and _NUMBER.fullmatch(minute) and _NUMBER.fullmatch(hour):
        at = f"at {int(hour):02d}:{int(minute):02d} {zone}"
        if (day, weekday) == ("*", "*"):
            return at
        if day == "*" and _NUMBER.fullmatch(weekday) and int(weekday) <= 7:
            return f"{_WEEKDAYS[int(weekday)]} {at}"
        if day == "*" and weekday == "1-5":
            return f"weekdays {at}"
        if weekday == "*" and _NUMBER.fullmatch(day):
            return f"monthly on day {int(day)} {at}"
    numbers = all(_NUMBER.fullmatch(f) for f in (minute, hour, day, month))
    if numbers and weekday == "*" and 1 <= int(month) <= 12:
        at = f"at {int(hour):02d}:{int(minute):02d} {zone}"
        return f"yearly on {int(day)} {_MONTHS[int(month) - 1]} {at}"
    if (day, month, weekday) == ("*", "*", "*") and _NUMBER.fullmatch(minute):
        step = _STEP.fullmatch(hour)
        if step:
            return f"every {int(step.group(1))} h at :{int(minute):02d}"
    return f"cron {expression} {zone}"


# --------------------------------------------------------------------------- time


def absolute(moment: datetime | None) -> str:
    """``2026-01-31 14:05:09 UTC``; ``-`` for none."""
    if moment is None:
        return "-"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def short_time(moment: datetime | None, now: datetime) -> str:
    """``14:05 UTC`` on the day of ``now`` (UTC), else ``2026-01-31 14:05 UTC``; ``-`` for
    none. For a table cell: :func:`absolute` goes in its title."""
    if moment is None:
        return "-"
    at = moment.astimezone(UTC)
    if at.date() == now.astimezone(UTC).date():
        return at.strftime("%H:%M UTC")
    return at.strftime("%Y-%m-%d %H:%M UTC")


def relative(moment: datetime | None, now: datetime) -> str:
    """``3 min ago``, ``in 4 h``, ``just now``; the same rules as the page's script,
    which keeps them current without asking the server."""
    if moment is None:
        return "-"
    seconds = (moment - now).total_seconds()
    size = abs(seconds)
    if size < 1:
        return "just now"
    if size < 60:
        amount = f"{int(size)} s"
    elif size < 3600:
        amount = f"{int(size // 60)} min"
    elif size < 48 * 3600:
        amount = f"{int(size // 3600)} h"
    else:
        amount = f"{int(size // 86400)} days"
    return f"in {amount}" if seconds > 0 else f"{amount} ago"


def iso(moment: datetime | None) -> str:
    """The machine-readable form for ``<time datetime=...>``."""
    return moment.astimezone(UTC).isoformat(timespec="seconds") if moment is not None else ""


def took(start: datetime | None, end: datetime | None) -> str:
    """The time between two instants in words, ``-`` when either is missing."""
    if start is None or end is None:
        return "-"
    return duration_words(max(end - start, timedelta(0)))


# --------------------------------------------------------------------------- jobs


def waiting_for(job: JobView, status: DaemonStatus) -> str | None:
    """``waiting for a worker serving T`` when the job's worker type is served by no
    connected worker, or by none that may run its namespace (and the job would otherwise
    run), else ``None``."""
    kind = why.worker_type(job.target)
    if kind is None or job.state not in ("active", "queued"):
        return None
    if kind not in status.served_types:
        return why.waiting_for_worker(kind)
    if not status.serves(kind, job.namespace):
        return why.waiting_for_worker(kind, job.namespace)
    return None


def job_state(job: JobView, status: DaemonStatus) -> str:
    """The job's state word, or what it waits for."""
    return waiting_for(job, status) or job.state


def state_class(state: str) -> str:
    """The CSS class of a state or status (colour)."""
    if state.startswith("blocked"):
        return "s-unresolved"
    if state.startswith("waiting"):
        return "s-waiting"
    return "s-" + re.sub(r"[^a-z_]", "", state)


def next_run(job: JobView, status: DaemonStatus) -> str | None:
    """Why a job will not run at a saved deadline (``None`` when it will). A paused
    job's saved deadline stays saved but is not served (resuming forgets it)."""
    if job.paused:
        return "paused"
    if job.invalid_reason is not None:
        return "never (invalid)"
    if job.next_run_at is not None:
        return None
    if job.schedule_kind == "manual":
        return "when triggered"
    if why.one_shot_done(job):  # (the CLI's rule: the refresh arms it no more)
        return "done"
    if waiting_for(job, status) is not None:
        return "when a worker connects"
    if not status.leading:
        return "when a daemon leads"
    return "at the next refresh"


def retry_policy(job: JobView) -> str:
    """``3 retries, after 1 s doubling to at most 1 h`` (with jitter), or ``none``."""
    if job.retries < 1:
        return "none"
    count = "1 retry" if job.retries == 1 else f"{job.retries} retries"
    first = duration_words(min(job.retry_backoff, job.retry_max_delay))
    if job.retries == 1:
        return f"{count}, after {first}"
    if job.retry_backoff >= job.retry_max_delay:
        return f"{count}, {first} apart"
    return f"{count}, after {first} doubling to at most {duration_words(job.retry_max_delay)}"


def misfire_policy(job: JobView) -> str:
    """What an overdue deadline does: ``run once`` or ``skip if more than 5 min late``."""
    if job.misfire == "skip":
        grace = duration_words(job.misfire_grace) if job.misfire_grace is not None else "0 s"
        return f"skip if more than {grace} late (the next deadline counts from then)"
    return "run once, however late"


def retry_of_total(job: JobView) -> str | None:
    """``retry 2 of 4`` for the job's waiting retry (attempt 3 of a job allowing 4
    retries), else ``None``."""
    if job.outstanding_status != "queued" or job.outstanding_due_at is None:
        return None
    attempt = job.outstanding_attempt or 2
    return f"retry {attempt - 1} of {max(job.retries, attempt - 1)}"


def history_kept(job: JobView) -> str:
    """Which finished runs retention keeps for the job: ``the newest 30 runs, none older
    than 90 days``; what the job does not override is ``the default`` (the daemon's
    ``retention`` setting, not known to the page)."""
    count = (
        f"the newest {job.keep_last} runs"
        if job.keep_last is not None
        else "the default number of newest runs"
    )
    age = (
        f"none older than {duration_words(job.retention)}"
        if job.retention is not None
        else "none older than the default age"
    )
    if job.keep_last is None and job.retention is None:
        return "the defaults (the retention setting)"
    return f"{count}, {age}"


#: Characters of a cursor shown (a cursor holds up to 16 KiB of JSON).
CURSOR_SHOWN: Final = 1200
#: Characters of a finding's detail shown in its row.
DETAIL_SHOWN: Final = 400


def json_text(value: Any, limit: int, *, indent: int | None = 1) -> tuple[str, int, bool]:
    """``value`` as JSON (indented, or on one line with ``indent=None``) cut to ``limit``
    characters: the text, the size of the whole compact JSON in bytes (what was saved),
    and whether it was cut. The template escapes the text (a cursor is anything a worker
    sent)."""
    whole = json.dumps(value, indent=indent, sort_keys=True, ensure_ascii=False, default=str)
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode())
    shown = clip(whole, limit)
    return shown, size, shown != whole


#: Severities, least to most severe (the findings filter's order).
SEVERITY_ORDER: Final = SEVERITIES


#: Most characters of an output tail, or of an error, a run's page shows: the daemon
#: keeps 16 KiB tails and 2,000-character errors, but a row written otherwise may hold
#: megabytes (a tester's run page was 2.76 MB and took 1.1 s).
OUTPUT_SHOWN: Final = 16 * 1024
ERROR_SHOWN: Final = 4000


def output_text(text: object, *, limit: int = OUTPUT_SHOWN, keep: str = "end") -> str:
    """A run's output or error for a ``<pre>``: its lines kept, every other control
    character written as an escape (``\x1b``), as the CLI prints it, so that nothing the
    page shows hides what a terminal would have acted on. At most ``limit`` characters,
    the last (``keep="end"``: an output's tail) or the first (an error), saying how many
    are left out."""
    raw = str(text or "")
    before = after = ""
    if len(raw) > limit:
        left_out = f"{len(raw) - limit:,}"
        if keep == "end":
            raw, before = raw[-limit:], f"[... the first {left_out} characters are not shown]\n"
        else:
            raw, after = raw[:limit], f"\n[... {left_out} more characters are not shown]"
    return before + "\n".join(printable(line) for line in raw.split("\n")) + after


def severity_word(severity: str) -> str:
    """``data loss`` for ``data_loss``; the others as they are."""
    return severity.replace("_", " ")


#: The job filter's choices: the value and its label.
STATE_FILTERS: Final = (
    ("", "any state"),
    ("active", "active"),
    ("running", "running"),
    ("queued", "a run queued"),
    ("paused", "paused"),
    ("run-paused", "a run paused"),
    ("retrying", "retry waiting"),
    ("failing", "last run failed"),
    ("blocked", "blocked"),
    ("waiting", "waiting for a worker"),
    ("invalid", "invalid"),
)


def matches(job: JobView, state: str, status: DaemonStatus) -> bool:
    """Whether ``job`` passes the state filter ``state`` ('' passes everything)."""
    if not state:
        return True
    if state == "failing":
        return job.last_status in ("failed", "timed_out")
    if state == "waiting":
        return waiting_for(job, status) is not None
    if state == "blocked":
        return job.blocked_by is not None
    if state == "running":
        return job.outstanding_status in ("running", "pending")
    if state == "queued":  # (waiting for a slot, a worker, a resume or a retry's time)
        return job.outstanding_status == "queued"
    if state == "run-paused":
        return job.outstanding_status in ("paused", "cancel_requested")
    if state == "retrying":
        return retry_of_total(job) is not None
    return job.state == state and waiting_for(job, status) is None


# --------------------------------------------------------------------------- sparklines

#: Pixels: a bar's width, the gap between bars, the chart's height.
BAR: Final = 6
GAP: Final = 2
HEIGHT: Final = 22


def sparkline(stats: RunStats, *, bar: int = BAR, height: int = HEIGHT) -> Markup:
    """A stacked-bar chart of ``stats`` as inline SVG: one element of class ``bucket`` per
    bucket (a ``<g>`` holding one ``<rect>`` per outcome, heights scaled to the busiest
    bucket; an empty bucket is one faint baseline ``<rect>``). A bucket with runs has a
    ``<title>`` (its span and counts) for the tooltip; colours come from the stylesheet
    (classes, no inline style: the CSP allows none). A span with no runs at all is one
    dashed baseline ``<line class="empty">`` that looks the same, with no element per
    bucket (29 empty ``<rect>`` were 2 KB per job of the jobs view)."""
    buckets = stats.buckets
    peak = max((sum(c.values()) for c in stats.counts), default=0)
    width = buckets.count * (bar + GAP) - GAP
    totals = stats.totals
    summary = ", ".join(f"{totals[o]} {o}" for o in OUTCOMES if totals.get(o)) or "no runs"
    label = f"runs per {buckets.width} since {absolute(buckets.since)}: {summary}"
    parts = [
        f'<svg class="spark" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" aria-label="{escape(label)}" '
        f'data-unit="{buckets.unit}" data-step="{buckets.step}" '
        f'data-count="{buckets.count}" data-since="{iso(buckets.since)}" '
        f'data-until="{iso(buckets.until)}">'
    ]
    if not peak:
        # No run in the whole span: the baselines as one line, dashed where the bars
        # would stand (stroke-dasharray is a presentation attribute: the CSP allows it).
        parts.append(
            f'<line class="empty" x1="0" y1="{height - 0.5}" x2="{width}" '
            f'y2="{height - 0.5}" stroke-dasharray="{bar} {GAP}"/></svg>'
        )
        return Markup("".join(parts))
    for index, ((start, end), counts) in enumerate(zip(buckets.spans(), stats.counts, strict=True)):
        x = index * (bar + GAP)
        total = sum(counts.values())
        if not total:  # the common case: a faint baseline, no tooltip, few bytes
            parts.append(
                f'<rect class="bucket empty" x="{x}" y="{height - 1}" width="{bar}" height="1"/>'
            )
            continue
        words = ", ".join(f"{counts[o]} {o}" for o in _ordered(counts))
        title = f"{_short(start)} to {_short(end)}: {words}"
        parts.append(f'<g class="bucket" data-total="{total}"><title>{escape(title)}</title>')
        y = float(height)
        for outcome in _ordered(counts):
            size = max(counts[outcome] / peak * height, 1.5)
            y -= size
            parts.append(
                f'<rect class="{state_class(outcome)}" x="{x}" y="{max(y, 0):.1f}" '
                f'width="{bar}" height="{size:.1f}"/>'
            )
        parts.append("</g>")
    parts.append("</svg>")
    return Markup("".join(parts))


def _short(moment: datetime) -> str:
    """A bucket edge in a tooltip: ``03-02 14:00`` (UTC, the year left out)."""
    return moment.astimezone(UTC).strftime("%m-%d %H:%M")


def _ordered(counts: Any) -> list[str]:
    known = [o for o in OUTCOMES if counts.get(o)]
    return known + sorted(k for k in counts if k not in OUTCOMES and counts[k])


# --------------------------------------------------------------------------- spans

#: The sparkline windows offered: query value, label, length.
SPANS: Final = (
    ("1d", "24 hours", timedelta(days=1)),
    ("2d", "2 days", timedelta(days=2)),
    ("7d", "7 days", timedelta(days=7)),
    ("30d", "30 days", timedelta(days=30)),
    ("6mo", "6 months", timedelta(days=183)),
    ("1y", "1 year", timedelta(days=365)),
)
DEFAULT_SPAN: Final = "7d"


def span(value: str | None) -> tuple[str, timedelta]:
    """The span named by ``?span=`` (the default when absent); a clear error otherwise."""
    chosen = value or DEFAULT_SPAN
    for key, _label, length in SPANS:
        if key == chosen:
            return key, length
    raise InvalidInput("span", f"must be one of {', '.join(k for k, _, _ in SPANS)}")


__all__ = [
    "DEFAULT_SPAN",
    "OUTCOMES",
    "SPANS",
    "STATE_FILTERS",
    "absolute",
    "cadence",
    "duration_words",
    "history_kept",
    "iso",
    "job_state",
    "json_text",
    "matches",
    "misfire_policy",
    "next_run",
    "relative",
    "retry_of_total",
    "retry_policy",
    "severity_word",
    "short_time",
    "span",
    "sparkline",
    "state_class",
    "took",
    "waiting_for",
]
