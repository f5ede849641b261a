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
