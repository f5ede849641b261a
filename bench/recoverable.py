"""Recoverable runs: what checkpoints and findings cost, and what a crash replays.

* **Checkpoint writes**: one recoverable run whose worker sends checkpoints as fast as
  its connection takes them for N seconds. Counted from the server log: the daemon's
  ``coordinator._checkpoint`` statements (its only statement per write), checkpoints per
  write, writes per second; from ``pg_stat_statements``: server time per write.
* **Findings**: one run reporting F distinct findings (100 before each checkpoint):
  statements that carried them, findings per statement, server time per finding.
* **Replay after SIGKILL**: a worker checkpointing every 10 ms; the daemon is killed
  (SIGKILL) after a while, K times (each next daemon pauses the run at start, the bench
  triggers it again: the same run resumes). Per kill: the saved cursor (``runs.cursor``)
  against the last checkpoint the worker had sent, in items and in seconds (kill time
  minus the send time of the saved cursor), next to the daemon's checkpoint interval
  (2 s).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import statistics
import time
from typing import TYPE_CHECKING, Any

from . import common
from .common import APP_DAEMON, DAEMON_ROLE, BenchCluster, DaemonProcess

if TYPE_CHECKING:
    from pathlib import Path

#: The worker executor's checkpoint_interval (coordinator/executors/worker.py).
CHECKPOINT_INTERVAL = 2.0


async def _start(bc: BenchCluster, db: str, name: str) -> tuple[DaemonProcess, Path]:
    socket_path = bc.tmp / "scan.sock"
    daemon = DaemonProcess(
        bc.dsn(db, user=DAEMON_ROLE),
        state_dir=bc.tmp / name,
        env={"COORDINATOR_WORKER_SOCKET": str(socket_path)},
    )
    await daemon.start()
    await daemon.wait_event("ready", timeout=60)
    return daemon, socket_path


async def _worker(socket_path: Path) -> Any:
    return await asyncio.create_subprocess_exec(
        str(common.COORDINATOR_BIN),
        "worker",
        "bench.scan_worker:worker",
        "--socket",
        str(socket_path),
        "--log-level",
        "warning",
        cwd=str(common.REPO),
        env={**os.environ, "PYTHONPATH": str(common.REPO)},
    )


async def _define(conn: Any, name: str, params: dict[str, Any]) -> int:
    job_id: int = await conn.fetchval(
        "SELECT coordinator.define_job(name => $1, schedule_kind => 'manual', "
        'target => \'{"kind": "worker", "type": "scan"}\', params => $2::text::jsonb, '
        "recoverable => true)",
        name,
        json.dumps(params),
    )
    return job_id


async def _pgss(bc: BenchCluster, db: str, function: str) -> dict[str, float]:
    """Calls of ``coordinator.<function>...`` (``_settle`` covers ``_settle_many``) by the
    daemon's role, and their server time."""
    conn = await bc.connect("bench")
    try:
        row = await conn.fetchrow(
            """
            SELECT sum(s.calls) AS calls, sum(s.total_exec_time) AS ms
              FROM pg_stat_statements s
              JOIN pg_roles r ON r.oid = s.userid
              JOIN pg_database d ON d.oid = s.dbid
             WHERE r.rolname = $1 AND d.datname = $2 AND s.query LIKE $3
            """,
            DAEMON_ROLE,
            db,
            f"%coordinator.{function}%(%",
        )
    finally:
        await conn.close()
    return {"calls": float(row["calls"] or 0), "ms": float(row["ms"] or 0)}


async def _one_run(bc: BenchCluster, db: str, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Run job ``name`` once under a fresh daemon; count its statements."""
    conn = await bc.connect(db)
    daemon, socket_path = await _start(bc, db, f"state-{name}")
    worker = await _worker(socket_path)
    try:
        await daemon.wait_event(
            "wake", timeout=30, where=lambda e: e.get("reason") == "workers.changed"
        )
        await _define(conn, name, params)
        await bc.pgss_reset()
        start = bc.log_offset()
        run_id = await conn.fetchval("SELECT coordinator.trigger('default', $1)", name)
        _, finished = await daemon.wait_event(
            "job.run", timeout=params["seconds"] + 60, where=lambda e: e.get("run") == run_id
        )
        await asyncio.sleep(0.5)  # the server log catches up
        log = bc.between(start, bc.log_offset())
        statements = log.statements(app=APP_DAEMON, db=db)
        pgss = await _pgss(bc, db, "_checkpoint")
        settle = await _pgss(bc, db, "_settle")
        row = await conn.fetchrow(
            "SELECT status, count, extra::text AS extra, finding_counts::text AS counts "
            "FROM coordinator.runs WHERE id = $1",
            run_id,
        )
    finally:
        worker.terminate()
        await worker.wait()
        await daemon.stop()
        await conn.close()
    extra = json.loads(row["extra"] or "{}")
    writes = [s for s in statements if "coordinator._checkpoint(" in s.sql]
    return {
        "status": row["status"],
        "outcome": finished["outcome"],
        "checkpoints_sent": extra.get("checkpoints_sent"),
        "seconds": extra.get("seconds"),
        "count": row["count"],
        "finding_counts": json.loads(row["counts"] or "{}"),
        "checkpoint_statements": len(writes),
        "daemon_statements": len(statements),
        "daemon_statement_kinds": sorted({s.sql.split("(")[0][:60] for s in statements}),
        "pgss_calls": pgss["calls"],
        "pgss_ms": pgss["ms"],
        "settle_ms": settle["ms"],
    }


async def _replay(bc: BenchCluster, db: str, kills: int) -> list[dict[str, Any]]:
    conn = await bc.connect(db)
    log_path = bc.tmp / "replay.log"
    await _define(conn, "replay", {"pace": 0.01, "seconds": 3600, "log": str(log_path)})
    rounds: list[dict[str, Any]] = []
    worker = None
    run_id = None
    try:
        for i in range(kills + 1):
            daemon, socket_path = await _start(bc, db, f"state-replay-{i}")
            if worker is None:
                worker = await _worker(socket_path)  # it reconnects to each next daemon
            await daemon.wait_event(
                "worker.connected", timeout=60, where=lambda e: e.get("worker") == "bench-scan"
            )
            triggered = await conn.fetchval("SELECT coordinator.trigger('default', 'replay')")
            assert run_id is None or triggered == run_id, (run_id, triggered)
            run_id = triggered
            if i == kills:
                # (The trigger queued it; pausing a queued run would pause it unclaimed.)
                while (
                    await conn.fetchval("SELECT status FROM coordinator.runs WHERE id = $1", run_id)
                    != "running"
                ):
                    await asyncio.sleep(0.05)
                await conn.execute("SELECT coordinator.pause_run($1)", run_id)
                await daemon.wait_event("job.run", where=lambda e, r=run_id: e.get("run") == r)
                await daemon.stop()
                break
            await asyncio.sleep(random.uniform(3.0, 6.0))
            assert daemon.proc is not None
            daemon.proc.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            await daemon.proc.wait()
            await asyncio.sleep(0.3)  # the worker's last lines reach its log
            sent = [
                (int(c), float(t))
                for c, t in (line.split() for line in log_path.read_text().splitlines())
            ]
            before = [(c, t) for c, t in sent if t <= killed_at]
            saved = await conn.fetchval("SELECT cursor::text FROM coordinator.runs WHERE id = $1",
                                        run_id)  # fmt: skip
            saved_cursor = int(saved)
            last_cursor, last_at = before[-1]
            saved_at = next(t for c, t in before if c == saved_cursor)
            rounds.append(
                {
                    "saved_cursor": saved_cursor,
                    "last_sent_cursor": last_cursor,
                    "replayed_items": last_cursor - saved_cursor,
                    "replay_window_s": killed_at - saved_at,
                    "last_sent_before_kill_s": killed_at - last_at,
                }
            )
    finally:
        if worker is not None:
            worker.terminate()
            await worker.wait()
        await conn.close()
    return rounds


async def run(*, quick: bool) -> dict[str, Any]:
    seconds = 5.0 if quick else 15.0
    findings_seconds = 3.0 if quick else 10.0
    kills = 3 if quick else 8
    common.banner(
        f"recoverable: checkpoint writes ({seconds:g} s), findings ({findings_seconds:g} s), "
        f"replay after SIGKILL x{kills}"
    )
    async with BenchCluster("recoverable") as bc:
        db = await bc.create_database("recoverable")
        rate = await _one_run(bc, db, "rate", {"pace": 0, "seconds": seconds})
        common.note(f"checkpoints: {rate}")
        found = await _one_run(
            bc, db, "findings", {"pace": 0, "seconds": findings_seconds, "findings": 100}
        )
        common.note(f"findings: {found}")
        replay = await _replay(bc, db, kills)
        server_version = bc.server_version
    sent, writes = rate["checkpoints_sent"] or 0, rate["checkpoint_statements"]
    findings = sum(found["finding_counts"].values())
    windows = [r["replay_window_s"] for r in replay]
    items = [r["replayed_items"] for r in replay]
    text = common.table(
        ["measure", "value"],
        [
            ["checkpoints sent by the worker", sent],
            ["  in seconds", rate["seconds"]],
            ["checkpoint writes (coordinator._checkpoint statements)", writes],
            ["  writes per second", writes / rate["seconds"] if rate["seconds"] else None],
            ["  checkpoints per write", sent / writes if writes else None],
            ["  statements per write", 1],
            ["  server time per write (ms, pg_stat_statements)",
             rate["pgss_ms"] / rate["pgss_calls"] if rate["pgss_calls"] else None],
            ["daemon statements in the run, all kinds", rate["daemon_statements"]],
            ["findings recorded (distinct)", findings],
            ["  findings reported per checkpoint", 100],
            ["  checkpoint writes that carried them (at most 1,000 each)",
             found["checkpoint_statements"]],
            ["  ... plus the settlement (what was left at the result)", 1],
            ["  findings per statement", findings / (found["checkpoint_statements"] + 1)],
            ["  server time per finding (ms, writes + settlement)",
             (found["pgss_ms"] + found["settle_ms"]) / findings if findings else None],
            ["replay after SIGKILL: kills", len(replay)],
            ["  replayed items (10 ms each): median / max",
             f"{statistics.median(items):g} / {max(items)}" if items else "-"],
            ["  replay window (s): median / max",
             f"{statistics.median(windows):.2f} / {max(windows):.2f}" if windows else "-"],
            ["  checkpoint interval (s)", CHECKPOINT_INTERVAL],
        ],
    )  # fmt: skip
    print()
    print(text, flush=True)
    return {
        "benchmark": "recoverable",
        "quick": quick,
        "machine": common.machine_info(server_version),
        "table": text,
        "checkpoints": rate,
        "findings": found,
        "replay": replay,
        "checkpoint_interval_s": CHECKPOINT_INTERVAL,
    }
