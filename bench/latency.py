"""Wake latency: commit of ``SELECT coordinator.trigger(...)`` -> the call starts.

The bench triggers one manual job at a time (each sample its own job, so no sample waits
for another's run), records its wall clock right after the COMMIT returns (autocommit:
the statement's response comes after the commit), waits for the daemon's ``job.run``
event, pauses 5-20 ms, and goes on. Afterwards it reads each run's ``started_at``: the
exec executor's wall clock just before it spawns the command. So the figure is
notification delivery + admission + the claim (one statement and its commit) + executor
start-up, and **excludes** process spawn. With the no-op SDK worker
(``bench/noop_worker.py``) the handler reports its own clock, so the first row measures
trigger commit -> the worker's code running.

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
            "SELECT id, status, claimed_at, started_at, extra->>'handler_started' AS handler "
            "FROM coordinator.runs WHERE id = ANY($1)",
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
        if row["handler"] is not None:  # the no-op worker reports when its code ran
            s["commit_to_handler_ms"] = (float(row["handler"]) - s["t_commit"]) * 1000
            s["sent_to_handler_ms"] = (float(row["handler"]) - s["t_before"]) * 1000
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
        **(
            {
                key: common.summary([s[key] for s in measured])
                for key in ("commit_to_handler_ms", "sent_to_handler_ms")
            }
            if all("commit_to_handler_ms" in s for s in measured)
            else {}
        ),
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
    ("commit_to_handler_ms", "COMMIT returned -> worker handler runs"),
    ("commit_to_start_ms", "COMMIT returned -> call start"),
    ("sent_to_start_ms", "trigger sent -> call start"),
    ("commit_to_claim_ms", "COMMIT returned -> claim tx start"),
    ("trigger_round_trip_ms", "trigger round trip (client)"),
)

HEADERS = ["system", "interval (ms)", "n", "p50", "p90", "p99", "max", "mean"]


async def run(*, quick: bool) -> dict[str, Any]:
    n = 200 if quick else 1000
    common.banner(
        f"latency: {n} samples (+{WARMUP} warm-up) each, a no-op SDK worker and exec `true`"
    )
    results: dict[str, dict[str, Any]] = {}
    async with BenchCluster("latency") as bc:
        db = await bc.create_database("latency")
        conn = await bc.connect(db)
        try:
            await insert_jobs(conn, "manual-worker", n + WARMUP, prefix="worker-")
            await insert_jobs(conn, "manual", n + WARMUP, prefix="exec-")
        finally:
            await conn.close()
        for target in ("worker", "exec"):
            socket_path = bc.tmp / f"w-{target}.sock"
            daemon = DaemonProcess(
                bc.dsn(db, user=DAEMON_ROLE),
                state_dir=bc.tmp / f"state-{target}",
                env={"COORDINATOR_WORKER_SOCKET": str(socket_path)},
            )
            await daemon.start()
            worker = None
            try:
                await daemon.wait_event("ready", timeout=120)
                if target == "worker":
                    worker = await common.start_noop_worker(daemon, socket_path)
                await bc.make_wal_segments()
                results[target] = await measure(bc, db, daemon, n=n, prefix=f"{target}-")
            finally:
                if worker is not None:
                    worker.terminate()
                    await worker.wait()
                await daemon.stop()
        server_version = bc.server_version
    text = common.table(
        HEADERS,
        rows_for("coordinator (no-op SDK worker)", results["worker"])
        + rows_for("coordinator (exec `true`)", results["exec"]),
    )
    print()
    print(
        f"wake latency, {n} samples each; daemon statements per run: "
        + ", ".join(
            f"{t} {r['daemon_statements_per_run']:.2f} ({r['statuses']})"
            for t, r in results.items()
        )
    )
    print(text, flush=True)
    return {
        "benchmark": "latency",
        "quick": quick,
        "measures": (
            "bench wall clock right after the trigger's COMMIT returned -> (worker) the no-op "
            "handler's own clock when it ran, reported in extra; -> (both) runs.started_at "
            "(the executor's clock when it sent the call / just before spawning the command)."
        ),
        "machine": common.machine_info(server_version),
        "server_settings": common.SERVER_SETTINGS,
        "table": text,
        "results": results["exec"],
        "results_worker": results["worker"],
    }
