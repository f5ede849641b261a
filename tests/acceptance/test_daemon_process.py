"""The daemon as a process, as an operator runs it: killed, restarted, doubled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

    from coordinator.embedded import StatementLog

COORDINATOR = [
    sys.executable,
    "-c",
    "import sys; from coordinator.cli import main; sys.exit(main())",
]
#: An empty configuration file: the processes never read the machine's /etc/coordinator.
EMPTY_CONFIG = Path(tempfile.mkdtemp(prefix="coordinator-daemon-")) / "coordinator.toml"
EMPTY_CONFIG.write_text("")


@attrs.define(eq=False)
class DaemonProcess:
    """``coordinator run`` in a subprocess, its JSON log lines collected from a file."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    def events(self, name: str | None = None, **match: Any) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if (name is None or event.get("event") == name) and all(
                event.get(k) == v for k, v in match.items()
            ):
                out.append(event)
        return out

    def wait_event(self, name: str, timeout: float = 20.0, **match: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.events(name, **match)
            if found:
                return found[0]
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError(
            f"no {name} {match} within {timeout}s (exit {self.proc.poll()}); log:\n"
            + self.log_path.read_text()[-3000:]
        )

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def daemons(database: str, tmp_path: Path) -> Iterator[Any]:
    started: list[DaemonProcess] = []
    sockets = Path(tempfile.mkdtemp(prefix="cw-"))  # short: a socket path has ~108 bytes

    def start(name: str = "d1", *extra: str) -> DaemonProcess:
        log_path = tmp_path / f"{name}.log"
        env = {**os.environ, "COORDINATOR_DSN": database, "COORDINATOR_CONFIG": str(EMPTY_CONFIG)}
        env["COORDINATOR_WORKER_SOCKET"] = str(sockets / f"{name}.sock")
        env.pop("COORDINATOR_TEST_DSN", None)
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [
                    *COORDINATOR,
                    "run",
                    "--log-format",
                    "json",
                    "--state-dir",
                    str(tmp_path / f"state-{name}"),
                    *extra,
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=env,
            )
        d = DaemonProcess(proc=proc, log_path=log_path)
        started.append(d)
        return d

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.kill()


def cli(database: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COORDINATOR_DSN": database, "COORDINATOR_CONFIG": str(EMPTY_CONFIG)}
    return subprocess.run(
        [*COORDINATOR, *args], capture_output=True, text=True, env=env, timeout=60
    )


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_until(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.mark.parametrize(
    ("signum", "status"), [(signal.SIGTERM, 0), (signal.SIGHUP, 129)], ids=["SIGTERM", "SIGHUP"]
)
def test_sigterm_stops_cleanly(daemons: Any, signum: signal.Signals, status: int) -> None:
    # (SIGHUP's default action ended the process at once: no stop, no flush, no spool.)
    # SIGHUP stops as cleanly, but exits 129 (128 + SIGHUP, as a shell reports a hangup):
    # an operator's `kill -HUP` means "reload", and the daemon has no reload, so the
    # shipped unit's Restart=on-failure must start it again (exit 0 left it stopped for
    # good: tester-ha #13).
    d = daemons()
    d.wait_event("ready")
    d.proc.send_signal(signum)
    assert d.proc.wait(30) == status
    assert d.wait_event("signal")["signal"] == signum.name
    stopped = d.wait_event("stopped")
    assert stopped.get("exit_code") == (status or None)


def test_sighup_to_a_standby_exits_129_too(daemons: Any) -> None:
    """The tester's case: a standby's `kill -HUP` left it stopped under Restart=on-failure."""
    leader = daemons("d1")
    leader.wait_event("ready")
    standby = daemons("d2")
    standby.wait_event("standby")
    standby.proc.send_signal(signal.SIGHUP)
    assert standby.proc.wait(30) == 129
    assert leader.proc.poll() is None


def test_killed_mid_run_leaves_an_unresolved_run_that_blocks_until_resolved(
    daemons: Any, database: str, tmp_path: Path
) -> None:
    effects, started = tmp_path / "effects.txt", tmp_path / "started"
    cmd = f"echo started >> {effects}; touch {started}; sleep 30"
    assert cli(database, "jobs", "define", "pay", "--manual", "--", "sh", "-c", cmd).returncode == 0
    first = daemons("d1")
    first.wait_event("ready")
    run_id = cli(database, "jobs", "trigger", "pay").stdout.strip()
    wait_until(started.exists)
    first.kill()

    second = daemons("d2")
    lost = second.wait_event("startup.lost_run")
    assert str(lost["run"]) == run_id
    assert lost["action"] == "unresolved"
    second.wait_event("ready")
    shown = json.loads(cli(database, "runs", "show", run_id, "--json").stdout)
    assert shown["status"] == "unresolved"
    assert shown["error_cause"] == "lost"
    # A trigger does not start the job: it answers with the unresolved run.
    again = cli(database, "jobs", "trigger", "pay")
    assert again.stdout.strip() == run_id
    time.sleep(1.0)
    assert lines(effects) == 1
    jobs = json.loads(cli(database, "jobs", "list", "--json").stdout)
    assert jobs[0]["blocked_by"] == int(run_id)

    # The operator decides; the job is free again.
    assert cli(database, "runs", "resolve", run_id, "--as", "failed").returncode == 0
    started.unlink()
    new_run = cli(database, "jobs", "trigger", "pay").stdout.strip()
    assert new_run != run_id
    wait_until(started.exists)
    assert lines(effects) == 2


def test_killed_mid_run_of_an_idempotent_job_runs_it_once_more(
    daemons: Any, database: str, tmp_path: Path
) -> None:
    effects, started = tmp_path / "effects.txt", tmp_path / "started"
    cmd = (
        f'echo "$COORDINATOR_ATTEMPT" >> {effects}; touch {started}; '
        f'[ "$COORDINATOR_ATTEMPT" = 1 ] && sleep 30; true'
    )
    assert (
        cli(
            database, "jobs", "define", "sweep", "--manual", "--idempotent", "--", "sh", "-c", cmd
        ).returncode
        == 0
    )
    first = daemons("d1")
    first.wait_event("ready")
    cli(database, "jobs", "trigger", "sweep")
    wait_until(started.exists)
    first.kill()

    second = daemons("d2")
    second.wait_event("startup.lost_run", action="retried")
    run = second.wait_event("job.run", trigger="retry")
    assert run["outcome"] == "succeeded"
    assert effects.read_text().split() == ["1", "2"]


def _alive(pid: int) -> bool:
    """A live process (a zombie waiting for its parent is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


def test_a_daemon_killed_outright_has_its_commands_stopped_by_the_next_start(
    daemons: Any, database: str, tmp_path: Path
) -> None:
    """A daemon killed with SIGKILL leaves its command running (it leads a process group
    of its own). The next start with the same state directory stops it before the sweep's
    retry of the idempotent job can run beside it (two copies side by side before)."""
    pid_file, started, effects = tmp_path / "pid", tmp_path / "started", tmp_path / "effects"
    cmd = (
        f'echo "$COORDINATOR_ATTEMPT" >> {effects}; echo $$ > {pid_file}; touch {started}; '
        f'if [ "$COORDINATOR_ATTEMPT" = 1 ]; then exec sleep 300; fi'
    )
    defined = cli(database, "jobs", "define", "sweep", "--manual", "--idempotent", "--",
                  "sh", "-c", cmd)  # fmt: skip
    assert defined.returncode == 0, defined.stderr
    state = ["--state-dir", str(tmp_path / "state")]
    first = daemons("d1", *state)
    first.wait_event("ready")
    run_id = int(cli(database, "jobs", "trigger", "sweep").stdout.strip())
    wait_until(started.exists)
    orphan = int(pid_file.read_text())
    first.kill()
    assert _alive(orphan)  # nothing stopped it with the daemon

    second = daemons("d2", *state)
    stopped = second.wait_event("startup.orphan_stopped")
    assert (stopped["run"], stopped["pgid"], stopped["signal"]) == (run_id, orphan, "SIGTERM")
    assert not _alive(orphan)
    second.wait_event("startup.lost_run", action="retried")
    run = second.wait_event("job.run", trigger="retry")
    assert run["outcome"] == "succeeded"
    assert effects.read_text().split() == ["1", "2"]
    names = [e["event"] for e in second.events()]
    assert names.index("startup.orphan_stopped") < names.index("job.run")
    # Only the groups still running are recorded: the finished retry left nothing.
    assert list((tmp_path / "state" / "commands").iterdir()) == []


def _define_tick(database: str, effects: Path) -> None:
    """A 1 s interval job writing its run id. Idempotent: the leader is killed at a moment
    the test does not choose, maybe during a run, whose outcome is then unknown; a
    job that is not idempotent is blocked by that run until an operator resolves it
    (promise 8, tested above), an idempotent one runs it once more and goes on."""
    assert (
        cli(
            database,
            "jobs",
            "define",
            "tick",
            "--every",
            "1s",
            "--idempotent",
            "--",
            "sh",
            "-c",
            f'echo "$COORDINATOR_RUN_ID" >> {effects}',
        ).returncode
        == 0
    )


def test_standby_is_silent_and_takes_over(
    daemons: Any, database: str, database_name: str, sql_log: StatementLog, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.txt"
    _define_tick(database, effects)
    leader = daemons("leader")
    leader.wait_event("ready")
    standby = daemons("standby")
    standby.wait_event("standby")
    time.sleep(0.5)
    standby_pid = standby.proc.pid
    sql_log.mark()
    time.sleep(3.0)
    standby_statements = [
        s
        for s in sql_log.statements(app="coordinator", db=database_name)
        if s.pid not in _backend_pids_of_leader(sql_log, database_name, leader)
    ]
    # The leader runs the interval job meanwhile; the standby says nothing at all.
    assert standby_statements == []
    assert standby_pid

    killed_at = time.monotonic()
    leader.kill()
    ran_before = lines(effects)
    ready = standby.wait_event("ready", timeout=30)
    takeover = time.monotonic() - killed_at
    assert takeover < 10
    # The new leader runs the job (not merely: the two of them ran it 4 times in all;
    # a call of the killed leader may still write one line).
    wait_until(lambda: lines(effects) >= ran_before + 2, timeout=20)
    ids = effects.read_text().split()
    assert len(ids) == len(set(ids))  # no run duplicated
    runs = json.loads(cli(database, "runs", "list", "--json", "--limit", "200").stdout)
    assert any(r["instance"] == ready["instance"] and r["status"] == "succeeded" for r in runs)
    scheduled = [r["scheduled_for"] for r in runs if r["trigger"] == "schedule"]
    assert len(scheduled) == len(set(scheduled))


class _Application:
    """A plain SQL session beside the daemons (a private asyncio loop, stepped in turn)."""

    def __init__(self, database: str) -> None:
        import asyncio

        import asyncpg

        self._loop = asyncio.new_event_loop()
        self._conn = self._loop.run_until_complete(asyncpg.connect(database))

    def fetchval(self, sql: str, *args: Any) -> Any:
        return self._loop.run_until_complete(self._conn.fetchval(sql, *args))

    def close(self) -> None:
        self._loop.run_until_complete(self._conn.close())
        self._loop.close()


def _hold_the_job_between_runs(app: _Application, name: str) -> None:
    """Lock the job's row in an open transaction at a moment its job has no outstanding
    run, so that the next thing waiting for that row is the leader's next claim."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        app.fetchval("BEGIN")
        app.fetchval("SELECT 1 FROM coordinator.jobs WHERE name = $1 FOR UPDATE", name)
        outstanding = app.fetchval(
            "SELECT count(*) FROM coordinator.runs r JOIN coordinator.jobs j ON j.id = r.job_id"
            " WHERE j.name = $1 AND r.status NOT IN ('succeeded', 'failed', 'cancelled',"
            " 'timed_out')",
            name,
        )
        if outstanding == 0:
            return
        app.fetchval("ROLLBACK")
        time.sleep(0.02)
    raise AssertionError("the job always had a run outstanding")


def _waiting_for_a_lock(app: _Application, query_like: str) -> bool:
    return bool(
        app.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND state = 'active' AND application_name = 'coordinator' AND query LIKE $1",
            query_like,
        )
    )


def test_a_claim_in_flight_when_the_leader_is_killed_does_not_block_its_job(
    daemons: Any, database: str, tmp_path: Path
) -> None:
    """SIGKILL leaves the leader's backends running what they were given: a claim past
    its fence check, waiting for the job's row, commits its run after the leader died.
    The new leader's crash sweep must see that run (it waits for the claims in flight),
    else nothing would ever settle it and the job would never run again (promise 9)."""
    effects = tmp_path / "effects.txt"
    _define_tick(database, effects)
    leader = daemons("leader")
    leader.wait_event("ready")
    standby = daemons("standby")
    standby.wait_event("standby")
    wait_until(lambda: lines(effects) >= 1)
    holder, prober = _Application(database), _Application(database)
    try:
        # An application holds the job's row: the leader's next claim waits for it.
        _hold_the_job_between_runs(holder, "tick")
        wait_until(lambda: _waiting_for_a_lock(prober, "%coordinator._claim%"))
        leader.kill()
        standby.wait_event("startup.lock")
        # The new leader's sweep has run, or waits for the dead leader's claim.
        wait_until(
            lambda: (
                bool(standby.events("startup.sweep"))
                or _waiting_for_a_lock(prober, "%coordinator._sweep_lost%")
            )
        )
        ran_before = lines(effects)
        holder.fetchval("ROLLBACK")  # the dead leader's claim goes on and commits its run
    finally:
        holder.close()
        prober.close()
    lost = standby.wait_event("startup.lost_run")
    assert lost["action"] == "retried"  # the run nobody will settle: seen and run again
    standby.wait_event("ready")
    wait_until(lambda: lines(effects) >= ran_before + 2)


def _backend_pids_of_leader(log: StatementLog, db: str, leader: DaemonProcess) -> set[int]:
    """Backends that ran claims or settlements: the leader's (the standby claims nothing)."""
    return {
        s.pid
        for s in log.statements(app="coordinator", db=db)
        if "_claim" in s.sql or "_settle" in s.sql
    }


def test_run_without_dsn_uses_and_stops_its_private_cluster(
    tmp_path: Path, cluster_home: Path
) -> None:
    from coordinator.embedded import NoServerBinaries, find_bin_dir

    try:
        bin_dir = str(find_bin_dir())
    except NoServerBinaries:
        pytest.skip("needs PostgreSQL server binaries")
    state = cluster_home / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR_")}
    env["COORDINATOR_CONFIG"] = str(EMPTY_CONFIG)
    env.update(
        COORDINATOR_STATE_DIR=str(state),
        COORDINATOR_PG_BIN=bin_dir,
        COORDINATOR_WORKER_SOCKET=str(Path(tempfile.mkdtemp(prefix="cw-")) / "w.sock"),
    )
    pidfile = state / "postgres" / "data" / "postmaster.pid"
    created: list[float] = []
    for attempt in range(2):  # the second start reuses the cluster the first created
        log_path = tmp_path / f"run{attempt}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [*COORDINATOR, "run", "--migrate", "--log-format", "json"],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=env,
            )
        d = DaemonProcess(proc=proc, log_path=log_path)
        try:
            d.wait_event("ready", timeout=60)
            assert pidfile.exists()
            assert "started the embedded PostgreSQL" in log_path.read_text()
            created.append((state / "postgres" / "data" / "PG_VERSION").stat().st_mtime)
        finally:
            d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(60) == 0
        assert not pidfile.exists()  # stopped with the daemon
    assert created[0] == created[1]  # initdb ran once


def test_systemd_notify_ready_status_stopping(database: str, tmp_path: Path) -> None:
    """`coordinator run` under a (simulated) systemd: the notify datagrams arrive."""
    import socket as socketlib

    sock_dir = Path(tempfile.mkdtemp(prefix="cn-"))
    address = str(sock_dir / "notify")
    receiver = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_DGRAM)
    receiver.bind(address)
    receiver.settimeout(30)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR_")}
    env["COORDINATOR_CONFIG"] = str(EMPTY_CONFIG)
    env.update(
        COORDINATOR_DSN=database,
        COORDINATOR_WORKER_SOCKET=str(sock_dir / "w.sock"),
        NOTIFY_SOCKET=address,
    )
    log_path = tmp_path / "d.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*COORDINATOR, "run", "--log-format", "json", "--state-dir", str(tmp_path / "s")],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
        )
    messages: list[str] = []
    try:
        while "READY=1" not in messages:
            messages.append(receiver.recv(4096).decode())
        while not messages[-1].startswith("STATUS=ready:"):  # a summary follows READY
            messages.append(receiver.recv(4096).decode())
        assert "armed" in messages[-1]
        DaemonProcess(proc=proc, log_path=log_path).wait_event("ready")
        proc.send_signal(signal.SIGTERM)
        while "STOPPING=1" not in messages:
            messages.append(receiver.recv(4096).decode())
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        receiver.close()
    # Without WATCHDOG_USEC there is no watchdog ping: nothing periodic at all.
    assert not any(m.startswith("WATCHDOG") for m in messages)


def test_a_second_daemon_on_the_same_state_directory_is_refused(
    daemons: Any, tmp_path: Path
) -> None:
    """Two daemons sharing a state directory share its spool and alert outbox: a
    tester's same-host pair sent an alert twice. The second is refused before it
    connects (exit 2, one line naming the first); a standby needs its own."""
    state = ["--state-dir", str(tmp_path / "state")]
    first = daemons("d1", *state)
    first.wait_event("ready")
    second = daemons("d2", *state)
    assert second.proc.wait(20) == 2
    said = second.log_path.read_text()
    assert (
        f"state directory {tmp_path / 'state'} is in use by another daemon (pid {first.proc.pid})"
    ) in said, said
    assert first.proc.poll() is None
