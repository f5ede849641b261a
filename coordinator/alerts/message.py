"""What an alert says: one value (:class:`Alert`) and one function that writes it
(:func:`render`) for every sink: the email's subject and body and the webhook's JSON.

Everything that ends up in front of a person goes through :func:`render`, so output that
may hold secrets (a job's error text is the tail of its output) is redacted in exactly
one place: ``render(alert, redact=...)``.

Layering: pure (attrs, json, datetime); no I/O.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import attrs

from ..events import iso
from ..schedule import format_duration
from ..text import printable

if TYPE_CHECKING:
    from collections.abc import Callable

#: The kinds of alerts, each rate-limited on its own per job.
#: failed: a run ended failed or timed out with no retry left; unresolved: a crash left a
#: run unresolved; findings: a run recorded findings of severity error or data_loss.
KINDS: Final = ("failed", "unresolved", "findings")
#: The webhook body's version (a field added keeps it; a field changed bumps it).
PAYLOAD_VERSION: Final = 1
#: Longest error text carried (the executors already bound output tails).
_ERROR_LIMIT: Final = 4000


def _same(text: str) -> str:
    return text


@attrs.frozen(kw_only=True)
class Alert:
    """One alert about one run, as every sink receives it."""

    #: One of :data:`KINDS`.
    kind: str
    #: The job, ``namespace/name``, and its id.
    job: str
    job_id: int
    #: The run it is about, and which attempt it was.
    run: int
    attempt: int | None = None
    #: How the run ended: ``failed``, ``timed_out``, ``unresolved``.
    outcome: str
    #: Why (``handler``, ``timeout``, ``crashed``, ``lost``), and the category of the
    #: failure when the run reported one.
    cause: str | None = None
    category: str | None = None
    #: The run's error text (redacted by :func:`render`).
    error: str | None = None
    #: The job's retries were used up by this run (``None``: it allowed none, or unknown).
    exhausted: bool | None = None
    #: How long the call took, seconds (``None``: not known, e.g. a lost run).
    elapsed_s: float | None = None
    #: When it happened: the time of the log line that told it (``event``).
    at: datetime
    #: That log line's event name, for grep (``job.run``, ``startup.lost_run``).
    event: str
    #: The run's page on the admin web server, when it is on.
    url: str | None = None
    #: The daemon that saw it (``host:pid:random``).
    instance: str
    #: Alerts of this (job, kind) not sent since the previous one, and when that was.
    suppressed: int = 0
    since: datetime | None = None
    #: The rate limit: one alert per (job, kind) per window.
    window: timedelta
    #: ``findings`` alerts: (kind, severity, how many) of the serious findings, and the
    #: worst one as an example (kind, severity, resource id).
    findings: tuple[tuple[str, str, int], ...] = ()
    example: tuple[str, str, str] | None = None


@attrs.frozen(kw_only=True)
class Message:
    """An alert written out: the email's subject and plain-text body, the webhook body."""

    subject: str
    text: str
    payload: dict[str, Any]


def _what(alert: Alert) -> str:
    if alert.kind == "unresolved":
        return f"run {alert.run} left unresolved by a crash"
    if alert.kind == "findings":
        # Each severity counted apart: "4 finding(s) of severity data_loss" for one
        # data_loss and three errors named the worst and counted them all as it.
        by_severity = {
            severity: sum(n for _, s, n in alert.findings if s == severity)
            for severity in ("data_loss", "error")
        }
        counted = " and ".join(f"{n} {s}" for s, n in by_severity.items() if n)
        return f"run {alert.run} found {counted or 'no'} finding(s)"
    word = "timed out" if alert.outcome == "timed_out" else "failed"
    why = [w for w in (alert.cause, alert.category) if w]
    if len(why) == 2 and why[0] == why[1]:
        why.pop()
    return f"{word} ({', '.join(why) or alert.outcome})"


def _attempt(alert: Alert) -> str | None:
    if alert.attempt is None:
        return None
    if alert.exhausted:
        return f"{alert.attempt} (the last one the job's retries allowed)"
    return str(alert.attempt)


def render(alert: Alert, *, redact: Callable[[str], str] = _same) -> Message:
    """The subject, body and webhook payload of ``alert``; ``redact`` is applied to
    every text that comes from a job's output (its error)."""
    error = redact(alert.error)[:_ERROR_LIMIT] if alert.error else None
    subject = f"[coordinator] {alert.job} {_what(alert)}"
    window = format_duration(alert.window)
    lines = [f"{alert.job}: {_what(alert)}", ""]
    rows: list[tuple[str, str | None]] = [
        ("job", alert.job),
        ("alert", alert.kind),
        ("outcome", alert.outcome),
        ("cause", alert.cause),
        ("category", alert.category),
        ("error", error),
        (
            "findings",
            ", ".join(f"{kind} {severity} x{n}" for kind, severity, n in alert.findings) or None,
        ),
        ("example", " ".join(alert.example) if alert.example else None),
        ("run", str(alert.run)),
        ("attempt", _attempt(alert)),
        ("elapsed", f"{alert.elapsed_s:.3f}s" if alert.elapsed_s is not None else None),
        ("logged at", f"{iso(alert.at)} (event={alert.event} run={alert.run})"),
        ("run page", alert.url),
        ("daemon", alert.instance),
    ]
    width = max(len(name) for name, _ in rows) + 2
    for name, value in rows:
        if value is None:
            continue
        # Each line with its control characters escaped (a job's stderr may carry
        # terminal escapes: nothing of it should act on the reader's mail client or
        # terminal), as the CLI and the log show them.
        first, *rest = [printable(line) for line in value.splitlines()] or [""]
        lines.append(f"{name + ':':<{width}}{first}")
        lines.extend(f"{'':<{width}}{line}" for line in rest)
    lines.append("")
    if alert.suppressed:
        since = iso(alert.since) if alert.since else "the previous alert"
        lines.append(
            f"And {alert.suppressed} more since {since}: alerts of this kind for {alert.job} "
            f"are sent at most once per {window}."
        )
    else:
        lines.append(f"Alerts of this kind for {alert.job} are sent at most once per {window}.")
    namespace, _, name = alert.job.partition("/")
    payload: dict[str, Any] = {
        "version": PAYLOAD_VERSION,
        "kind": alert.kind,
        "subject": subject,
        "job": {"id": alert.job_id, "namespace": namespace, "name": name},
        "run": {
            "id": alert.run,
            "attempt": alert.attempt,
            "exhausted": alert.exhausted,
            "outcome": alert.outcome,
            "cause": alert.cause,
            "category": alert.category,
            "error": error,
            "elapsed_s": alert.elapsed_s,
            "url": alert.url,
        },
        "logged_at": iso(alert.at),
        "event": alert.event,
        "findings": [
            {"kind": kind, "severity": severity, "count": n} for kind, severity, n in alert.findings
        ],
        "example": (
            {
                "kind": alert.example[0],
                "severity": alert.example[1],
                "resource_id": alert.example[2],
            }
            if alert.example
            else None
        ),
        "suppressed": {"count": alert.suppressed, "since": iso(alert.since)},
        "window_s": alert.window.total_seconds(),
        "instance": alert.instance,
        "text": "\n".join(lines),
    }
    return Message(subject=subject, text="\n".join(lines) + "\n", payload=payload)


__all__ = ["KINDS", "PAYLOAD_VERSION", "Alert", "Message", "render"]
