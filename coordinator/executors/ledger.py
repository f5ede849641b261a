"""The process groups of the commands a daemon started and has not seen end, one file
each in the state directory, so that the next start can stop those a killed daemon left.

A daemon killed outright (SIGKILL, the OOM killer) leaves its commands running: each
leads a process group of its own (``exec.py``), so nothing stops them with it. Under the
systemd unit the whole cgroup is killed before a restart; anywhere else the next start's
crash sweep found their runs lost and, for an idempotent job, queued the run again while
the old command still ran (two copies side by side, seen by a helper on 2026-12-02).

So a command's group is recorded when it is spawned and forgotten when it has been
reaped, and :meth:`CommandLedger.stop_orphans` (the exec executor's ``serve``: after the
lock is taken and before the first refresh can start anything) stops every recorded
group still alive whose daemon is not: SIGTERM, then SIGKILL after the grace. A group
is taken for the recorded one only if its leader is alive with the recorded start time
and boot: a pid reused since (a reboot, or a group long gone) is left alone, and so are
children a dead leader left behind (nothing proves whose they are). The run itself is
the sweep's: its outcome is unknown whatever becomes of the command.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import trio

from ..files import make_state_dir, private_text

if TYPE_CHECKING:
    from ..events import EventBus


@attrs.frozen
class _Identity:
    """What names one process for good: its boot, and its start time since boot."""

    boot: str
    start: int


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            return file.read().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, ``/proc/PID/stat`` field 22),
    ``None`` if there is no such live process (or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: read after the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if not fields or fields[0] in (b"Z", b"X"):
        return None  # exited (a zombie waits for its parent only)
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


@attrs.define(eq=False)
class _Orphan:
    """A recorded group found still led by its recorded process."""

    path: Path
    pgid: int
    run_id: int
    identity: _Identity
    #: A pidfd on its leader (``None``: an old kernel), to wait for its exit.
    fd: int | None = None
    signal: str = "SIGTERM"


@attrs.define(eq=False)
class CommandLedger:
    """One file per running command, named by its process group id, each also naming
    the daemon process that started it."""

    directory: Path
    _boot: str = attrs.field(factory=_boot_id)
    #: This daemon process (its pid and start time), recorded with each command.
    _owner: tuple[int, int | None] = attrs.field(
        factory=lambda: (os.getpid(), _start_ticks(os.getpid()))
    )

    def record(self, pgid: int, run_id: int) -> str | None:
        """The command leading group ``pgid`` runs ``run_id``; why it could not be
        recorded (``None``: it was, or its leader is already gone). Best effort: a
        ledger that cannot be written loses only this safeguard, and the caller says so
        (on a full disk the entry was left an empty file, without a word). Private to
        this user, and not synced: a host that crashes takes the commands with it."""
        start = _start_ticks(pgid)
        if start is None or not self._boot:
            return None
        owner_pid, owner_start = self._owner
        entry = {
            "pgid": pgid,
            "run": run_id,
            "boot": self._boot,
            "start": start,
            "daemon": owner_pid,
            "daemon_start": owner_start,
        }
        path = self.directory / str(pgid)
        try:
            make_state_dir(self.directory.parent)  # (the state directory: 0711, not 0755)
            self.directory.mkdir(mode=0o700, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as file:
                file.write(json.dumps(entry))
        except OSError as exc:
            with contextlib.suppress(OSError):
                path.unlink()  # (not left empty or torn)
            return f"{path}: {exc.strerror or exc}"
        return None

    def forget(self, pgid: int) -> None:
        """The group's leader was reaped (its pid may be reused from now on)."""
        with contextlib.suppress(OSError):
            (self.directory / str(pgid)).unlink()

    async def stop_orphans(self, *, grace: float, events: EventBus | None) -> int:
        """Stop every recorded group whose leader is still the recorded process and
        whose daemon is gone, then clear their entries; how many were stopped. All are
        signalled at once and given one ``grace`` together: SIGTERM, then SIGKILL to
        every group, for what is left of it once its leader exited or the grace ran out
        (a child that ignores SIGTERM would outlive a leader that does not). Said once
        per group (``startup.orphan_stopped``). An entry of a daemon still running (two
        daemons given one state directory) is left alone, as is one that is not this
        user's private regular file."""
        try:
            files = sorted(self.directory.iterdir())
        except OSError:
            return 0
        orphans: list[_Orphan] = []
        for path in files:
            orphan = self._orphan(path)
            if isinstance(orphan, _LiveOwner):
                continue  # another daemon's, running now: not ours to touch
            if orphan is not None:
                orphans.append(orphan)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        if not orphans:
            return 0
        try:
            for orphan in orphans:
                with contextlib.suppress(OSError):
                    orphan.fd = os.pidfd_open(orphan.pgid)
                _kill(orphan.pgid, signal.SIGTERM)
            with trio.move_on_after(grace):
                for orphan in orphans:
                    if orphan.fd is None:
                        await trio.sleep(grace)  # (an old kernel: no exit to wait on)
                        break
                    await trio.lowlevel.wait_readable(orphan.fd)
            for orphan in orphans:
                if self._alive_as(orphan.pgid, orphan.identity):
                    orphan.signal = "SIGKILL"
                # The rest of the group (its id is not handed out again while a member
                # lives, so nothing but its own processes can be hit).
                _kill(orphan.pgid, signal.SIGKILL)
        finally:
            for orphan in orphans:
                if orphan.fd is not None:
                    trio.lowlevel.notify_closing(orphan.fd)
                    os.close(orphan.fd)
        for orphan in orphans:
            with contextlib.suppress(OSError):
                orphan.path.unlink()
            if events is not None:
                events.log.warning(
                    "startup.orphan_stopped",
                    run=orphan.run_id,
                    pgid=orphan.pgid,
                    signal=orphan.signal,
                )
        return len(orphans)

    def _orphan(self, path: Path) -> _Orphan | _LiveOwner | None:
        """The group an entry names, if it is an orphan to stop; :data:`_LIVE_OWNER` if
        its daemon still runs; ``None`` for an entry to drop (unreadable, another boot,
        its leader gone or replaced)."""
        text = private_text(path)
        if text is None:
            return None
        try:
            entry = json.loads(text)
            pgid, run_id = int(entry["pgid"]), int(entry["run"])
            identity = _Identity(boot=str(entry["boot"]), start=int(entry["start"]))
            owner, owner_start = int(entry["daemon"]), entry["daemon_start"]
        except (ValueError, KeyError, TypeError, OverflowError):
            return None
        if pgid <= 1 or identity.boot != self._boot:
            return None
        if owner != os.getpid() and owner_start is not None and _start_ticks(owner) == owner_start:
            return _LIVE_OWNER
        if not self._alive_as(pgid, identity):
            return None
        return _Orphan(path=path, pgid=pgid, run_id=run_id, identity=identity)

    def _alive_as(self, pgid: int, recorded: _Identity) -> bool:
        return recorded.boot == self._boot and _start_ticks(pgid) == recorded.start


class _LiveOwner:
    """The marker of an entry whose daemon is running."""


_LIVE_OWNER: Final = _LiveOwner()


def _kill(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


__all__ = ["CommandLedger"]
