"""Durability timings: standby takeover and spool replay.

* **Takeover**: a leader and a standby daemon on one database; the leader is killed
  (SIGKILL, as a crash); the time from the kill to the standby's ``ready`` event (the
  standby's lock wait returns when PostgreSQL ends the dead leader's session). N rounds.
* **Spool replay**: R results of runs a dead daemon left ``running`` are written to a spool
  file (fsynced appends, timed), then a daemon starts on it; its ``spool.replayed`` event
  reports how long saving them took, before anything else happens.
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import time
from datetime import UTC, datetime
from typing import Any

from coordinator.model import Outcome
from coordinator.spool import HeldResult, Spool

from . import common
from .common import DAEMON_ROLE, BenchCluster, DaemonProcess


async def takeover(bc: BenchCluster, db: str, rounds: int) -> list[float]:
    seconds: list[float] = []
    for i in range(rounds):
        leader = DaemonProcess(bc.dsn(db, user=DAEMON_ROLE), state_dir=bc.tmp / f"leader{i}")
        standby = DaemonProcess(bc.dsn(db, user=DAEMON_ROLE), state_dir=bc.tmp / f"standby{i}")
        await leader.start()
        try:
            await leader.wait_event("ready", timeout=60)
            await standby.start()
            await standby.wait_event("standby", timeout=60)
            await asyncio.sleep(0.3)
            assert leader.proc is not None
            killed = time.monotonic()
            leader.proc.send_signal(signal.SIGKILL)
            await standby.wait_event("ready", timeout=60)
            seconds.append(time.monotonic() - killed)
        finally:
            await standby.stop()
            await leader.stop()
    return seconds


async def replay(bc: BenchCluster, db: str, records: int) -> dict[str, Any]:
    conn = await bc.connect(db)
    try:
        await conn.execute(
            "INSERT INTO coordinator.jobs (namespace, name, schedule_kind, target) "
            "SELECT 'bench', 'spooled-' || g, 'manual', "
            '\'{"kind": "exec", "argv": ["true"]}\' FROM generate_series(1, $1) g',
            records,
        )
        rows = await conn.fetch(
            "INSERT INTO coordinator.runs (job_id, trigger, status, instance, claimed_at, "
            "started_at) SELECT id, 'manual', 'running', 'gone', now(), now() "
            "FROM coordinator.jobs WHERE name LIKE 'spooled-%' RETURNING id"
        )
        state = bc.tmp / "replay"
        spool = Spool(state / "spool.jsonl")
        now = datetime.now(UTC)
        started = time.perf_counter()
        for row in rows:
            spool.append(
                HeldResult(
                    run_id=row["id"],
                    job_key="bench/spooled",
                    schedule_version=1,
                    next_run_at=None,
                    outcome=Outcome(status="succeeded", started_at=now, finished_at=now, count=1),
                )
            )
        append_s = time.perf_counter() - started
        daemon = DaemonProcess(bc.dsn(db, user=DAEMON_ROLE), state_dir=state)
        await daemon.start()
        try:
            _, event = await daemon.wait_event("spool.replayed", timeout=120)
            await daemon.wait_event("ready", timeout=120)
        finally:
            await daemon.stop()
        saved = await conn.fetchval(
            "SELECT count(*) FROM coordinator.runs WHERE status = 'succeeded'"
        )
    finally:
        await conn.close()
    return {
        "records": records,
        "append_s": append_s,
        "replay_ms": event["elapsed_ms"],
        "saved": event["saved"],
        "succeeded_after": saved,
    }


async def run(*, quick: bool) -> dict[str, Any]:
    rounds, records = (5, 1000) if quick else (10, 1000)
    common.banner(f"durability: standby takeover x{rounds}, spool replay of {records} results")
    async with BenchCluster("durability") as bc:
        db = await bc.create_database("durability")
        seconds = await takeover(bc, db, rounds)
        spool = await replay(bc, db, records)
        server_version = bc.server_version
    text = common.table(
        ["measure", "n", "median", "min", "max"],
        [
            [
                "takeover: leader killed -> standby ready (ms)",
                len(seconds),
                statistics.median(seconds) * 1000,
                min(seconds) * 1000,
                max(seconds) * 1000,
            ],
            [f"spool: {records} fsynced appends (ms)", 1, spool["append_s"] * 1000, "-", "-"],
            [
                f"spool: replay of {records} results at startup (ms)",
                1,
                spool["replay_ms"],
                "-",
                "-",
            ],
        ],
    )
    print()
    print(text, flush=True)
    return {
        "benchmark": "durability",
        "quick": quick,
        "machine": common.machine_info(server_version),
        "table": text,
        "takeover_s": seconds,
        "spool": spool,
    }
