"""The command ledger (coordinator.executors.ledger) against real processes: a recorded
group still led by the recorded process is stopped; a pid that changed hands is not."""

from __future__ import annotations

import json
import subprocess
from typing import TYPE_CHECKING

import trio

from coordinator.executors.ledger import CommandLedger, _start_ticks

if TYPE_CHECKING:
    from pathlib import Path


def _spawn() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def test_a_recorded_group_is_stopped_and_the_ledger_cleared(tmp_path: Path) -> None:
    proc = _spawn()
    try:
        ledger = CommandLedger(tmp_path / "commands")
        ledger.record(proc.pid, 7)
        assert json.loads((tmp_path / "commands" / str(proc.pid)).read_text())["run"] == 7
        assert trio.run(lambda: ledger.stop_orphans(grace=5.0, events=None)) == 1
        assert proc.wait(5) == -15  # SIGTERM
        assert list((tmp_path / "commands").iterdir()) == []
    finally:
        proc.kill()
        proc.wait()


def test_a_pid_that_changed_hands_is_left_alone(tmp_path: Path) -> None:
    """The entry's start time is not the live process's (the pid was reused): not ours."""
    proc = _spawn()
    try:
        ledger = CommandLedger(tmp_path / "commands")
        ledger.record(proc.pid, 7)
        path = tmp_path / "commands" / str(proc.pid)
        entry = json.loads(path.read_text())
        assert entry["start"] == _start_ticks(proc.pid)
        path.write_text(json.dumps({**entry, "start": entry["start"] - 1}))
        assert trio.run(lambda: ledger.stop_orphans(grace=5.0, events=None)) == 0
        assert proc.poll() is None  # still running
        assert not path.exists()  # and the stale entry is gone
        # Forgotten once reaped: nothing is recorded for a command that ended.
        ledger.record(proc.pid, 8)
        ledger.forget(proc.pid)
        assert not path.exists()
    finally:
        proc.kill()
        proc.wait()


def _group(pgid: int) -> list[int]:
    """The live processes of group ``pgid`` (zombies excluded)."""
    from pathlib import Path

    members = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if fields[0] not in (b"Z", b"X") and int(fields[2]) == pgid:
            members.append(int(proc.name))
    return members


def test_what_a_group_keeps_after_its_leader_exits_is_killed(tmp_path: Path) -> None:
    """The leader dies on SIGTERM; a child that ignores it stays in the group: it gets
    SIGKILL (a retry would otherwise run beside it)."""
    import time

    proc = subprocess.Popen(["sh", "-c", '(trap "" TERM; sleep 60) & wait'], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while len(_group(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(_group(proc.pid)) >= 2
        ledger = CommandLedger(tmp_path / "commands")
        ledger.record(proc.pid, 9)
        assert trio.run(lambda: ledger.stop_orphans(grace=5.0, events=None)) == 1
        proc.wait(5)
        deadline = time.monotonic() + 5
        while _group(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _group(proc.pid) == []
    finally:
        proc.kill()
        proc.wait()


def test_the_commands_of_a_daemon_still_running_are_left_alone(tmp_path: Path) -> None:
    """Two daemons given one state directory: the entries of the one that runs are not
    the other's to stop."""
    command, daemon = _spawn(), _spawn()
    try:
        ledger = CommandLedger(tmp_path / "commands")
        ledger.record(command.pid, 7)
        path = tmp_path / "commands" / str(command.pid)
        entry = json.loads(path.read_text())
        entry.update(daemon=daemon.pid, daemon_start=_start_ticks(daemon.pid))
        path.write_text(json.dumps(entry))
        path.chmod(0o600)
        assert trio.run(lambda: ledger.stop_orphans(grace=5.0, events=None)) == 0
        assert command.poll() is None
        assert path.exists()
        # Once that daemon is gone, its command is an orphan.
        daemon.kill()
        daemon.wait()
        assert trio.run(lambda: ledger.stop_orphans(grace=5.0, events=None)) == 1
        assert command.wait(5) == -15
    finally:
        for proc in (command, daemon):
            proc.kill()
            proc.wait()
