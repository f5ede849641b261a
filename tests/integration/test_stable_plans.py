"""Plans that survive statistics (issue #14, item 5), against a real PostgreSQL.

A young installation: autovacuum ANALYZEs ``coordinator.jobs`` and ``coordinator.runs``
while they are still empty, so ``pg_class.reltuples`` says 0 instead of "never counted"
(-1, for which the planner assumes at least 10 pages). A session that then runs the SQL
functions while the tables are tiny plans every statement inside them as a sequential
scan (correct for a table of one page), and after five executions PL/pgSQL keeps that
plan as the generic one for the rest of the session: nothing invalidates it until the
next ANALYZE of the table. When the tables fill up, every claim, settlement and trigger
reads the whole of ``runs`` (and ``jobs``) several times.

The test recreates that state deterministically (autovacuum off on the two tables, one
explicit ANALYZE, a warm-up on tiny tables), then loads, and reads what the statements
did from the server's own statistics (``pg_stat_user_tables``, flushed by
``pg_stat_force_next_flush()`` before each reading): every SQL function of the schema
must reach rows through indexes, whatever the statistics said when it was planned.
No timing is involved.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
import trio

from coordinator.db import aio
from coordinator.store import LOCK_CLASS, LOCK_OBJECT

#: Jobs (and runs per phase) of the load: enough that a sequential scan reads many pages.
LOAD = 150
#: Warm-up rounds on tiny tables: PL/pgSQL switches to the cached generic plan after
#: five executions of a statement.
WARMUP_ROUNDS = 7
EXEC = json.dumps({"kind": "exec", "argv": ["true"]})
NEVER = "0 0 1 1 *"  # a cron job that is never due during the test


async def _connect(dsn: str, **settings: str) -> asyncpg.Connection:
    return await aio(asyncpg.connect)(
        dsn, server_settings={"application_name": "tests-app", **settings}
    )


class Sessions:
    """An application session, a daemon-like session (wakes suppressed, as the daemon's
    are) and an observer reading the statistics."""

    def __init__(self, app: Any, daemon: Any, observer: Any) -> None:
        self.app = app
        self.daemon = daemon
        self.observer = observer
        self.phases: list[tuple[str, dict[str, int]]] = []
        self._last: dict[str, int] = {}

    async def _reading(self) -> dict[str, int]:
        # Each session flushes its pending statistics before its next ReadyForQuery.
        for conn in (self.app, self.daemon, self.observer):
            await aio(conn.execute)("SELECT pg_stat_force_next_flush()")
        await aio(self.observer.execute)("SELECT pg_stat_clear_snapshot()")
        rows = await aio(self.observer.fetch)(
            """
            SELECT relname, seq_scan, seq_tup_read, coalesce(idx_scan, 0) AS idx_scan
              FROM pg_stat_user_tables
             WHERE schemaname = 'coordinator' AND relname IN ('jobs', 'runs')
            """
        )
        out: dict[str, int] = {}
        for r in rows:
            for key in ("seq_scan", "seq_tup_read", "idx_scan"):
                out[f"{r['relname']}.{key}"] = r[key]
        return out

    async def start(self) -> None:
        self._last = await self._reading()

    async def phase(self, name: str) -> None:
        """Record what the statements since the previous phase did to jobs and runs."""
        now = await self._reading()
        self.phases.append((name, {k: now[k] - self._last[k] for k in now}))
        self._last = now

    # -- the SQL API and the daemon's functions, one statement each ---------------------

    async def define(self, namespace: str, name: str) -> int:
        return await aio(self.app.fetchval)(
            "SELECT coordinator.define_job(name => $1, schedule_kind => 'cron', "
            "schedule => $2, target => $3::jsonb, namespace => $4)",
            name,
            NEVER,
            EXEC,
            namespace,
        )

    async def sync(self, namespace: str, names: list[str]) -> None:
        jobs = [{"name": n, "schedule_kind": "cron", "schedule": NEVER, "target": json.loads(EXEC)}
                for n in names]  # fmt: skip
        await aio(self.app.fetchval)(
            "SELECT created FROM coordinator.sync($1, $2::jsonb)", namespace, json.dumps(jobs)
        )

    async def trigger(self, namespace: str, name: str) -> int:
        return await aio(self.app.fetchval)("SELECT coordinator.trigger($1, $2)", namespace, name)

    async def claim(self, job_id: int, run_id: int | None) -> int:
        row = await aio(self.daemon.fetchrow)(
            "SELECT reason, run_id FROM coordinator._claim($1, $2, NULL, 1, 'tests', "
            "NULL, NULL, NULL, NULL)",
            job_id,
            run_id,
        )
        assert row["reason"] is None, row
        return row["run_id"]

    async def settle(self, run_id: int) -> None:
        outcome = await aio(self.daemon.fetchval)(
            "SELECT outcome FROM coordinator._settle($1, 'succeeded', NULL, now(), 1, NULL, "
            "NULL, NULL, 1, NULL)",
            run_id,
        )
        assert outcome == "saved", (run_id, outcome)

    async def sweep(self) -> int:
        rows = await aio(self.daemon.fetch)(
            "SELECT * FROM coordinator._sweep_lost('tests', $1, $2)", LOCK_CLASS, LOCK_OBJECT
        )
        return len(rows)

    async def app_call(self, sql: str, *args: Any) -> Any:
        return await aio(self.app.fetchval)(sql, *args)


async def _exercise_everything(s: Sessions, namespace: str, names: list[str]) -> None:
    """Every SQL function of the schema, at least once per job name given."""
    ids = [await s.define(namespace, n) for n in names]
    await s.sync(namespace + "-sync", names)
    for job_id, name in zip(ids, names, strict=True):
        # manual dispatch, settled
        await s.settle(await s.claim(job_id, await s.trigger(namespace, name)))
        # scheduled dispatch (the deadline armed for version 1 is the saved one: none)
        await s.settle(await s.claim(job_id, None))
        # a queued run cancelled
        await s.app_call("SELECT coordinator.cancel($1)", await s.trigger(namespace, name))
        await s.app_call("SELECT coordinator.pause($1, $2)", namespace, name)
        await s.app_call("SELECT coordinator.resume($1, $2)", namespace, name)
    # lost runs: claimed, swept to unresolved by a "restarted daemon", resolved
    running = [
        await s.claim(j, await s.trigger(namespace, n)) for j, n in zip(ids, names, strict=True)
    ]
    assert await s.sweep() == len(running)
    for run_id in running:
        retry = await s.app_call("SELECT coordinator.resolve($1, 'retry')", run_id)
        await s.app_call("SELECT coordinator.cancel($1)", retry)
    await s.app_call("SELECT coordinator.remove($1, $2)", namespace, names[-1])


@pytest.fixture
async def sessions(aio_loop: Any, database: str) -> Any:
    setup = await _connect(database)
    try:
        # Nothing but this test may ANALYZE the tables (an autovacuum run in the middle
        # would invalidate the cached plans and hide the problem).
        await aio(setup.execute)(
            "ALTER TABLE coordinator.jobs SET (autovacuum_enabled = off);"
            "ALTER TABLE coordinator.runs SET (autovacuum_enabled = off);"
            # As autovacuum does on a young installation: both tables still empty.
            "ANALYZE coordinator.jobs; ANALYZE coordinator.runs;"
        )
    finally:
        await aio(setup.close)()
    app = await _connect(database)
    daemon = await _connect(database, **{"coordinator.origin": "daemon"})
    observer = await _connect(database)
    try:
        if (
            await aio(observer.fetchval)("SELECT current_setting('server_version_num')::int")
            < 150000
        ):
            pytest.skip("pg_stat_force_next_flush() needs PostgreSQL 15")
        yield Sessions(app, daemon, observer)
    finally:
        with trio.CancelScope(shield=True):
            for conn in (app, daemon, observer):
                await aio(conn.close)()


async def test_sql_functions_keep_index_plans_after_analyze_of_empty_tables(
    sessions: Sessions,
) -> None:
    with trio.fail_after(120):  # no timing is asserted; this only bounds a hang
        await _warm_up_then_load(sessions)


async def _warm_up_then_load(s: Sessions) -> None:
    reltuples = await aio(s.observer.fetchval)(
        "SELECT reltuples FROM pg_class WHERE oid = 'coordinator.runs'::regclass"
    )
    assert reltuples == 0  # analyzed while empty (never analyzed would be -1)

    # Warm-up while the tables are tiny: each session caches its generic plans.
    for i in range(WARMUP_ROUNDS):
        await _exercise_everything(s, "warm", [f"w{i}-a", f"w{i}-b"])

    # The load, phase by phase, each function's statements counted on their own.
    await s.start()
    names = [f"j{i}" for i in range(LOAD)]
    await s.sync("load", names)
    await s.phase(f"sync() of {LOAD} jobs (define_job each)")
    ids = dict(
        await aio(s.observer.fetch)(
            "SELECT name, id FROM coordinator.jobs WHERE namespace = 'load'"
        )
    )
    await s.phase("(the test reading job ids)")
    runs = [await s.trigger("load", n) for n in names]
    await s.phase(f"trigger() x {LOAD} (and the runs wake trigger)")
    half = LOAD // 2
    claimed = [await s.claim(ids[n], r) for n, r in zip(names[:half], runs[:half], strict=True)]
    await s.phase(f"_claim() x {half}, manual")
    for run_id in claimed:
        await s.settle(run_id)
    await s.phase(f"_settle() x {half}, manual")
    for run_id in runs[half:]:
        await s.app_call("SELECT coordinator.cancel($1)", run_id)
    await s.phase(f"cancel() x {LOAD - half}")
    scheduled = [await s.claim(ids[n], None) for n in names]
    await s.phase(f"_claim() x {LOAD}, scheduled")
    for run_id in scheduled:
        await s.settle(run_id)
    await s.phase(f"_settle() x {LOAD}, scheduled")
    lost = [await s.claim(ids[n], await s.trigger("load", n)) for n in names[:half]]
    await s.phase(f"trigger() + _claim() x {half}")
    assert await s.sweep() == len(lost)
    await s.phase("_sweep_lost()")
    retries = [await s.app_call("SELECT coordinator.resolve($1, 'retry')", r) for r in lost]
    await s.phase(f"resolve() x {half}")
    for name in names[:half]:
        await s.app_call("SELECT coordinator.pause('load', $1)", name)
        await s.app_call("SELECT coordinator.resume('load', $1)", name)
    await s.phase(f"pause() + resume() x {half}")
    for run_id in retries:
        await s.app_call("SELECT coordinator.cancel($1)", run_id)
    for name in names[:half]:
        await s.app_call("SELECT coordinator.remove('load', $1)", name)
    await s.phase(f"cancel() + remove() x {half}")

    counted = {name: d for name, d in s.phases if not name.startswith("(")}
    report = "\n".join(
        f"  {name:45} runs: {d['runs.seq_scan']:6} seq scans, {d['runs.seq_tup_read']:9} rows"
        f" read, {d['runs.idx_scan']:6} index scans | jobs: {d['jobs.seq_scan']:6} seq scans,"
        f" {d['jobs.seq_tup_read']:9} rows read"
        for name, d in s.phases
    )
    print(report)  # shown with -s, and by pytest on failure
    # The scans are being counted at all (so the test cannot pass vacuously).
    assert sum(d["runs.seq_scan"] + d["runs.idx_scan"] for d in counted.values()) >= 4 * LOAD
    sequential = {
        name: (d["runs.seq_scan"], d["jobs.seq_scan"])
        for name, d in counted.items()
        if d["runs.seq_scan"] or d["jobs.seq_scan"]
    }
    assert not sequential, "sequential scans of runs/jobs under load:\n" + report


async def test_every_sql_function_carries_its_planner_setting(aio_loop: Any, database: str) -> None:
    # A later `CREATE OR REPLACE FUNCTION` without the SET clause silently drops it: every
    # PL/pgSQL function of the schema must keep running with enable_seqscan = off.
    conn = await _connect(database)
    try:
        rows = await aio(conn.fetch)(
            """
            SELECT p.oid::regprocedure::text AS function, p.proconfig
              FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
             WHERE p.pronamespace = 'coordinator'::regnamespace AND l.lanname = 'plpgsql'
             ORDER BY 1
            """
        )
    finally:
        await aio(conn.close)()
    assert len(rows) >= 14
    missing = [r["function"] for r in rows if "enable_seqscan=off" not in (r["proconfig"] or [])]
    assert not missing, f"functions without SET enable_seqscan = off: {missing}"
