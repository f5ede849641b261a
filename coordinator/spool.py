"""Held results, and the durable local journal of those the database would not take.

A :class:`HeldResult` is one settlement the database has not acknowledged: the exact
outcome of a call plus what saving it needs. It is the same value wherever it waits: in
memory while the daemon retries it (:mod:`coordinator.daemon.settlement`), here on disk
when the daemon had to stop without saving it, and again in memory when the next start
replays it.

The journal holds one record per line: JSON, a tab, and the CRC32 of the JSON in hex.
Every write replaces the whole file atomically (a temporary file is written, fsynced
and renamed over the journal, then the directory is fsynced), so a crash or a full disk
leaves either the old journal or the new one, never half a record; a failed write raises
:class:`SpoolError` and the caller says so loudly. A line that cannot be read back (a
torn write by an older version, a flipped bit) is reported and moved aside, byte for
byte, to a ``.corrupt-<time>`` file beside the journal, never silently dropped. The
journal, its directory and the files set aside are private to the daemon's user (0600,
0700) whatever the umask: they hold output tails.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import zlib
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from .errors import CoordinatorError
from .files import STATE_DIR_MODE, make_state_dir
from .model import Cursor, Finding, Outcome

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from .clock import WallClock

FILE_MODE = 0o600
#: A directory the spool makes (the state directory, usually): nobody else may list or
#: write it, but others may pass through it -- the embedded PostgreSQL runs as another
#: user (``postgres``) when the daemon runs as root, and its cluster lives in
#: ``<state dir>/postgres``. At 0700, `coordinator run` as root on a fresh machine made
#: /var/lib/coordinator, then refused it as unreachable (a tester's finding). What is in
#: it is private by its own mode (the spool's files 0600, the cluster's 0700).
DIR_MODE = STATE_DIR_MODE
#: What the start's probe writes in the spool's directory: a page, so that a full disk
#: is found (an empty file is made even there), not a small one that still has room.
PROBE_BYTES: Final = 4096


class SpoolError(CoordinatorError):
    """The journal could not be written (a full disk, a read-only directory...)."""


@attrs.frozen(kw_only=True)
class HeldResult:
    """A result the database has not acknowledged yet. Never recomputed, only re-sent."""

    #: The run it settles.
    run_id: int
    #: Its job (``None`` for records spooled by an older version, which lacked it).
    job_id: int | None = None
    #: ``namespace/name``, for logs.
    job_key: str
    #: The schedule version the run was claimed under (an edit made meanwhile stands).
    schedule_version: int
    #: The job's next deadline, computed from the outcome when the call ended.
    next_run_at: datetime | None
    #: The call's outcome, exactly.
    outcome: Outcome
    #: Drawn once when the call ended (0 to 1): how much of a quarter of a retry's delay
    #: is taken off, should the settlement queue a retry (``coordinator._settle``).
    retry_jitter: float = 0.0
    #: When the run was claimed, as the database saved it (``runs.claimed_at``): a
    #: give-back (``outcome.status`` ``queued``) undoes that claim only, never a later
    #: one of the same run. ``None`` in records spooled before it was kept.
    claimed_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        o = self.outcome
        outcome: dict[str, Any] = {
            "status": o.status,
            "started_at": o.started_at.isoformat(),
            "finished_at": o.finished_at.isoformat(),
            "count": o.count,
            "extra": o.extra,
            "error_cause": o.error_cause,
            "error_message": o.error_message,
            "category": o.category,
            "retryable": o.retryable,
        }
        # A recoverable run's cursor ({"value": null} is JSON null, absent: none) and the
        # findings not yet written, kept exactly like the rest.
        if o.cursor is not None:
            outcome["cursor"] = {"value": o.cursor.value}
        if o.findings:
            outcome["findings"] = [f.to_json() for f in o.findings]
        return {
            "run_id": self.run_id,
            "job_id": self.job_id,
            "job": self.job_key,
            "schedule_version": self.schedule_version,
            "next_run_at": self.next_run_at.isoformat() if self.next_run_at else None,
            "retry_jitter": self.retry_jitter,
            "claimed_at": self.claimed_at.isoformat() if self.claimed_at else None,
            "outcome": outcome,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HeldResult:
        o = data["outcome"]
        nxt = data.get("next_run_at")
        job_id = data.get("job_id")
        cursor = o.get("cursor")
        claimed = data.get("claimed_at")
        return cls(
            run_id=int(data["run_id"]),
            job_id=int(job_id) if job_id is not None else None,
            job_key=str(data.get("job", "?")),
            schedule_version=int(data["schedule_version"]),
            next_run_at=datetime.fromisoformat(nxt) if nxt else None,
            # (Records spooled by older versions lack the keys added since.)
            retry_jitter=float(data.get("retry_jitter") or 0.0),
            claimed_at=datetime.fromisoformat(claimed) if claimed else None,
            outcome=Outcome(
                status=o["status"],
                started_at=datetime.fromisoformat(o["started_at"]),
                finished_at=datetime.fromisoformat(o["finished_at"]),
                count=o.get("count"),
                extra=o.get("extra") or {},
                error_cause=o.get("error_cause"),
                error_message=o.get("error_message"),
                category=o.get("category"),
                retryable=o.get("retryable"),
                cursor=None if cursor is None else Cursor(value=cursor["value"]),
                findings=tuple(Finding.from_json(f) for f in o.get("findings") or ()),
            ),
        )

    def line(self) -> bytes:
        """The journal line: JSON, a tab, its CRC32, a newline."""
        body = json.dumps(self.to_json(), separators=(",", ":"), default=str)
        return f"{body}\t{_crc(body)}\n".encode()


@attrs.frozen(kw_only=True)
class Unreadable:
    """A journal line that could not be read back, kept byte for byte."""

    raw: bytes
    reason: str


@attrs.frozen(kw_only=True)
class SpoolContents:
    """What :meth:`Spool.read` found."""

    records: list[HeldResult]
    #: Lines that could not be read back (torn or corrupt), with the reason.
    corrupt: list[Unreadable]


def _crc(text: str) -> str:
    return f"{zlib.crc32(text.encode()):08x}"


@attrs.define(eq=False)
class Spool:
    """The journal file ``path`` (its directory is created on first write)."""

    path: Path

    def check(self, *, probe: bool = False) -> None:
        """Refuse a path that can never hold the journal (a directory, say, or a
        directory that cannot be written): raises :class:`SpoolError` naming it. Called at
        start, before anything is owed: found only at a stop, with results to keep, it
        was a lost result. ``probe``: make the directory and write a file there and
        remove it (``coordinator run``); otherwise ask the file system's permissions only
        (``coordinator config``, which changes nothing)."""
        if self.path.is_dir():
            raise SpoolError(f"spool: {self.path} is a directory, not a file")
        parent = self.path.parent
        if parent.exists() and not parent.is_dir():
            raise SpoolError(f"spool: {parent} is not a directory")
        why = _unwritable(parent, probe=probe)
        if why is not None:
            raise SpoolError(
                f"spool: cannot write in {parent}: {why} (results the database refuses at "
                "a stop are kept there; give the state directory to the daemon's user)"
            )

    def append(self, results: Iterable[HeldResult]) -> None:
        """Add ``results`` to the journal, durably, or raise :class:`SpoolError`."""
        new = b"".join(r.line() for r in results)
        if not new:
            return
        try:
            old = self.path.read_bytes()
        except FileNotFoundError:
            old = b""
        except OSError as exc:
            raise SpoolError(f"cannot read {self.path}: {exc.strerror or exc}") from exc
        if old and not old.endswith(b"\n"):
            old += b"\n"  # keep a torn last line a line of its own: it is read back as such
        self._replace(old + new)

    def rewrite(self, results: Sequence[HeldResult]) -> None:
        """Make the journal hold exactly ``results`` (none: remove it)."""
        if not results:
            self.clear()
            return
        self._replace(b"".join(r.line() for r in results))

    def read(self) -> SpoolContents:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return SpoolContents(records=[], corrupt=[])
        records: list[HeldResult] = []
        corrupt: list[Unreadable] = []
        lines = data.split(b"\n")
        # The bytes after the last newline are a torn write, if anything.
        for i, raw in enumerate(lines):
            if not raw:
                continue
            if i == len(lines) - 1:
                corrupt.append(Unreadable(raw=raw, reason="torn write: no line end"))
                continue
            body_bytes, sep, crc = raw.rpartition(b"\t")
            try:
                body = body_bytes.decode("utf-8")
            except UnicodeDecodeError:
                corrupt.append(Unreadable(raw=raw, reason="not UTF-8"))
                continue
            if not sep or _crc(body).encode() != crc:
                corrupt.append(Unreadable(raw=raw, reason="checksum mismatch"))
                continue
            try:
                records.append(HeldResult.from_json(json.loads(body)))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                corrupt.append(Unreadable(raw=raw, reason=f"unreadable record: {exc}"))
        return SpoolContents(records=records, corrupt=corrupt)

    def set_aside(self, lines: Sequence[Unreadable], clock: WallClock, kind: str) -> Path | None:
        """Keep ``lines`` (byte for byte, each after a ``# reason`` line) in a
        ``.<kind>-<time>`` file beside the journal, for an operator. Raises
        :class:`SpoolError` if it cannot be written."""
        if not lines:
            return None
        stamp = clock.now().strftime("%Y%m%dT%H%M%S.%fZ")
        aside = self.path.with_name(f"{self.path.name}.{kind}-{stamp}")
        body = b"".join(
            b"# " + line.reason.encode("utf-8", "replace").replace(b"\n", b" ") + b"\n"
            + line.raw + b"\n"
            for line in lines
        )  # fmt: skip
        self._write_new(aside, body)
        return aside

    def clear(self) -> None:
        """Remove the journal once every record in it is saved (or set aside)."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise SpoolError(f"cannot remove {self.path}: {exc.strerror or exc}") from exc
        _fsync_dir(self.path.parent)

    # -- durable writes ---------------------------------------------------------------

    def _replace(self, data: bytes) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        self._write_new(tmp, data)
        try:
            os.replace(tmp, self.path)
        except OSError as exc:
            _unlink_quietly(tmp)
            raise SpoolError(f"cannot write {self.path}: {exc.strerror or exc}") from exc
        _fsync_dir(self.path.parent)

    def _write_new(self, path: Path, data: bytes) -> None:
        """Write ``path`` from scratch (0600), fsynced; on failure remove what was left."""
        try:
            _make_private_dir(path.parent)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        except OSError as exc:
            raise SpoolError(f"cannot write {path}: {exc.strerror or exc}") from exc
        try:
            os.fchmod(fd, FILE_MODE)  # the umask may have narrowed or the file pre-existed
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            _unlink_quietly(path)
            raise SpoolError(f"cannot write {path}: {exc.strerror or exc}") from exc
        os.close(fd)


def _unwritable(directory: Path, *, probe: bool) -> str | None:
    """Why files cannot be made in ``directory`` (``None``: they can)."""
    if not probe:
        existing = directory
        while not existing.exists() and existing.parent != existing:
            existing = existing.parent  # (made on the first write: its parent must allow it)
        return None if os.access(existing, os.W_OK | os.X_OK) else "permission denied"
    name = None
    try:
        _make_private_dir(directory)
        fd, name = tempfile.mkstemp(prefix=".probe-", dir=directory)
        # Some bytes, synced: an empty file is made even on a full disk, which then
        # passed, and a stop found the disk full with results to keep (a tester's).
        with os.fdopen(fd, "wb") as file:
            file.write(bytes(PROBE_BYTES))
            file.flush()
            os.fsync(file.fileno())
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        if name is not None:
            _unlink_quietly(Path(name))
    return None


def _make_private_dir(path: Path) -> None:
    """Create ``path`` (and parents) 0711 if missing; an existing directory is kept as it is
    (the operator may have chosen its mode)."""
    make_state_dir(path)


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


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


__all__ = ["HeldResult", "Spool", "SpoolContents", "SpoolError", "Unreadable"]
