"""One structured line per event, on stderr.

``ts=... level=info event=job.run job=default/backup outcome=succeeded`` (logfmt) by
default, JSON lines with ``--log-format json``. Under systemd, when ``JOURNAL_STREAM``
says stderr is the journal, each line gets a ``<N>`` priority prefix so journald files it
at the right level. Event names are stable: scripts and tests wait for them. Every
field is redacted before it is written (:mod:`coordinator.redact`).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, Literal, TextIO

import attrs
import trio

from . import redact
from .text import CONTROL

#: A logfmt value is quoted when it holds a space, a quote, ``=``, a backslash or a
#: control character (:data:`~coordinator.text.CONTROL`).
_QUOTED = re.compile(f'[ "=\\\\]|{CONTROL.pattern}')

Level = Literal["debug", "info", "warning", "error"]
_LEVELS: dict[str, int] = {"debug": 10, "info": 20, "warning": 30, "error": 40}
#: syslog priorities for journald's ``<N>`` prefix.
_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3}


def _stderr_is_journal() -> bool:
    stream = os.environ.get("JOURNAL_STREAM", "")
    if not stream:
        return False
    try:
        st = os.fstat(2)
        dev, ino = stream.split(":", 1)
        return st.st_dev == int(dev) and st.st_ino == int(ino)
    except (OSError, ValueError):
        return False


def _logfmt_value(value: Any) -> str:
    if isinstance(value, datetime):
        text = value.isoformat()
    elif isinstance(value, float):
        text = f"{value:.3f}".rstrip("0").rstrip(".")
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (dict, list, tuple)):
        text = json.dumps(value, default=str, separators=(",", ":"))
    else:
        text = str(value)
    if not text or _QUOTED.search(text) is not None:
        # JSON's string syntax: quotes, backslashes and C0 controls escaped; then the
        # control characters it leaves raw (DEL, C1, U+2028/U+2029) as \uXXXX. Other
        # characters stay as they are: `ü` or `日` escaped were unreadable in journalctl,
        # and a grep for a job's name did not find it (a tester's finding).
        return CONTROL.sub(_escaped, json.dumps(text, ensure_ascii=False))
    return text


def _escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


#: The JSON format's encoder (one object: ``json.dumps`` with options builds one per call).
_JSON: Final = json.JSONEncoder(default=str, separators=(",", ":"))
#: The last second formatted by :func:`_timestamp`: (second, its text up to the seconds),
#: replaced whole (a thread that logs reads one pair or the other, never half of each).
_second: tuple[int, str] = (-(2**62), "")


def _timestamp(now: float) -> str:
    """``now`` as ISO 8601 UTC with milliseconds, as ``datetime.isoformat`` writes it;
    the text up to the second is formatted once per second (a burst logs thousands of
    lines a second, and this was most of a line's time)."""
    # (Rounded as datetime.fromtimestamp rounds: the fraction to microseconds, half even.)
    fraction, whole = math.modf(now)
    second, micro = int(whole), round(fraction * 1_000_000)
    if micro >= 1_000_000:
        second, micro = second + 1, micro - 1_000_000
    elif micro < 0:
        second, micro = second - 1, micro + 1_000_000
    global _second
    known, text = _second
    if second != known:
        text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second = (second, text)
    return f"{text}.{micro // 1000:03d}+00:00"


def _record(now: float, level: Level, name: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    ts = _timestamp(now)
    record: dict[str, Any] = {"ts": ts, "level": level, "event": name}
    record.update({k: v for k, v in fields.items() if v is not None})
    return record


@attrs.define(eq=False)
class EventLog:
    """Writes events; the daemon passes one of these to everything that logs."""

    #: ``logfmt`` or ``json``.
    format: Literal["logfmt", "json"] = "logfmt"
    #: Events below this level are dropped.
    level: Level = "info"
    stream: TextIO | None = None
    #: Prefix lines with ``<N>`` (journald priority); detected from JOURNAL_STREAM.
    journal: bool = attrs.field(factory=_stderr_is_journal)
    #: Called with every record written (tests and the metrics use it).
    observers: list[Callable[[dict[str, Any]], None]] = attrs.field(factory=list)
    #: While :meth:`writer` runs: records it has yet to format and write (time, level,
    #: name, redacted fields), and its wake-up.
    _pending: list[tuple[float, Level, str, Mapping[str, Any]]] = attrs.field(
        factory=list, init=False, repr=False
    )
    _wake: trio.Event | None = attrs.field(default=None, init=False, repr=False)

    async def writer(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Write the lines in batches until cancelled (the daemon runs this as a task).

        Each line used to be one ``write`` to stderr: in a burst of runs, one system call
        per run that also wakes the reader (journald) per line. With this task running,
        the lines logged in one scheduler round go in one write, at the next round;
        whatever is left is written when it is cancelled. Lines are also formatted
        here, not where they are logged: a lone trigger's path (wake, claim, call)
        logs three events and need not wait for their text. Without this task (the
        CLI), each line is formatted and written at once."""
        if self._wake is not None:  # another daemon of this process writes already
            task_status.started()
            return
        self._wake = trio.Event()
        task_status.started()
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                self._flush()
        finally:
            self._wake = None
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        text = "".join([self._line(*entry) + "\n" for entry in pending])
        stream = self.stream if self.stream is not None else sys.stderr
        stream.write(text)
        stream.flush()

    def wants(self, level: Level) -> bool:
        """Whether an event at ``level`` would be written or observed (skip building it
        otherwise: debug events on a hot path cost nothing at the default level)."""
        return bool(self.observers) or _LEVELS[level] >= _LEVELS[self.level]

    def event(self, name: str, level: Level = "info", **fields: Any) -> None:
        self.write(name, level, fields)

    def write(
        self, name: str, level: Level, fields: Mapping[str, Any], *, redacted: bool = False
    ) -> None:
        """Write one line. Its fields are redacted first (:mod:`coordinator.redact`: a
        secret never reaches the log), unless the caller already did (``redacted``)."""
        written = _LEVELS[level] >= _LEVELS[self.level]
        if not written and not self.observers:
            return
        if not redacted:
            fields = redact.default().fields(fields)
        now = time.time()
        if self.observers:
            # Observers (metrics, tests) see every event, whatever the level written.
            record = _record(now, level, name, fields)
            for observer in self.observers:
                observer(record)
            if not written:
                return
        if self._wake is not None:
            self._pending.append((now, level, name, fields))
            self._wake.set()
            return
        stream = self.stream if self.stream is not None else sys.stderr
        stream.write(self._line(now, level, name, fields) + "\n")
        stream.flush()

    def _line(self, now: float, level: Level, name: str, fields: Mapping[str, Any]) -> str:
        record = _record(now, level, name, fields)
        if self.format == "json":
            # (DEL, the one control character json.dumps leaves raw, can only be in a string.)
            line = _JSON.encode(record).replace("\x7f", "\\u007f")
        else:
            line = " ".join(f"{k}={_logfmt_value(v)}" for k, v in record.items())
        if self.journal:
            line = f"<{_PRIORITY[level]}>{line}"
        return line

    def info(self, name: str, **fields: Any) -> None:
        self.event(name, "info", **fields)

    def warning(self, name: str, **fields: Any) -> None:
        self.event(name, "warning", **fields)

    def error(self, name: str, **fields: Any) -> None:
        self.event(name, "error", **fields)

    def debug(self, name: str, **fields: Any) -> None:
        self.event(name, "debug", **fields)
