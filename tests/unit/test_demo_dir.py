"""The CLI given a demo's directory with ``--state-dir`` (``coordinator.demo``): the demo's
database, worker socket and, only while that demo runs, its admin API. The demo itself
is driven end to end in tests/acceptance/test_operator.py; here, each state a directory
can be left in, without a daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest
import trio

from coordinator import cli, demo, probe, top
from coordinator.config import Config, load
from coordinator.errors import ConfigError, InvalidInput
from coordinator.files import write_private

if TYPE_CHECKING:
    from pathlib import Path

SERVICE = """
dsn = "postgresql://app@db.example/app"
admin_listen = "127.0.0.1:9999"
admin_token = "service-token-0123456789"
"""


def _config(tmp_path: Path, state_dir: Path, **flags: str) -> tuple[Config, bool, Path | None]:
    file = tmp_path / "coordinator.toml"
    file.write_text(SERVICE)
    loaded = load(file=file, environ={}, flags={"state_dir": str(state_dir), **flags})
    return cli._with_demo(loaded)


def _demo_dir(tmp_path: Path, state: dict[str, object] | None, *, cluster: bool) -> Path:
    where = tmp_path / "demo"
    where.mkdir()
    (where / demo.MARKER).write_text("made by `coordinator demo`\n")
    if cluster:
        (where / "postgres").mkdir()
    if state is not None:
        write_private(where / demo.STATE_FILE, json.dumps(state))
    return where


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_running_demo_is_asked_for_its_database_socket_and_admin_api(tmp_path: Path) -> None:
    state = {"database": "own", "pid": os.getpid(), "listen": "127.0.0.1:4321", "token": "t" * 32}
    where = _demo_dir(tmp_path, state, cluster=True)
    config, own, elsewhere = _config(tmp_path, where)
    assert (own, elsewhere) == (True, None)
    assert config.dsn is None
    assert config.admin_listen == "127.0.0.1:4321"
    assert config.admin_token_value() == "t" * 32
    assert config.worker_socket == where / "worker.sock"
    assert str(config.source("admin_listen")) == f"demo {where / demo.STATE_FILE}"
    # --dsn still wins for the database.
    config, own, _ = _config(tmp_path, where, dsn="postgresql://me@elsewhere/db")
    assert not own
    assert config.dsn == "postgresql://me@elsewhere/db"


@pytest.mark.parametrize("left", ["stopped", "killed", "pid reused", "shared file", "older demo"])
def test_a_demo_that_no_longer_runs_has_no_admin_api_not_the_services(
    tmp_path: Path, left: str
) -> None:
    """Its database is still the demo's; the service's admin API would answer for another
    daemon, so none is used: ``status`` shows the database, ``top`` says no demo runs."""
    state: dict[str, object] | None = {
        "stopped": {"database": "own"},
        "killed": {
            "database": "own",
            "pid": _dead_pid(),
            "listen": "127.0.0.1:4321",
            "token": "t" * 32,
        },
        # Its pid now another process's (this one's): not the demo, which started earlier.
        "pid reused": {
            "database": "own",
            "pid": os.getpid(),
            "started": "1",
            "listen": "127.0.0.1:4321",
            "token": "t" * 32,
        },
        "shared file": None,
        "older demo": None,
    }[left]
    where = _demo_dir(tmp_path, state, cluster=True)
    if left == "shared file":  # readable by others: not trusted with a token
        (where / demo.STATE_FILE).write_text(
            json.dumps(
                {"database": "given", "pid": os.getpid(), "listen": "127.0.0.1:1", "token": "t"}
            )
        )
        (where / demo.STATE_FILE).chmod(0o644)
    config, own, elsewhere = _config(tmp_path, where)
    # (Where its jobs are is read from a shared file too: no secret.)
    assert (own, elsewhere) == ((False, where) if left == "shared file" else (True, None))
    assert config.admin_listen is None
    assert config.admin_token_value() is None
    answer = probe.fetch_status(config)
    assert answer.label == f"no demo runs in {where} now"
    with pytest.raises(ConfigError, match=f"no demo runs in {where} now"):
        top.api_for(config)


def test_a_demo_given_a_dsn_needs_that_dsn_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its jobs are in the database it was given: not the service's, nor a cluster that
    happens to be in its directory."""
    where = _demo_dir(tmp_path, {"database": "given"}, cluster=True)
    _, own, elsewhere = _config(tmp_path, where)
    assert (own, elsewhere) == (False, where)
    monkeypatch.setenv("COORDINATOR_CONFIG", str(tmp_path / "coordinator.toml"))
    args = cli.build_parser().parse_args(["--state-dir", str(where), "jobs", "list"])
    with pytest.raises(ConfigError, match="given with --dsn: pass that --dsn too"):
        trio.run(cli.CommandContext(args=args).database)


def test_the_daemon_and_the_demo_never_take_a_demos_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = {"database": "own", "pid": os.getpid(), "listen": "127.0.0.1:4321", "token": "t" * 32}
    where = _demo_dir(tmp_path, state, cluster=True)
    file = tmp_path / "coordinator.toml"
    file.write_text(SERVICE)
    monkeypatch.setenv("COORDINATOR_CONFIG", str(file))
    for command in (["run"], ["demo"], ["status"]):
        args = cli.build_parser().parse_args(["--state-dir", str(where), *command])
        config = cli.CommandContext(args=args).config()
        demo_api = config.admin_listen == "127.0.0.1:4321"
        assert demo_api == (command == ["status"]), command


def test_not_a_demos_directory_is_left_alone(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    (plain / "postgres").mkdir(parents=True)
    config, own, elsewhere = _config(tmp_path, plain)
    assert (own, elsewhere) == (False, None)
    assert config.admin_listen == "127.0.0.1:9999"
    assert config.dsn == "postgresql://app@db.example/app"


def test_a_demo_will_not_take_the_directory_of_a_demo_still_running(tmp_path: Path) -> None:
    """Two demos on one directory would each write the other's address over its own."""
    state = {"database": "own", "pid": os.getpid(), "started": demo._started(os.getpid())}
    where = _demo_dir(tmp_path, state, cluster=False)
    with pytest.raises(InvalidInput, match=f"pid {os.getpid()}"):
        demo.Demo.prepare(where, keep=True, external_database=False)
    write_private(where / demo.STATE_FILE, json.dumps({"database": "own", "pid": _dead_pid()}))
    assert demo.Demo.prepare(where, keep=True, external_database=False).state_dir == where


def test_a_demo_killed_and_not_yet_reaped_no_longer_runs(tmp_path: Path) -> None:
    """``kill -9`` of a demo whose shell had not reaped it yet: the pid still answered
    ``kill(pid, 0)``, so its directory was refused as "a demo still running"."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = demo._started(child.pid)
        child.kill()
        for _ in range(500):  # (its parent, this test, reaps it only below)
            if (demo._stat(child.pid) or ("?",))[0] == "Z":
                break
            time.sleep(0.01)
        assert (demo._stat(child.pid) or ("?",))[0] == "Z"
        state = {"database": "own", "pid": child.pid, "started": started}
        where = _demo_dir(tmp_path, state, cluster=False)
        assert demo.read_state(where).pid is None
    finally:
        child.wait()


def test_the_start_hint_of_a_demo_s_directory_is_the_demo(tmp_path: Path) -> None:
    """A demo that died: every command given its directory told a new user to start the
    service (`coordinator run`, or `systemctl start coordinator`)."""
    from coordinator import why

    where = _demo_dir(tmp_path, {"database": "own"}, cluster=True)
    config, _, _ = _config(tmp_path, where)
    hint = probe.start_hint(config)
    assert hint == f"`coordinator demo --state-dir {where} --keep`"
    facts = probe.Facts(leader=None, leader_known=True, start_hint=hint)
    assert (why.no_daemon(facts) or "").endswith(f"until one starts ({hint})")
    service = load(file=None, environ={}, flags={"state_dir": str(tmp_path / "svc")})
    assert probe.start_hint(service) == why.START_HINT
