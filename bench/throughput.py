"""Throughput and cost per run.

M manual jobs (exec ``true``, then a no-op SDK worker, ``bench/noop_worker.py``) are all
triggered in one statement (one transaction, M dispatch wakes at its commit); the
daemon runs with ``--concurrency`` 16, then 64. Per burst: runs per second (from the
trigger's COMMIT to the moment every run is settled in the table, polled every 20 ms by
the bench), statements per run (the daemon's, from the server log), daemon CPU seconds
per 1,000 runs (``/proc/<pid>/stat`` utime+stime; the commands' own CPU is reported
apart, as the reaped children's).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from . import common
from .common import APP_DAEMON, DAEMON_ROLE, BenchCluster, DaemonProcess
from .jobs import NAMESPACE, insert_jobs

TERMINAL = ("succeeded", "failed", "timed_out", "cancelled")


async def burst(
    bc: BenchCluster, db: str, daemon: DaemonProcess, conn: Any, m: int, prefix: str
) -> dict[str, Any]:
    last = await conn.fetchval("SELECT coalesce(max(id), 0) FROM coordinator.runs")
    bc.log.mark()
    since = len(daemon.events)
    cpu0 = daemon.cpu()
    t0 = time.time()
    await conn.execute(
        "SELECT count(coordinator.trigger($1, $3 || g::text, '{}'::jsonb)) "
        "FROM generate_series(1, $2::integer) AS g",
        NAMESPACE,
        m,
        prefix,
    )
    t_commit = time.time()
    loop = asyncio.get_running_loop()
    end = loop.time() + max(120.0, m / 10)
    done = 0
    while loop.time() < end:
        done = await conn.fetchval(
            "SELECT count(*) FROM coordinator.runs WHERE id > $1 AND status = ANY($2)",
            last,
            list(TERMINAL),
        )
        if done >= m:
            break
        await asyncio.sleep(0.02)
    t_done = time.time()
    cpu1 = daemon.cpu()
    window = await conn.fetchrow(
        """
        SELECT min(claimed_at) AS first_claim, max(finished_at) AS last_finish,
               count(*) FILTER (WHERE status = 'succeeded') AS succeeded
          FROM coordinator.runs WHERE id > $1
        """,
        last,
    )
    statements = bc.log.statements(app=APP_DAEMON, db=db)
    kinds: dict[str, int] = {}
    for s in statements:
        key = " ".join(s.sql.split())[:60]
        kinds[key] = kinds.get(key, 0) + 1
    daemon_cpu = (cpu1["user"] + cpu1["system"]) - (cpu0["user"] + cpu0["system"])
    children_cpu = (cpu1["children_user"] + cpu1["children_system"]) - (
        cpu0["children_user"] + cpu0["children_system"]
    )
    elapsed = t_done - t_commit
    db_span = (window["last_finish"] - window["first_claim"]).total_seconds()
    return {
        "runs": m,
        "settled": done,
        "succeeded": window["succeeded"],
        "trigger_statement_s": t_commit - t0,
        "commit_to_all_settled_s": elapsed,
        "runs_per_s": m / elapsed,
        "first_claim_to_last_finish_s": db_span,
        "runs_per_s_db_span": m / db_span if db_span > 0 else None,
        "daemon_statements": len(statements),
        "statements_per_run": len(statements) / m,
        "statement_kinds": kinds,
        "daemon_cpu_s": daemon_cpu,
        "daemon_cpu_s_per_1000_runs": daemon_cpu * 1000 / m,
        "children_cpu_s_per_1000_runs": children_cpu * 1000 / m,
        "job_run_events": len(daemon.named("job.run", since=since)),
    }


async def run(*, quick: bool) -> dict[str, Any]:
    m = 1000 if quick else 5000
    bursts = 2 if quick else 3
    common.banner(
        f"throughput: bursts of {m} runs, exec `true` and a no-op SDK worker "
        "(capacity 64), concurrency 16 and 64"
    )
    results: list[dict[str, Any]] = []
    async with BenchCluster("throughput") as bc:
        db = await bc.create_database("throughput")
        conn = await bc.connect(db)
        try:
            await insert_jobs(conn, "manual", m, prefix="exec-")
            await insert_jobs(conn, "manual-worker", m, prefix="worker-")
            for target in ("exec", "worker"):
                for concurrency in (16, 64):
                    socket_path = bc.tmp / f"w-{target}-{concurrency}.sock"
                    daemon = DaemonProcess(
                        bc.dsn(db, user=DAEMON_ROLE),
                        state_dir=bc.tmp / f"state-{target}-{concurrency}",
                        args=("--concurrency", str(concurrency)),
                        env={"COORDINATOR_WORKER_SOCKET": str(socket_path)},
                    )
                    await daemon.start()
                    worker = None
                    try:
                        await daemon.wait_event("ready", timeout=120)
                        if target == "worker":
                            worker = await common.start_noop_worker(daemon, socket_path)
                        for b in range(bursts):
                            r = await burst(bc, db, daemon, conn, m, f"{target}-")
                            r.update(target=target, concurrency=concurrency, burst=b + 1)
                            results.append(r)
                            common.note(
                                f"{target} concurrency {concurrency} burst {b + 1}: "
                                f"{r['runs_per_s']:.0f} runs/s, "
                                f"{r['statements_per_run']:.2f} statements/run"
                            )
                            await asyncio.sleep(1.0)
                        rss = daemon.memory()
                        for r in results:
                            if (r["target"], r["concurrency"]) == (target, concurrency):
                                r["peak_rss_kb"] = rss.get("VmHWM")
                    finally:
                        if worker is not None:
                            worker.terminate()
                            await worker.wait()
                        await daemon.stop()
        finally:
            await conn.close()
        server_version = bc.server_version
    headers = [
        "target",
        "slots",
        "burst",
        "runs",
        "runs/s",
        "stmts/run",
        "daemon CPU s/1k runs",
        "children CPU s/1k runs",
        "peak RSS MB",
    ]
    rows = [
        [
            r["target"],
            r["concurrency"],
            r["burst"],
            r["settled"],
            r["runs_per_s"],
            r["statements_per_run"],
            r["daemon_cpu_s_per_1000_runs"],
            r["children_cpu_s_per_1000_runs"],
            (r.get("peak_rss_kb") or 0) / 1024,
        ]
        for r in results
    ]
    text = common.table(headers, rows)
    print()
    print(f"throughput, bursts of {m} manual runs (pool_size 4, the default)")
    print(text, flush=True)
    return {
        "benchmark": "throughput",
        "quick": quick,
        "machine": common.machine_info(server_version),
        "server_settings": common.SERVER_SETTINGS,
        "table": text,
        "results": results,
    }
