"""A durable local journal of results the database would not take.

When the daemon stops and a settlement still cannot be written, the exact result goes
here instead of being lost; the next start replays it before anything else. One record
per line: JSON, a tab, and the CRC32 of the JSON in hex. Each append is fsynced (and the
directory too when the file is created), so an acknowledged record survives a power
cut. A torn last write (no newline, or a CRC that does not match) is detected on read;
such a line is reported and moved aside to a ``.corrupt`` file, never silently dropped.
"""

from __future__ import annotations

import json
import os
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs

from .model import Outcome


@attrs.frozen(kw_only=True)
class SpooledResult:
    """One unsaved settlement: everything :meth:`Store.settle_raw` needs."""

    run_id: int
    job_key: str
    schedule_version: int
    next_run_at: datetime | None
    outcome: Outcome

    def to_json(self) -> dict[str, Any]:
        o = self.outcome
        return {
            "run_id": self.run_id,
            "job": self.job_key,
            "schedule_version": self.schedule_version,
            "next_run_at": self.next_run_at.isoformat() if self.next_run_at else None,
            "outcome": {
                "status": o.status,
                "started_at": o.started_at.isoformat(),
                "finished_at": o.finished_at.isoformat(),
                "count": o.count,
                "extra": o.extra,
                "error_cause": o.error_cause,
                "error_message": o.error_message,
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SpooledResult:
        o = data["outcome"]
        nxt = data.get("next_run_at")
        return cls(
            run_id=int(data["run_id"]),
            job_key=str(data.get("job", "?")),
            schedule_version=int(data["schedule_version"]),
            next_run_at=datetime.fromisoformat(nxt) if nxt else None,
            outcome=Outcome(
                status=o["status"],
                started_at=datetime.fromisoformat(o["started_at"]),
                finished_at=datetime.fromisoformat(o["finished_at"]),
                count=o.get("count"),
                extra=o.get("extra") or {},
                error_cause=o.get("error_cause"),
                error_message=o.get("error_message"),
            ),
        )


@attrs.frozen(kw_only=True)
class SpoolContents:
    """What :meth:`Spool.read` found."""

    records: list[SpooledResult]
    #: Lines that could not be read back (torn or corrupt), with the reason.
    corrupt: list[tuple[str, str]]


def _crc(text: str) -> str:
    return f"{zlib.crc32(text.encode()):08x}"


@attrs.define(eq=False)
class Spool:
    """The journal file ``path`` (its directory is created on first append)."""

    path: Path

    def append(self, result: SpooledResult) -> None:
        body = json.dumps(result.to_json(), separators=(",", ":"), default=str)
        line = f"{body}\t{_crc(body)}\n".encode()
        created = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            _fsync_dir(self.path.parent)

    def read(self) -> SpoolContents:
        if not self.path.exists():
            return SpoolContents(records=[], corrupt=[])
        data = self.path.read_bytes().decode("utf-8", "replace")
        records: list[SpooledResult] = []
        corrupt: list[tuple[str, str]] = []
        lines = data.split("\n")
        # The text after the last newline is a torn write, if anything.
        for i, line in enumerate(lines):
            last = i == len(lines) - 1
            if not line:
                continue
            if last:
                corrupt.append((line, "torn write: no line end"))
                continue
            body, sep, crc = line.rpartition("\t")
            if not sep or _crc(body) != crc:
                corrupt.append((line, "checksum mismatch"))
                continue
            try:
                records.append(SpooledResult.from_json(json.loads(body)))
            except (ValueError, KeyError, TypeError) as exc:
                corrupt.append((line, f"unreadable record: {exc}"))
        return SpoolContents(records=records, corrupt=corrupt)

    def set_aside(self, corrupt: list[tuple[str, str]]) -> Path | None:
        """Keep corrupt lines in a ``.corrupt`` file beside the spool, for an operator."""
        if not corrupt:
            return None
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        with aside.open("a", encoding="utf-8") as f:
            for line, reason in corrupt:
                f.write(f"# {reason}\n{line}\n")
            f.flush()
            os.fsync(f.fileno())
        return aside

    def clear(self) -> None:
        """Remove the journal once every record in it is saved (or set aside)."""
        if self.path.exists():
            self.path.unlink()
            _fsync_dir(self.path.parent)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
