"""Peers, same scenario, same run: coordinator next to procrastinate and pgqueuer.

One cluster; one database per system (so the server log's ``db=`` separates them, and
each connects as its own role for pg_stat_statements). Each gets 100 far-future cron /
periodic tasks and runs its worker/scheduler the way its docs describe; all run at the
same time and are counted over the same idle window. Then each one's wake latency
(enqueue commit -> task function starts) is measured in the same run, one system at a
time, the others still running idle.

Each peer runs twice: with its defaults, and "tuned", with the knobs that reduce its
polling turned up (procrastinate: fetch/abort polling and heartbeat intervals;
pgqueuer: ``dequeue_timeout`` and ``heartbeat_timeout``). What those knobs cost is
written in bench/README.md.

The peers are installed into ``bench/.peers`` (a virtual environment made here, ignored
by git): never a dependency of the project.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from . import common
from . import latency as latency_mod
from .common import APP_BENCH, DAEMON_ROLE, BenchCluster, DaemonProcess
from .jobs import far_future_cron, insert_jobs

if TYPE_CHECKING:
    from pathlib import Path

PEERS_VENV = common.BENCH_DIR / ".peers"
PEER_APPS = common.BENCH_DIR / "peer_apps"
#: What the bench installs into the peers' environment (pinned: the versions measured).
PEER_PACKAGES = ("procrastinate==3.10.0", "pgqueuer==1.6.0", "psycopg[binary]", "asyncpg")
PERIODIC_TASKS = 100
#: Seconds between starting everything and opening the idle window (startup settles).
SETTLE = 10.0
TUNED_INTERVAL = 600
#: Latency samples are taken in this many rounds, each system in turn within a round:
#: this machine's speed drifts over a run by as much as the systems differ, and a system
#: measured in one block of time would carry its drift.
ROUNDS = 4

PROCRASTINATE_DEFAULTS = (
    "defaults (listen_notify on, fetch_job_polling_interval 5 s, abort_job_polling_interval 5 s, "
    "update_heartbeat_interval 10 s)"
)
PROCRASTINATE_TUNED = {
    "fetch_job_polling_interval": TUNED_INTERVAL,
    "abort_job_polling_interval": TUNED_INTERVAL,
    "update_heartbeat_interval": TUNED_INTERVAL,
    "stalled_worker_timeout": 3 * TUNED_INTERVAL,
}
PGQUEUER_TUNED = {"dequeue_timeout": TUNED_INTERVAL, "heartbeat_timeout": TUNED_INTERVAL}


def peer_python() -> Path:
    return PEERS_VENV / "bin" / "python"


def ensure_peers_venv() -> dict[str, str]:
    """Create bench/.peers and install the peers if needed; return their versions."""
    if not peer_python().exists():
        common.note(f"creating {PEERS_VENV.relative_to(common.REPO)} (peers' own venv)")
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    versions = _peer_versions()
    wanted = {p.split("==")[0]: p.split("==")[1] for p in PEER_PACKAGES if "==" in p}
    if any(versions.get(name) != version for name, version in wanted.items()) or not all(
        versions.get(n) for n in ("psycopg", "asyncpg")
    ):
        common.note("installing " + " ".join(PEER_PACKAGES) + " into the peers' venv")
        subprocess.run(
            [str(peer_python()), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True
        )
        versions = _peer_versions()
    return versions


def _peer_versions() -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json\n"
        "out = {}\n"
        "for n in ('procrastinate', 'pgqueuer', 'psycopg', 'psycopg-pool', 'asyncpg'):\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([str(peer_python()), "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        return {}
    result: dict[str, str] = json.loads(proc.stdout)
    return result


class LineProcess:
    """A child process whose stdout carries JSON lines (collected) and whose stderr goes
    to a file."""

    def __init__(self, name: str, argv: list[str], *, env: dict[str, str], log: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log = log
        self.records: list[dict[str, Any]] = []
        self.proc: asyncio.subprocess.Process | None = None
        self._changed = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._eof = False
        self._stderr: Any = None

    async def start(self, *, stdin: bool = False) -> None:
        self._stderr = self.log.open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=self.env,
            cwd=str(PEER_APPS),
            start_new_session=True,
        )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                break
            received = time.time()
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    record["_received"] = received
                    self.records.append(record)
                    self._poke()
        self._eof = True
        self._poke()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self, where: Any, *, since: int = 0, timeout: float = 30.0) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        i = since
        while True:
            while i < len(self.records):
                if where(self.records[i]):
                    return self.records[i]
                i += 1
            if self._eof:
                raise RuntimeError(f"{self.name} exited; see {self.log}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"{self.name}: nothing matching within {timeout}s")
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    async def send(self, text: str) -> None:
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        await self.proc.stdin.drain()

    async def stop(self, *, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.stdin is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 5)
        if self._stderr is not None:
            self._stderr.close()
        return self.proc.returncode


class Peer:
    """One peer configuration: its database, role, worker command and enqueuer."""

    def __init__(
        self,
        *,
        label: str,
        system: str,
        db: str,
        bc: BenchCluster,
        config: dict[str, Any],
        worker_options: dict[str, Any] | None = None,
    ) -> None:
        self.label = label
        self.system = system
        self.db = db
        self.role = f"peer_{db}"
        self.bc = bc
        self.config = config
        self.worker_options = worker_options or {}
        self.worker: LineProcess | None = None

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("VIRTUAL_ENV", None)
        env["PATH"] = f"{PEERS_VENV / 'bin'}:{env.get('PATH', '')}"
        env["PYTHONPATH"] = str(PEER_APPS)
        env["PYTHONUNBUFFERED"] = "1"
        env["BENCH_FAR_FUTURE"] = far_future_cron()
        dsn = self.bc.dsn(self.db, user=self.role) + f"?application_name={self.system}"
        env["BENCH_PEER_DSN"] = dsn
        env["PGDSN"] = dsn
        env["BENCH_WORKER_OPTIONS"] = json.dumps(self.worker_options)
        return env

    def log(self, what: str) -> Path:
        return self.bc.tmp / f"{self.db}-{what}.log"

    async def prepare(self) -> None:
        assert self.bc.admin is not None
        await self.bc.admin.execute(f"CREATE ROLE {self.role} LOGIN SUPERUSER")
        await self.bc.admin.execute(f"CREATE DATABASE {self.db} OWNER {self.role}")
        if self.system == "procrastinate":
            argv = [str(PEERS_VENV / "bin" / "procrastinate"), "--app=procrastinate_app.app",
                    "schema", "--apply"]  # fmt: skip
        else:
            argv = [str(PEERS_VENV / "bin" / "pgq"), "install"]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=self.env(),
            cwd=str(PEER_APPS),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"{self.label}: schema install failed:\n{out.decode()[-2000:]}")

    def worker_argv(self) -> list[str]:
        if self.system == "procrastinate":
            return [str(PEERS_VENV / "bin" / "procrastinate"), "--app=procrastinate_app.app",
                    "worker"]  # fmt: skip
        return [str(peer_python()), "pgqueuer_app.py", "worker"]

    def enqueuer_argv(self) -> list[str]:
        return [str(peer_python()), f"{self.system}_app.py", "enqueue"]

    async def start(self) -> None:
        self.worker = LineProcess(
            f"{self.label} worker", self.worker_argv(), env=self.env(), log=self.log("worker")
        )
        await self.worker.start()

    async def stop(self) -> None:
        if self.worker is not None:
            await self.worker.stop()

    async def latency(self, n: int) -> dict[str, Any]:
        assert self.worker is not None
        enq = LineProcess(
            f"{self.label} enqueuer", self.enqueuer_argv(), env=self.env(), log=self.log("enqueue")
        )
        await enq.start(stdin=True)
        samples = []
        warmup = latency_mod.WARMUP
        try:
            for i in range(warmup + n):
                since_w, since_e = len(self.worker.records), len(enq.records)
                await enq.send(f"{i}\n")
                sent = await enq.wait(lambda r, i=i: r.get("seq") == i, since=since_e)
                started = await self.worker.wait(lambda r, i=i: r.get("seq") == i, since=since_w)
                samples.append(
                    {
                        "i": i,
                        "t_before": sent["t_before"],
                        "t_commit": sent["t_after"],
                        "started": started["t"],
                        "commit_to_start_ms": (started["t"] - sent["t_after"]) * 1000,
                        "sent_to_start_ms": (started["t"] - sent["t_before"]) * 1000,
                        "trigger_round_trip_ms": (sent["t_after"] - sent["t_before"]) * 1000,
                    }
                )
                await asyncio.sleep(random.uniform(0.005, 0.020))
        finally:
            await enq.stop()
        measured = samples[warmup:]
        return {
            "n": n,
            "warmup": warmup,
            "commit_to_start_ms": common.summary([s["commit_to_start_ms"] for s in measured]),
            "sent_to_start_ms": common.summary([s["sent_to_start_ms"] for s in measured]),
            "trigger_round_trip_ms": common.summary([s["trigger_round_trip_ms"] for s in measured]),
            "samples": samples,
        }


def _merged(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One system's latency rounds as one result: the measured samples of every round
    together (each round's warm-up left out), their summaries computed again, counts
    added up."""
    warmup = parts[0]["warmup"]
    measured = [s for part in parts for s in part["samples"][warmup:]]
    out = dict(parts[0])
    out["n"] = len(measured)
    out["rounds"] = len(parts)
    out["samples"] = [s for part in parts for s in part["samples"]]
    for key, value in parts[0].items():
        if isinstance(value, dict) and "p50" in value:
            out[key] = common.summary([s[key] for s in measured if key in s])
        elif key == "daemon_statements":
            out[key] = sum(part[key] for part in parts)
        elif key in ("statuses", "daemon_statement_kinds"):
            total: dict[str, int] = {}
            for part in parts:
                for kind, count in part[key].items():
                    total[kind] = total.get(kind, 0) + count
            out[key] = total
        elif key == "warmup_commit_to_start_ms":
            out[key] = [v for part in parts for v in part[key]]
    if "daemon_statements" in out:
        out["daemon_statements_per_run"] = out["daemon_statements"] / len(out["samples"])
    return out


async def run(*, quick: bool, window: float | None = None) -> dict[str, Any]:
    if window is None:
        window = 30.0 if quick else 180.0
    n = 200
    common.banner(
        f"peers: {window:.0f} s idle window, then {n} latency samples each, "
        f"in {ROUNDS} rounds of every system in turn"
    )
    versions = ensure_peers_venv()
    common.note(f"peer versions: {versions}")
    async with BenchCluster("peers") as bc:
        # coordinator: 100 far-future cron jobs (+ the manual jobs the latency run
        # triggers; manual-only jobs are not even loaded by the daemon).
        coord_db = await bc.create_database("coordinator")
        conn = await bc.connect(coord_db)
        try:
            await insert_jobs(conn, "cron", PERIODIC_TASKS)
            await insert_jobs(conn, "manual-worker", n + latency_mod.WARMUP, prefix="worker-")
        finally:
            await conn.close()
        peers = [
            Peer(label="procrastinate", system="procrastinate", db="procrastinate", bc=bc,
                 config={"worker_options": PROCRASTINATE_DEFAULTS}),
            Peer(label="procrastinate (tuned)", system="procrastinate", db="procrastinate_tuned",
                 bc=bc, worker_options=PROCRASTINATE_TUNED,
                 config={"worker_options": PROCRASTINATE_TUNED}),
            Peer(label="pgqueuer", system="pgqueuer", db="pgqueuer", bc=bc,
                 config={"run options": "defaults (dequeue_timeout 30 s, heartbeat_timeout 30 s)"}),
            Peer(label="pgqueuer (tuned)", system="pgqueuer", db="pgqueuer_tuned", bc=bc,
                 worker_options=PGQUEUER_TUNED, config={"run options (s)": PGQUEUER_TUNED}),
        ]  # fmt: skip
        for peer in peers:
            await peer.prepare()

        # Start everything, let startup settle, then one common idle window.
        startup_offset = bc.log_offset()
        socket_path = bc.tmp / "w.sock"
        daemon = DaemonProcess(
            bc.dsn(coord_db, user=DAEMON_ROLE),
            state_dir=bc.tmp / "state",
            env={"COORDINATOR_WORKER_SOCKET": str(socket_path)},
        )
        worker = None
        await daemon.start()
        for peer in peers:
            await peer.start()
        try:
            await daemon.wait_event("ready", timeout=120)
            await asyncio.sleep(SETTLE)
            window_offset = bc.log_offset()
            await bc.pgss_reset()
            t0 = time.monotonic()
            await asyncio.sleep(window)
            elapsed = time.monotonic() - t0
            end_offset = bc.log_offset()
            startup_log = bc.between(startup_offset, window_offset)
            window_log = bc.between(window_offset, end_offset)
            idle: dict[str, Any] = {}
            for label, db, role in [
                ("coordinator", coord_db, DAEMON_ROLE),
                *((p.label, p.db, p.role) for p in peers),
            ]:
                found = [s for s in window_log.statements(db=db) if s.app != APP_BENCH]
                kinds: dict[str, int] = {}
                for s in found:
                    key = " ".join(s.sql.split())[:100] or "(empty query string)"
                    kinds[key] = kinds.get(key, 0) + 1
                pgss_rows = await bc.pgss(db=db, role=role)
                idle[label] = {
                    "database": db,
                    "statements_log": len(found),
                    "statements_pgss": sum(r["calls"] for r in pgss_rows),
                    "per_hour": len(found) * 3600 / elapsed,
                    "by_statement": kinds,
                    "pgss": pgss_rows,
                    "startup_by_app": common.statements_by_app(startup_log, db=db),
                }
            common.note("idle window done; measuring latency")
            await bc.make_wal_segments()
            lat: dict[str, Any] = {}
            # Like the peers' task functions, coordinator's figure is its worker's handler
            # starting (the no-op SDK worker reports its own clock); connected only now, so
            # that it is not part of the idle window.
            worker = await common.start_noop_worker(daemon, socket_path)
            rounds: dict[str, list[dict[str, Any]]] = {"coordinator": []}
            rounds.update({peer.label: [] for peer in peers})
            for _round in range(ROUNDS):
                rounds["coordinator"].append(
                    await latency_mod.measure(bc, coord_db, daemon, n=n // ROUNDS, prefix="worker-")
                )
                for peer in peers:
                    rounds[peer.label].append(await peer.latency(n // ROUNDS))
            lat.update({label: _merged(parts) for label, parts in rounds.items()})
            coordinator = lat["coordinator"]
            coordinator["commit_to_call_ms"] = coordinator["commit_to_start_ms"]
            coordinator["commit_to_start_ms"] = coordinator["commit_to_handler_ms"]
            coordinator["sent_to_start_ms"] = coordinator["sent_to_handler_ms"]
            for label, result in lat.items():
                common.note(f"{label}: p50 {result['commit_to_start_ms']['p50']:.2f} ms")
        finally:
            if worker is not None:
                worker.terminate()
                await worker.wait()
            await daemon.stop()
            for peer in peers:
                await peer.stop()
        server_version = bc.server_version

    idle_headers = [
        "system",
        "idle stmts (log)",
        "idle stmts (pgss)",
        "stmts/hour",
        "what it sent while idle (count x statement)",
    ]
    idle_rows = []
    for label, r in idle.items():
        top = sorted(r["by_statement"].items(), key=lambda kv: -kv[1])[:3]
        idle_rows.append(
            [
                label,
                r["statements_log"],
                r["statements_pgss"],
                r["per_hour"],
                "; ".join(f"{c}x {q[:48]}" for q, c in top) or "-",
            ]
        )
    idle_text = common.table(idle_headers, idle_rows)
    lat_headers = ["system", "n", "p50", "p90", "p99", "max", "mean", "sent->start p50"]
    lat_rows = []
    for label, r in lat.items():
        s = r["commit_to_start_ms"]
        lat_rows.append(
            [label, s["n"], s["p50"], s["p90"], s["p99"], s["max"], s["mean"],
             r["sent_to_start_ms"]["p50"]]
        )  # fmt: skip
    lat_text = common.table(lat_headers, lat_rows)
    print()
    print(
        f"idle statements, {PERIODIC_TASKS} far-future periodic jobs each, "
        f"same {window:.0f} s window"
    )
    print(idle_text)
    print()
    print("wake latency (ms): enqueue/trigger COMMIT returned -> task function / call starts")
    print(lat_text, flush=True)
    return {
        "benchmark": "peers",
        "quick": quick,
        "window_s": window,
        "settle_s": SETTLE,
        "machine": {**common.machine_info(server_version), "peer_packages": versions},
        "server_settings": common.SERVER_SETTINGS,
        "configurations": {p.label: {"database": p.db, **p.config} for p in peers},
        "table_idle": idle_text,
        "table_latency": lat_text,
        "idle": idle,
        "latency": lat,
    }
