"""As root the embedded server needs an unprivileged user; making one is announced first.

A process-level test would need a machine without a ``postgres`` user; here the account
lookups and ``useradd`` are replaced, and the order of events is what is checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from coordinator import embedded

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


def test_useradd_is_announced_before_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []

    def no_such_user(name: str) -> Any:
        raise KeyError(name)

    def run(cmd: list[str], **kwargs: Any) -> None:
        events.append("ran " + " ".join(cmd[:2]))

    monkeypatch.setattr(embedded.os, "geteuid", lambda: 0)
    monkeypatch.setattr(embedded.pwd, "getpwnam", no_such_user)
    monkeypatch.setattr(embedded.subprocess, "run", run)
    user = embedded.unprivileged_user(announce=lambda message: events.append(message))
    assert user == "coordinator"
    assert events[1] == "ran useradd --system"
    assert "no user 'postgres' or 'coordinator'" in events[0]
    assert "creating the system user 'coordinator'" in events[0]


def test_an_existing_user_is_used_silently(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded.os, "geteuid", lambda: 0)
    monkeypatch.setattr(embedded.pwd, "getpwnam", lambda name: object())
    announced: list[str] = []
    assert embedded.unprivileged_user(announce=announced.append) == "postgres"
    assert announced == []


class _Server:
    """A stand-in for embedded.Cluster: what ensure_running asks of it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.initialized = True
        self.running = False
        self.starts = 0

    def is_running(self) -> bool:
        return self.running

    def start(self) -> None:
        self.starts += 1
        self.running = True

    def stop(self) -> None:
        self.running = False


def test_an_owner_that_has_not_written_its_pid_yet_is_waited_for(tmp_path: Path) -> None:
    """Another command holds owner.pid with no pid in it (it is starting the server, or
    handed it over): a locked file with no pid read as "no owner file we can use", and a
    second `pg_ctl start` failed (a reviewer's finding). It is waited for."""
    import fcntl
    import os
    import threading

    server = _Server(tmp_path)
    other = os.open(tmp_path / embedded.OWNER_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another command's lock, no pid
    try:
        threading.Timer(0.2, lambda: setattr(server, "running", True)).start()
        assert embedded.ensure_running(server) is False  # type: ignore[arg-type]
        assert server.starts == 0
    finally:
        embedded.leave(server)  # type: ignore[arg-type]
        os.close(other)
