"""Fixtures for the process-level tests."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def cluster_home() -> Iterator[Path]:
    """A directory for an embedded cluster, outside pytest's ``tmp_path``.

    As root the server runs as an unprivileged user, which must traverse every parent;
    pytest resets its ``/tmp/pytest-of-<user>`` to mode 0700 whenever a pytest process
    starts (another suite on the same machine), which would lock the server out midway.
    """
    home = Path(tempfile.mkdtemp(prefix="coordinator-cluster-"))
    try:
        yield home
    finally:
        from coordinator.embedded import Cluster

        for pidfile in home.glob("**/data/postmaster.pid"):
            Cluster(root=pidfile.parent.parent, port=None).stop("immediate")
        shutil.rmtree(home, ignore_errors=True)
