"""Wake latency: commit of ``SELECT coordinator.trigger(...)`` -> the call starts.

The bench triggers one manual job at a time (each sample its own job, so no sample waits
for another's run), records its wall clock right after the COMMIT returns (autocommit:
the statement's response comes after the commit), waits for the daemon's ``job.run``
event, pauses 5-20 ms, and goes on. Afterwards it reads each run's ``started_at``: the
exec executor's wall clock just before it spawns the command. So the figure is
notification delivery + admission + the claim (one statement and its commit) + executor
start-up, and **excludes** process spawn. The worker target (an SDK no-op worker, the
issue's intended measurement) does not exist yet; when it lands it gets a variant here.

``claimed_at`` (the claim transaction's ``now()``, server clock, same machine) splits the
figure into "heard and sent the claim" and "claim done, executor started".
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from . import common
from .common import APP_DAEMON, DAEMON_ROLE, BenchCluster, DaemonProcess
from .jobs import NAMESPACE, insert_jobs

WARMUP = 10


async def measure(
    bc: BenchCluster, db: str, daemon: DaemonProcess, *, n: int, prefix: str = "manual-"
) -> dict[str, Any]:
    """``n`` samples (+ WARMUP discarded) against a ready daemon whose database holds
    manual jobs ``{prefix}1 ..``. Returns raw samples and summaries (ms)."""
    conn = await bc.connect(db)
    samples: list[dict[str, Any]] = []
    try:
        stmt = await conn.prepare("SELECT coordinator.trigger($1, $2, '{}'::jsonb)")
        bc.log.mark()
        for i in range(WARMUP + n):
            name = f"{prefix}{i + 1}"
            since = len(daemon.events)
            t0 = time.time()
            run_id = await stmt.fetchval(NAMESPACE, name)
            t1 = time.time()
            await daemon.wait_event(
                "job.run", since=since, timeout=30, where=lambda e, r=run_id: e.get("run") == r
            )
            samples.append({"i": i, "run": run_id, "t_before": t0, "t_commit": t1})
            await asyncio.sleep(random.uniform(0.005, 0.020))
        # Let the last settlement land before counting and reading.
        await asyncio.sleep(0.5)
        daemon_statements = bc.log.statements(app=APP_DAEMON, db=db)
        rows = await conn.fetch(
            "SELECT id, status, claimed_at, started_at FROM coordinator.runs WHERE id = ANY($1)",
            [s["run"] for s in samples],
        )
    finally:
        await conn.close()
    by_id = {r["id"]: r for r in rows}
    for s in samples:
        row = by_id[s["run"]]
        s["status"] = row["status"]
        s["claimed_at"] = row["claimed_at"].timestamp()
        s["started_at"] = row["started_at"].timestamp()
        s["commit_to_start_ms"] = (s["started_at"] - s["t_commit"]) * 1000
        s["sent_to_start_ms"] = (s["started_at"] - s["t_before"]) * 1000
        s["commit_to_claim_ms"] = (s["claimed_at"] - s["t_commit"]) * 1000
        s["trigger_round_trip_ms"] = (s["t_commit"] - s["t_before"]) * 1000
    measured = samples[WARMUP:]
    statuses: dict[str, int] = {}
    for s in measured:
        statuses[s["status"]] = statuses.get(s["status"], 0) + 1
    sql_kinds: dict[str, int] = {}
    for st in daemon_statements:
        key = " ".join(st.sql.split())[:60]
        sql_kinds[key] = sql_kinds.get(key, 0) + 1
    return {
        "n": n,
        "warmup": WARMUP,
        "statuses": statuses,
        "commit_to_start_ms": common.summary([s["commit_to_start_ms"] for s in measured]),
        "sent_to_start_ms": common.summary([s["sent_to_start_ms"] for s in measured]),
        "commit_to_claim_ms": common.summary([s["commit_to_claim_ms"] for s in measured]),
        "trigger_round_trip_ms": common.summary([s["trigger_round_trip_ms"] for s in measured]),
        "warmup_commit_to_start_ms": [s["commit_to_start_ms"] for s in samples[:WARMUP]],
        "daemon_statements": len(daemon_statements),
        "daemon_statements_per_run": len(daemon_statements) / len(samples),
        "daemon_statement_kinds": sql_kinds,
        "samples": samples,
    }


def rows_for(label: str, result: dict[str, Any]) -> list[list[Any]]:
    out = []
    for key, what in INTERVALS:
        if key not in result:
            continue
        s = result[key]
        out.append([label, what, s["n"], s["p50"], s["p90"], s["p99"], s["max"], s["mean"]])
    return out


INTERVALS = (
    ("commit_to_start_ms", "COMMIT returned -> call start"),
    ("sent_to_start_ms", "trigger sent -> call start"),
    ("commit_to_claim_ms", "COMMIT returned -> claim tx start"),
    ("trigger_round_trip_ms", "trigger round trip (client)"),
)

HEADERS = ["system", "interval (ms)", "n", "p50", "p90", "p99", "max", "mean"]


async def run(*, quick: bool) -> dict[str, Any]:
    n = 200 if quick else 1000
    common.banner(f"latency: {n} samples (+{WARMUP} warm-up), exec target `true`")
    async with BenchCluster("latency") as bc:
        db = await bc.create_database("latency")
        conn = await bc.connect(db)
        try:
            await insert_jobs(conn, "manual", n + WARMUP, prefix="manual-")
        finally:
            await conn.close()
        daemon = DaemonProcess(bc.dsn(db, user=DAEMON_ROLE), state_dir=bc.tmp / "state")
        await daemon.start()
        try:
            await daemon.wait_event("ready", timeout=120)
            result = await measure(bc, db, daemon, n=n)
        finally:
            await daemon.stop()
        server_version = bc.server_version
    text = common.table(HEADERS, rows_for("coordinator (exec `true`)", result))
    print()
    print(
        f"wake latency, {n} samples; daemon statements per run: "
        f"{result['daemon_statements_per_run']:.2f}; run statuses: {result['statuses']}"
    )
    print(text, flush=True)
    return {
        "benchmark": "latency",
        "quick": quick,
        "measures": (
            "bench wall clock right after the trigger's COMMIT returned -> runs.started_at "
            "(exec executor's clock just before spawning the command): NOTIFY delivery, "
            "admission, claim statement + commit, executor start-up; excludes process spawn. "
            "Worker-SDK no-op variant: not yet (no worker executor)."
        ),
        "machine": common.machine_info(server_version),
        "server_settings": common.SERVER_SETTINGS,
        "table": text,
        "results": result,
    }
