"""hosts: one daemon, many workers, several hosts (docs/scaling.md's figures).

Three measurements, each on clusters of its own:

**workers** -- one ``coordinator run`` and N worker connections made by this process
(the wire protocol itself, no SDK: a worker answers each ``call`` with ``result`` at
once; at most 50 connecting at a time), half over the Unix socket, half over TLS to a
0.0.0.0 listener (certificates from trustme, one ``worker_tokens`` token for the fleet).
Reported: the time to connect and be welcomed, the daemon's resident memory per
connected worker, its CPU and its statements
over an idle window with every worker connected (both should be nothing: a connected,
quiet worker costs no timer and no SQL), and runs/s when M queued manual runs of the
workers' type are dispatched across all of them (64 slots), from the first call to the
last run saved (the wait for the coalesced refresh that finds them is left out, as in
``bench throughput``).

**standby** -- two daemons against one database over TCP, each through its own relay
(``bench/relay.py``, a host's network path): the leader is killed (``SIGKILL``) and the
time until the standby logs ``ready`` is taken; then the leader's host is cut off (its
relay drops every connection, as PostgreSQL's TCP keepalive eventually would) and the
same is taken. Five samples each.

**failover** -- a primary and a streaming replica (``pg_basebackup -R``); the daemon's DSN
names both hosts with ``target_session_attrs=read-write`` (what a client of Patroni or a
managed service's failover does by DNS). An interval job runs every second; the primary
is stopped (``immediate``) and the replica promoted: reported are the seconds from the
promotion until the daemon runs the job again, and what it logged meanwhile.

    python -m bench hosts [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import ssl
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from coordinator.embedded import Cluster, free_port

from . import common
from .jobs import NAMESPACE, insert_jobs
from .relay import Relay

TOKEN = "bench-fleet-token-" + "f" * 24


# --------------------------------------------------------------------------- workers


class _Fleet:
    """N raw-protocol workers in this process."""

    def __init__(self) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.calls = 0
        self.first_call_at: float | None = None

    async def connect(self, name: str, opener: Any) -> None:
        reader, writer = await opener()
        hello = {"v": 1, "type": "hello", "worker": name, "types": ["noop"], "capacity": 1,
                 "token": TOKEN}  # fmt: skip
        writer.write(json.dumps(hello).encode() + b"\n")
        await writer.drain()
        line = await reader.readline()
        if json.loads(line).get("type") != "welcome":
            raise RuntimeError(f"{name}: {line!r}")
        self.writers.append(writer)
        self.tasks.append(asyncio.create_task(self._serve(reader, writer)))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            message = json.loads(line)
            if message.get("type") == "call":
                if self.first_call_at is None:
                    self.first_call_at = time.perf_counter()
                self.calls += 1
                result = {"v": 1, "type": "result", "run": message["run"], "ok": True}
                writer.write(json.dumps(result).encode() + b"\n")

    async def close(self) -> None:
        for writer in self.writers:
            writer.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    import trustme  # a test dependency: pip install -e '.[test]'

    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    cert, key, ca_file = directory / "server.pem", directory / "server.key", directory / "ca.pem"
    server.cert_chain_pems[0].write_to_path(str(cert))
    server.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    return cert, key, ca_file


async def _workers(bench: common.BenchCluster, *, quick: bool) -> dict[str, Any]:
    n = 200 if quick else 1000
    runs = 1000 if quick else 5000
    common.banner(f"hosts/workers: {n} workers on one daemon ({n // 2} Unix, {n // 2} TLS)")
    db = await bench.create_database("workers")
    conn = await bench.connect(db)
    try:
        await insert_jobs(conn, "manual-worker", runs, prefix="w-")
    finally:
        await conn.close()
    cert, key, ca_file = _certificates(bench.tmp)
    socket_path = Path(tempfile.mkdtemp(prefix="cw-")) / "w.sock"
    tokens = {"fleet": {"hash": common.hash_token(TOKEN), "namespaces": [NAMESPACE],
                        "types": ["noop"]}}  # fmt: skip
    config = bench.tmp / "empty.toml"
    config.write_text("")
    daemon = common.DaemonProcess(
        bench.dsn(db, user=common.DAEMON_ROLE),
        state_dir=bench.tmp / "workers-state",
        args=("--concurrency", "64"),
        env={
            "COORDINATOR_CONFIG": str(config),
            "COORDINATOR_WORKER_SOCKET": str(socket_path),
            "COORDINATOR_WORKER_LISTEN": "0.0.0.0:0",
            "COORDINATOR_WORKER_TLS_CERT": str(cert),
            "COORDINATOR_WORKER_TLS_KEY": str(key),
            "COORDINATOR_WORKER_TOKENS": json.dumps(tokens),
        },
        passive=True,
    )
    fleet = _Fleet()
    await daemon.start()
    try:
        _, listening = await daemon.wait_event("worker.listening")
        port = int(listening["tcp"].rsplit(":", 1)[1])
        await daemon.wait_event("ready")
        await asyncio.sleep(1.0)
        rss_before = daemon.memory()["VmRSS"]
        client_tls = ssl.create_default_context(cafile=str(ca_file))

        async def unix() -> Any:
            return await asyncio.open_unix_connection(str(socket_path), limit=1 << 20)

        async def tls() -> Any:
            return await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_tls, server_hostname="localhost", limit=1 << 20
            )

        # At most 50 connecting at once: a fleet comes up host by host, not in one
        # millisecond (and the Unix socket's listen backlog is 128).
        gate = asyncio.Semaphore(50)

        async def connect(name: str, opener: Any) -> None:
            async with gate:
                await fleet.connect(name, opener)

        timings = {}
        for label, opener in (("unix", unix), ("tls", tls)):
            t0 = time.perf_counter()
            await asyncio.gather(*(connect(f"{label}-{i}", opener) for i in range(n // 2)))
            timings[label] = time.perf_counter() - t0
            common.note(f"{n // 2} {label} workers welcomed in {timings[label]:.2f} s")
        # The connections' wakes ask for one coalesced refresh (refresh_spacing after the
        # last): the idle window starts once it is done.
        connected_at = time.time()
        await daemon.wait_event(
            "refresh", timeout=60, where=lambda e: e.get("_received", 0) > connected_at
        )
        await asyncio.sleep(1.0)
        rss_after = daemon.memory()["VmRSS"]

        # Idle with every worker connected: CPU and statements over a window.
        window = 10.0 if quick else 30.0
        cpu0 = sum(daemon.cpu()[k] for k in ("user", "system"))
        start = bench.log_offset()
        await asyncio.sleep(window)
        cpu_idle = sum(daemon.cpu()[k] for k in ("user", "system")) - cpu0
        idle_statements, _sql = common.count_statements(
            bench.between(start, bench.log_offset()), app=common.APP_DAEMON, db=db
        )
        common.note(
            f"idle {window:.0f} s with {len(fleet.writers)} workers: {cpu_idle:.3f} CPU s, "
            f"{idle_statements} statements"
        )

        # Dispatch: queue one run per job, all at once (one statement, so one coalesced
        # refresh finds them: timed from the first call, as bench throughput does).
        conn = await bench.connect(db)
        try:
            calls0 = fleet.calls
            fleet.first_call_at = None
            await conn.execute(
                "INSERT INTO coordinator.runs (job_id, trigger, status) "
                "SELECT id, 'manual', 'queued' FROM coordinator.jobs"
            )
            while fleet.calls - calls0 < runs:
                await asyncio.sleep(0.02)
            while await conn.fetchval(
                "SELECT count(*) FROM coordinator.runs WHERE status <> 'succeeded'"
            ):
                await asyncio.sleep(0.02)
            assert fleet.first_call_at is not None
            elapsed = time.perf_counter() - fleet.first_call_at
        finally:
            await conn.close()
        common.note(f"{runs} runs across {len(fleet.writers)} workers: {runs / elapsed:.0f} runs/s")
    finally:
        await fleet.close()
        await daemon.stop()
        shutil.rmtree(socket_path.parent, ignore_errors=True)
    return {
        "workers": n,
        "connect_s": timings,
        "rss_kb_before": rss_before,
        "rss_kb_after": rss_after,
        "rss_kb_per_worker": (rss_after - rss_before) / n,
        "idle_window_s": window,
        "idle_cpu_s": cpu_idle,
        "idle_statements": idle_statements,
        "runs": runs,
        "runs_per_s": runs / elapsed,
    }


# --------------------------------------------------------------------------- standby


async def _standby(bench: common.BenchCluster, *, quick: bool) -> dict[str, Any]:
    samples = 3 if quick else 5
    common.banner(f"hosts/standby: two daemons over TCP, each through its own relay "
                  f"({samples} samples per way of losing the leader)")  # fmt: skip
    db = await bench.create_database("standby")
    config = bench.tmp / "empty.toml"
    config.write_text("")
    target = ("127.0.0.1", bench.port)
    out: dict[str, list[float]] = {"kill": [], "cut": []}
    for i in range(samples):
        for way in ("kill", "cut"):
            relays = [Relay(target=target), Relay(target=target)]
            daemons = [
                common.DaemonProcess(
                    relay.dsn(bench.dsn(db)),
                    state_dir=bench.tmp / f"standby-{i}-{way}-{n}",
                    env={
                        "COORDINATOR_CONFIG": str(config),
                        "COORDINATOR_WORKER_SOCKET": str(bench.tmp / f"s{i}{way}{n}.sock"),
                    },
                )
                for n, relay in enumerate(relays)
            ]
            try:
                await daemons[0].start()
                await daemons[0].wait_event("ready")
                await daemons[1].start()
                await daemons[1].wait_event("standby")
                await asyncio.sleep(0.5)
                t0 = time.perf_counter()
                if way == "kill":
                    assert daemons[0].proc is not None
                    daemons[0].proc.kill()
                else:
                    relays[0].cut()
                await daemons[1].wait_event("ready")
                out[way].append(time.perf_counter() - t0)
            finally:
                for d in daemons:
                    await d.stop(timeout=10)
                for relay in relays:
                    relay.close()
        common.note(f"sample {i + 1}: kill {out['kill'][-1] * 1000:.0f} ms, "
                    f"cut {out['cut'][-1] * 1000:.0f} ms")  # fmt: skip
    return {
        "samples": out,
        "kill_ms_median": statistics.median(out["kill"]) * 1000,
        "cut_ms_median": statistics.median(out["cut"]) * 1000,
    }


# --------------------------------------------------------------------------- failover


def _as_server_user(cluster: Cluster, *argv: str) -> None:
    cmd = [str(cluster.bin_dir / argv[0]), *argv[1:]]
    if cluster.user is not None:
        cmd = ["runuser", "-u", cluster.user, "--", *cmd]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)


async def _failover(*, quick: bool) -> dict[str, Any]:
    samples = 1 if quick else 3
    common.banner(f"hosts/failover: primary stopped, replica promoted ({samples} samples)")
    results = []
    for i in range(samples):
        results.append(await _failover_once(i))
        r = results[-1]
        common.note(
            f"sample {i + 1}: promoted -> next run {r['promoted_to_run_s']:.2f} s "
            f"(primary stopped -> promoted {r['stopped_to_promoted_s']:.2f} s)"
        )
    return {
        "samples": results,
        "promoted_to_run_s_median": statistics.median(r["promoted_to_run_s"] for r in results),
    }


async def _failover_once(index: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"coordinator-bench-failover-{index}-"))
    os.chmod(tmp, 0o755)
    settings = {"wal_level": "replica", "max_wal_senders": "4", "hot_standby": "on",
                "log_min_messages": "warning"}  # fmt: skip
    primary = Cluster(root=tmp / "primary", port=free_port(), settings=settings)
    replica = Cluster(root=tmp / "replica", port=free_port(), settings=settings)
    daemon: common.DaemonProcess | None = None
    try:
        await asyncio.to_thread(primary.init)
        (primary.data_dir / "pg_hba.conf").open("a").write(
            "host replication all 127.0.0.1/32 trust\n"
        )
        await asyncio.to_thread(primary.start)
        replica.root.mkdir(parents=True)
        replica.socket_dir.mkdir()
        if replica.user is not None:
            shutil.chown(replica.root, replica.user)
            shutil.chown(replica.socket_dir, replica.user)
        await asyncio.to_thread(
            _as_server_user, replica, "pg_basebackup", "-D", str(replica.data_dir), "-R",
            "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres", "-X", "stream",
        )  # fmt: skip
        await asyncio.to_thread(replica.start)
        dsn = (
            f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{replica.port}/postgres"
            "?target_session_attrs=read-write"
        )
        proc = await asyncio.create_subprocess_exec(
            str(common.COORDINATOR_BIN), "migrate", "--dsn", primary.dsn("postgres"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await proc.communicate()
        if proc.returncode:
            raise RuntimeError(out.decode())
        ticks = tmp / "ticks.txt"
        define = await asyncio.create_subprocess_exec(
            str(common.COORDINATOR_BIN), "jobs", "define", "tick", "--every", "1s",
            "--dsn", primary.dsn("postgres"), "--", "sh", "-c", f"date +%s.%N >> {ticks}",
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        await define.communicate()
        config = tmp / "empty.toml"
        config.write_text("")
        daemon = common.DaemonProcess(
            dsn, state_dir=tmp / "state",
            env={"COORDINATOR_CONFIG": str(config),
                 "COORDINATOR_WORKER_SOCKET": str(tmp / "w.sock")},
        )  # fmt: skip
        await daemon.start()
        await daemon.wait_event("ready")
        runs_before = len(daemon.named("job.run"))
        while len(daemon.named("job.run")) < runs_before + 3:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        since = len(daemon.events)
        stopped_at = time.time()
        await asyncio.to_thread(primary.stop, "immediate")
        await asyncio.sleep(1.0)  # a failover manager decides (Patroni: its TTL)
        await asyncio.to_thread(_as_server_user, replica, "pg_ctl", "-D", str(replica.data_dir),
                                "-w", "promote")  # fmt: skip
        promoted_at = time.time()
        _, first = await daemon.wait_event(
            "job.run", since=since, timeout=120, where=lambda e: e.get("_received", 0) > promoted_at
        )
        logged = sorted(
            {e["event"] for e in daemon.events[since:] if e.get("_received", 0) > stopped_at}
        )
        return {
            "stopped_to_promoted_s": promoted_at - stopped_at,
            "promoted_to_run_s": first["_received"] - promoted_at,
            "events_meanwhile": logged,
        }
    finally:
        if daemon is not None:
            await daemon.stop(timeout=20)
        for cluster in (replica, primary):
            with contextlib.suppress(Exception):
                await asyncio.to_thread(cluster.stop, "immediate")
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- all


def summary_table(
    workers: dict[str, Any], standby: dict[str, Any], failover: dict[str, Any]
) -> str:
    """The headline table (printed, and kept in the result for bench/README.md)."""
    rows = [
        ["workers connected (half Unix, half TLS)", workers["workers"]],
        ["connect and welcome, Unix / TLS (s)",
         f"{workers['connect_s']['unix']:.2f} / {workers['connect_s']['tls']:.2f}"],
        ["daemon memory per connected worker (KiB)", f"{workers['rss_kb_per_worker']:.1f}"],
        [f"idle {workers['idle_window_s']:.0f} s with all connected: CPU s / statements",
         f"{workers['idle_cpu_s']:.3f} / {workers['idle_statements']}"],
        [f"{workers['runs']} runs across them, 64 slots (runs/s)", round(workers["runs_per_s"])],
        ["standby takeover after SIGKILL of the leader, median (ms)",
         round(standby["kill_ms_median"])],
        ["standby takeover after the leader's host is cut off, median (ms)",
         round(standby["cut_ms_median"])],
        ["PostgreSQL failover: promotion -> next run, median (s)",
         f"{failover['promoted_to_run_s_median']:.2f}"],
    ]  # fmt: skip
    return common.table(["what", "figure"], rows)


async def run(*, quick: bool = False) -> dict[str, Any]:
    async with common.BenchCluster("hosts") as bench:
        workers = await _workers(bench, quick=quick)
        standby = await _standby(bench, quick=quick)
        machine = common.machine_info(bench.server_version)
    failover = await _failover(quick=quick)
    table = summary_table(workers, standby, failover)
    print(table)
    return {"machine": machine, "workers": workers, "standby": standby, "failover": failover,
            "table": table}  # fmt: skip
