"""Small private files (``coordinator.files``): written whole and 0600, read only when
nobody else could have read or put them there."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from coordinator.files import StateDirInUse, hold_state_dir, private_text, write_private

if TYPE_CHECKING:
    from pathlib import Path


def test_written_whole_for_its_owner_only_and_nothing_left_beside(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    write_private(path, "one")
    write_private(path, "two")
    assert path.read_text() == "two"
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret"]
    assert private_text(path) == "two"


def test_a_shared_file_or_a_link_is_not_read_as_private(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    write_private(path, "key")
    link = tmp_path / "link"
    link.symlink_to(path)
    assert private_text(link) is None
    os.chmod(path, 0o640)
    assert private_text(path) is None
    assert private_text(tmp_path / "absent") is None
    (tmp_path / "bytes").write_bytes(b"\xff")
    os.chmod(tmp_path / "bytes", 0o600)
    assert private_text(tmp_path / "bytes") is None


def test_a_fifo_in_its_place_is_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo", 0o600)
    assert private_text(tmp_path / "fifo") is None  # (opening it blocked, without a writer)


def test_a_state_directory_is_held_by_one_daemon_at_a_time(tmp_path: Path) -> None:
    """Two daemons sharing one state directory share its spool and alert outbox (a
    tester's same-host pair sent an alert twice): the second is refused, naming the
    first, and the directory is free again once the first lets go."""
    state = tmp_path / "new" / "state"
    first = hold_state_dir(state)
    try:
        with pytest.raises(StateDirInUse) as refused:
            hold_state_dir(state)
        assert str(refused.value) == (
            f"state directory {state} is in use by another daemon (pid {os.getpid()}): give "
            "each daemon a state directory of its own (state_dir, COORDINATOR_STATE_DIR)"
        )
    finally:
        os.close(first)
    os.close(hold_state_dir(state))
