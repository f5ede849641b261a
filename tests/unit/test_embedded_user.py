"""As root the embedded server needs an unprivileged user; making one is announced first.

A process-level test would need a machine without a ``postgres`` user; here the account
lookups and ``useradd`` are replaced, and the order of events is what is checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from coordinator import embedded

if TYPE_CHECKING:
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
