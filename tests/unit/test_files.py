"""Small private files (``coordinator.files``): written whole and 0600, read only when
nobody else could have read or put them there."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from coordinator.files import private_text, write_private

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
