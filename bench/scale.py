"""Scale: 10,000 / 100,000 / 1,000,000 far-future cron jobs (``--quick``: the first two).

Per size, in a fresh database (jobs written with one INSERT ... SELECT generate_series):

* **cold start**: no deadline saved yet, so the startup refresh computes one per job
  (croniter) and saves them, a batched statement per 25,000 jobs, written while the next
  page of 50,000 is read;
* **warm start**: a restart with every deadline saved (the steady state);
* **wake refresh**: on the warm daemon, one ``NOTIFY coordinator`` from the bench asks for
  a refresh (``--refresh-spacing 1s`` so it is granted at once).

Figures: time to ``ready`` (spawn -> the ``ready`` line), the CPU seconds the daemon and
the PostgreSQL cluster spent until then and how busy the whole machine was (a shared
machine's other work shows there), the ``refresh`` event's ``elapsed_ms``, the daemon's
peak RSS (``VmHWM``), and the daemon's statements (server log): at startup, and for each
wake refresh (one-job: one statement at any size; full: one per 50,000 jobs).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from . import common
from .common import APP_DAEMON, DAEMON_ROLE, BenchCluster, DaemonProcess
from .jobs import insert_jobs


async def _start(bc: BenchCluster, db: str, state: Any, *, timeout: float) -> dict[str, Any]:
    bc.log.mark()
    daemon = DaemonProcess(
        bc.dsn(db, user=DAEMON_ROLE), state_dir=state, args=("--refresh-spacing", "1s")
    )
    busy0, server0 = common.machine_busy(), common.tree_cpu(bc.postmaster_pid())
    await daemon.start()
    try:
        _, ready = await daemon.wait_event("ready", timeout=timeout)
        ready_s = ready["_received"] - daemon.spawned_at
        # Where the time went up to ready (CPU seconds; the machine has cpu_count of them
        # per second): the daemon, the PostgreSQL cluster, and everything (other work on
        # a shared machine included), as a share of the machine.
        cpu = daemon.cpu()
        span = time.time() - daemon.spawned_at
        busy = (common.machine_busy() - busy0) / (span * (os.cpu_count() or 1))
        server_cpu = common.tree_cpu(bc.postmaster_pid()) - server0
        refresh = daemon.named("refresh")[0]
        startup = bc.log.statements(app=APP_DAEMON, db=db)
        mem_ready = daemon.memory()
        out: dict[str, Any] = {
            "ready_s": ready_s,
            "refresh_ms": refresh.get("elapsed_ms"),
            "refresh_event": {k: v for k, v in refresh.items() if k != "_received"},
            "startup_statements": len(startup),
            "startup_sql": [" ".join(s.sql.split())[:80] for s in startup],
            "rss_kb_at_ready": mem_ready.get("VmRSS"),
            "peak_rss_kb_at_ready": mem_ready.get("VmHWM"),
            "daemon_cpu_s_at_ready": cpu["user"] + cpu["system"],
            "server_cpu_s_at_ready": server_cpu,
            "machine_busy_pct": 100 * busy,
        }
        # One wake -> one refresh, counted alone: first a change to one job (the wake
        # names it: the refresh reads that row), then an unnamed one (it reads them all).
        for kind, payload in (
            ("one", None),
            ("full", '{"jobs": "many"}'),
        ):
            await asyncio.sleep(1.5)
            bc.log.mark()
            since = len(daemon.events)
            conn = await bc.connect(db)
            try:
                if payload is None:
                    job = await conn.fetchval("SELECT min(id) FROM coordinator.jobs")
                    payload = json.dumps({"job": job})
                t0 = time.time()
                await conn.execute("SELECT pg_notify('coordinator', $1)", payload)
            finally:
                await conn.close()
            _, wake_refresh = await daemon.wait_event("refresh", since=since, timeout=timeout)
            wake_refresh_seen = wake_refresh["_received"] - t0
            await asyncio.sleep(0.5)
            wake_statements = bc.log.statements(app=APP_DAEMON, db=db)
            prefix = "wake_refresh" if kind == "full" else "one_job_refresh"
            out.update(
                {
                    f"{prefix}_ms": wake_refresh.get("elapsed_ms"),
                    f"{prefix}_seen_s": wake_refresh_seen,
                    f"{prefix}_rows": wake_refresh.get("jobs"),
                    f"{prefix}_statements": len(wake_statements),
                    f"{prefix}_sql": [" ".join(s.sql.split())[:80] for s in wake_statements],
                }
            )
        mem = daemon.memory()
        out.update(peak_rss_kb=mem.get("VmHWM"), rss_kb=mem.get("VmRSS"))
    finally:
        out_code = await daemon.stop(timeout=120)
    out["exit_code"] = out_code
    return out


async def run(*, quick: bool) -> dict[str, Any]:
    sizes = [10_000, 100_000] if quick else [10_000, 100_000, 1_000_000]
    common.banner(f"scale: {', '.join(f'{n:,}' for n in sizes)} far-future cron jobs")
    results: list[dict[str, Any]] = []
    async with BenchCluster("scale") as bc:
        for n in sizes:
            db = await bc.create_database(f"scale_{n}")
            conn = await bc.connect(db)
            try:
                t0 = time.monotonic()
                await insert_jobs(conn, "cron", n)
                await conn.execute("ANALYZE coordinator.jobs")
                insert_s = time.monotonic() - t0
            finally:
                await conn.close()
            timeout = max(120.0, n / 1000)
            for phase in ("cold", "warm"):
                r = await _start(bc, db, bc.tmp / f"state-{n}-{phase}", timeout=timeout)
                r.update(jobs=n, phase=phase, insert_s=insert_s)
                results.append(r)
                common.note(
                    f"{n:,} {phase}: ready {r['ready_s']:.2f} s (daemon "
                    f"{r['daemon_cpu_s_at_ready']:.2f} CPU s, server "
                    f"{r['server_cpu_s_at_ready']:.2f} CPU s, machine "
                    f"{r['machine_busy_pct']:.0f}% busy), refresh {r['refresh_ms']} ms, "
                    f"peak RSS {r['peak_rss_kb'] / 1024:.0f} MB, "
                    f"wake refresh {r['wake_refresh_statements']} statements"
                )
        server_version = bc.server_version
    headers = [
        "jobs",
        "start",
        "ready s",
        "daemon / server CPU s, machine busy %",
        "startup refresh ms",
        "startup stmts",
        "one-job wake refresh ms",
        "full wake refresh ms",
        "stmts per wake refresh",
        "peak RSS MB",
    ]
    rows = [
        [
            r["jobs"],
            r["phase"],
            r["ready_s"],
            f"{r['daemon_cpu_s_at_ready']:.2f} / {r['server_cpu_s_at_ready']:.2f}, "
            f"{r['machine_busy_pct']:.0f}",
            r["refresh_ms"],
            r["startup_statements"],
            r["one_job_refresh_ms"],
            r["wake_refresh_ms"],
            r["wake_refresh_statements"],
            r["peak_rss_kb"] / 1024,
        ]
        for r in results
    ]
    text = common.table(headers, rows)
    print()
    print("scale (cold: no deadline saved yet; warm: restart with deadlines saved)")
    print(text, flush=True)
    return {
        "benchmark": "scale",
        "quick": quick,
        "machine": common.machine_info(server_version),
        "server_settings": common.SERVER_SETTINGS,
        "table": text,
        "results": results,
    }
