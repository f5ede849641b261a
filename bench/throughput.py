"""Throughput, side by side: coordinator, procrastinate and pgqueuer on one cluster, in one run.

Each system has its own database (and role) on the same cluster and runs alone while it
is measured (the others are stopped); bursts go round-robin over the systems so that a
busy moment of the shared machine does not fall on one system only.

**Bursts.** N no-op jobs (5,000; 1,000 with ``--quick``) are queued while nothing consumes
them, then the consumer starts, with 64 and then 16 slots:

* coordinator: the daemon starts (``--concurrency`` = slots) and finds the queued runs
  in its startup refresh; then the no-op SDK worker (``bench/noop_worker.py``, capacity
  64) connects and the runs are dispatched to it;
* coordinator-ahead: the same with ``claim_ahead`` = slots (opt-in): the worker's
  capacity is the slots, ``--concurrency`` twice that (runs claimed ahead count);
* procrastinate: ``procrastinate worker --concurrency <slots>``, otherwise its defaults;
* pgqueuer: ``pgqueuer.run(max_concurrent_tasks=<slots>, batch_size=min(10, slots // 2))``
  (10 is its default batch; it refuses ``max_concurrent_tasks`` below twice the batch).

*runs/s* = N / (the first handler starts -> the bench sees no job left, polled every
20 ms with a ``LIMIT 1`` query, sequential scans off: coordinator's and procrastinate's
read their index of unfinished jobs; pgqueuer's table holds only unfinished jobs).
*stmts/job*: the system's statements from the server log (coordinator: the daemon's; the
worker sends none; peers: everything in their database but the bench's own sessions)
from the consumer's spawn to the end, per job (start-up included);
pg_stat_statements (by role) is kept in the JSON as a cross-check. *CPU s/1k runs*: user +
system time (``/proc/<pid>/stat``) of the daemon, of the worker process and of the whole
PostgreSQL cluster (less the backend answering the bench's polls) over the same interval
as runs/s (interpolated between the 20 ms samples), per 1,000 runs; and the share of the
machine (``/proc/stat``) that other processes took meanwhile. Before each measurement
the bench waits (up to 60 s) for a second in which the machine is less than 15% busy.

**Steady.** With 64 slots and the consumer running (warmed up by 20 jobs), a load
generator (``bench/peer_apps/load.py``, one process, the same for all three) keeps 4
connections committing one job per transaction flat out for a window (20 s; 5 s with
``--quick``), then the bench waits for the backlog to drain. Reported: triggers/s
committed; completions/s within the window (triggered - growth of the backlog); the
backlog at the end of the window and its slope (least squares over samples every 100 ms);
whether it grows (more than 5% of the window's triggers still waiting at its end);
statements and CPU per job over the window; and latency under that load: the load
generator's clock right after each COMMIT returned -> the handler's own clock when it
started (the no-op handlers report it: coordinator's in the run's ``extra``, the peers'
on their stdout).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import time
from typing import TYPE_CHECKING, Any

from . import common
from .common import APP_BENCH, APP_DAEMON, DAEMON_ROLE, BenchCluster, DaemonProcess
from .jobs import insert_jobs
from .peers import PEER_APPS, Peer, ensure_peers_venv, peer_python

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

SYSTEMS = ("coordinator", "coordinator-ahead", "procrastinate", "pgqueuer")
PEERS = ("procrastinate", "pgqueuer")
SLOTS = (64, 16)
STEADY_SLOTS = 64
CONNECTIONS = 4
WARMUP = 20
BURST_POLL = 0.02
STEADY_POLL = 0.1
#: coordinator's steady load triggers a different manual job each time (one outstanding
#: run per job): this many jobs per second of window are created beforehand.
STEADY_JOBS_PER_S = 5000
#: The backlog "grows" when more than this share of the window's jobs still wait at its end.
GROWS = 0.05
#: Before each measurement the bench waits up to QUIET_WAIT s for a second in which the
#: machine (shared with other work) is less than QUIET busy.
QUIET = 0.15
QUIET_WAIT = 60.0

REMAINING = {
    "coordinator": (
        "SELECT count(*) FROM coordinator.runs WHERE status IN ('queued', 'pending', 'running')"
    ),
    "procrastinate": (
        "SELECT count(*) FROM procrastinate_jobs WHERE status = ANY (ARRAY["
        "'todo'::procrastinate_job_status, 'doing'::procrastinate_job_status])"
    ),
    # pgqueuer deletes a finished job from its queue table (and logs it).
    "pgqueuer": "SELECT count(*) FROM pgqueuer WHERE status IN ('queued', 'picked')",
}


def _any_left(system: str) -> str:
    """1 while any job is left, else 0: what a burst polls (cheaper than a count)."""
    return f"SELECT count(*) FROM ({REMAINING[system].replace('count(*)', '1', 1)} LIMIT 1) s"


# --------------------------------------------------------------------------- sampling


class Sampler:
    """Polls the jobs left (one cheap count) and the watched processes' CPU time."""

    def __init__(self, conn: Any, sql: str, interval: float) -> None:
        self.conn = conn
        self.sql = sql
        self.interval = interval
        #: Processes whose CPU time is sampled: the bench itself always (its share is
        #: not the system's, nor a stranger's).
        self.pids: dict[str, int] = {"bench": os.getpid()}
        self.postmaster: int | None = None
        #: (wall time, jobs left, {process: cumulative CPU seconds})
        self.samples: list[tuple[float, int, dict[str, float]]] = []
        self._task: asyncio.Task[None] | None = None
        self._new = asyncio.Event()

    def watch(self, name: str, pid: int) -> None:
        self.pids[name] = pid

    def watch_server(self, postmaster: int) -> None:
        self.postmaster = postmaster

    async def __aenter__(self) -> Sampler:
        # The backend answering the polls: its CPU is the bench's, not the system's.
        self.watch("poll", await self.conn.fetchval("SELECT pg_backend_pid()"))
        # Each system's poll is meant to read its index of unfinished jobs. On tables of
        # a few thousand rows the planner prefers a sequential scan, which reads every
        # finished job too: coordinator's burst poll then took 1.3 ms after the first
        # burst and 4.2 ms after the third (5,000 more finished runs each), 50 times a
        # second, on the two CPUs the system under test needs (its later bursts were the
        # slower ones). With sequential scans off the polls are index scans whose cost
        # does not grow with the finished jobs (the burst poll's LIMIT 1 stays under
        # 0.15 ms); a table with no such index is still scanned. DISCARD PLANS: a statement
        # this session prepared before (the steady poll's count is first run to check the
        # queue) keeps its plan across a SET until its plans are dropped.
        await self.conn.execute("SET enable_seqscan = off; DISCARD PLANS")
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self.conn.execute("RESET enable_seqscan; DISCARD PLANS")

    async def _run(self) -> None:
        while True:
            t = time.time()
            left = await self.conn.fetchval(self.sql)
            cpu: dict[str, float] = {"machine": common.machine_busy()}
            if self.postmaster is not None:
                cpu["server"] = common.tree_cpu(self.postmaster)
            for name, pid in self.pids.items():
                with contextlib.suppress(OSError):
                    c = common.proc_cpu(pid)
                    cpu[name] = c["user"] + c["system"]
            self.samples.append((t, left, cpu))
            self._new.set()
            self._new = asyncio.Event()
            await asyncio.sleep(self.interval)

    async def wait_for(self, predicate: Callable[[int], bool], *, timeout: float) -> float | None:
        """The time of the first sample taken after this call whose count satisfies
        ``predicate``; None after ``timeout`` seconds."""
        start = time.time()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        i = len(self.samples)
        while True:
            while i < len(self.samples):
                t, left, _ = self.samples[i]
                if t >= start and predicate(left):
                    return t
                i += 1
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), remaining)

    def left_at(self, t: float) -> float:
        return _interpolate([(s[0], float(s[1])) for s in self.samples], t)

    def cpu_at(self, name: str, t: float) -> float:
        return _interpolate([(s[0], s[2][name]) for s in self.samples if name in s[2]], t)

    def slope(self, start: float, end: float) -> float | None:
        """Least-squares slope (jobs/s) of the jobs left over [start, end]."""
        points = [(t, float(left)) for t, left, _ in self.samples if start <= t <= end]
        if len(points) < 3:
            return None
        mt = statistics.fmean(p[0] for p in points)
        ml = statistics.fmean(p[1] for p in points)
        den = sum((p[0] - mt) ** 2 for p in points)
        return sum((p[0] - mt) * (p[1] - ml) for p in points) / den if den else None


def _interpolate(points: list[tuple[float, float]], t: float) -> float:
    if not points:
        return float("nan")
    if t <= points[0][0]:
        return points[0][1]
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return points[-1][1]


# --------------------------------------------------------------------------- systems


async def run_load(
    env: dict[str, str], *args: str, sampler: Sampler | None = None
) -> dict[str, Any]:
    """``bench/peer_apps/load.py ARGS`` in the peers' venv; its last stdout line (JSON)."""
    proc = await asyncio.create_subprocess_exec(
        str(peer_python()),
        "load.py",
        *args,
        env=env,
        cwd=str(PEER_APPS),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    if sampler is not None:
        sampler.watch("load", proc.pid)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"load.py {' '.join(args)} failed:\n{err.decode()[-3000:]}")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


class System:
    """What the bench needs of one system: queue jobs, start and stop its consumer,
    find its statements, and when each handler started."""

    #: The label of its results.
    name = ""
    #: Which system it is (its queries and its load): ``name`` but for a variant.
    kind = ""
    db = ""
    role = ""

    def load_env(self) -> dict[str, str]:
        raise NotImplementedError

    async def start(self, slots: int, sampler: Sampler) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    def statements(self, log: Any) -> list[Any]:
        raise NotImplementedError

    async def burst_first_start(self, conn: Any) -> float:
        raise NotImplementedError

    async def handler_starts(self, conn: Any, samples: list[dict[str, Any]]) -> dict[int, float]:
        """seq -> handler start (wall clock) for the load generator's samples."""
        raise NotImplementedError

    async def queue(self, n: int, first: int) -> None:
        await run_load(self.load_env(), self.kind, "burst", str(n), str(first))


class Coordinator(System):
    name = kind = "coordinator"
    role = DAEMON_ROLE

    #: Runs claimed ahead of the worker's free slots (:class:`CoordinatorAhead`).
    ahead = False

    def __init__(self, bc: BenchCluster, db: str) -> None:
        self.bc = bc
        self.db = db
        self.daemon: DaemonProcess | None = None
        self.worker: Any = None
        self.starts = 0
        self.last_run_id = 0

    def load_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("VIRTUAL_ENV", None)
        env["BENCH_PEER_DSN"] = self.bc.dsn(self.db) + f"?application_name={APP_BENCH}"
        return env

    async def prepare(self, *, burst: int, steady: int) -> None:
        conn = await self.bc.connect(self.db)
        try:
            await insert_jobs(conn, "manual-worker", max(burst, WARMUP), prefix="b-")
            await insert_jobs(conn, "manual-worker", steady, prefix="s-")
        finally:
            await conn.close()

    async def queue(self, n: int, first: int) -> None:
        conn = await self.bc.connect(self.db)
        try:
            self.last_run_id = await conn.fetchval(
                "SELECT coalesce(max(id), 0) FROM coordinator.runs"
            )
        finally:
            await conn.close()
        await super().queue(n, first)

    async def start(self, slots: int, sampler: Sampler) -> None:
        self.starts += 1
        socket_path = self.bc.tmp / f"{self.name}-w{self.starts}.sock"
        self.daemon = DaemonProcess(
            self.bc.dsn(self.db, user=DAEMON_ROLE),
            state_dir=self.bc.tmp / f"{self.name}-state-{self.starts}",
            args=("--concurrency", str(slots * (2 if self.ahead else 1))),
            # (COORDINATOR_CLAIM_AHEAD only when used: a daemon older than the setting
            # refuses it, and the bench also runs against older commits.)
            env={"COORDINATOR_WORKER_SOCKET": str(socket_path)}
            | ({"COORDINATOR_CLAIM_AHEAD": str(slots)} if self.ahead else {}),
            passive=True,
        )
        await self.daemon.start()
        sampler.watch("daemon", self.daemon.pid)
        await self.daemon.wait_event("ready", timeout=120)
        self.worker = await common.start_noop_worker(
            self.daemon, socket_path, capacity=slots if self.ahead else 64
        )
        sampler.watch("worker", self.worker.pid)

    async def stop(self) -> None:
        if self.worker is not None:
            with contextlib.suppress(ProcessLookupError):
                self.worker.terminate()
            await self.worker.wait()
            self.worker = None
        if self.daemon is not None:
            await self.daemon.stop()

    def statements(self, log: Any) -> list[Any]:
        return list(log.statements(app=APP_DAEMON, db=self.db))

    async def burst_first_start(self, conn: Any) -> float:
        value = await conn.fetchval(
            "SELECT min((extra->>'handler_started')::float8) FROM coordinator.runs WHERE id > $1",
            self.last_run_id,
        )
        return float(value)

    async def handler_starts(self, conn: Any, samples: list[dict[str, Any]]) -> dict[int, float]:
        by_run = {s["run"]: s["seq"] for s in samples}
        rows = await conn.fetch(
            "SELECT id, (extra->>'handler_started')::float8 AS t FROM coordinator.runs "
            "WHERE id = ANY($1::bigint[]) AND extra ? 'handler_started'",
            list(by_run),
        )
        return {by_run[r["id"]]: r["t"] for r in rows}


class CoordinatorAhead(Coordinator):
    """The same daemon with ``claim_ahead`` (an opt-in setting) = slots: the worker takes
    ``slots`` calls at once (its capacity), and as many runs again may be claimed while
    they run, each started as a slot frees (``--concurrency`` 2 x slots: runs claimed
    ahead count against it). Shares coordinator's database: the systems run one at a
    time."""

    name = "coordinator-ahead"
    ahead = True

    async def prepare(self, *, burst: int, steady: int) -> None:
        """Nothing: coordinator's jobs serve it too."""


class PeerSystem(System):
    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.name = self.kind = peer.system
        self.db = peer.db
        self.role = peer.role
        self.proc: asyncio.subprocess.Process | None = None
        self.out: Path | None = None
        self.starts = 0

    def _env(self) -> dict[str, str]:
        env = self.peer.env()
        env["BENCH_PERIODIC"] = "0"
        return env

    def load_env(self) -> dict[str, str]:
        env = self._env()
        dsn = self.peer.bc.dsn(self.db, user=self.role) + f"?application_name={APP_BENCH}"
        env["BENCH_PEER_DSN"] = env["PGDSN"] = dsn
        return env

    async def start(self, slots: int, sampler: Sampler) -> None:
        self.starts += 1
        env = self._env()
        argv = self.peer.worker_argv()
        if self.name == "procrastinate":
            argv += ["--concurrency", str(slots)]
        else:
            env["BENCH_WORKER_OPTIONS"] = json.dumps(
                {"max_concurrent_tasks": slots, "batch_size": min(10, slots // 2)}
            )
        self.out = self.peer.bc.tmp / f"{self.db}-worker-{self.starts}.out"
        err = self.peer.bc.tmp / f"{self.db}-worker-{self.starts}.log"
        with self.out.open("wb") as stdout, err.open("wb") as stderr:
            self.proc = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                cwd=str(PEER_APPS),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )
        sampler.watch("worker", self.proc.pid)

    async def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                await self.proc.wait()
        self.proc = None

    def statements(self, log: Any) -> list[Any]:
        return [s for s in log.statements(db=self.db) if s.app != APP_BENCH]

    def _records(self) -> dict[int, float]:
        assert self.out is not None
        starts: dict[int, float] = {}
        for line in self.out.read_text().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and "seq" in record:
                    starts[int(record["seq"])] = float(record["t"])
        return starts

    async def burst_first_start(self, conn: Any) -> float:
        return min(self._records().values())

    async def handler_starts(self, conn: Any, samples: list[dict[str, Any]]) -> dict[int, float]:
        return self._records()


# --------------------------------------------------------------------------- measures


def _cpu(sampler: Sampler, start: float, end: float) -> dict[str, float]:
    """CPU seconds over [start, end] of each watched process; ``server`` is the cluster
    without the backend answering the bench's polls (``poll``)."""
    names = [*sampler.pids, *(["server"] if sampler.postmaster is not None else [])]
    cpu = {name: sampler.cpu_at(name, end) - sampler.cpu_at(name, start) for name in names}
    if "server" in cpu and "poll" in cpu:
        cpu["server"] -= cpu["poll"]
    return cpu


def _machine(sampler: Sampler, start: float, end: float) -> dict[str, Any]:
    """How busy the whole machine was over [start, end] (share of all its CPUs), and how
    much of it went to processes that are neither the system, the server, the load nor
    the bench: a shared machine's other work shows there."""
    capacity = (end - start) * (os.cpu_count() or 1)
    busy = sampler.cpu_at("machine", end) - sampler.cpu_at("machine", start)
    ours = sum(_cpu(sampler, start, end).values())
    return {
        "busy_share": busy / capacity,
        "others_share": max(0.0, busy - ours) / capacity,
        "loadavg": os.getloadavg(),
    }


def _kinds(statements: list[Any], top: int = 8) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for s in statements:
        key = " ".join(s.sql.split())[:80] or "(empty query string)"
        kinds[key] = kinds.get(key, 0) + 1
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1])[:top])


async def wait_for_quiet(*, busy_below: float = QUIET, longest: float = QUIET_WAIT) -> float:
    """Before a measurement, wait (up to ``longest`` seconds) for a second in which the
    machine's CPUs are less than ``busy_below`` busy: nothing of ours runs between
    measurements, so what is busy then is someone else's. Returns the last second's busy
    share (recorded with the figure)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + longest
    cpus = os.cpu_count() or 1
    while True:
        before = common.machine_busy()
        await asyncio.sleep(1.0)
        share = (common.machine_busy() - before) / cpus
        if share < busy_below or loop.time() >= deadline:
            return share


async def burst(
    bc: BenchCluster, conn: Any, system: System, *, n: int, slots: int
) -> dict[str, Any]:
    await system.queue(n, 1)
    queued = await conn.fetchval(REMAINING[system.kind])
    if queued < n:
        raise RuntimeError(f"{system.name}: {queued} jobs queued, expected {n}")
    quiet = await wait_for_quiet()
    offset = bc.log_offset()
    await bc.pgss_reset()
    async with Sampler(conn, _any_left(system.kind), BURST_POLL) as sampler:
        sampler.watch_server(bc.postmaster_pid())
        t_spawn = time.time()
        try:
            await system.start(slots, sampler)
            t_done = await sampler.wait_for(lambda left: left == 0, timeout=max(120.0, n / 10))
            end = bc.log_offset()
        finally:
            await system.stop()
    if t_done is None:
        raise RuntimeError(f"{system.name}: burst of {n} not done in time")
    t_first = await system.burst_first_start(conn)
    elapsed = t_done - t_first
    statements = system.statements(bc.between(offset, end))
    cpu = _cpu(sampler, t_first, t_done)
    pgss = await bc.pgss(db=system.db, role=system.role)
    return {
        "system": system.name,
        "slots": slots,
        "runs": n,
        "first_start_to_done_s": elapsed,
        "runs_per_s": n / elapsed,
        "spawn_to_done_s": t_done - t_spawn,
        "statements": len(statements),
        "statements_per_job": len(statements) / n,
        "statement_kinds": _kinds(statements),
        "pgss_calls": sum(r["calls"] for r in pgss),
        "cpu_s": cpu,
        "cpu_s_per_1000": {k: v * 1000 / n for k, v in cpu.items()},
        "machine": {**_machine(sampler, t_first, t_done), "busy_before": quiet},
    }


async def steady(
    bc: BenchCluster, conn: Any, system: System, *, seconds: float, limit: int
) -> dict[str, Any]:
    out = bc.tmp / f"steady-{system.name}.jsonl"
    async with Sampler(conn, REMAINING[system.kind], STEADY_POLL) as sampler:
        sampler.watch_server(bc.postmaster_pid())
        try:
            await system.start(STEADY_SLOTS, sampler)
            await system.queue(WARMUP, 1 if system.kind == "coordinator" else 10**9)
            if await sampler.wait_for(lambda left: left == 0, timeout=120) is None:
                raise RuntimeError(f"{system.name}: warm-up jobs not done")
            quiet = await wait_for_quiet()
            offset = bc.log_offset()
            await bc.pgss_reset()
            summary = await run_load(
                system.load_env(),
                system.kind,
                "steady",
                str(seconds),
                str(out),
                str(CONNECTIONS),
                str(limit),
                sampler=sampler,
            )
            end = bc.log_offset()
            drained = await sampler.wait_for(lambda left: left == 0, timeout=max(60.0, seconds * 3))
        finally:
            await system.stop()
    samples = [json.loads(line) for line in out.read_text().splitlines()]
    starts = await system.handler_starts(conn, samples)
    started, ended = summary["started"], summary["ended"]
    window = ended - started
    count = summary["count"]
    left0, left1 = sampler.left_at(started), sampler.left_at(ended)
    completed = count - (left1 - left0)
    statements = system.statements(bc.between(offset, end))
    cpu = _cpu(sampler, started, ended)
    latency = [(starts[s["seq"]] - s["t1"]) * 1000 for s in samples if s["seq"] in starts]
    pgss = await bc.pgss(db=system.db, role=system.role)
    return {
        "system": system.name,
        "slots": STEADY_SLOTS,
        "connections": CONNECTIONS,
        "window_s": window,
        "triggers": count,
        "triggers_per_s": count / window,
        "load": {k: v for k, v in summary.items() if k not in ("started", "ended")},
        "completed_in_window": completed,
        "completions_per_s": completed / window,
        "backlog_start": left0,
        "backlog_end": left1,
        "backlog_slope_per_s": sampler.slope(started, ended),
        "backlog_grows": (left1 - left0) > GROWS * count,
        "drained_after_s": None if drained is None else max(0.0, drained - ended),
        "statements": len(statements),
        "statements_per_job": len(statements) / completed if completed else None,
        "statement_kinds": _kinds(statements),
        "pgss_calls": sum(r["calls"] for r in pgss),
        "cpu_s": cpu,
        "cpu_s_per_1000": {k: v * 1000 / completed for k, v in cpu.items()} if completed else {},
        "machine": {**_machine(sampler, started, ended), "busy_before": quiet},
        "latency_ms": common.summary(latency),
        "latency_missing": count - len(latency),
        "backlog_samples": [
            (round(t - started, 2), left) for t, left, _ in sampler.samples if t >= started
        ],
    }


# --------------------------------------------------------------------------- the run


async def run(*, quick: bool) -> dict[str, Any]:
    n = 1000 if quick else 5000
    reps = 2 if quick else 3
    seconds = 5.0 if quick else 20.0
    common.banner(
        f"throughput: coordinator (as built, and with claim_ahead), procrastinate and "
        f"pgqueuer; bursts of {n} queued jobs "
        f"x {reps} with {' and '.join(map(str, SLOTS))} slots; steady load from "
        f"{CONNECTIONS} connections for {seconds:.0f} s"
    )
    versions = ensure_peers_venv()
    limit = int(STEADY_JOBS_PER_S * seconds)
    bursts: list[dict[str, Any]] = []
    steadies: list[dict[str, Any]] = []
    async with BenchCluster("throughput") as bc:
        coord_db = await bc.create_database("coordinator")
        coordinator = Coordinator(bc, coord_db)
        await coordinator.prepare(burst=n, steady=limit)
        ahead = CoordinatorAhead(bc, coord_db)
        peers = []
        for name in PEERS:
            peer = Peer(label=name, system=name, db=name, bc=bc, config={})
            await peer.prepare()
            peers.append(PeerSystem(peer))
        systems: list[System] = [coordinator, ahead, *peers]
        conns = {s.name: await bc.connect(s.db) for s in systems}
        try:
            for rep in range(reps):
                for slots in SLOTS:
                    for system in systems:
                        r = await burst(bc, conns[system.name], system, n=n, slots=slots)
                        r["rep"] = rep + 1
                        bursts.append(r)
                        common.note(
                            f"burst {rep + 1}, {slots} slots, {system.name}: "
                            f"{r['runs_per_s']:.0f} runs/s, "
                            f"{r['statements_per_job']:.2f} statements/job"
                        )
            for system in systems:
                r = await steady(bc, conns[system.name], system, seconds=seconds, limit=limit)
                steadies.append(r)
                common.note(
                    f"steady, {system.name}: {r['triggers_per_s']:.0f} triggers/s, "
                    f"{r['completions_per_s']:.0f} completions/s, backlog "
                    f"{r['backlog_start']:.0f} -> {r['backlog_end']:.0f}"
                    f"{' (grows)' if r['backlog_grows'] else ''}, latency p50 "
                    f"{r['latency_ms'].get('p50', float('nan')):.1f} ms"
                )
        finally:
            for c in conns.values():
                await c.close()
        server_version = bc.server_version

    tables = _tables(bursts, steadies)
    print()
    for caption, text in tables.values():
        print(caption)
        print(text)
        print(flush=True)
    return {
        "benchmark": "throughput",
        "quick": quick,
        "burst_runs": n,
        "burst_reps": reps,
        "steady_window_s": seconds,
        "machine": {**common.machine_info(server_version), "peer_packages": versions},
        "server_settings": common.SERVER_SETTINGS,
        "table_summary": tables["summary"][1],
        "table_bursts": tables["bursts"][1],
        "table_steady": tables["steady"][1],
        "bursts": bursts,
        "steady": steadies,
    }


def _label(system: str) -> str:
    if system == "coordinator":
        return "coordinator (no-op SDK worker)"
    if system == "coordinator-ahead":
        return "coordinator, claim_ahead = slots (opt-in)"
    return system


def _rate(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:,.0f}"
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def _median(
    rs: list[dict[str, Any]], get: Callable[[dict[str, Any]], float | None]
) -> float | None:
    values = [v for v in map(get, rs) if v is not None]
    return statistics.median(values) if values else None


def _tables(
    bursts: list[dict[str, Any]], steadies: list[dict[str, Any]]
) -> dict[str, tuple[str, str]]:
    def of(system: str, slots: int) -> list[dict[str, Any]]:
        return [b for b in bursts if b["system"] == system and b["slots"] == slots]

    def per_1k(name: str) -> Callable[[dict[str, Any]], float | None]:
        return lambda r: r["cpu_s_per_1000"].get(name)

    def others(r: dict[str, Any]) -> float:
        return float(r["machine"]["others_share"]) * 100

    burst_rows = []
    for system in SYSTEMS:
        for slots in SLOTS:
            rs = of(system, slots)
            if rs:
                burst_rows.append(
                    [
                        _label(system),
                        slots,
                        len(rs),
                        _rate([r["runs_per_s"] for r in rs]),
                        _median(rs, lambda r: r["statements_per_job"]),
                        _median(rs, per_1k("daemon")),
                        _median(rs, per_1k("worker")),
                        _median(rs, per_1k("server")),
                        _median(rs, others),
                        _median(rs, lambda r: r["spawn_to_done_s"]),
                    ]
                )
    steady_rows = []
    for r in steadies:
        lat = r["latency_ms"]
        cpu = r["cpu_s_per_1000"]
        steady_rows.append(
            [
                _label(r["system"]),
                r["triggers_per_s"],
                r["completions_per_s"],
                f"{r['backlog_end']:.0f}" + (" (grows)" if r["backlog_grows"] else ""),
                r["backlog_slope_per_s"],
                r["drained_after_s"],
                r["statements_per_job"],
                cpu.get("daemon"),
                cpu.get("worker"),
                cpu.get("server"),
                others(r),
                lat.get("p50"),
                lat.get("p90"),
                lat.get("p99"),
                lat.get("max"),
            ]
        )
    summary_rows = []
    for system in SYSTEMS:
        st = next((r for r in steadies if r["system"] == system), None)
        b64 = of(system, 64)
        steady_text = "-"
        if st is not None:
            steady_text = (
                f"{st['triggers_per_s']:,.0f} in/s, {st['completions_per_s']:,.0f} done/s, "
                + ("backlog grows" if st["backlog_grows"] else "no backlog")
            )
        summary_rows.append(
            [
                _label(system),
                _rate([r["runs_per_s"] for r in b64]),
                _rate([r["runs_per_s"] for r in of(system, 16)]),
                steady_text,
                _median(b64, lambda r: r["statements_per_job"]),
                _median(
                    b64,
                    lambda r: sum(r["cpu_s_per_1000"].get(k, 0.0) for k in ("daemon", "worker")),
                ),
                _median(b64, per_1k("server")),
                None if st is None else st["latency_ms"].get("p50"),
                None if st is None else st["latency_ms"].get("p99"),
            ]
        )
    return {
        "summary": (
            "side by side (runs/s: median (min-max) over the bursts; stmts and CPU per job: "
            f"bursts with 64 slots; steady: {CONNECTIONS} connections flat out, "
            f"{STEADY_SLOTS} slots)",
            common.table(
                [
                    "system",
                    "burst, 64 slots (runs/s)",
                    "burst, 16 slots (runs/s)",
                    "steady, flat out",
                    "stmts/job",
                    "client CPU s/1k",
                    "server CPU s/1k",
                    "steady p50 ms",
                    "steady p99 ms",
                ],
                summary_rows,
            ),
        ),
        "bursts": (
            "bursts: queued jobs, then the consumer starts (runs/s from the first handler "
            "start; CPU s per 1,000 runs over the same interval; others %: the share of the "
            "machine's CPUs that other processes took meanwhile)",
            common.table(
                [
                    "system",
                    "slots",
                    "bursts",
                    "runs/s",
                    "stmts/job",
                    "daemon CPU s/1k",
                    "worker CPU s/1k",
                    "server CPU s/1k",
                    "others %",
                    "spawn->done s",
                ],
                burst_rows,
            ),
        ),
        "steady": (
            f"steady: {CONNECTIONS} connections commit one job per transaction flat out "
            "(latency ms: COMMIT returned -> handler starts; server CPU includes the load's "
            "own sessions)",
            common.table(
                [
                    "system",
                    "triggers/s",
                    "completions/s",
                    "backlog at end",
                    "backlog slope /s",
                    "drained after s",
                    "stmts/job",
                    "daemon CPU s/1k",
                    "worker CPU s/1k",
                    "server CPU s/1k",
                    "others %",
                    "p50",
                    "p90",
                    "p99",
                    "max",
                ],
                steady_rows,
            ),
        ),
    }
