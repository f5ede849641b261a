"""Lateness: how late a saved deadline's call starts.

1,000 one-shot jobs (``schedule_kind = 'once'``, exec ``true``) whose deadlines are
spread evenly (with jitter) over 60 s, starting 10 s after they are written (before the
daemon starts; it is ready well within those 10 s). Figure:
``runs.started_at`` (the exec executor's wall clock just before it spawns the command)
minus ``runs.scheduled_for`` (the saved deadline the claim consumed). Process spawn is
not included; the timer, the claim (one statement and its commit) and executor start-up
are.
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any

from . import common
from .common import APP_DAEMON, DAEMON_ROLE, BenchCluster, DaemonProcess
from .jobs import insert_once

JOBS = 1000
SPREAD_S = 60.0
LEAD_S = 10.0


async def run(*, quick: bool) -> dict[str, Any]:
    common.banner(f"lateness: {JOBS} one-shot jobs over {SPREAD_S:.0f} s")
    async with BenchCluster("lateness") as bc:
        db = await bc.create_database("lateness")
        start = datetime.now(UTC) + timedelta(seconds=LEAD_S)
        step = SPREAD_S / JOBS
        deadlines = [
            start + timedelta(seconds=i * step + random.uniform(0, step)) for i in range(JOBS)
        ]
        conn = await bc.connect(db)
        # Written before the daemon starts (as saved deadlines); startup's refresh arms them.
        await insert_once(conn, prefix="once-", deadlines=deadlines)
        daemon = DaemonProcess(bc.dsn(db, user=DAEMON_ROLE), state_dir=bc.tmp / "state")
        await daemon.start()
        try:
            await daemon.wait_event("ready", timeout=120)
            refresh = daemon.named("refresh")[0]
            if datetime.now(UTC) > start:
                common.note("WARNING: the daemon was ready after the first deadline")
            try:
                bc.log.mark()
                since = len(daemon.events)
                deadline_wait = LEAD_S + SPREAD_S + 60
                loop = asyncio.get_running_loop()
                end = loop.time() + deadline_wait
                while len(daemon.named("job.run", since=since)) < JOBS and loop.time() < end:
                    await asyncio.sleep(0.5)
                await asyncio.sleep(1.0)  # the last settlements
                daemon_statements = bc.log.statements(app=APP_DAEMON, db=db)
                rows = await conn.fetch(
                    """
                    SELECT r.id, r.status, r.scheduled_for, r.claimed_at, r.started_at
                      FROM coordinator.runs r
                     WHERE r.trigger = 'schedule'
                    """
                )
                pending = await conn.fetchval(
                    "SELECT count(*) FROM coordinator.jobs WHERE next_run_at IS NOT NULL"
                )
            finally:
                await conn.close()
            runs_logged = daemon.named("job.run", since=since)
        finally:
            await daemon.stop()
        server_version = bc.server_version
    lateness = [(r["started_at"] - r["scheduled_for"]).total_seconds() * 1000 for r in rows]
    to_claim = [(r["claimed_at"] - r["scheduled_for"]).total_seconds() * 1000 for r in rows]
    event_lateness = [
        float(e["lateness_ms"]) for e in runs_logged if e.get("lateness_ms") is not None
    ]
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    result = {
        "jobs": JOBS,
        "spread_s": SPREAD_S,
        "runs": len(rows),
        "statuses": statuses,
        "jobs_still_pending": pending,
        "refresh_event": {k: v for k, v in refresh.items() if k != "_received"},
        "lateness_ms": common.summary(lateness),
        "deadline_to_claim_ms": common.summary(to_claim),
        "event_lateness_ms": common.summary(event_lateness),
        "daemon_statements": len(daemon_statements),
        "daemon_statements_per_run": len(daemon_statements) / max(1, len(rows)),
        "samples": [
            {
                "run": r["id"],
                "scheduled_for": r["scheduled_for"].isoformat(),
                "lateness_ms": (r["started_at"] - r["scheduled_for"]).total_seconds() * 1000,
            }
            for r in rows
        ],
    }
    headers = ["interval (ms)", "n", "min", "p50", "p90", "p99", "max", "mean"]
    rows_out = []
    for key, what in (
        ("lateness_ms", "deadline -> call start (runs.started_at)"),
        ("deadline_to_claim_ms", "deadline -> claim tx start (claimed_at)"),
        ("event_lateness_ms", "job.run event lateness_ms"),
    ):
        s = result[key]
        rows_out.append([what, s["n"], s["min"], s["p50"], s["p90"], s["p99"], s["max"], s["mean"]])
    text = common.table(headers, rows_out)
    print()
    print(
        f"lateness, {JOBS} one-shot jobs over {SPREAD_S:.0f} s; run statuses {statuses}; "
        f"daemon statements per run {result['daemon_statements_per_run']:.2f}"
    )
    print(text, flush=True)
    return {
        "benchmark": "lateness",
        "quick": quick,
        "machine": common.machine_info(server_version),
        "server_settings": common.SERVER_SETTINGS,
        "table": text,
        "results": result,
    }
