"""Retention prune: throughput of a large backlog, and claim latency while it runs.

A fresh database gets ``N`` finished runs (10,000,000; ``--quick`` 500,000) spread over
100 jobs, all 60 days old (plus a VACUUM ANALYZE, as an old table would have), and one
manual job, ``probe``. The daemon (``coordinator run``, as a process) is started with
``prune_at = "* * * * *"``: the prune falls due at the next minute, like any deadline.
From start to the end of the prune, the bench triggers ``probe`` over and over (one at a
time: trigger, wait for its ``job.run``, pause 20 ms) and reads each run's
``claimed_at - created_at`` afterwards: the server's clock at the trigger's transaction
and at the claim's, so the figure is notification + admission + the claim statement,
measured on one clock. Samples are split into those triggered before the prune started
(baseline) and during it.

The prune's own figures come from its ``retention.pruned`` event: runs deleted,
batches, elapsed time; throughput is runs / elapsed, the pauses between batches included
(the daemon yields as long as each batch took: about half the wall time is spent
yielding).
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

from . import common
from .common import DAEMON_ROLE, BenchCluster, DaemonProcess

JOBS = 100


async def seed(conn: Any, n: int) -> float:
    began = time.monotonic()
    await conn.execute(
        "INSERT INTO coordinator.jobs (name, schedule_kind, target)"
        ' SELECT \'old-\' || g, \'manual\', \'{"kind": "exec", "argv": ["true"]}\''
        " FROM generate_series(1, $1) g",
        JOBS,
    )
    per_job = n // JOBS
    for chunk in range(0, JOBS, 10):
        await conn.execute(
            "INSERT INTO coordinator.runs (job_id, trigger, status, created_at, started_at,"
            " finished_at)"
            " SELECT j.id, 'schedule', 'succeeded', t, t, t"
            "   FROM coordinator.jobs j,"
            "        LATERAL (SELECT now() - interval '60 days' - g * interval '1 second' AS t"
            "                   FROM generate_series(1, $1) g) s"
            "  WHERE j.name LIKE 'old-%' AND j.id > $2 AND j.id <= $3",
            per_job,
            chunk,
            chunk + 10,
        )
    await conn.execute(
        "INSERT INTO coordinator.jobs (name, schedule_kind, target, keep_last)"
        ' VALUES (\'probe\', \'manual\', \'{"kind": "exec", "argv": ["true"]}\', 1000000)'
    )
    await conn.execute("VACUUM ANALYZE coordinator.runs")
    await conn.execute("VACUUM ANALYZE coordinator.jobs")
    return time.monotonic() - began


async def probe(
    bc: BenchCluster, db: str, daemon: DaemonProcess, stop: asyncio.Event
) -> list[dict[str, Any]]:
    conn = await bc.connect(db)
    samples: list[dict[str, Any]] = []
    try:
        trigger = await conn.prepare("SELECT coordinator.trigger('default', 'probe')")
        while not stop.is_set():
            since = len(daemon.events)
            t0 = time.time()
            run_id = await trigger.fetchval()
            t1 = time.time()
            await daemon.wait_event(
                "job.run", since=since, timeout=120, where=lambda e, r=run_id: e.get("run") == r
            )
            samples.append({"run": run_id, "t_before": t0, "t_commit": t1})
            await asyncio.sleep(0.02)
        rows = await conn.fetch(
            "SELECT id, created_at, claimed_at FROM coordinator.runs WHERE id = ANY($1)",
            [s["run"] for s in samples],
        )
    finally:
        await conn.close()
    by_id = {r["id"]: r for r in rows}
    for s in samples:
        row = by_id[s["run"]]
        s["created_at"] = row["created_at"].timestamp()
        s["claim_ms"] = (row["claimed_at"] - row["created_at"]).total_seconds() * 1000
        s["commit_to_claim_ms"] = (row["claimed_at"].timestamp() - s["t_commit"]) * 1000
    return samples


async def run(*, quick: bool) -> dict[str, Any]:
    n = 500_000 if quick else 10_000_000
    common.banner(f"prune: {n:,} runs 60 days old over {JOBS} jobs, probe claims meanwhile")
    async with BenchCluster("prune") as bc:
        db = await bc.create_database("prune")
        conn = await bc.connect(db)
        try:
            seeded_s = await seed(conn, n)
            size = await conn.fetchval("SELECT pg_total_relation_size('coordinator.runs')")
        finally:
            await conn.close()
        common.note(f"seeded in {seeded_s:.0f} s; runs table {size / 2**20:.0f} MiB")
        daemon = DaemonProcess(
            bc.dsn(db, user=DAEMON_ROLE),
            state_dir=bc.tmp / "state",
            env={
                "COORDINATOR_PRUNE_AT": "* * * * *",
                "COORDINATOR_WORKER_SOCKET": str(bc.tmp / "w.sock"),
            },
        )
        await daemon.start()
        stop = asyncio.Event()
        try:
            await daemon.wait_event("ready", timeout=120)
            prober = asyncio.create_task(probe(bc, db, daemon, stop))
            _, event = await daemon.wait_event("retention.pruned", timeout=7200)
            stop.set()
            samples = await prober
        finally:
            stop.set()
            await daemon.stop()
        conn = await bc.connect(db)
        try:
            left = await conn.fetchval("SELECT count(*) FROM coordinator.runs")
        finally:
            await conn.close()
        server_version = bc.server_version
    ended = datetime.fromisoformat(event["ts"]).timestamp()
    began = ended - event["elapsed_ms"] / 1000
    during = [s for s in samples if began <= s["created_at"] <= ended]
    before = [s for s in samples if s["created_at"] < began]
    rate = event["runs"] / (event["elapsed_ms"] / 1000)
    rows = [
        ["runs deleted", f"{event['runs']:,}"],
        ["batches", event["batches"]],
        ["prune wall time (s)", common.fmt(event["elapsed_ms"] / 1000, 1)],
        ["throughput (runs/s, pauses included)", f"{rate:,.0f}"],
        ["runs left", left],
    ]
    latency_rows = []
    for label, group in (("before the prune", before), ("during the prune", during)):
        if not group:
            continue
        s = common.summary([x["claim_ms"] for x in group])
        latency_rows.append([label, s["n"], s["p50"], s["p90"], s["p99"], s["max"]])
    text = (
        common.table(["prune", ""], rows)
        + "\n\n"
        + common.table(
            ["trigger -> claim (ms, server clock)", "n", "p50", "p90", "p99", "max"], latency_rows
        )
    )
    print()
    print(text, flush=True)
    return {
        "benchmark": "prune",
        "quick": quick,
        "measures": (
            "retention.pruned's runs/elapsed (pauses between batches included); probe runs' "
            "claimed_at - created_at (server clock) before and during the prune"
        ),
        "machine": common.machine_info(server_version),
        "server_settings": common.SERVER_SETTINGS,
        "backlog": n,
        "jobs": JOBS,
        "seed_s": round(seeded_s, 1),
        "runs_table_bytes": size,
        "pruned": event,
        "runs_per_s": round(rate),
        "runs_left": left,
        "claim_ms_before": common.summary([x["claim_ms"] for x in before]) if before else None,
        "claim_ms_during": common.summary([x["claim_ms"] for x in during]) if during else None,
        "longest_claim_ms_during": max((x["claim_ms"] for x in during), default=None),
        "table": text,
        "samples": samples,
    }
