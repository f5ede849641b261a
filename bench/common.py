"""Shared machinery of the benchmarks.

* :class:`BenchCluster`: a private PostgreSQL (``coordinator.embedded.Cluster``) logging
  every statement (``log_statement=all``; the log line prefix carries the application
  and database names) with ``pg_stat_statements`` loaded, plus helpers to make migrated
  databases and to count what a role or an application sent.
* :class:`DaemonProcess`: ``coordinator run --log-format json`` as a subprocess; its JSON
  event lines are collected so a benchmark can wait for ``ready``, ``refresh``,
  ``job.run``...; its CPU time and memory come from ``/proc``.
* Machine information, percentiles, tables and the result files.

Statement counts come from PostgreSQL's own accounting, never from the daemon:
``coordinator.embedded.StatementLog`` parses the server log, and ``pg_stat_statements``
(filtered by the daemon's dedicated role) cross-checks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from coordinator.embedded import Cluster, StatementLog, free_port

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
#: The console script of the environment running the bench.
COORDINATOR_BIN = Path(sys.executable).with_name("coordinator")

#: The role the daemon connects as (pg_stat_statements has no application column, so the
#: cross-check filters by role). Superuser only for simplicity: the daemon needs no more
#: than the schema's privileges.
DAEMON_ROLE = "coordinator_daemon"
#: application_name of the daemon's sessions and of the CLI (see coordinator/db.py).
APP_DAEMON = "coordinator"
APP_CLI = "coordinator-cli"
#: application_name of the bench's own sessions (excluded from every count).
APP_BENCH = "bench"

#: Server settings of every bench cluster. Durability settings are PostgreSQL's defaults
#: (fsync, synchronous_commit on): a commit costs what it costs in production.
SERVER_SETTINGS: dict[str, str] = {
    "log_statement": "all",
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "top",
    "pg_stat_statements.track_utility": "on",
    "max_connections": "200",
    "log_min_messages": "warning",
    # Autovacuum/analyze happen in server processes (no client statements), but keep
    # them from stealing a core in the middle of a latency run.
    "autovacuum_naptime": "60s",
}


# --------------------------------------------------------------------------- cluster


class BenchCluster:
    """One throwaway cluster for one benchmark."""

    def __init__(self, name: str, *, settings: dict[str, str] | None = None) -> None:
        self.name = name
        self.tmp = Path(tempfile.mkdtemp(prefix=f"coordinator-bench-{name}-"))
        os.chmod(self.tmp, 0o755)
        self.settings = {**SERVER_SETTINGS, **(settings or {})}
        self.cluster = Cluster(root=self.tmp / "pg", port=free_port(), settings=self.settings)
        self.log = StatementLog(self.cluster.log_path)
        self.admin: asyncpg.Connection | None = None
        self.server_version = ""
        self._segments = 0

    async def __aenter__(self) -> BenchCluster:
        await asyncio.to_thread(self.cluster.init)
        await asyncio.to_thread(self.cluster.start)
        self.admin = await self.connect("postgres")
        self.server_version = await self.admin.fetchval("SHOW server_version")
        await self.admin.execute(f"CREATE ROLE {DAEMON_ROLE} LOGIN SUPERUSER")
        await self.admin.execute("CREATE DATABASE bench")
        conn = await self.connect("bench")
        try:
            await conn.execute("CREATE EXTENSION pg_stat_statements")
        finally:
            await conn.close()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.admin is not None:
            with contextlib.suppress(Exception):
                await self.admin.close()
        await asyncio.to_thread(self.cluster.stop, "immediate")
        if os.environ.get("BENCH_KEEP_TMP"):
            print(f"(kept {self.tmp})", file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    @property
    def port(self) -> int:
        assert self.cluster.port is not None
        return self.cluster.port

    def postmaster_pid(self) -> int:
        """The server's postmaster (first line of ``postmaster.pid``)."""
        return int((self.cluster.data_dir / "postmaster.pid").read_text().split()[0])

    def dsn(self, db: str, *, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{db}"

    async def connect(self, db: str, *, app: str = APP_BENCH, user: str = "postgres") -> Any:
        return await asyncpg.connect(
            self.dsn(db, user=user), server_settings={"application_name": app}
        )

    async def create_database(self, db: str, *, migrate: bool = True) -> str:
        """A database for one scenario, migrated with ``coordinator migrate``."""
        assert self.admin is not None
        await self.admin.execute(f"CREATE DATABASE {db}")
        if migrate:
            proc = await asyncio.create_subprocess_exec(
                str(COORDINATOR_BIN),
                "migrate",
                "--dsn",
                self.dsn(db),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            out, _ = await proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"coordinator migrate failed: {out.decode()}")
        return db

    # -- pg_stat_statements ------------------------------------------------------------

    async def pgss_reset(self) -> None:
        conn = await self.connect("bench")
        try:
            await conn.execute("SELECT pg_stat_statements_reset()")
        finally:
            await conn.close()

    async def pgss(self, *, db: str, role: str) -> list[dict[str, Any]]:
        """Statements ``role`` ran in ``db`` since the last reset (query text, calls)."""
        conn = await self.connect("bench")
        try:
            rows = await conn.fetch(
                """
                SELECT s.query, s.calls
                  FROM pg_stat_statements s
                  JOIN pg_roles r ON r.oid = s.userid
                  JOIN pg_database d ON d.oid = s.dbid
                 WHERE r.rolname = $1 AND d.datname = $2
                 ORDER BY s.calls DESC
                """,
                role,
                db,
            )
        finally:
            await conn.close()
        return [{"query": r["query"], "calls": r["calls"]} for r in rows]

    async def make_wal_segments(self, segments: int = 4) -> None:
        """Have PostgreSQL make its next WAL segments now, before a latency measurement.

        A fresh cluster creates and zero-fills each new 16 MB segment in the commit that
        first needs it: about 10 ms more for that one transaction, which ``peers`` showed
        as one sample's max (coordinator's 78th trigger in every run, the file's creation
        time matching it to the millisecond). A switch after a write moves on to a new
        segment (made here); the checkpoint then keeps the old ones for reuse
        (``min_wal_size``), so the measurement's commits only rename them.
        """
        conn = await self.connect("bench")
        try:
            await conn.execute("CREATE TABLE IF NOT EXISTS bench_wal (x int)")
            for _ in range(segments):
                await conn.execute("INSERT INTO bench_wal VALUES (1)")
                await conn.execute("SELECT pg_switch_wal()")
            await conn.execute("INSERT INTO bench_wal VALUES (1)")
            await conn.execute("CHECKPOINT")
        finally:
            await conn.close()

    # -- the server log ----------------------------------------------------------------

    def log_offset(self) -> int:
        """The server log's current end (a position for :meth:`between`)."""
        return self.cluster.log_path.stat().st_size

    def between(self, start: int, end: int) -> StatementLog:
        """A StatementLog over the log bytes in ``[start, end)`` only (a copy, so that a
        count is not extended by lines written after ``end``)."""
        with self.cluster.log_path.open("rb") as f:
            f.seek(start)
            data = f.read(end - start)
        self._segments += 1
        path = self.tmp / f"log-segment-{self._segments}.log"
        path.write_bytes(data)
        return StatementLog(path)

    def raw_lines(
        self, start: int, end: int, *, app: str | None = None, db: str | None = None
    ) -> list[str]:
        """Raw server-log lines in ``[start, end)`` naming ``app``/``db`` (for quoting in
        a report, with their timestamps; counting is StatementLog's job)."""
        with self.cluster.log_path.open("rb") as f:
            f.seek(start)
            text = f.read(end - start).decode("utf-8", "replace")
        out = []
        for line in text.splitlines():
            if app is not None and f" app={app} " not in line:
                continue
            if db is not None and f" db={db} " not in line:
                continue
            out.append(line)
        return out


def count_statements(
    log: StatementLog, *, app: str | None = None, db: str | None = None
) -> tuple[int, list[str]]:
    """Statements in the log after its mark: (count, their SQL)."""
    found = log.statements(app=app, db=db)
    return len(found), [s.sql for s in found]


def statements_by_app(log: StatementLog, *, db: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in log.statements(db=db):
        counts[s.app] = counts.get(s.app, 0) + 1
    return counts


# --------------------------------------------------------------------------- the daemon


class DaemonExited(RuntimeError):
    pass


class DaemonProcess:
    """``coordinator run --dsn DSN --log-format json`` as a child process.

    By default the bench reads the daemon's event lines as they come. With
    ``passive=True`` they go straight to the log file and are parsed only while the bench
    waits for an event: the throughput benchmark must not spend CPU on a line per run
    beside the daemon it measures.
    """

    def __init__(
        self,
        dsn: str,
        *,
        state_dir: Path,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        passive: bool = False,
    ) -> None:
        self.dsn = dsn
        self.state_dir = state_dir
        self.args = args
        self.env = env
        self.log_path = log_path or state_dir / "daemon.log"
        self.passive = passive
        self._parsed = 0  # bytes of the log file parsed (passive mode)
        self.events: list[dict[str, Any]] = []
        self.proc: asyncio.subprocess.Process | None = None
        self.spawned_at = 0.0
        self._changed = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._eof = False

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(self.env or {})
        self.spawned_at = time.time()
        argv = [str(COORDINATOR_BIN), "run", "--dsn", self.dsn, "--state-dir",
                str(self.state_dir), "--log-format", "json", *self.args]  # fmt: skip
        if self.passive:
            with self.log_path.open("ab") as log:
                self.proc = await asyncio.create_subprocess_exec(
                    *argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env
                )
            return
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            limit=1 << 20,
        )
        self._reader = asyncio.create_task(self._read())

    def _catch_up(self) -> None:
        """Passive mode: parse the complete lines the daemon has written since last time."""
        with self.log_path.open("rb") as f:
            f.seek(self._parsed)
            data = f.read()
        end = data.rfind(b"\n") + 1
        received = time.time()
        for line in data[:end].splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    record["_received"] = received
                    self.events.append(record)
        self._parsed += end
        if self.proc is not None and self.proc.returncode is not None:
            self._eof = True

    async def _read(self) -> None:
        assert self.proc is not None
        assert self.proc.stderr is not None
        with self.log_path.open("a") as out:
            while True:
                line = await self.proc.stderr.readline()
                if not line:
                    break
                received = time.time()
                text = line.decode("utf-8", "replace")
                out.write(text)
                try:
                    record = json.loads(text)
                except ValueError:
                    record = None
                if isinstance(record, dict):
                    record["_received"] = received
                    self.events.append(record)
                    self._wake()
        self._eof = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-n:])
        except OSError:
            return ""

    async def wait_event(
        self,
        name: str,
        *,
        since: int = 0,
        timeout: float = 60.0,
        where: Any = None,
    ) -> tuple[int, dict[str, Any]]:
        """The first event ``name`` at index >= ``since`` (satisfying ``where``):
        returns (index, record)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        i = since
        while True:
            if self.passive:
                self._catch_up()
            while i < len(self.events):
                record = self.events[i]
                if record.get("event") == name and (where is None or where(record)):
                    return i, record
                i += 1
            if self._eof:
                raise DaemonExited(f"daemon exited before {name!r}:\n{self.tail()}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"no {name!r} event within {timeout}s:\n{self.tail()}")
            if self.passive:
                await asyncio.sleep(min(0.01, remaining))
                continue
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    def named(self, name: str, *, since: int = 0) -> list[dict[str, Any]]:
        if self.passive:
            self._catch_up()
        return [e for e in self.events[since:] if e.get("event") == name]

    async def stop(self, *, timeout: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 5)
        return self.proc.returncode

    # -- /proc -------------------------------------------------------------------------

    def cpu(self) -> dict[str, float]:
        """CPU seconds of the daemon (user, system) and of its reaped children."""
        return proc_cpu(self.pid)

    def memory(self) -> dict[str, int]:
        """VmRSS and VmHWM (peak RSS) in kB."""
        return proc_memory(self.pid)

    def switches(self) -> int:
        """Context switches (voluntary + involuntary) of the daemon's main thread, the one
        the trio loop runs on: every wake-up of the loop shows here. (Summing over all
        threads would go down when a helper thread exits.)"""
        return proc_switches(self.pid)


_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> dict[str, float]:
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state); utime is field 14 -> index 11.
    utime, stime, cutime, cstime = (int(x) / _TICK for x in fields[11:15])
    return {"user": utime, "system": stime, "children_user": cutime, "children_system": cstime}


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy (every CPU, every process: all but
    idle and iowait in ``/proc/stat``): the share of a measured interval that other
    processes took shows how much a shared machine disturbed it."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid``, of its live children and of the children it
    has reaped: for the postmaster, everything the cluster's processes have spent (a
    backend's time moves into the postmaster's reaped-children figures when it exits)."""
    own = proc_cpu(pid)
    total = sum(own.values())
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    for child in children:
        with contextlib.suppress(OSError):
            c = proc_cpu(int(child))
            total += c["user"] + c["system"]
    return total


def proc_memory(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def proc_switches(pid: int) -> int:
    total = 0
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
            total += int(line.split()[1])
    return total


async def start_noop_worker(daemon: DaemonProcess, socket_path: Path, *, capacity: int = 64) -> Any:
    """``coordinator worker bench.noop_worker:worker`` on ``socket_path``, ``capacity``
    calls at once; returns once the daemon has seen it connect (its ``workers.changed``
    wake)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "BENCH_NOOP_CAPACITY": str(capacity)}
    worker = await asyncio.create_subprocess_exec(
        str(COORDINATOR_BIN),
        "worker",
        "bench.noop_worker:worker",
        "--socket",
        str(socket_path),
        "--log-level",
        "warning",
        cwd=str(REPO),
        env=env,
    )
    await daemon.wait_event(
        "wake", timeout=30, where=lambda e: e.get("reason") == "workers.changed"
    )
    return worker


# --------------------------------------------------------------------------- figures


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (q in 0..100)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "min": min(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values),
        "mean": sum(values) / len(values),
    }


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.{digits}f}"
    return str(value)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


# --------------------------------------------------------------------------- results


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git() -> dict[str, Any]:
    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return proc.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def machine_info(server_version: str = "") -> dict[str, Any]:
    uname = platform.uname()
    mem_kb = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_kb = int(line.split()[1])
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_kb": mem_kb,
        "uname": " ".join([uname.system, uname.node, uname.release, uname.version, uname.machine]),
        "python": sys.version.split()[0],
        "postgresql": server_version,
        "packages": {
            name: _version(name)
            for name in ("coordinator", "asyncpg", "trio", "trio-asyncio", "croniter", "attrs")
        },
        "git": _git(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


def hash_token(token: str) -> str:
    """A token's hash as ``worker_tokens``/``admin_tokens`` keep it."""
    from coordinator.tokens import hash_token as _hash

    return _hash(token)


def banner(text: str) -> None:
    print(f"\n== {text}", flush=True)


def note(text: str) -> None:
    print(f"   {text}", flush=True)
