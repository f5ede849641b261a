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
group still alive: SIGTERM, then SIGKILL after the grace. A group is taken for the
recorded one only if its leader is alive with the recorded start time and boot: a pid
reused since (a reboot, or a group long gone) is left alone, and so are children a dead
leader left behind (nothing proves whose they are). The run itself is the sweep's: its
outcome is unknown whatever becomes of the command.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import trio

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
class CommandLedger:
    """One file per running command, named by its process group id."""

    directory: Path
    _boot: str = attrs.field(factory=_boot_id)

    def record(self, pgid: int, run_id: int) -> None:
        """The command leading group ``pgid`` runs ``run_id`` (best effort: a ledger
        that cannot be written loses only this safeguard)."""
        start = _start_ticks(pgid)
        if start is None or not self._boot:
            return
        entry = {"pgid": pgid, "run": run_id, "boot": self._boot, "start": start}
        with contextlib.suppress(OSError):
            self.directory.mkdir(parents=True, exist_ok=True)
            (self.directory / str(pgid)).write_text(json.dumps(entry))

    def forget(self, pgid: int) -> None:
        """The group's leader was reaped (its pid may be reused from now on)."""
        with contextlib.suppress(OSError):
            (self.directory / str(pgid)).unlink()

    async def stop_orphans(self, *, grace: float, events: EventBus | None) -> int:
        """Stop every recorded group whose leader is still the recorded process, then
        clear the ledger; how many were stopped. Said once per group
        (``startup.orphan_stopped``)."""
        try:
            files = sorted(self.directory.iterdir())
        except OSError:
            return 0
        stopped = 0
        for path in files:
            try:
                entry = json.loads(path.read_text())
                pgid, run_id = int(entry["pgid"]), int(entry["run"])
                recorded = _Identity(boot=str(entry["boot"]), start=int(entry["start"]))
            except (OSError, ValueError, KeyError, TypeError):
                entry = None
            if entry is not None and self._alive_as(pgid, recorded):
                signalled = await self._stop(pgid, recorded, grace)
                stopped += 1
                if events is not None:
                    events.log.warning(
                        "startup.orphan_stopped", run=run_id, pgid=pgid, signal=signalled
                    )
            with contextlib.suppress(OSError):
                path.unlink()
        return stopped

    def _alive_as(self, pgid: int, recorded: _Identity) -> bool:
        return recorded.boot == self._boot and _start_ticks(pgid) == recorded.start

    async def _stop(self, pgid: int, recorded: _Identity, grace: float) -> str:
        """SIGTERM the group, SIGKILL it if its leader outlives ``grace``; the last
        signal sent. The leader's exit is awaited on a pidfd (any process's, not only a
        child's), opened before the identity is checked again: the pid cannot change
        hands in between."""
        try:
            fd: int | None = os.pidfd_open(pgid)
        except OSError:
            fd = None  # gone already, or an old kernel
        try:
            if not self._alive_as(pgid, recorded):
                return "none"
            _kill(pgid, signal.SIGTERM)
            with trio.move_on_after(grace):
                if fd is not None:
                    await trio.lowlevel.wait_readable(fd)
                else:
                    await trio.sleep(grace)
                if not self._alive_as(pgid, recorded):
                    return "SIGTERM"
            _kill(pgid, signal.SIGKILL)
            return "SIGKILL"
        finally:
            if fd is not None:
                trio.lowlevel.notify_closing(fd)
                os.close(fd)


def _kill(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


__all__ = ["CommandLedger"]
