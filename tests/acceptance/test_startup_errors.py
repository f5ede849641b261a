"""What a person sees when `coordinator run` cannot start, and when they press Ctrl-C:
one line naming the setting and exit status 2, never a traceback; a first interrupt
says what the daemon waits for, a second one cancels running calls at once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from .test_daemon_process import COORDINATOR, cli, wait_until

GOOD_TOKEN = "a-token-long-enough-for-the-api"


def run(database: str | None, tmp_path: Path, env: dict[str, str] | None = None) -> Any:
    """``coordinator run`` to completion (it should refuse to start)."""
    full = {**os.environ, **(env or {})}
    full.pop("COORDINATOR_TEST_DSN", None)
    if database is not None:
        full["COORDINATOR_DSN"] = database
    full.setdefault(
        "COORDINATOR_WORKER_SOCKET", str(Path(tempfile.mkdtemp(prefix="cw-")) / "w.sock")
    )
    return subprocess.run(
        [*COORDINATOR, "run", "--state-dir", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        env=full,
        timeout=60,
    )


def start_run(dsn: str, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """``coordinator run`` in the background, JSON log lines (and the terminal's lines)
    going to a file; the process and that file."""
    env = {**os.environ, "COORDINATOR_DSN": dsn}
    env.pop("COORDINATOR_TEST_DSN", None)
    env["COORDINATOR_WORKER_SOCKET"] = str(Path(tempfile.mkdtemp(prefix="cw-")) / "w.sock")
    stderr = tmp_path / "stderr.txt"
    with stderr.open("wb") as out:
        proc = subprocess.Popen(
            [*COORDINATOR, "run", "--log-format", "json", "--state-dir", str(tmp_path / "s")],
            stdout=subprocess.DEVNULL,
            stderr=out,
            env=env,
        )
    return proc, stderr


def assert_one_line_refusal(result: Any, *words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("coordinator: "), last
    for word in words:
        assert word in last, last


def test_a_short_admin_token(database: str, tmp_path: Path) -> None:
    result = run(
        database,
        tmp_path,
        {"COORDINATOR_ADMIN_LISTEN": "127.0.0.1:0", "COORDINATOR_ADMIN_TOKEN": "short"},
    )
    assert_one_line_refusal(result, "admin token", "16")


def _run_with_a_port_taken(
    database: str, tmp_path: Path, listen: str, token: str
) -> tuple[Any, int]:
    """``run`` with ``listen`` (a variable) at a port another socket holds."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        env = {listen: f"127.0.0.1:{port}", token: GOOD_TOKEN}
        return run(database, tmp_path, env), port


def test_an_admin_port_in_use(database: str, tmp_path: Path) -> None:
    result, port = _run_with_a_port_taken(
        database, tmp_path, "COORDINATOR_ADMIN_LISTEN", "COORDINATOR_ADMIN_TOKEN"
    )
    assert_one_line_refusal(
        result, "admin_listen", str(port), "a daemon already running? `coordinator status` asks it"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory owned by another user needs root")
def test_a_socket_directory_owned_by_another_user(database: str, tmp_path: Path) -> None:
    directory = Path(tempfile.mkdtemp(prefix="cw-"))
    os.chown(directory, 65534, 65534)
    result = run(database, tmp_path, {"COORDINATOR_WORKER_SOCKET": str(directory / "w.sock")})
    assert_one_line_refusal(result, "worker_socket", "another user")


def test_a_spool_path_that_is_a_directory(database: str, tmp_path: Path) -> None:
    (tmp_path / "state" / "spool.jsonl").mkdir(parents=True)
    result = run(database, tmp_path)
    assert_one_line_refusal(result, "spool", "is a directory")


def test_a_state_directory_that_cannot_be_written(database: str, tmp_path: Path) -> None:
    """Refused at start (it was accepted, and found only at a stop with results to keep,
    which were then lost). /proc takes no new directory, even from root."""
    env = {**os.environ, "COORDINATOR_DSN": database}
    env.pop("COORDINATOR_TEST_DSN", None)
    env["COORDINATOR_WORKER_SOCKET"] = str(Path(tempfile.mkdtemp(prefix="cw-")) / "w.sock")
    result = subprocess.run(
        [*COORDINATOR, "run", "--state-dir", f"/proc/coordinator-{tmp_path.name}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert_one_line_refusal(result, "spool: cannot write in /proc/coordinator-")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_state_directory_on_a_full_disk(database: str, tmp_path: Path) -> None:
    """An empty probe file is made even on a full disk: the start passed, and a stop
    found the disk full with results to keep (a tester's). Since a state directory made
    by the daemon is 0711, its parents too: one removed while it ran came back 0755."""
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(state)], check=True)
    try:
        with (state / "filler").open("wb") as f, pytest.raises(OSError, match="No space"):
            f.write(b"x" * 512 * 1024)
        result = run(database, tmp_path)
        assert_one_line_refusal(result, "spool: cannot write in", "No space left on device")
        assert list(state.glob(".probe-*")) == []
    finally:
        subprocess.run(["umount", str(state)], check=False)


def test_the_state_directory_and_its_parents_are_made_0711(tmp_path: Path) -> None:
    from coordinator.files import make_state_dir

    old = os.umask(0o022)
    try:
        make_state_dir(tmp_path / "a" / "b" / "state")
    finally:
        os.umask(old)
    for path in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "state"):
        assert path.stat().st_mode & 0o777 == 0o711, path


def test_an_embedded_state_directory_too_deep_for_its_socket(tmp_path: Path) -> None:
    """It was found by the server, after a whole initdb: "pg_ctl: could not start server
    | Examine the log output." and exit 1."""
    deep = Path(tempfile.mkdtemp(prefix="cw-")) / ("d" * 100)
    env = {k: v for k, v in os.environ.items() if k != "COORDINATOR_DSN"}
    env.pop("COORDINATOR_TEST_DSN", None)
    env["COORDINATOR_WORKER_SOCKET"] = str(Path(tempfile.mkdtemp(prefix="cw-")) / "w.sock")
    env["COORDINATOR_CONFIG"] = str(tmp_path / "none.toml")
    (tmp_path / "none.toml").write_text("")
    result = subprocess.run(
        [*COORDINATOR, "run", "--state-dir", str(deep)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert_one_line_refusal(result, "socket would be", "choose a shorter state directory")
    assert not (deep / "postgres" / "data").exists()  # (no initdb first)


def test_a_worker_listener_without_a_token(database: str, tmp_path: Path) -> None:
    result = run(database, tmp_path, {"COORDINATOR_WORKER_LISTEN": "127.0.0.1:0"})
    assert_one_line_refusal(result, "worker_token")


@pytest.mark.parametrize(
    ("files", "words"),
    [
        ({"cert": "not a certificate\n", "key": "nor a key\n"}, ("worker_tls_cert", "cannot load")),
        ({"key": "nor a key\n"}, ("worker_tls_cert", "No such file")),
    ],
    ids=["garbage", "missing"],
)
def test_a_bad_tls_file(
    database: str, tmp_path: Path, files: dict[str, str], words: tuple[str, ...]
) -> None:
    """A worker listener's certificate that cannot be loaded stops the start with one line
    naming the setting and the file, before anything listens."""
    for name, text in files.items():
        (tmp_path / f"worker.{name}").write_text(text)
    env = {
        "COORDINATOR_WORKER_LISTEN": "127.0.0.1:0",
        "COORDINATOR_WORKER_TOKEN": "a-token-long-enough-for-workers",
        "COORDINATOR_WORKER_TLS_CERT": str(tmp_path / "worker.cert"),
        "COORDINATOR_WORKER_TLS_KEY": str(tmp_path / "worker.key"),
    }
    result = run(database, tmp_path, env)
    assert_one_line_refusal(result, *words, str(tmp_path / "worker.cert"))


def test_a_schema_that_lacks_migrations(pg_server: Any, tmp_path: Path) -> None:
    """A database nobody migrated: the daemon says what to do instead of serving."""
    import asyncio

    import asyncpg

    name = pg_server.new_database_name()

    async def create() -> None:
        conn = await asyncpg.connect(pg_server.admin_dsn)
        try:
            await conn.execute(f"CREATE DATABASE {name}")
        finally:
            await conn.close()

    asyncio.run(create())
    result = run(pg_server.dsn(name), tmp_path)
    assert_one_line_refusal(result, "coordinator migrate")


def _stopping_with_a_call_running(
    database: str, tmp_path: Path, signum: int
) -> tuple[subprocess.Popen[bytes], Path, str, str]:
    """`coordinator run` with a 60 s call under way, sent ``signum``: the process, its
    stderr, the run id and the line that says what the stop waits for."""
    started = tmp_path / "started"
    assert (
        cli(database, "jobs", "define", "slow", "--manual", "--", "sh", "-c",
            f"touch {started}; sleep 60").returncode
        == 0
    )  # fmt: skip
    proc, stderr = start_run(database, tmp_path)
    try:
        wait_until(lambda: '"event":"ready"' in stderr.read_text())
        run_id = cli(database, "jobs", "trigger", "slow").stdout.strip()
        wait_until(started.exists)
        proc.send_signal(signum)
        wait_until(lambda: "waiting for 1 running call" in stderr.read_text())
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise
    said = [line for line in stderr.read_text().splitlines() if "waiting for" in line]
    return proc, stderr, run_id, said[0]


def test_first_interrupt_says_what_it_waits_for_second_cancels(
    database: str, tmp_path: Path
) -> None:
    proc, stderr, run_id, said = _stopping_with_a_call_running(database, tmp_path, signal.SIGINT)
    try:
        assert f"default/slow (run {run_id})" in said
        assert "Ctrl-C again" in said
        assert proc.poll() is None  # still waiting for the call
        began = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
        assert time.monotonic() - began < 15  # not the 60 s stop timeout, nor the sleep
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    shown = json.loads(cli(database, "runs", "show", run_id, "--json").stdout)
    assert shown["status"] == "cancelled"
    assert "Traceback" not in stderr.read_text()


def test_a_sigterm_stop_says_sigint_cancels_and_a_second_sigterm_does_not(
    database: str, tmp_path: Path
) -> None:
    """A service manager stops with SIGTERM: the line must not tell it to press Ctrl-C,
    and a second SIGTERM does not cancel the running call (SIGINT does)."""
    proc, _stderr, _run, said = _stopping_with_a_call_running(database, tmp_path, signal.SIGTERM)
    try:
        assert f"(SIGINT cancels them now: kill -INT {proc.pid})" in said
        assert "Ctrl-C" not in said
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert proc.poll() is None  # still waiting for the call
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_waits_for_the_database_at_start(private_cluster: Any, tmp_path: Path) -> None:
    """PostgreSQL down when the service starts: the daemon waits (degraded), no exit."""
    dsn = private_cluster.dsn("postgres")
    assert cli(dsn, "migrate").returncode == 0
    private_cluster.stop("fast")
    proc, stderr = start_run(dsn, tmp_path)
    try:
        wait_until(lambda: stderr.read_text().count("startup.database_unavailable") >= 2)
        assert proc.poll() is None
        private_cluster.start()
        wait_until(lambda: '"event":"ready"' in stderr.read_text(), timeout=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "Traceback" not in stderr.read_text()


def test_a_worker_port_in_use(database: str, tmp_path: Path) -> None:
    """Exit 2 in one line, as an admin port in use (systemd does not restart it every
    2 s): a tester saw exit 1 and only the log's daemon.failed line."""
    result, port = _run_with_a_port_taken(
        database, tmp_path, "COORDINATOR_WORKER_LISTEN", "COORDINATOR_WORKER_TOKEN"
    )
    assert_one_line_refusal(result, "worker_listen", str(port), "in use")
