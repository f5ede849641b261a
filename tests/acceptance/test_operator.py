"""Operator experience, as a person at a terminal sees it: one configuration for the CLI
and the service, the demo that keeps to itself, manifests that fail the deploy, answers
to "why is nothing happening?", and the small traps (issue 18).

Every command runs as a process. Configuration files live in the test's temporary
directory and are named by ``COORDINATOR_CONFIG`` (the CLI's and the service's file), so
nothing here reads or writes /etc.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest

from coordinator.embedded import Cluster, NoServerBinaries, find_bin_dir, free_port
from tests.acceptance.test_cli import NO_BINARIES, RUN_MAIN, Result, one_line_error, sql

if TYPE_CHECKING:
    from collections.abc import Iterator

TOKEN = "an-admin-token-for-the-tests"


def run_cli(*args: str, config: Path | None, timeout: float = 120, **env: str) -> Result:
    """``coordinator ARGS`` with ``COORDINATOR_CONFIG`` naming ``config`` (a file in the
    test's directory) and nothing else from the caller's COORDINATOR_* environment."""
    proc = subprocess.run(
        [sys.executable, "-c", RUN_MAIN, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_environment(config, **env),
    )
    result = Result(proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in result.err, result.err
    return result


def _environment(config: Path | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR_")}
    env.pop("STATE_DIRECTORY", None)
    env.pop("CREDENTIALS_DIRECTORY", None)
    if config is not None:
        env["COORDINATOR_CONFIG"] = str(config)
    env.setdefault("COORDINATOR_PG_BIN", NO_BINARIES)
    env.update(extra)
    return env


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def server_binaries() -> str:
    try:
        return str(find_bin_dir())
    except NoServerBinaries:
        pytest.skip("needs PostgreSQL server binaries")


def short_dir() -> Path:
    """A short directory for Unix sockets (a socket path has ~108 bytes)."""
    return Path(tempfile.mkdtemp(prefix="co-"))


def wait_until(predicate: Any, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not met within {timeout}s")


def postmaster_pid(root: Path) -> int | None:
    pidfile = root / "data" / "postmaster.pid"
    try:
        return int(pidfile.read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (its parent may not have reaped it yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop_leftover(root: Path) -> None:
    """Test clean-up: never leave a server running, whatever the test did."""
    if postmaster_pid(root) is not None:
        Cluster(root=root, port=None).stop("immediate")


# --------------------------------------------------------------------------- 1. one config


def test_the_cli_reads_the_services_configuration_file(database: str, tmp_path: Path) -> None:
    config = write(
        tmp_path / "coordinator.toml",
        f"""
        dsn = "{database}"
        stop_timeout = "2m"
        """,
    )
    defined = run_cli(
        "jobs", "define", "backup", "--cron", "0 3 * * *", "--", "true", config=config
    )
    assert defined.code == 0, defined
    listed = run_cli("jobs", "list", "--json", config=config)
    assert [job["name"] for job in listed.json] == ["backup"]

    shown = run_cli("config", config=config, COORDINATOR_CONCURRENCY="3")
    assert shown.code == 0, shown
    assert shown.out.splitlines()[0] == f"configuration file: {config}"
    rows = {line.split()[0]: line for line in shown.out.splitlines()[2:]}
    assert re.search(rf"^dsn\s+\S+\s+file {re.escape(str(config))}$", rows["dsn"])
    assert re.search(r"^stop_timeout\s+2m\s+file ", rows["stop_timeout"])
    assert re.search(r"^concurrency\s+3 calls\s+env COORDINATOR_CONCURRENCY$", rows["concurrency"])
    assert re.search(r"^refresh_spacing\s+30s\s+default$", rows["refresh_spacing"])
    flagged = run_cli("config", "--json", "--refresh-spacing", "10s", config=config).json
    assert flagged["refresh_spacing"] == {
        "value": 10.0,
        "unit": "s",
        "source": "flag",
        "origin": "--refresh-spacing",
    }


def test_refuses_an_embedded_database_when_the_service_env_file_names_one(
    tmp_path: Path,
) -> None:
    """The old layout: the DSN in coordinator.env, which only systemd reads."""
    config = write(tmp_path / "coordinator.toml", 'log_level = "info"\n')
    write(tmp_path / "coordinator.env", "COORDINATOR_DSN=postgresql://svc:pw@db.example/jobs\n")
    state = tmp_path / "state"
    result = run_cli("migrate", config=config, COORDINATOR_STATE_DIR=str(state))
    one_line_error(result, code=2, contains=f"{tmp_path / 'coordinator.env'} gives the service")
    assert "postgresql://svc:***@db.example/jobs" in result.err
    assert f"move it to {config} (dsn = " in result.err
    assert "pw@" not in result.err
    assert not state.exists()  # nothing created


def test_refuses_an_embedded_database_beside_a_service_configured_elsewhere(
    database: str, tmp_path: Path
) -> None:
    service = write(tmp_path / "coordinator.toml", f'dsn = "{database}"\n')
    mine = write(tmp_path / "mine.toml", "")
    result = run_cli("jobs", "list", "--config", str(mine), config=service)
    one_line_error(result, code=2, contains=f"{service} gives the service the database")
    assert "or pass --dsn" in result.err


def test_refuses_another_embedded_state_directory_unless_chosen(tmp_path: Path) -> None:
    config = write(tmp_path / "coordinator.toml", f'state_dir = "{tmp_path / "svc"}"\n')
    elsewhere = str(tmp_path / "elsewhere")
    refused = run_cli("jobs", "list", config=config, COORDINATOR_STATE_DIR=elsewhere)
    one_line_error(refused, code=2, contains=f"pass --state-dir {tmp_path / 'svc'}")
    # Chosen on the command line: allowed (and here it stops at the missing binaries).
    chosen = run_cli("jobs", "list", "--state-dir", elsewhere, config=config)
    one_line_error(chosen, code=2, contains="no PostgreSQL server binaries")


# --------------------------------------------------------------------------- 2. the demo


@attrs.define(eq=False)
class DemoProcess:
    """``coordinator demo`` in a subprocess, its stdout read line by line."""

    proc: subprocess.Popen[str]
    lines: list[str] = attrs.field(factory=list)

    def read_until(self, text: str, timeout: float = 60.0) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip("\n"))
            if text in line:
                return line
        raise AssertionError(f"no {text!r} in the demo's output:\n" + "\n".join(self.lines))

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=60)
        self.lines += out.splitlines()
        return out


def start_demo(*args: str, config: Path, **env: str) -> DemoProcess:
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN_MAIN, "demo", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_environment(config, **env),
    )
    return DemoProcess(proc=proc)


def _demo_dir(line: str) -> Path:
    found = re.match(r"demo: state directory (\S+):", line)
    assert found, line
    return Path(found[1])


def test_demo_uses_its_own_directory_shows_output_and_cleans_up(
    database: str, tmp_path: Path
) -> None:
    bin_dir = server_binaries()
    # A service configuration naming a database, an admin API and a worker socket: the
    # demo must use none of them.
    service_state = tmp_path / "service-state"
    config = write(
        tmp_path / "coordinator.toml",
        f"""
        dsn = "{database}"
        state_dir = "{service_state}"
        worker_socket = "{short_dir() / "svc.sock"}"
        admin_listen = "127.0.0.1:{free_port()}"
        admin_token = "{TOKEN}"
        """,
    )
    demo = start_demo(config=config, COORDINATOR_PG_BIN=bin_dir)
    root: Path | None = None
    try:
        where = _demo_dir(demo.read_until("demo: state directory"))
        root = where / "postgres"
        assert where.is_dir()
        assert where != service_state
        assert "deleted on exit unless --keep" in demo.lines[0]
        # The manual run's output, as it happens.
        demo.read_until("demo: run 1 demo/hello (manual) succeeded")
        assert demo.read_until("hello from a manual run").startswith("  | ")
        server = postmaster_pid(root)
        assert server is not None
        # `status` and `top` given the demo's directory ask the demo's daemon, not the
        # service's configured admin API (nothing listens there).
        hint = "`coordinator status --state-dir"
        said = next((x for x in demo.lines if hint in x), None) or demo.read_until(hint)
        assert f"`coordinator top --state-dir {where}` ask this daemon" in said
        pages = [
            re.match(r"demo: admin web page: (http://127\.0\.0\.1:\d+)/", x) for x in demo.lines
        ]
        demo_api = next(found for found in pages if found)
        status = run_cli(
            "status", "--state-dir", str(where), config=config, COORDINATOR_PG_BIN=bin_dir
        )
        assert status.code == 0, status.err
        assert f"the daemon's admin API at {demo_api[1]}/api/status" in status.out
        assert "(the database holds 3)" in status.out  # ... compared with the demo's database
        assert "demo/" in run_cli("top", "--once", "--state-dir", str(where), config=config).out
        shown = run_cli("config", "--state-dir", str(where), config=config).out
        settings = {line.split()[0]: line for line in shown.splitlines()[1:]}
        for name in ("dsn", "admin_listen", "admin_token", "worker_socket"):
            assert settings[name].endswith(f"demo {where / 'demo.json'}"), settings[name]
        assert (where / "demo.json").stat().st_mode & 0o777 == 0o600
        # ... and its database, not the one the service's configuration names.
        listed = run_cli(
            "jobs", "list", "--state-dir", str(where), config=config, COORDINATOR_PG_BIN=bin_dir
        )
        assert [line.split()[1] for line in listed.out.splitlines()[1:]] == [
            "heartbeat",
            "hello",
            "tick",
        ]
        out = demo.stop()
        assert demo.proc.returncode == 0
        assert f"demo: deleted {where} (its jobs, runs and PostgreSQL)" in out
        assert not where.exists()
        wait_until(lambda: not alive(server), 10, "the demo's PostgreSQL to exit")
    finally:
        if demo.proc.poll() is None:
            demo.proc.kill()
        if root is not None and root.exists():
            stop_leftover(root)
    assert not service_state.exists()
    assert sql(database, "SELECT count(*) AS n FROM coordinator.jobs")[0]["n"] == 0


def test_demo_with_a_dsn_removes_its_jobs_unless_kept(database: str, tmp_path: Path) -> None:
    config = write(tmp_path / "coordinator.toml", "")
    demo = start_demo("--dsn", database, config=config)
    where = _demo_dir(demo.read_until("demo: state directory"))
    demo.read_until("hello from a manual run")
    assert "demo: deleted" in demo.stop()
    assert not where.exists()
    assert sql(database, "SELECT count(*) AS n FROM coordinator.jobs")[0]["n"] == 0

    kept = tmp_path / "kept"
    demo = start_demo("--dsn", database, "--keep", "--state-dir", str(kept), config=config)
    assert _demo_dir(demo.read_until("demo: state directory")) == kept
    demo.read_until("hello from a manual run")
    # Its jobs are in the database it was given: a command given its directory needs that
    # --dsn too, and then asks the demo's daemon.
    look = ("--state-dir", str(kept), "status")
    refused = run_cli("--state-dir", str(kept), "jobs", "list", config=config)
    one_line_error(refused, code=2, contains="given with --dsn: pass that --dsn too")
    # (`status` still shows the daemon's view, and says why it compared no database.)
    assert "pass that --dsn too" in run_cli(*look, config=config).out
    assert "the daemon's admin API at" in run_cli("--dsn", database, *look, config=config).out
    assert f"demo: kept {kept}" in demo.stop()
    assert kept.is_dir()
    stopped = run_cli("--dsn", database, *look, config=config)
    assert f"(no daemon view: no demo runs in {kept} now)" in stopped.out
    assert "token" not in (kept / "demo.json").read_text()
    names = sql(database, "SELECT name FROM coordinator.jobs WHERE namespace = 'demo'")
    assert sorted(r["name"] for r in names) == ["heartbeat", "hello", "tick"]


def test_demo_with_a_dsn_refuses_a_database_with_other_jobs(database: str, tmp_path: Path) -> None:
    """Given a database with jobs of its own, the demo's sync paused the other jobs of
    namespace 'demo' and its daemon ran every other namespace's queued runs."""
    config = write(tmp_path / "coordinator.toml", "")
    assert run_cli("--dsn", database, "jobs", "define", "important", "--namespace", "demo",
                   "--every", "1h", "--", "true", config=config).code == 0  # fmt: skip
    assert run_cli("--dsn", database, "jobs", "define", "other", "--manual", "--", "true",
                   config=config).code == 0  # fmt: skip
    assert run_cli("--dsn", database, "jobs", "trigger", "other", config=config).code == 0
    refused = run_cli("demo", "--dsn", database, config=config)
    one_line_error(
        refused,
        code=2,
        contains="--dsn: the database holds 2 job(s) besides the demo's (default/other, "
        "demo/important): the demo's daemon would run them",
    )
    jobs = sql(
        database,
        "SELECT namespace || '/' || name AS job, paused FROM coordinator.jobs ORDER BY 1",
    )
    assert [(r["job"], r["paused"]) for r in jobs] == [
        ("default/other", False),
        ("demo/important", False),
    ]
    runs = sql(database, "SELECT status FROM coordinator.runs")
    assert [r["status"] for r in runs] == ["queued"]
    # Jobs removed with their history kept are not in its way.
    for name, where in (("other", "default"), ("important", "demo")):
        removed = run_cli(
            "--dsn", database, "jobs", "remove", name, "-n", where, "--keep-history", config=config
        )
        assert removed.code == 0, removed.err
    demo = start_demo("--dsn", database, config=config)
    demo.read_until("hello from a manual run")
    assert "demo: deleted" in demo.stop()


def test_demo_with_a_dsn_refuses_before_migrating(database: str, tmp_path: Path) -> None:
    """The database given was migrated before the demo refused it."""
    config = write(tmp_path / "c.toml", "")
    run_cli("--dsn", database, "jobs", "define", "theirs", "--manual", "--", "true", config=config)
    # As if this build had a migration the database has not had yet.
    last = sql(database, "SELECT max(name) AS m FROM coordinator.schema_migrations")[0]["m"]
    sql(database, "DELETE FROM coordinator.schema_migrations WHERE name = $1", last)
    refused = run_cli("demo", "--dsn", database, config=config)
    one_line_error(refused, code=2, contains="besides the demo's (default/theirs)")
    pending = sql(
        database, "SELECT count(*) AS n FROM coordinator.schema_migrations WHERE name = $1", last
    )
    assert pending[0]["n"] == 0  # not applied


def test_a_kept_demo_is_kept_when_run_again_as_it_says(tmp_path: Path) -> None:
    # "run it again with `coordinator demo --state-dir DIR`" deleted it at that run's end.
    config = write(tmp_path / "coordinator.toml", "")
    kept = tmp_path / "kept"
    bin_dir = server_binaries()
    demo = start_demo("--keep", "--state-dir", str(kept), config=config, COORDINATOR_PG_BIN=bin_dir)
    demo.read_until("hello from a manual run")
    said = demo.stop()
    again = re.search(r"run it again with `coordinator (demo [^`]*)`", said)
    assert again is not None, said
    demo = start_demo(*again[1].split()[1:], config=config, COORDINATOR_PG_BIN=bin_dir)
    try:
        demo.read_until("demo: state directory")
        assert f"demo: kept {kept}" in demo.stop()
        assert kept.is_dir()
    finally:
        if demo.proc.poll() is None:
            demo.proc.kill()
        stop_leftover(kept / "postgres")


def test_ctrl_c_while_initdb_runs_is_an_interruption_not_a_failure(tmp_path: Path) -> None:
    """Ctrl-C reaches the terminal's process group: initdb died of it first and the demo
    said "initdb failed: ... terminated by signal 2: Interrupt", exit 1."""
    # A stand-in initdb that waits to be interrupted, reachable by the server's user
    # (the demo runs the tools as postgres when started as root).
    fake = Path(tempfile.mkdtemp(prefix="cfake-"))
    fake.chmod(0o777)
    started = fake / "started"
    for tool in ("initdb", "pg_ctl"):
        # As the real initdb does: it catches SIGINT, cleans up and exits 1.
        script = fake / tool
        script.write_text(
            "#!/bin/sh\n"
            "sleep 30 &\n"
            "trap 'kill $! 2>/dev/null; echo \"child process was terminated by signal 2: "
            "Interrupt\" >&2; exit 1' INT\n"
            f"touch {started}\n"
            "wait $!\n"
        )
        script.chmod(0o755)
    config = write(tmp_path / "coordinator.toml", "")
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN_MAIN, "demo", "--state-dir", str(tmp_path / "d")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=_environment(config, COORDINATOR_PG_BIN=str(fake)),
        start_new_session=True,
    )
    try:
        wait_until(started.exists, 60, "the stand-in initdb to start")
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C does
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "coordinator: interrupted", err


def test_demo_refuses_a_directory_that_is_not_its_own(tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "spool.jsonl").write_text("")
    result = run_cli("demo", "--state-dir", str(busy), config=write(tmp_path / "c.toml", ""))
    one_line_error(result, code=2, contains="is neither empty nor a demo's directory")
    assert (busy / "spool.jsonl").exists()
    service = tmp_path / "service"
    config = write(tmp_path / "s.toml", f'state_dir = "{service}"\n')
    result = run_cli("demo", "--state-dir", str(service), config=config)
    one_line_error(result, code=2, contains="is the service's state directory")


# --------------------------------------------------------------------------- 3. manifests


def test_sync_refuses_the_issues_typos_and_changes_nothing(database: str, tmp_path: Path) -> None:
    config = write(tmp_path / "coordinator.toml", f'dsn = "{database}"\n')
    good = write(
        tmp_path / "good.toml",
        """\
        namespace = "ops"

        [[jobs]]
        name = "report"
        cron = "0 3 * * *"
        command = ["report"]

        [[jobs]]
        name = "reindex"
        every = "6h"
        worker = "search"
        """,
    )
    assert run_cli("sync", str(good), config=config).code == 0
    typo = write(
        tmp_path / "typo.toml",
        """\
        namespace = "ops"

        [[jobs]]
        name = "report"
        cron = "0 0 3 * * *"
        command = ["report"]

        [[jobs]]
        name = "reindex"
        every = "6 hours"
        worker = "search"
        """,
    )
    result = run_cli("sync", str(typo), config=config)
    assert result.code == 2
    assert [line.split(": ")[:3] for line in result.err_lines[:2]] == [
        [f"{typo}:5", "report", "cron"],
        [f"{typo}:10", "reindex", "every"],
    ]
    assert result.err_lines[2].startswith(f"coordinator: {typo}: 2 problems in the manifest")
    jobs = run_cli("jobs", "list", "-n", "ops", "--json", config=config).json
    assert [(j["name"], j["invalid_reason"], j["paused"]) for j in jobs] == [
        ("reindex", None, False),
        ("report", None, False),
    ]
    allowed = run_cli("sync", str(typo), "--allow-invalid", config=config)
    assert allowed.code == 0, allowed
    assert "2 problems (those jobs are stored inert)" in allowed.out


# --------------------------------------------------------------------------- 4. why


@attrs.define(eq=False)
class Daemon:
    """``coordinator run`` with the admin API, and the configuration the CLI shares."""

    proc: subprocess.Popen[bytes]
    config: Path
    log: Path
    listen: str

    def wait_ready(self) -> None:
        def ready() -> bool:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            text = self.log.read_text()
            return '"event":"admin.listening"' in text and '"event":"ready"' in text

        wait_until(ready, timeout=60, what="the daemon's admin API and its ready")

    def cli(self, *args: str) -> Result:
        return run_cli(*args, config=self.config)

    def api(self, method: str, path: str) -> tuple[int, Any]:
        request = urllib.request.Request(
            f"http://{self.listen}{path}",
            method=method,
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


@pytest.fixture
def daemon_config(database: str, tmp_path: Path) -> Path:
    token = tmp_path / "admin-token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    return write(
        tmp_path / "coordinator.toml",
        f"""
        dsn = "{database}"
        state_dir = "{tmp_path / "state"}"
        worker_socket = "{short_dir() / "w.sock"}"
        admin_listen = "127.0.0.1:{free_port()}"
        admin_token_file = "{token}"
        log_format = "json"
        """,
    )


@pytest.fixture
def start_daemon(daemon_config: Path, tmp_path: Path) -> Iterator[Any]:
    started: list[Daemon] = []

    def start() -> Daemon:
        log = tmp_path / f"daemon{len(started)}.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-c", RUN_MAIN, "run"],
                stdout=subprocess.DEVNULL,
                stderr=sink,
                env=_environment(daemon_config),
            )
        listen = re.search(r'admin_listen = "(\S+)"', daemon_config.read_text())
        assert listen is not None
        daemon = Daemon(proc=proc, config=daemon_config, log=log, listen=listen[1])
        started.append(daemon)
        daemon.wait_ready()
        return daemon

    yield start
    for daemon in started:
        if daemon.proc.poll() is None:
            daemon.proc.send_signal(signal.SIGTERM)
            try:
                daemon.proc.wait(30)
            except subprocess.TimeoutExpired:
                daemon.proc.kill()


def test_why_nothing_runs_while_a_daemon_runs(start_daemon: Any, database: str) -> None:
    d = start_daemon()
    defined = d.cli("jobs", "define", "nightly", "--cron", "0 3 * * *", "--", "true")
    assert defined.code == 0, defined
    assert re.fullmatch(
        r"next run \d{4}-\d\d-\d\d 03:00:00Z, armed at the daemon's next refresh "
        r"\(within 30s\)",
        defined.out.splitlines()[1],
    ), defined.out

    # A worker job no worker serves: the admin API says which types are served.
    defined = d.cli("jobs", "define", "thumbs", "--manual", "--worker", "images")
    assert defined.code == 0, defined
    listing = d.cli("jobs", "list")
    row = next(line for line in listing.out.splitlines() if " thumbs " in line)
    assert row.endswith("waiting for a worker serving images")
    assert listing.err == ""  # a daemon leads and the API answered: nothing to add
    waited = d.cli("jobs", "trigger", "thumbs", "--wait-timeout", "300ms")
    assert waited.code == 1
    assert waited.err_lines[-1].endswith(
        "is still queued after 300ms: no worker serves images; start one "
        "(coordinator worker MODULE:OBJECT)"
    )

    # A paused job.
    d.cli("jobs", "define", "held", "--manual", "--paused", "--", "true")
    waited = d.cli("jobs", "trigger", "held", "--wait-timeout", "300ms")
    assert waited.code == 1
    assert waited.err_lines[-1].endswith(
        "is still queued after 300ms: the job is paused; `coordinator jobs resume held` lets it run"
    )

    # A job blocked by a run whose outcome is unknown.
    d.cli("jobs", "define", "pay", "--manual", "--", "true")
    lost = sql(
        database,
        "INSERT INTO coordinator.runs (job_id, trigger, status, error_cause) "
        "SELECT id, 'manual', 'unresolved', 'lost' FROM coordinator.jobs WHERE name = 'pay' "
        "RETURNING id",
    )[0]["id"]
    again = d.cli("jobs", "trigger", "pay", "--wait-timeout", "5s")
    assert (again.code, again.out) == (1, f"{lost}\nunresolved\n")
    assert f"default/pay is blocked by unresolved run {lost}" in again.err_lines[0]
    assert again.err_lines[-1] == (
        f"coordinator: run {lost} unresolved (lost); it blocks default/pay: resolve it with "
        f"`coordinator runs resolve {lost} --as failed|succeeded|retry`"
    )


def _noop_worker(config: Path) -> subprocess.Popen[bytes]:
    """``coordinator worker bench.noop_worker:worker`` (type ``noop``) with ``config``
    as its only configuration: the socket it finds there."""
    repo = Path(__file__).resolve().parents[2]
    return subprocess.Popen(
        [sys.executable, "-c", RUN_MAIN, "worker", "bench.noop_worker:worker"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=repo,
        env=_environment(config, PYTHONPATH=str(repo)),
    )


def test_a_worker_finds_the_socket_in_the_shared_configuration(start_daemon: Any) -> None:
    """`coordinator worker` with no --socket reads worker_socket from the file the daemon
    reads (the example worker unit relies on it); the "why" answer then goes away."""
    d = start_daemon()
    d.cli("jobs", "define", "n", "--manual", "--worker", "noop")
    assert d.cli("jobs", "list").out.splitlines()[1].endswith("waiting for a worker serving noop")
    worker = _noop_worker(d.config)
    try:
        wait_until(
            lambda: d.cli("jobs", "list").out.splitlines()[1].endswith("active"),
            what="the worker's connection",
        )
        done = d.cli("jobs", "trigger", "n", "--wait-timeout", "30s")
        assert (done.code, done.out.splitlines()[-1]) == (0, "succeeded"), done
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)


def test_status_labels_its_source_and_explains_differences(
    start_daemon: Any, daemon_config: Path, database: str
) -> None:
    for args in (
        ("soon", "--every", "1m", "--worker", "images"),  # its deadline is never armed
        ("daily", "--cron", "@daily", "--", "true"),
        ("held", "--every", "1h", "--paused", "--", "true"),
        ("button", "--manual", "--", "true"),
    ):
        assert run_cli("jobs", "define", *args, config=daemon_config).code == 0
    d = start_daemon()
    status = d.cli("status")
    assert status.code == 0, status
    fields = dict(line.split(":", 1) for line in status.out.splitlines() if ":" in line)
    assert fields["source"].strip() == f"the daemon's admin API at http://{d.listen}/api/status"
    assert fields["jobs"].strip() == "2 loaded (the database holds 4)"
    differences = [
        line.split(":", 1)[1].strip()
        for line in status.out.splitlines()
        if line.startswith("difference:")
    ]
    assert differences[0] == (
        "the database holds 4 jobs and the daemon has loaded 2: it loads only jobs that can "
        "fall due (1 paused, 1 manual not loaded)"
    )
    assert re.fullmatch(
        r"the database's earliest saved deadline, \S+ for default/soon, is not armed: no "
        r"worker serves images",
        differences[1],
    ), differences
    as_json = d.cli("status", "--json").json
    assert (as_json["source"], as_json["jobs"], as_json["database"]["jobs"]) == ("daemon", 2, 4)

    # The shared configuration's API with another database's DSN: the daemon answering
    # leads this one, not that one (status said "leader" where `jobs list` said no daemon
    # runs): the other database answers, and says whose daemon the API is.
    base, _, query = database.partition("?")
    name = base.rsplit("/", 1)[1] + "_other"

    def dsn_of(dbname: str) -> str:
        return base.rsplit("/", 1)[0] + "/" + dbname + ("?" + query if query else "")

    other = dsn_of("postgres")
    sql(other, f"CREATE DATABASE {name} TEMPLATE coordinator_template")
    try:
        elsewhere = dsn_of(name)
        status = run_cli("status", config=daemon_config, COORDINATOR_DSN=elsewhere)
        assert status.code == 0, status
        fields = dict(line.split(":", 1) for line in status.out.splitlines() if ":" in line)
        assert "answers for the daemon of another database" in fields["source"], status.out
        assert fields["daemon"].strip().startswith("not running"), status.out
        # Every command's facts, not status's only: the other daemon's workers are not
        # this database's (`jobs define` counted them as serving this one's jobs).
        worker = _noop_worker(d.config)
        try:
            wait_until(
                lambda: "noop" in (d.cli("status", "--json").json.get("workers") or ()),
                what="the worker's connection",
            )
            defined = run_cli(
                "jobs", "define", "w", "--every", "1h", "--worker", "noop",
                config=daemon_config, COORDINATOR_DSN=elsewhere,
            )  # fmt: skip
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)
        assert defined.code == 0, defined
        assert "once a daemon runs and a worker serving noop connects" in defined.out, defined
    finally:
        sql(other, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    # Without the API the database answers, labelled, and says a daemon leads.
    no_api = write(daemon_config.parent / "no-api.toml", f'dsn = "{database}"\n')
    status = run_cli("status", config=no_api)
    fields = dict(line.split(":", 1) for line in status.out.splitlines())
    assert fields["source"].strip().startswith("PostgreSQL (no daemon view: no admin API")
    assert fields["daemon"].strip().startswith("leading: PostgreSQL session ")


def test_status_and_list_without_any_daemon(database: str, tmp_path: Path) -> None:
    config = write(tmp_path / "coordinator.toml", f'dsn = "{database}"\n')
    run_cli("jobs", "define", "tick", "--every", "5m", "--", "true", config=config)
    listing = run_cli("jobs", "list", config=config)
    assert listing.out.splitlines()[1].split()[5:7] == ["no", "daemon"]
    assert listing.err.startswith("coordinator: note: no daemon is running on this database")
    status = run_cli("status", config=config)
    fields = dict(line.split(":", 1) for line in status.out.splitlines())
    assert fields["daemon"].strip().startswith("not running: no session holds its lock")


def test_admin_api_accepts_the_usual_boolean_spellings(start_daemon: Any) -> None:
    d = start_daemon()
    d.cli("jobs", "define", "m", "--manual", "--paused", "--", "true")
    code, body = d.api("POST", "/api/jobs/default/m/trigger?force=1")
    assert code == 200, body
    assert d.cli("runs", "show", str(body["run"]), "--json").json["args"] == {"force": True}
    for spelling in ("YES", "on", "True", "0", "off"):
        assert d.api("POST", f"/api/jobs/default/m/trigger?force={spelling}")[0] == 200
    code, body = d.api("POST", "/api/jobs/default/m/trigger?force=maybe")
    assert (code, body["error"]) == (400, "invalid_input")


# --------------------------------------------------------------------------- 6. small traps


def test_version() -> None:
    result = run_cli("--version", config=None)
    assert result.code == 0
    assert re.fullmatch(r"coordinator \d+\.\d+\.\d+\S*\n", result.out)
    # `python -m coordinator` too (there was no __main__: "cannot be directly executed").
    ran = subprocess.run(
        [sys.executable, "-m", "coordinator", "--version"], capture_output=True, text=True
    )
    assert (ran.returncode, ran.stdout) == (0, result.out), ran.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--every", "5"), "--every: '5': a unit is required: 5s or 5m?"),
        (("--manual", "--timeout", "90"), "--timeout: '90': a unit is required: 90s or 90m?"),
    ],
)
def test_durations_need_a_unit(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    config = write(tmp_path / "c.toml", "")
    result = run_cli("jobs", "define", "x", *args, "--", "true", config=config)
    one_line_error(result, code=2, contains=message)


def _embedded_config(tmp_path: Path, state: Path) -> Path:
    """A configuration with no DSN: the embedded cluster under ``state``."""
    return write(
        tmp_path / "coordinator.toml",
        f"""
        state_dir = "{state}"
        worker_socket = "{short_dir() / "w.sock"}"
        log_format = "json"
        """,
    )


def _run_embedded(config: Path, log: Path, bin_dir: str, *args: str) -> subprocess.Popen[bytes]:
    """`coordinator run` on ``config``'s embedded cluster, its log lines in ``log``."""
    with log.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-c", RUN_MAIN, "run", *args],
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env=_environment(config, COORDINATOR_PG_BIN=bin_dir),
        )


def test_an_orphaned_embedded_cluster_is_adopted_and_stopped(
    tmp_path: Path, cluster_home: Path
) -> None:
    """`kill -9` of the command that started the embedded PostgreSQL: the next command
    finds the server running with nobody owning it, adopts it and stops it."""
    bin_dir = server_binaries()
    state = cluster_home / "state"
    config = _embedded_config(tmp_path, state)
    root = state / "postgres"
    log = tmp_path / "run.log"
    try:
        proc = _run_embedded(config, log, bin_dir, "--migrate")
        wait_until(lambda: '"event":"ready"' in log.read_text(), 60, "the daemon's ready")
        server = postmaster_pid(root)
        assert server is not None
        proc.kill()
        proc.wait(10)
        assert alive(server)  # the orphan

        listed = run_cli("jobs", "list", config=config, COORDINATOR_PG_BIN=bin_dir)
        assert listed.code == 0, listed
        assert listed.out == "no jobs\n"
        assert listed.err_lines[0] == (
            f"coordinator: note: adopted the embedded PostgreSQL in {root}, left running by "
            f"pid {proc.pid}, which is gone; stopping it when this command ends, unless "
            "another command still uses it"
        )
        assert postmaster_pid(root) is None
        wait_until(lambda: not alive(server), 10, "the orphan's exit")
    finally:
        stop_leftover(root)


def test_a_daemon_starts_its_embedded_server_again_when_it_dies(
    tmp_path: Path, cluster_home: Path
) -> None:
    """A tester's kill -9 of the postmaster left the daemon logging "Connection refused"
    for good, and commands waited 60 s for an owner that would never start it."""
    bin_dir = server_binaries()
    state = cluster_home / "state"
    config = _embedded_config(tmp_path, state)
    root = state / "postgres"
    log = tmp_path / "run.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc = _run_embedded(config, log, bin_dir, "--migrate")
        wait_until(lambda: '"event":"ready"' in log.read_text(), 60, "the daemon's ready")
        server = postmaster_pid(root)
        assert server is not None
        os.kill(server, signal.SIGKILL)
        wait_until(lambda: '"event":"embedded.restarted"' in log.read_text(), 60, "a restart")
        again = postmaster_pid(root)
        assert again is not None
        assert again != server
        assert '"event":"embedded.exited"' in log.read_text()
        listed = run_cli("jobs", "list", config=config, COORDINATOR_PG_BIN=bin_dir, timeout=60)
        assert (listed.code, listed.out) == (0, "no jobs\n"), listed
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert postmaster_pid(root) is None  # and stopped with the daemon, as before
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        stop_leftover(root)


def test_the_embedded_cluster_stays_up_while_a_daemon_uses_it_and_stops_with_the_last_user(
    tmp_path: Path, cluster_home: Path
) -> None:
    """A command that started the embedded PostgreSQL (`jobs trigger --wait`) used to
    stop it when it ended, under a daemon that had started meanwhile: the daemon was
    degraded for good. Every command now counts as a user; the last to leave stops it."""
    bin_dir = server_binaries()
    state = cluster_home / "state"
    config = _embedded_config(tmp_path, state)
    root = state / "postgres"
    env = _environment(config, COORDINATOR_PG_BIN=bin_dir)
    wait = ("jobs", "trigger", "waiter", "--wait", "--wait-timeout", "60s")
    daemon: subprocess.Popen[bytes] | None = None
    try:
        assert run_cli("migrate", config=config, COORDINATOR_PG_BIN=bin_dir).code == 0
        defined = run_cli(
            "jobs", "define", "waiter", "--manual", "--", "true",
            config=config, COORDINATOR_PG_BIN=bin_dir,
        )  # fmt: skip
        assert defined.code == 0, defined
        assert postmaster_pid(root) is None  # each command stopped what it started
        waiting = subprocess.Popen(
            [sys.executable, "-c", RUN_MAIN, *wait],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        wait_until(lambda: postmaster_pid(root) is not None, 60, "the command's server")
        daemon = _run_embedded(config, tmp_path / "run.log", bin_dir)
        out, err = waiting.communicate(timeout=90)
        # The daemon ran it, so it was using the server when the command ended.
        assert (waiting.returncode, out.split()[-1:]) == (0, ["succeeded"]), err
        server = postmaster_pid(root)
        assert server is not None  # not stopped under the daemon
        # Trust authentication: only the server's user (and root) may open its socket.
        (sock,) = (root / "socket").glob(".s.PGSQL.*[0-9]")
        assert sock.stat().st_mode & 0o777 == 0o700
        again = run_cli(*wait, config=config, COORDINATOR_PG_BIN=bin_dir)
        assert (again.code, again.out.split()[-1:]) == (0, ["succeeded"]), again
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
        # The daemon was the last to leave: it stopped the server.
        assert postmaster_pid(root) is None
        wait_until(lambda: not alive(server), 10, "the server's exit")
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait(10)
        stop_leftover(root)


@pytest.mark.skipif(
    os.geteuid() != 0, reason="the embedded server runs as another user only under root"
)
def test_run_as_root_makes_a_state_directory_its_embedded_server_can_reach(
    tmp_path: Path,
) -> None:
    """As root the embedded server runs as `postgres`, under `<state dir>/postgres`.
    `run` made a missing state directory 0700, then refused it as unreachable and
    suggested that very directory. Outside /tmp (whose directories the cluster opens
    for itself), as /var/lib/coordinator is."""
    bin_dir = server_binaries()
    base = Path(tempfile.mkdtemp(prefix="coordinator-state-", dir="/var/tmp"))
    base.chmod(0o755)
    state = base / "state"  # missing: `run` makes it
    config = _embedded_config(tmp_path, state)
    log = tmp_path / "run.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc = _run_embedded(config, log, bin_dir, "--migrate")
        wait_until(
            lambda: '"event":"ready"' in log.read_text() or proc.poll() is not None,
            90,
            "the daemon's ready",
        )
        assert proc.poll() is None, log.read_text()
        assert state.stat().st_mode & 0o777 == 0o711
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        stop_leftover(state / "postgres")
        shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------- 5. the web page


class Browser:
    """A cookie-keeping client of the web page, as a person's browser is."""

    def __init__(self, listen: str) -> None:
        self.url = f"http://{listen}/"
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def _csrf(self, path: str) -> str:
        page = self.opener.open(self.url + path, timeout=10).read().decode()
        found = re.search(r'name="csrf" value="([^"]+)"', page)
        assert found is not None, page[:2000]
        return found[1]

    def sign_in(self, token: str = TOKEN) -> None:
        body = urllib.parse.urlencode({"token": token, "csrf": self._csrf("signin")})
        assert self.opener.open(self.url + "signin", data=body.encode(), timeout=10).geturl() == (
            self.url
        )

    def sign_out(self) -> None:
        body = urllib.parse.urlencode({"csrf": self._csrf("")}).encode()
        self.opener.open(self.url + "signout", data=body, timeout=10).read()

    def signed_in(self) -> bool:
        """The jobs view answers (else the page sends the browser to sign in)."""
        return self.opener.open(self.url, timeout=10).geturl() == self.url


def _restart(daemon: Daemon, start_daemon: Any) -> Daemon:
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(30) == 0
    started: Daemon = start_daemon()
    return started


def test_web_sessions_outlive_a_restart_as_sign_outs_do_but_not_a_new_token(
    start_daemon: Any, tmp_path: Path
) -> None:
    """The service keeps the key that signs the page's sessions in its state directory
    (readable by its owner only), and sign-outs beside it: a restart (a deploy) signs
    nobody out and nobody back in. A session is bound to its token as configured, so a
    replaced token ends it, restart or not."""
    daemon = start_daemon()
    stays, leaves = Browser(daemon.listen), Browser(daemon.listen)
    stays.sign_in()
    leaves.sign_in()
    daemon = _restart(daemon, start_daemon)
    assert stays.signed_in()
    assert leaves.signed_in()
    leaves.sign_out()
    assert not leaves.signed_in()
    daemon = _restart(daemon, start_daemon)
    assert stays.signed_in()
    assert not leaves.signed_in()
    key = tmp_path / "state" / "web-session.key"
    assert key.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "state" / "web-signouts.jsonl").stat().st_mode & 0o777 == 0o600
    # A new token (the same name, admin): the sessions of the old one end.
    (tmp_path / "admin-token").write_text("another-admin-token-for-the-tests\n")
    daemon = _restart(daemon, start_daemon)
    assert not stays.signed_in()
    stays.sign_in("another-admin-token-for-the-tests")
    assert stays.signed_in()
