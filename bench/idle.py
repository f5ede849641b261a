"""Idle silence: what an idle daemon sends to PostgreSQL.

For each scenario (a job set written with plain SQL before the daemon starts): time to
``ready``, the statements of startup, then every statement over the idle window, counted
from the server log by application name (``coordinator``: the daemon's sessions) and
cross-checked with ``pg_stat_statements`` filtered by the daemon's dedicated role. The
daemon's CPU time and context switches over the window show whether the process itself
sleeps.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from . import common
from .common import APP_CLI, APP_DAEMON, DAEMON_ROLE, BenchCluster, DaemonProcess
from .jobs import insert_jobs

SCENARIOS: list[tuple[str, list[tuple[str, int]]]] = [
    ("no jobs", []),
    ("10k far-future cron", [("cron", 10_000)]),
    ("10k manual-only", [("manual", 10_000)]),
    ("1k paused", [("paused", 1_000)]),
    ("1k invalid cron", [("invalid", 1_000)]),
    ("1k worker target, no worker", [("worker", 1_000)]),
    (
        "all together",
        [
            ("cron", 10_000),
            ("manual", 10_000),
            ("paused", 1_000),
            ("invalid", 1_000),
            ("worker", 1_000),
        ],
    ),
]


async def run_idle_daemon(
    bc: BenchCluster,
    db: str,
    *,
    window: float,
    state_dir: Any,
    label: str,
    ready_timeout: float = 600.0,
) -> dict[str, Any]:
    """Start a daemon on ``db`` (already populated), wait for ``ready``, then watch an
    idle window. Returns the raw figures."""
    startup_offset = bc.log_offset()
    await bc.pgss_reset()
    daemon = DaemonProcess(
        bc.dsn(db, user=DAEMON_ROLE), state_dir=state_dir, log_path=state_dir / "daemon.log"
    )
    await daemon.start()
    try:
        _, ready = await daemon.wait_event("ready", timeout=ready_timeout)
        # The idle window starts at `ready`: everything logged before is startup.
        ready_offset = bc.log_offset()
        cpu0, sw0, t0 = daemon.cpu(), daemon.switches(), time.monotonic()
        ready_s = ready["_received"] - daemon.spawned_at
        refresh = daemon.named("refresh")
        startup_log = bc.between(startup_offset, ready_offset)
        startup_daemon, startup_sql = common.count_statements(startup_log, app=APP_DAEMON, db=db)
        startup_cli, _ = common.count_statements(startup_log, app=APP_CLI, db=db)
        # (pg_stat_statements is read and reset a few ms after `ready`; the log is exact.)
        startup_pgss = sum(r["calls"] for r in await bc.pgss(db=db, role=DAEMON_ROLE))
        await bc.pgss_reset()
        events_before = len(daemon.events)
        await asyncio.sleep(window - (time.monotonic() - t0))
        cpu1, sw1, t1 = daemon.cpu(), daemon.switches(), time.monotonic()
        end_offset = bc.log_offset()
        elapsed = t1 - t0
        idle_statements = bc.between(ready_offset, end_offset).statements(db=db)
        idle_daemon = [s for s in idle_statements if s.app == APP_DAEMON]
        others = [s for s in idle_statements if s.app not in (common.APP_BENCH,)]
        idle_pgss_rows = await bc.pgss(db=db, role=DAEMON_ROLE)
        idle_pgss = sum(r["calls"] for r in idle_pgss_rows)
        memory = daemon.memory()
        events_in_window = [
            {k: v for k, v in e.items() if k != "_received"} for e in daemon.events[events_before:]
        ]
    finally:
        exit_code = await daemon.stop()
    # /proc counts CPU time in clock ticks (10 ms here): round away float noise.
    cpu_ms = max(0.0, round((cpu1["user"] + cpu1["system"] - cpu0["user"] - cpu0["system"]) * 1000))
    return {
        "scenario": label,
        "database": db,
        "ready_s": ready_s,
        "ready_event": {k: v for k, v in ready.items() if k != "_received"},
        "refresh_ms": refresh[0].get("elapsed_ms") if refresh else None,
        "refresh_event": {k: v for k, v in refresh[0].items() if k != "_received"}
        if refresh
        else None,
        "startup_statements_daemon": startup_daemon,
        "startup_statements_cli": startup_cli,
        "startup_statements_pgss_role": startup_pgss,
        "startup_sql": startup_sql,
        "window_s": elapsed,
        "idle_statements_log": len(idle_daemon),
        "idle_statements_log_all_apps": len(others),
        "idle_statements_pgss_role": idle_pgss,
        "idle_statements_per_hour": len(idle_daemon) * 3600 / elapsed,
        "idle_sql": [{"app": s.app, "sql": s.sql} for s in others],
        "idle_raw_lines": bc.raw_lines(ready_offset, end_offset, db=db)[:200] if others else [],
        "idle_pgss": idle_pgss_rows,
        "idle_cpu_ms": cpu_ms,
        "idle_context_switches": sw1 - sw0,
        "idle_events": events_in_window,
        "rss_kb": memory.get("VmRSS"),
        "peak_rss_kb": memory.get("VmHWM"),
        "exit_code": exit_code,
    }


async def run(*, quick: bool, window: float | None = None) -> dict[str, Any]:
    if window is None:
        window = 30.0 if quick else 180.0
    results: list[dict[str, Any]] = []
    common.banner(f"idle: {len(SCENARIOS)} scenarios, {window:.0f} s idle window each")
    async with BenchCluster("idle") as bc:
        for i, (label, kinds) in enumerate(SCENARIOS):
            db = await bc.create_database(f"idle_{i}")
            conn = await bc.connect(db)
            try:
                for kind, count in kinds:
                    await insert_jobs(conn, kind, count)
                total = await conn.fetchval("SELECT count(*) FROM coordinator.jobs")
            finally:
                await conn.close()
            common.note(f"{label}: {total} jobs, starting the daemon")
            result = await run_idle_daemon(
                bc, db, window=window, state_dir=bc.tmp / f"state-{i}", label=label
            )
            result["jobs"] = total
            results.append(result)
            common.note(
                f"{label}: ready in {result['ready_s']:.2f} s, startup "
                f"{result['startup_statements_daemon']} statements, idle "
                f"{result['idle_statements_log']} (log) / {result['idle_statements_pgss_role']} "
                f"(pg_stat_statements)"
            )
            for item in result["idle_sql"]:
                common.note(f"  IDLE STATEMENT [{item['app']}]: {item['sql']}")
        server_version = bc.server_version
    headers = [
        "scenario",
        "jobs",
        "ready s",
        "refresh ms",
        "startup stmts (daemon+cli)",
        "idle stmts (log)",
        "idle stmts (pgss)",
        "stmts/hour",
        "idle CPU ms (10 ms ticks)",
        "ctx switches",
    ]
    rows = [
        [
            r["scenario"],
            r["jobs"],
            r["ready_s"],
            r["refresh_ms"],
            f"{r['startup_statements_daemon']}+{r['startup_statements_cli']}",
            r["idle_statements_log"],
            r["idle_statements_pgss_role"],
            r["idle_statements_per_hour"],
            r["idle_cpu_ms"],
            r["idle_context_switches"],
        ]
        for r in results
    ]
    text = common.table(headers, rows)
    print()
    print(f"idle silence ({window:.0f} s window per scenario)")
    print(text, flush=True)
    return {
        "benchmark": "idle",
        "quick": quick,
        "window_s": window,
        "machine": common.machine_info(server_version),
        "server_settings": common.SERVER_SETTINGS,
        "table": text,
        "results": results,
    }
