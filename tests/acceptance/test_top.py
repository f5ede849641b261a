"""``coordinator top`` as a person runs it next to a daemon (issue 18, item 8): one screen
of running calls, next deadlines, workers and recent outcomes, fed by the daemon's event
stream over the admin API, and no SQL while nothing happens (server log)."""

from __future__ import annotations

import http.cookiejar
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest

from tests.acceptance import test_operator
from tests.acceptance.test_cli import RUN_MAIN, sql
from tests.acceptance.test_operator import _environment, run_cli, write

if TYPE_CHECKING:
    from pathlib import Path

# A daemon process with the admin API, and the configuration the CLI shares with it.
daemon_config = test_operator.daemon_config
start_daemon = test_operator.start_daemon

IDLE_WINDOW = 5.0


class Frames:
    """``coordinator top`` piped: a frame is printed each time the screen changes."""

    def __init__(self, config: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RUN_MAIN, "top"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_environment(config),
        )
        self.frames: list[str] = []
        self.err = ""
        self._current: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("coordinator top · ") and self._current:
                self.frames.append("".join(self._current))
                self._current = []
            self._current.append(line)

    def all(self) -> list[str]:
        """Every frame so far, the one being printed last."""
        return [*self.frames, "".join(self._current)]

    def wait_for(self, *texts: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for frame in reversed(self.all()):
                if all(t in frame for t in texts):
                    return frame
            assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
            time.sleep(0.05)
        raise AssertionError(f"no frame with {texts}; last:\n{self.all()[-1]}")

    def stop(self) -> int:
        """Ctrl-C; the exit status (``err`` holds what it wrote on stderr)."""
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self._reader.join(10)
            assert self.proc.stdout is not None
            assert self.proc.stderr is not None
            self.err = self.proc.stderr.read()
            self.proc.stdout.close()
            self.proc.stderr.close()
        return code


def test_top_follows_the_daemon_and_sends_no_sql_while_idle(
    start_daemon: Any, daemon_config: Path, database: str, sql_log: Any, database_name: str
) -> None:
    # New jobs get their first deadline at the next refresh: soon.
    daemon_config.write_text(daemon_config.read_text() + 'refresh_spacing = "0.2s"\n')
    daemon = start_daemon()
    sql(
        database,
        "SELECT coordinator.define_job(name => 'nightly', schedule_kind => 'cron',"
        ' schedule => \'0 3 1 1 *\', target => \'{"kind": "exec", "argv": ["true"]}\')',
    )
    sql(
        database,
        "SELECT coordinator.define_job(name => 'by-hand', schedule_kind => 'manual',"
        ' target => \'{"kind": "exec", "argv": ["sh", "-c", "exit 3"]}\')',
    )
    top = Frames(daemon.config)
    try:
        first = top.wait_for("NEXT DEADLINES", "default/nightly", "cron 0 3 1 1 *")
        assert "daemon leader" in first
        assert "RUNNING\n  none" in first
        assert "WORKERS\n  none connected" in first
        # Idle: top open, the daemon idle, and the database hears nothing from anyone.
        time.sleep(1.0)
        frames = len(top.all())
        sql_log.mark()
        time.sleep(IDLE_WINDOW)
        statements = sql_log.statements(db=database_name)
        assert statements == [], [(s.app, s.sql[:120]) for s in statements]
        assert len(top.all()) == frames  # nothing changed, nothing printed
        # A run shows up in the recent outcomes, from the event itself.
        run_id = sql(database, "SELECT coordinator.trigger('default', 'by-hand') AS id")[0]["id"]
        frame = top.wait_for(f"run {run_id}", "default/by-hand", "failed")
        assert "RECENT OUTCOMES" in frame
    finally:
        code = top.stop()
    assert code == 0
    assert top.err == ""


def test_top_once_prints_one_screen_and_status_watch_is_top(start_daemon: Any) -> None:
    daemon = start_daemon()
    once = run_cli("top", "--once", config=daemon.config)
    assert once.code == 0, once
    assert once.out.startswith("coordinator top · http://127.0.0.1:")
    assert " · snapshot · " in once.out.splitlines()[0]
    for section in ("RUNNING", "NEXT DEADLINES", "WORKERS", "RECENT OUTCOMES"):
        assert section in once.out
    watch = subprocess.Popen(
        [sys.executable, "-c", RUN_MAIN, "status", "--watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_environment(daemon.config),
    )
    try:
        assert watch.stdout is not None
        assert watch.stdout.readline().startswith("coordinator top · ")
    finally:
        watch.send_signal(signal.SIGINT)
        _out, err = watch.communicate(timeout=10)
    assert watch.returncode == 0, err


def test_top_without_an_admin_api_says_what_to_set(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", "")
    result = run_cli("top", config=config)
    assert result.code == 2
    assert result.err.count("\n") == 1
    assert "none is configured (set admin_listen and admin_token" in result.err
    assert result.out == ""


def test_top_with_no_daemon_listening_asks_if_one_runs(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = write(
        tmp_path / "c.toml", f'admin_listen = "127.0.0.1:{port}"\nadmin_token = "{"t" * 24}"\n'
    )
    result = run_cli("top", "--once", config=config)
    assert result.code == 1, result.err
    assert result.err.count("\n") == 1
    assert "is the daemon running? (`coordinator status` says what it finds)" in result.err


@pytest.mark.parametrize("token", ["wrong-token-wrong-token"])
def test_top_with_a_wrong_token_says_so(start_daemon: Any, token: str, tmp_path: Path) -> None:
    daemon = start_daemon()
    listen = daemon.listen
    config = write(tmp_path / "wrong.toml", f'admin_listen = "{listen}"\nadmin_token = "{token}"\n')
    result = run_cli("top", "--once", config=config)
    assert result.code == 1
    assert "answered 403" in result.err
    assert result.err.count("\n") == 1


# --------------------------------------------------------------------------- the demo's page


def test_the_demo_serves_the_web_page_and_prints_its_address_and_token(
    database: str, tmp_path: Path
) -> None:
    demo = test_operator.start_demo("--dsn", database, config=write(tmp_path / "c.toml", ""))
    try:
        page_line = demo.read_until("demo: admin web page: ")
        token_line = demo.read_until("demo: admin token: ")
        url = page_line.split("demo: admin web page: ", 1)[1].split()[0]
        token = token_line.split("demo: admin token: ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:")
        assert len(token) >= 16
        assert token not in page_line
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        form = opener.open(url + "signin", timeout=10).read().decode()
        csrf = re.search(r'name="csrf" value="([^"]+)"', form)
        assert csrf is not None
        body = urllib.parse.urlencode({"token": token, "csrf": csrf[1]}).encode()
        jobs = opener.open(url + "signin", data=body, timeout=10)
        assert jobs.geturl() == url  # signed in, sent to the jobs view
        text = jobs.read().decode()
        for name in ("heartbeat", "tick", "hello"):
            assert f">{name}</a>" in text
        assert token not in text
    finally:
        demo.stop()
    assert demo.proc.returncode == 0
