"""Beyond one host, as an operator runs it: processes only.

* ``coordinator run`` refuses plain TCP on a non-loopback bind, in one line (exit 2);
* a real ``coordinator worker`` process connects over TLS (certificates made here by
  trustme, files as an operator has them), declares its schedules, runs its job;
* two daemons against the same database over TCP, each through its own network path
  (a relay standing for the network between a host and PostgreSQL): the leader is killed
  and the standby takes over; then the new leader's host is cut off from the database,
  the other takes over again, and the cut-off daemon, once it can reach the database
  again, finds the lock taken and steps down (exit 1) without running anything twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
import trustme

from bench.relay import Relay
from coordinator.tokens import hash_token

from .test_daemon_process import COORDINATOR, EMPTY_CONFIG, DaemonProcess, cli, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture
def run_daemon(database: str, tmp_path: Path) -> Iterator[Any]:
    started: list[DaemonProcess] = []

    def start(name: str, *, dsn: str | None = None, **env_extra: str) -> DaemonProcess:
        log_path = tmp_path / f"{name}.log"
        env = {**os.environ, "COORDINATOR_DSN": dsn or database,
               "COORDINATOR_CONFIG": str(EMPTY_CONFIG), **env_extra}  # fmt: skip
        env.setdefault("COORDINATOR_WORKER_SOCKET", f"/tmp/cw-{os.getpid()}-{name}.sock")
        env.pop("COORDINATOR_TEST_DSN", None)
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [*COORDINATOR, "run", "--log-format", "json", "--state-dir",
                 str(tmp_path / f"state-{name}")],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=env,
            )  # fmt: skip
        daemon = DaemonProcess(proc=proc, log_path=log_path)
        started.append(daemon)
        return daemon

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.kill()


def test_plain_tcp_on_a_non_loopback_bind_is_refused_in_one_line(
    database: str, tmp_path: Path
) -> None:
    env = {**os.environ, "COORDINATOR_DSN": database, "COORDINATOR_CONFIG": str(EMPTY_CONFIG),
           "COORDINATOR_WORKER_LISTEN": "0.0.0.0:0",
           "COORDINATOR_WORKER_TOKEN": "a-shared-token-of-some-length"}  # fmt: skip
    done = subprocess.run(
        [*COORDINATOR, "run", "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "coordinator: worker_listen: 0.0.0.0 is not a loopback address: workers on other "
        "hosts connect over TLS only (set worker_tls_cert and worker_tls_key); refusing "
        "plain TCP"
    ]


WORKER_MODULE = """
from coordinator.worker import Context, Worker

worker = Worker(worker_id="remote-1", capacity=2)


@worker.job("reports.daily", cron="0 6 * * *", timezone="Europe/Berlin", timeout="10m")
async def daily(ctx: Context) -> dict:
    return {"count": 1, "extra": {"on": ctx.namespace}}


@worker.job("reports.rebuild", manual=True)
async def rebuild(ctx: Context) -> int:
    return 42
"""


def test_a_worker_process_on_another_host_connects_over_tls_and_declares(
    run_daemon: Any, database: str, tmp_path: Path
) -> None:
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    cert, key, ca_file = tmp_path / "server.pem", tmp_path / "server.key", tmp_path / "ca.pem"
    server.cert_chain_pems[0].write_to_path(str(cert))
    server.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    token = "remote-worker-token-" + "t" * 24
    tokens = {"remote": {"hash": hash_token(token), "namespaces": ["reports"],
                         "types": ["reports.daily", "reports.rebuild"]}}  # fmt: skip
    daemon = run_daemon(
        "d1",
        COORDINATOR_WORKER_LISTEN="0.0.0.0:0",
        COORDINATOR_WORKER_TLS_CERT=str(cert),
        COORDINATOR_WORKER_TLS_KEY=str(key),
        COORDINATOR_WORKER_TOKENS=json.dumps(tokens),
    )
    listening = daemon.wait_event("worker.listening")
    assert listening["tls"] is True
    port = int(listening["tcp"].rsplit(":", 1)[1])
    daemon.wait_event("ready")

    (tmp_path / "remote_jobs.py").write_text(WORKER_MODULE)
    (tmp_path / "token").write_text(token + "\n")
    worker_env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR_")}
    worker_log = tmp_path / "worker.log"

    def worker_process(token_file: Path) -> subprocess.Popen[bytes]:
        with worker_log.open("ab") as log:
            return subprocess.Popen(
                [*COORDINATOR, "worker", "remote_jobs:worker", "--tcp", f"127.0.0.1:{port}",
                 "--tls-ca", str(ca_file), "--tls-server-name", "localhost",
                 "--token-file", str(token_file), "--namespace", "reports"],
                cwd=tmp_path, env=worker_env, stdout=log, stderr=log,
            )  # fmt: skip

    worker = worker_process(tmp_path / "token")
    try:
        declared = daemon.wait_event("worker.declared", worker="remote-1")
        assert (declared["namespace"], declared["created"]) == ("reports", 2)
        connected = daemon.wait_event("worker.connected", worker="remote-1")
        assert connected["transport"] == "tls"
        jobs = json.loads(cli(database, "jobs", "list", "--namespace", "reports", "--json").stdout)
        assert {j["name"]: j["schedule"] for j in jobs} == {
            "reports.daily": "0 6 * * *",
            "reports.rebuild": None,
        }
        run_id = cli(database, "jobs", "trigger", "reports.rebuild", "-n", "reports").stdout
        finished = daemon.wait_event("job.run", run=int(run_id))
        assert (finished["outcome"], finished["count"]) == ("succeeded", 42)

        # The same program with a wrong token is turned away (and says so).
        (tmp_path / "wrong").write_text("not-the-token-" + "w" * 24)
        impostor = worker_process(tmp_path / "wrong")
        wait_until(lambda: b"missing or wrong token" in worker_log.read_bytes(), timeout=20)
        impostor.kill()
        impostor.wait(10)
        refused = daemon.wait_event("worker.rejected")
        assert refused["error"] == "missing or wrong token"
    finally:
        worker.terminate()
        worker.wait(20)


# -- a standby on a second host --------------------------------------------------------


def just_settled(daemon: DaemonProcess) -> None:
    """Return right after ``daemon`` saves its next run (the interval job's next call is a
    second away)."""
    seen = len(daemon.events("job.run"))
    wait_until(lambda: len(daemon.events("job.run")) > seen)


@pytest.mark.slow
def test_a_standby_on_a_second_host_takes_over_and_a_cut_off_leader_steps_down(
    run_daemon: Any, database: str, tmp_path: Path
) -> None:
    server = urlsplit(database)
    target = (server.hostname or "127.0.0.1", server.port or 5432)
    host_a, host_b = Relay(target=target), Relay(target=target)
    effects = tmp_path / "effects.txt"
    command = f'echo "$COORDINATOR_RUN_ID $COORDINATOR_SCHEDULED_FOR" >> {effects}'
    defined = cli(database, "jobs", "define", "tick", "--every", "1s", "--", "sh", "-c", command)
    assert defined.returncode == 0, defined.stderr
    try:
        a = run_daemon("host-a", dsn=host_a.dsn(database))
        a.wait_event("ready")
        b = run_daemon("host-b", dsn=host_b.dsn(database))
        b.wait_event("standby")
        wait_until(lambda: effects.exists() and len(effects.read_text().splitlines()) >= 2)

        # 1. Host A's daemon dies: B's blocked pg_advisory_lock returns, B leads. (Right
        # after a run is saved, so that none is in flight: a run killed mid-call is
        # unresolved and blocks its job, which is another test's subject.)
        just_settled(a)
        killed = time.monotonic()
        a.kill()
        b.wait_event("ready", timeout=30)
        first_takeover = time.monotonic() - killed
        ran = len(effects.read_text().splitlines())
        wait_until(lambda: len(effects.read_text().splitlines()) >= ran + 2)

        # 2. A comes back (as a standby), then host B falls off the network.
        a2 = run_daemon("host-a2", dsn=host_a.dsn(database))
        a2.wait_event("standby")
        just_settled(b)
        cut = time.monotonic()
        host_b.cut()
        a2.wait_event("ready", timeout=30)
        second_takeover = time.monotonic() - cut
        b.wait_event("leadership.connection_lost", timeout=30)
        ran = len(effects.read_text().splitlines())
        wait_until(lambda: len(effects.read_text().splitlines()) >= ran + 2)

        # 3. B's network returns: it finds the lock taken and steps down.
        host_b.restore()
        b.wait_event("leadership.lost", timeout=60)
        assert b.proc.wait(60) == 1
    finally:
        host_a.close()
        host_b.close()
    lines = effects.read_text().splitlines()
    runs = [line.split()[0] for line in lines]
    deadlines = [line.split()[1] for line in lines if len(line.split()) > 1]
    assert len(runs) == len(set(runs))  # no run executed twice
    assert len(deadlines) == len(set(deadlines))  # no deadline served twice
    print(f"takeover after kill: {first_takeover:.2f}s; after a network cut: "
          f"{second_takeover:.2f}s", file=sys.stderr)  # fmt: skip
