"""The daemon core against a real PostgreSQL (real clock; SQL counted from the server log).

docs/design.md, promises 1-6: idle silence, saved deadlines only, post-commit wakes,
coalesced refresh, one claim boundary, settlement with the next deadline.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest
import trio

from coordinator.core.admission import Ticket
from coordinator.db import aio, transaction

from .conftest import StartDaemon, define, refreshes

if TYPE_CHECKING:
    from pathlib import Path

    from coordinator.embedded import StatementLog

IDLE_WINDOW = 21.0  # seconds of required silence (the benchmark measures 180 s)


def daemon_sql(log: StatementLog, db: str) -> list[Any]:
    return log.statements(app="coordinator", db=db)


def counter(tmp_path: Path, name: str = "runs.txt") -> tuple[list[str], Path]:
    """A command that appends a line per execution to a file."""
    path = tmp_path / name
    return ["sh", "-c", f'echo "$COORDINATOR_RUN_ID" >> {path}'], path


def executions(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


async def runs_of(conn: asyncpg.Connection, job_id: int) -> list[asyncpg.Record]:
    return await aio(conn.fetch)(
        "SELECT * FROM coordinator.runs WHERE job_id = $1 ORDER BY id", job_id
    )


async def wait_for(predicate: Any, timeout: float = 15.0, interval: float = 0.05) -> None:
    with trio.fail_after(timeout):
        while not await predicate():
            await trio.sleep(interval)


# -- idle silence --------------------------------------------------------------------------


async def _assert_idle_silence(start_daemon: StartDaemon, sql_log: StatementLog, db: str) -> None:
    harness = await start_daemon()
    startup = daemon_sql(sql_log, db)
    assert refreshes(startup) == 1
    # No type introspection (asyncpg's, for parameter types it does not know).
    assert [s.sql for s in startup if "pg_catalog" in s.sql or "typeinfo" in s.sql] == []
    # Let anything in flight land, then count from a fresh mark.
    await trio.sleep(0.5)
    sql_log.mark()
    await trio.sleep(IDLE_WINDOW)
    assert daemon_sql(sql_log, db) == []
    assert harness.daemon.status().refreshes == 1


@pytest.mark.slow
async def test_idle_silence_no_jobs(
    start_daemon: StartDaemon, sql_log: StatementLog, database_name: str
) -> None:
    await _assert_idle_silence(start_daemon, sql_log, database_name)


@pytest.mark.slow
async def test_idle_silence_thousand_far_future_cron_jobs(
    start_daemon: StartDaemon,
    sql_log: StatementLog,
    database_name: str,
    conn: asyncpg.Connection,
) -> None:
    await aio(conn.execute)(
        "INSERT INTO coordinator.jobs (name, schedule_kind, schedule, target) "
        "SELECT 'far' || g, 'cron', '0 0 1 1 *', '{\"kind\": \"exec\", \"argv\": [\"true\"]}' "
        "FROM generate_series(1, 1000) g"
    )
    sql_log.mark()
    await _assert_idle_silence(start_daemon, sql_log, database_name)
    armed = await aio(conn.fetchval)(
        "SELECT count(*) FROM coordinator.jobs WHERE next_run_at > now() + interval '1 day'"
    )
    assert armed == 1000


@pytest.mark.slow
async def test_idle_silence_manual_paused_invalid_jobs(
    start_daemon: StartDaemon,
    sql_log: StatementLog,
    database_name: str,
    conn: asyncpg.Connection,
) -> None:
    for i in range(50):
        await define(conn, f"manual{i}")
        await define(conn, f"paused{i}", schedule_kind="interval", schedule="1s", paused=True)
        await define(conn, f"invalid{i}", schedule_kind="cron", schedule="61 * * * *")
    sql_log.mark()
    await _assert_idle_silence(start_daemon, sql_log, database_name)
    invalid = await aio(conn.fetch)(
        "SELECT invalid_reason FROM coordinator.jobs WHERE name LIKE 'invalid%'"
    )
    assert len(invalid) == 50
    assert all(r["invalid_reason"] for r in invalid)


@pytest.mark.slow
async def test_idle_silence_with_paused_runs(
    start_daemon: StartDaemon,
    sql_log: StatementLog,
    database_name: str,
    conn: asyncpg.Connection,
    nursery: trio.Nursery,
) -> None:
    """A paused run arms nothing and costs no SQL, with a worker serving its job: a
    manual recoverable job's paused run waits for a trigger; a recurring one's next tick,
    an hour away, is the only timer."""
    from coordinator.worker import Worker

    worker_target = {"kind": "worker", "type": "scan"}
    manual = await define(conn, "scan-manual", target=worker_target, recoverable=True)
    hourly = await define(
        conn, "scan-hourly", target=worker_target, recoverable=True, schedule_kind="interval",
        schedule="1h",
    )  # fmt: skip
    for job_id in (manual, hourly):
        await aio(conn.execute)(
            "INSERT INTO coordinator.runs (job_id, trigger, status, cursor, count, started_at, "
            "paused_at) VALUES ($1, 'manual', 'paused', '{\"after\": 7}', 7, now(), now())",
            job_id,
        )
    harness = await start_daemon(refresh_spacing=1.0)
    worker = Worker(worker_id="idle")

    @worker.job("scan")
    async def scan(ctx: Any) -> None:
        raise AssertionError("nothing may run")

    socket_path = harness.daemon.executors["worker"].socket_path  # type: ignore[attr-defined]
    await nursery.start(lambda task_status: worker.run(socket_path, task_status=task_status))
    await harness.wait_event("wake", reason="workers.changed")
    await harness.wait_event("refresh", count=2)  # the one the worker's arrival asked for
    await trio.sleep(0.5)
    sql_log.mark()
    await trio.sleep(IDLE_WINDOW)
    assert daemon_sql(sql_log, database_name) == []
    status = harness.daemon.status()
    assert status.refreshes == 2
    assert (status.armed_deadlines, status.next_job) == (1, "default/scan-hourly")
    assert status.running == ()
    statuses = await aio(conn.fetch)("SELECT status FROM coordinator.runs")
    assert [r["status"] for r in statuses] == ["paused", "paused"]
    worker.stop()


# -- coalescing ------------------------------------------------------------------------------


async def test_sequential_manual_runs_cause_no_extra_refresh(
    start_daemon: StartDaemon,
    sql_log: StatementLog,
    database_name: str,
    conn: asyncpg.Connection,
    tmp_path: Path,
) -> None:
    argv, path = counter(tmp_path)
    for i in range(40):
        await define(conn, f"m{i}", target={"kind": "exec", "argv": argv})
    harness = await start_daemon(refresh_spacing=30.0)
    for i in range(15):
        run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', $1)", f"m{i}")
        await harness.wait_event("job.run", run=run_id)
    await wait_for(lambda: _true(executions(path) == 15))
    await trio.sleep(0.3)
    statements = daemon_sql(sql_log, database_name)
    assert refreshes(statements) <= 2  # the startup read, plus at most one
    # Per run: one claim and one settlement, nothing else.
    claims = [s for s in statements if "coordinator._claim" in s.sql]
    settles = [s for s in statements if "coordinator._settle" in s.sql]
    assert (len(claims), len(settles)) == (15, 15)
    assert len(statements) - refreshes(statements) == 30 + _startup_extras(statements)


def _startup_extras(statements: list[Any]) -> int:
    """Statements of the startup sequence other than the refresh (lock, schema, sweep)."""
    return sum(
        1
        for s in statements
        if "pg_try_advisory_lock" in s.sql
        or "_sweep_lost" in s.sql
        or "LISTEN" in s.sql
        or "schema_migrations" in s.sql
    )


async def _true(value: bool) -> bool:
    return value


async def test_burst_of_wakes_is_one_refresh(
    start_daemon: StartDaemon,
    sql_log: StatementLog,
    database_name: str,
    conn: asyncpg.Connection,
) -> None:
    spacing = 3.0
    harness = await start_daemon(refresh_spacing=spacing)
    sql_log.mark()
    began = trio.current_time()
    for i in range(10):
        await define(conn, f"w{i}", schedule_kind="interval", schedule="1h")
    await harness.wait_event("wake", count=10)
    burst = trio.current_time() - began
    # Whatever the machine's speed: refreshes are at least `spacing` apart, so a burst
    # that lasted `burst` seconds can have been served by at most 1 + burst/spacing.
    await harness.wait_event("refresh", count=2, timeout=10)  # startup + the burst's
    while not all(job in harness.daemon.deadlines for job in await _ids(conn, "w%")):
        await harness.wait_event("refresh", count=len(harness.named("refresh")) + 1)
    served = refreshes(daemon_sql(sql_log, database_name))
    assert 1 <= served <= 1 + int(burst // spacing)
    # No wake is pending now: a whole spacing later, nothing more was read.
    await trio.sleep(spacing + 1.0)
    assert refreshes(daemon_sql(sql_log, database_name)) == served


async def _ids(conn: asyncpg.Connection, pattern: str) -> list[int]:
    rows = await aio(conn.fetch)("SELECT id FROM coordinator.jobs WHERE name LIKE $1", pattern)
    return [r["id"] for r in rows]


# -- arming, pause, resume, remove ------------------------------------------------------------


UNPAUSE = {
    "resume": "SELECT coordinator.resume('default', 'held')",
    "define_job": "SELECT coordinator.define_job('held', 'manual', $1::jsonb, paused => false)",
    # (No "paused" key: the entry keeps the job's pause; "paused": false lifts it.)
    "sync": "SELECT * FROM coordinator.sync('default', jsonb_build_array(jsonb_build_object("
    "'name', 'held', 'schedule_kind', 'manual', 'target', $1::jsonb, 'paused', false)))",
}


@pytest.mark.parametrize("way", list(UNPAUSE))
async def test_lifting_a_pause_dispatches_the_run_queued_meanwhile_without_a_refresh(
    way: str,
    start_daemon: StartDaemon,
    sql_log: StatementLog,
    database_name: str,
    conn: asyncpg.Connection,
    tmp_path: Path,
) -> None:
    """A run triggered while its job was paused waits; lifting the pause (resume, define
    or sync) dispatches it at once (the run's dispatch wake, as trigger raises it), not at
    the next coalesced refresh, an hour away here."""
    argv, path = counter(tmp_path)
    target = {"kind": "exec", "argv": argv}
    await define(conn, "held", target=target, paused=True)
    harness = await start_daemon(refresh_spacing=3600.0)
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'held')")
    await trio.sleep(0.5)  # the dispatch wake came; the claim was refused: paused
    assert (await runs_of(conn, await _job_id(conn, "held")))[0]["status"] == "queued"
    sql = UNPAUSE[way]
    await aio(conn.execute)(sql, *((json.dumps(target),) if "$1" in sql else ()))
    await harness.wait_event("job.run", run=run_id, timeout=15)
    assert executions(path) == 1
    assert refreshes(daemon_sql(sql_log, database_name)) == 1  # the startup read only


async def _job_id(conn: asyncpg.Connection, name: str) -> int:
    job_id: int = await aio(conn.fetchval)("SELECT id FROM coordinator.jobs WHERE name = $1", name)
    return job_id


async def test_new_job_is_armed_after_refresh_pause_and_resume(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    harness = await start_daemon(refresh_spacing=0.2)
    job = await define(conn, "cron", schedule_kind="cron", schedule="*/5 * * * *")
    await harness.wait_event("refresh", count=2)
    assert job in harness.daemon.deadlines
    saved = await aio(conn.fetchval)("SELECT next_run_at FROM coordinator.jobs WHERE id = $1", job)
    assert saved is not None
    assert saved > datetime.now(UTC)
    assert harness.daemon.deadlines.get(job) == saved.timestamp()

    await aio(conn.execute)("SELECT coordinator.pause('default', 'cron')")
    await harness.wait_event("refresh", count=3)
    assert job not in harness.daemon.deadlines

    await aio(conn.execute)("SELECT coordinator.resume('default', 'cron')")
    await harness.wait_event("refresh", count=4)
    assert job in harness.daemon.deadlines


async def test_pausing_or_removing_an_armed_job_means_it_never_runs(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    argv, path = counter(tmp_path)
    later = datetime.now(UTC) + timedelta(minutes=5)
    ids = [
        await define(
            conn,
            name,
            schedule_kind="once",
            schedule=later.isoformat(),
            target={"kind": "exec", "argv": argv},
        )
        for name in ("p", "r")
    ]
    harness = await start_daemon(refresh_spacing=0.1)
    assert all(job in harness.daemon.deadlines for job in ids)
    await aio(conn.execute)("SELECT coordinator.pause('default', 'p')")
    await aio(conn.execute)("SELECT coordinator.remove('default', 'r')")
    with trio.fail_after(10):
        while any(job in harness.daemon.deadlines for job in ids):
            await harness.wait_event("refresh", count=len(harness.named("refresh")) + 1)
    # Even with its saved deadline overdue, the paused job is not armed or run.
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET next_run_at = now() - interval '1 second' WHERE id = $1",
        ids[0],
    )
    await harness.wait_event("refresh", count=len(harness.named("refresh")) + 1)
    assert ids[0] not in harness.daemon.deadlines
    await trio.sleep(0.5)
    assert executions(path) == 0
    assert harness.named("job.run") == []


async def test_interval_job_runs_and_next_deadline_follows_completion(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    argv, path = counter(tmp_path)
    job = await define(
        conn, "i", schedule_kind="interval", schedule="1s", target={"kind": "exec", "argv": argv}
    )
    harness = await start_daemon()
    events = await harness.wait_event("job.run", count=2, timeout=10)
    assert all(e["outcome"] == "succeeded" for e in events)
    runs = await runs_of(conn, job)
    first = runs[0]
    # The second deadline is one interval after the first run finished.
    assert runs[1]["scheduled_for"] - first["finished_at"] == timedelta(seconds=1)
    assert all(r["trigger"] == "schedule" for r in runs)
    assert executions(path) >= 2


# -- post-commit wakes ---------------------------------------------------------------------


async def test_rolled_back_change_causes_no_wake_and_no_sql(
    start_daemon: StartDaemon,
    sql_log: StatementLog,
    database_name: str,
    conn: asyncpg.Connection,
) -> None:
    harness = await start_daemon(refresh_spacing=0.1)
    sql_log.mark()
    tx = conn.transaction()
    await aio(tx.start)()
    await define(conn, "ghost", schedule_kind="interval", schedule="1s")
    await aio(tx.rollback)()
    await trio.sleep(1.0)
    assert harness.named("wake") == []
    assert daemon_sql(sql_log, database_name) == []

    async with transaction(conn):
        await define(conn, "real", schedule_kind="interval", schedule="1h")
    await harness.wait_event("wake")
    await harness.wait_event("refresh", count=2)
    assert refreshes(daemon_sql(sql_log, database_name)) == 1


# -- overdue deadlines, edits during a run ------------------------------------------------------


async def test_restart_with_overdue_deadline_runs_once(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    argv, path = counter(tmp_path)
    job = await define(
        conn, "late", schedule_kind="interval", schedule="1h", target={"kind": "exec", "argv": argv}
    )
    overdue = datetime.now(UTC) - timedelta(hours=5)
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET next_run_at = $2 WHERE id = $1", job, overdue
    )
    harness = await start_daemon()
    await harness.wait_event("job.run")
    await trio.sleep(1.0)
    assert executions(path) == 1
    runs = await runs_of(conn, job)
    assert len(runs) == 1
    assert runs[0]["scheduled_for"] == overdue
    next_at = await aio(conn.fetchval)(
        "SELECT next_run_at FROM coordinator.jobs WHERE id = $1", job
    )
    assert next_at == runs[0]["finished_at"] + timedelta(hours=1)
    assert harness.daemon.deadlines.get(job) == next_at.timestamp()


async def test_schedule_changed_during_run_keeps_the_new_deadline(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    job = await define(
        conn,
        "edit",
        schedule_kind="interval",
        schedule="1h",
        target={"kind": "exec", "argv": ["sh", "-c", f"touch {marker}; sleep 2"]},
    )
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET next_run_at = now() - interval '1 minute' WHERE id = $1", job
    )
    harness = await start_daemon(refresh_spacing=0.1)
    await wait_for(lambda: _true(marker.exists()))
    await define(
        conn,
        "edit",
        schedule_kind="cron",
        schedule="0 0 1 1 *",
        target={"kind": "exec", "argv": ["true"]},
    )
    await harness.wait_event("job.run")
    row = await aio(conn.fetchrow)("SELECT * FROM coordinator.jobs WHERE id = $1", job)
    assert row["schedule_version"] == 2
    # The new cron's deadline (January 1st), not the old interval's (one hour on).
    assert row["next_run_at"] is not None
    assert (row["next_run_at"].month, row["next_run_at"].day) == (1, 1)
    assert (await runs_of(conn, job))[0]["status"] == "succeeded"


# -- the claim boundary ----------------------------------------------------------------------


async def test_manual_triggers_racing_a_deadline_make_one_run(
    start_daemon: StartDaemon, conn: asyncpg.Connection, database: str, tmp_path: Path
) -> None:
    argv, path = counter(tmp_path)
    job = await define(
        conn,
        "race",
        schedule_kind="interval",
        schedule="1h",
        target={"kind": "exec", "argv": argv},
    )
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET next_run_at = now() - interval '1 second' WHERE id = $1",
        job,
    )
    # Hold the job row as the claim locks it (FOR NO KEY UPDATE: triggers' foreign key
    # checks still pass), so the overdue deadline's claim is certainly in flight, waiting,
    # while ten triggers commit: the race happens on every machine, however fast.
    blocker = await aio(asyncpg.connect)(database)
    try:
        await aio(blocker.execute)("BEGIN")
        await aio(blocker.execute)(
            "SELECT 1 FROM coordinator.jobs WHERE id = $1 FOR NO KEY UPDATE", job
        )
        harness = await start_daemon()
        with trio.fail_after(15):
            while not await aio(conn.fetchval)(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%coordinator._claim%'"
                " AND wait_event_type = 'Lock'"
            ):
                await trio.sleep(0.02)

        async def trigger() -> None:
            c = await aio(asyncpg.connect)(database)
            try:
                await aio(c.fetchval)("SELECT coordinator.trigger('default', 'race')")
            finally:
                await aio(c.close)()

        async with trio.open_nursery() as n:
            for _ in range(10):
                n.start_soon(trigger)
        await aio(blocker.execute)("COMMIT")
    finally:
        await aio(blocker.close)()
    run = await harness.wait_event("job.run")
    assert run[0]["trigger"] == "manual"
    assert harness.named("claim.rejected", reason="outstanding")
    runs = await runs_of(conn, job)
    assert len(runs) == 1
    assert executions(path) == 1


async def test_concurrent_claims_of_one_deadline_grant_one(
    start_daemon: StartDaemon, conn: asyncpg.Connection
) -> None:
    job = await define(conn, "c", schedule_kind="interval", schedule="1h", paused=True)
    due = datetime.now(UTC) - timedelta(seconds=1)
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET next_run_at = $2, paused = false WHERE id = $1", job, due
    )
    harness = await start_daemon(wait_ready=False)
    store = harness.daemon.store
    await harness.stop()  # we only borrow its store (and pool) below
    from coordinator.store import ConnectionPool, Store

    pool = ConnectionPool(store.pool.dsn, size=8)
    mine = Store(pool=pool, instance="test")
    results = []

    async def claim() -> None:
        results.append(
            await mine.claim(
                Ticket(
                    job_id=job,
                    priority="background",
                    due=due.timestamp(),
                    scheduled_for=due,
                    schedule_version=1,
                ),
                workers=[],
                now=datetime.now(UTC),
            )
        )

    try:
        async with trio.open_nursery() as n:
            for _ in range(8):
                n.start_soon(claim)
    finally:
        await pool.close()
    granted = [r for r in results if r.claim is not None]
    assert len(granted) == 1
    assert {r.reason for r in results if r.claim is None} <= {"outstanding"}
    assert len(await runs_of(conn, job)) == 1


# -- settlement failure ------------------------------------------------------------------------


async def test_failed_settlement_is_retained_and_saved_later_without_rerun(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    # A real write fault: a trigger that refuses to finish runs of job "a" while active.
    await aio(conn.execute)(
        """
        CREATE TABLE public.faults (active boolean NOT NULL);
        INSERT INTO public.faults VALUES (true);
        CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF (SELECT active FROM public.faults)
               AND NEW.status <> 'running'
               AND (SELECT name FROM coordinator.jobs WHERE id = NEW.job_id) = 'a' THEN
                RAISE EXCEPTION 'injected settlement fault';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse BEFORE UPDATE ON coordinator.runs
            FOR EACH ROW EXECUTE FUNCTION public.refuse();
        """
    )
    argv_a, path_a = counter(tmp_path, "a.txt")
    argv_b, path_b = counter(tmp_path, "b.txt")
    a = await define(conn, "a", target={"kind": "exec", "argv": argv_a})
    await define(
        conn, "b", schedule_kind="interval", schedule="1s", target={"kind": "exec", "argv": argv_b}
    )
    harness = await start_daemon(retry_cap=0.5)
    run_a = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'a')")
    await harness.wait_event("settle.retained", run=run_a)
    # Meanwhile the other job keeps running.
    before = executions(path_b)
    await wait_for(lambda: _true(executions(path_b) >= before + 2), timeout=10)
    assert (await runs_of(conn, a))[0]["status"] == "running"
    # A manual trigger of the blocked job returns the outstanding run, runs nothing.
    again = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'a')")
    assert again == run_a

    await aio(conn.execute)("UPDATE public.faults SET active = false")
    await harness.wait_event("settle.saved", run=run_a)
    assert (await runs_of(conn, a))[0]["status"] == "succeeded"
    assert executions(path_a) == 1


# -- capacity ----------------------------------------------------------------------------------


async def test_two_slots_five_due_jobs_interactive_first(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    log = tmp_path / "order.txt"
    overdue = datetime.now(UTC) - timedelta(minutes=1)
    # Durations chosen so that slots free at distinct moments (int1 at 0.3 s, int2 at
    # 0.7 s, bg1 at 0.8 s): the start order then shows the admission order.
    jobs = [
        ("bg1", "background", 0.5),
        ("bg2", "background", 0.5),
        ("bg3", "background", 0.5),
        ("int1", "interactive", 0.3),
        ("int2", "interactive", 0.7),
    ]
    for i, (name, priority, seconds) in enumerate(jobs):
        job = await define(
            conn,
            name,
            schedule_kind="interval",
            schedule="1h",
            priority=priority,
            target={
                "kind": "exec",
                "argv": ["sh", "-c", f"echo {name} >> {log}; sleep {seconds}"],
            },
        )
        await aio(conn.execute)(
            "UPDATE coordinator.jobs SET next_run_at = $2 WHERE id = $1",
            job,
            overdue + timedelta(seconds=i),
        )
    harness = await start_daemon(concurrency=2)
    await harness.wait_event("job.run", count=5, timeout=20)
    rows = await aio(conn.fetch)(
        "SELECT j.name, r.started_at, r.finished_at FROM coordinator.runs r "
        "JOIN coordinator.jobs j ON j.id = r.job_id ORDER BY r.started_at"
    )
    names = [r["name"] for r in rows]
    assert set(names[:2]) == {"int1", "int2"}
    assert names[2:] == ["bg1", "bg2", "bg3"]
    # Never more than two at once.
    edges = sorted(
        [(r["started_at"], 1) for r in rows] + [(r["finished_at"], -1) for r in rows],
        key=lambda e: (e[0], e[1]),
    )
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    assert peak == 2, [(r["name"], r["started_at"], r["finished_at"]) for r in rows]


async def test_bad_target_fails_the_run_without_crashing(
    start_daemon: StartDaemon, conn: asyncpg.Connection
) -> None:
    # (define_job refuses such a target since 0022; plain SQL can still write one.)
    job = await define(conn, "broken")
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET target = $1::jsonb WHERE id = $2",
        json.dumps({"kind": "exec", "argv": []}),
        job,
    )
    harness = await start_daemon()
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'broken')")
    await harness.wait_event("job.run", run=run_id)
    run = (await runs_of(conn, job))[0]
    assert run["status"] == "failed"
    assert "bad target" in run["error_message"]


async def test_tick_during_a_long_run_is_skipped_not_queued(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    argv, path = counter(tmp_path)
    job = await define(
        conn,
        "long",
        schedule_kind="interval",
        schedule="1h",
        target={"kind": "exec", "argv": ["sh", "-c", f"{argv[2]}; sleep 2.5"]},
    )
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET next_run_at = now() + interval '1 second' WHERE id = $1",
        job,
    )
    harness = await start_daemon()
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'long')")
    skipped = await harness.wait_event("job.tick_skipped", timeout=10)
    assert skipped[0]["run"] == run_id
    assert skipped[0]["running_s"] > 0
    await harness.wait_event("job.run", run=run_id, timeout=10)
    await trio.sleep(0.5)
    # The skipped tick is not owed: the next deadline follows the run's completion.
    runs = await runs_of(conn, job)
    assert [r["trigger"] for r in runs] == ["manual"]
    next_at = await aio(conn.fetchval)(
        "SELECT next_run_at FROM coordinator.jobs WHERE id = $1", job
    )
    assert next_at == runs[0]["finished_at"] + timedelta(hours=1)
    assert executions(path) == 1


async def test_job_removed_while_its_call_runs(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    await define(
        conn, "doomed", target={"kind": "exec", "argv": ["sh", "-c", f"touch {started}; sleep 1"]}
    )
    await define(conn, "other")
    harness = await start_daemon()
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'doomed')")
    await wait_for(lambda: _true(started.exists()))
    await aio(conn.execute)("SELECT coordinator.remove('default', 'doomed')")
    await harness.wait_event("settle.orphaned", run=run_id)
    # The daemon carries on.
    other = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'other')")
    await harness.wait_event("job.run", run=other)


async def test_a_lost_lock_session_is_not_reported_as_leading(
    start_daemon: StartDaemon, conn: asyncpg.Connection
) -> None:
    """While the single-writer lock's session is lost, the daemon does not lead (another
    may take the lock): the status says so (it said "leading" beside "leadership lock
    session lost", and so did coordinator_leading). Read at the moment the state turns
    degraded for it, then again once the lock is taken back."""
    from coordinator.events import Event, StateChanged

    harness = await start_daemon(retry_cap=0.5)
    assert harness.daemon.status().leading
    seen: list[tuple[bool, tuple[str, ...]]] = []

    def on_event(event: Event) -> None:
        if isinstance(event, StateChanged) and event.state == "degraded":
            status = harness.daemon.status()
            seen.append((status.leading, status.degraded))

    harness.daemon.events.subscribe(on_event)
    leader = harness.daemon.store.leader_pid
    await aio(conn.execute)("SELECT pg_terminate_backend($1)", leader)
    await harness.wait_event("leadership.regained")
    assert seen, "the state never turned degraded"
    assert seen[0] == (False, ("leadership lock session lost",))
    with trio.fail_after(10):
        while not harness.daemon.status().leading:
            await trio.sleep(0.05)


async def test_a_first_deadline_counts_from_the_definition_not_the_refresh(
    start_daemon: StartDaemon, conn: asyncpg.Connection
) -> None:
    """`jobs define` promises the first run from when the job was defined; the daemon
    reads the job at its next refresh, up to a coalescing window later. Counted from the
    refresh, a first tick falling in between was lost (a daily job defined shortly before
    its time first ran a day late). A definition within the lookback counts from itself;
    an older one (no daemon could read it) from the refresh, as before."""
    every = await define(conn, "hourly", schedule_kind="interval", schedule="1h")
    minutely = await define(conn, "minutely", schedule_kind="cron", schedule="* * * * *")
    stale = await define(conn, "stale", schedule_kind="interval", schedule="1h")
    # Defined 40 s ago; just before the current minute began (its tick fell since); and
    # ten minutes ago.
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET updated_at = CASE id "
        "  WHEN $1 THEN now() - interval '40 seconds' "
        "  WHEN $2 THEN date_trunc('minute', now()) - interval '5 seconds' "
        "  ELSE now() - interval '10 minutes' END "
        "WHERE id = ANY ($3::bigint[])",
        every,
        minutely,
        [every, minutely, stale],
    )
    defined = {
        r["id"]: r["updated_at"]
        for r in await aio(conn.fetch)("SELECT id, updated_at FROM coordinator.jobs")
    }
    harness = await start_daemon()
    # The tick that fell between the definition and the refresh is owed: it runs once.
    ran = (await harness.wait_event("job.run", job="default/minutely", timeout=20))[0]
    assert ran["outcome"] == "succeeded"
    scheduled = await aio(conn.fetchval)(
        "SELECT scheduled_for FROM coordinator.runs WHERE job_id = $1", minutely
    )
    assert scheduled == defined[minutely] + timedelta(seconds=5)  # the minute's start
    saved = {
        r["id"]: r["next_run_at"]
        for r in await aio(conn.fetch)("SELECT id, next_run_at FROM coordinator.jobs")
    }
    # (Counted from the definition's second: exact for cron, "about" for an interval.)
    assert saved[every] == defined[every].replace(microsecond=0) + timedelta(hours=1)
    # Ten minutes ago is beyond the lookback: counted from the refresh.
    assert saved[stale] - defined[stale] >= timedelta(hours=1, minutes=9)
