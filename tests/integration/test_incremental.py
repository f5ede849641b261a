"""Incremental refresh: a wake that names its job re-reads that job only (docs/design.md,
"Inside the daemon"); the server's own statistics show what was read."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import trio

from coordinator import store
from coordinator.daemon import inventory
from coordinator.db import aio

if TYPE_CHECKING:
    import asyncpg
    import pytest

    from coordinator.embedded import StatementLog

    from .conftest import StartDaemon

JOBS = 100_000


async def jobs_reads(conn: asyncpg.Connection) -> tuple[int, int]:
    row = await aio(conn.fetchrow)(
        "SELECT seq_tup_read, coalesce(idx_tup_fetch, 0) AS idx FROM pg_stat_user_tables "
        "WHERE relid = 'coordinator.jobs'::regclass"
    )
    return int(row["seq_tup_read"]), int(row["idx"])


async def stats_when(conn: asyncpg.Connection, predicate: Any) -> tuple[int, int]:
    """Table statistics once ``predicate(seq, idx)`` holds. A backend reports its
    counters when it goes idle, up to ten seconds later (PostgreSQL's idle flush)."""
    with trio.fail_after(40):
        while True:
            current = await jobs_reads(conn)
            if predicate(*current):
                return current
            await trio.sleep(0.5)


async def test_one_changed_job_of_many_is_read_alone(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    sql_log: StatementLog,
    database_name: str,
) -> None:
    await aio(conn.execute)("ALTER TABLE coordinator.jobs SET (autovacuum_enabled = off)")
    # Deadlines already saved (a restart, the steady state): the start reads them only.
    await aio(conn.execute)(
        "INSERT INTO coordinator.jobs (name, schedule_kind, schedule, target, next_run_at) "
        "SELECT 'far' || g, 'cron', '0 0 1 1 *', '{\"kind\": \"exec\", \"argv\": [\"true\"]}', "
        "date_trunc('year', now()) + interval '1 year' "
        f"FROM generate_series(1, {JOBS}) g"
    )
    harness = await start_daemon(refresh_spacing=0.2, ready_timeout=120)
    assert len(harness.daemon.deadlines) == JOBS
    job = await aio(conn.fetchval)("SELECT id FROM coordinator.jobs WHERE name = 'far777'")
    # The startup refresh read every row, a page at a time through the primary key:
    # wait until it is counted.
    before = await stats_when(conn, lambda _seq, idx: idx >= JOBS)
    sql_log.mark()
    # A change by plain SQL, as an application may make it. Its first tick half an hour
    # away: with '*/5 * * * *' a change made just before a five-minute boundary (CI at
    # 17:14:59) fell due at once, ran, and was not armed when the test looked.
    minute = (datetime.now(UTC).minute + 30) % 60
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET schedule = $2, next_run_at = NULL, "
        "schedule_version = schedule_version + 1 WHERE id = $1",
        job,
        f"{minute} * * * *",
    )
    refreshed = await harness.wait_event("refresh", count=2)
    assert (refreshed[-1]["named"], refreshed[-1]["jobs"]) == (1, 1)
    deadline = harness.daemon.deadlines.get(job)
    assert deadline is not None
    assert 0 < deadline - datetime.now(UTC).timestamp() <= timedelta(hours=1).total_seconds()
    # The daemon's backend reports all it did at once: once its index reads show, any
    # sequential scan it made would show too.
    after = await stats_when(conn, lambda _seq, idx: idx - before[1] >= 2)
    # No sequential scan of the jobs table, and a handful of rows by index: a full
    # refresh would have read all 100,000 rows (by index, a page at a time). By index:
    # the application's update, the refresh's row, the deadline's write.
    assert after[0] - before[0] == 0
    assert after[1] - before[1] <= 5
    statements = [s.sql for s in sql_log.statements(app="coordinator", db=database_name)]
    refreshes = [s for s in statements if "LEFT JOIN coordinator.runs r" in s]
    assert len(refreshes) == 1
    assert "ANY ($1::text::bigint[])" in refreshes[0]


async def test_a_wake_naming_an_unknown_job_is_harmless(
    start_daemon: StartDaemon, conn: asyncpg.Connection
) -> None:
    harness = await start_daemon(refresh_spacing=0.1)
    await aio(conn.execute)("SELECT pg_notify('coordinator', $1)", json.dumps({"job": 987654321}))
    refreshed = await harness.wait_event("refresh", count=2)
    assert (refreshed[-1]["named"], refreshed[-1]["jobs"]) == (1, 0)
    assert not harness.done.is_set()
    assert harness.daemon.status().state == "ready"


async def test_a_full_refresh_reads_pages_and_saves_each_pages_first_deadlines(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    sql_log: StatementLog,
    database_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Pages of 3 rows, first deadlines saved 2 at most per statement: 7 recurring jobs
    # without a deadline, one unusable schedule among them, a manual job (not loaded)
    # and one with its deadline saved already.
    monkeypatch.setattr(store, "REFRESH_PAGE", 3)
    monkeypatch.setattr(inventory, "FIRST_DEADLINE_BATCH", 2)
    target = '{"kind": "exec", "argv": ["true"]}'
    await aio(conn.execute)(
        "INSERT INTO coordinator.jobs (name, schedule_kind, schedule, target, next_run_at) "
        "SELECT 'j' || g, CASE WHEN g = 4 THEN 'manual' ELSE 'cron' END, "
        "CASE WHEN g = 4 THEN NULL WHEN g = 5 THEN '61 25 * * *' ELSE '0 0 1 1 *' END, "
        "$1::jsonb, CASE WHEN g = 8 THEN now() + interval '1 day' END "
        "FROM generate_series(1, 10) g",
        target,
    )
    sql_log.mark()
    harness = await start_daemon()
    statements = [s.sql for s in sql_log.statements(app="coordinator", db=database_name)]
    # 9 rows may need a timer (all but the manual job): three full pages, and a fourth
    # statement finds no more.
    assert sum("LEFT JOIN coordinator.runs r" in s for s in statements) == 4
    # Each page's first deadlines in statements of their own, 2 at most each: pages
    # (1, 2, 3), (5, 6, 7) and (8, 9, 10) need (1, 2) (3), (6, 7) and (9, 10). Every one
    # is written: the count answers, nothing is read back. The unusable one is marked.
    firsts = [s for s in statements if "SET next_run_at = (SELECT $4" in s]
    assert len(firsts) == 4
    assert not any("SELECT v.id" in s for s in statements)
    rows = await aio(conn.fetch)(
        "SELECT id, name, next_run_at, invalid_reason FROM coordinator.jobs ORDER BY id"
    )
    saved = {r["id"]: r["next_run_at"].timestamp() for r in rows if r["next_run_at"] is not None}
    by_name = {r["name"]: r for r in rows}
    assert by_name["j5"]["invalid_reason"] is not None
    assert by_name["j5"]["next_run_at"] is None
    assert by_name["j4"]["next_run_at"] is None
    # Every usable recurring job is armed on exactly what is saved, and holds it to the
    # microsecond (read as integer microseconds, or as written).
    assert len(saved) == 8
    assert dict(harness.daemon.deadlines.items()) == saved
    jobs = harness.daemon.inventory.jobs
    assert {r["id"]: jobs[r["id"]].next_run_at for r in rows if r["id"] in saved} == {
        r["id"]: r["next_run_at"] for r in rows if r["id"] in saved
    }


async def test_first_deadlines_never_overwrite_a_concurrent_writer(
    conn: asyncpg.Connection, database: str
) -> None:
    """A page's first deadlines are written where the job still has none and the schedule
    it was computed for; the jobs changed (or removed) since they were read come back as
    not written, found by a second statement only because the count fell short."""
    target = '{"kind": "exec", "argv": ["true"]}'
    ids = [
        await aio(conn.fetchval)(
            "INSERT INTO coordinator.jobs (name, schedule_kind, schedule, target) "
            "VALUES ($1, 'cron', '0 0 1 1 *', $2::jsonb) RETURNING id",
            f"c{n}",
            target,
        )
        for n in range(6)
    ]
    early, late = datetime(2030, 1, 1, tzinfo=UTC), datetime(2031, 1, 1, tzinfo=UTC)
    theirs = datetime(2029, 6, 1, tzinfo=UTC)
    # Sent in no particular order (an incremental refresh's), with two distinct deadlines.
    order = [ids[4], ids[0], ids[3], ids[5], ids[1], ids[2]]
    firsts = store.FirstDeadlines(
        ids=order, ats=[late if i % 2 else early for i in range(6)], versions=[1] * 6
    )
    sent = dict(zip(firsts.ids, firsts.ats, strict=True))
    pool = store.ConnectionPool(database)
    mine = store.Store(pool=pool, instance="test")
    try:
        # Meanwhile: a schedule edited, a deadline saved by someone else, a job removed,
        # and one saved by someone else with the very deadline the daemon computed.
        await aio(conn.execute)(
            "UPDATE coordinator.jobs SET schedule = '0 0 2 1 *', "
            "schedule_version = schedule_version + 1 WHERE id = $1",
            ids[1],
        )
        await aio(conn.execute)(
            "UPDATE coordinator.jobs SET next_run_at = $2 WHERE id = $1", ids[2], theirs
        )
        await aio(conn.execute)("DELETE FROM coordinator.jobs WHERE id = $1", ids[3])
        await aio(conn.execute)(
            "UPDATE coordinator.jobs SET next_run_at = $2 WHERE id = $1", ids[5], sent[ids[5]]
        )
        before = mine.statements
        refused = await mine.init_deadlines(firsts)
        assert mine.statements - before == 2  # short: the second statement looked
        assert refused == {ids[1], ids[2], ids[3]}
        # Nothing left to write: one statement, nothing refused.
        before = mine.statements
        clean = store.FirstDeadlines(ids=[ids[0]], ats=[sent[ids[0]]], versions=[1])
        await aio(conn.execute)(
            "UPDATE coordinator.jobs SET next_run_at = NULL WHERE id = $1", ids[0]
        )
        assert await mine.init_deadlines(clean) == set()
        assert mine.statements - before == 1
    finally:
        await pool.close()
    saved = {
        r["id"]: r["next_run_at"]
        for r in await aio(conn.fetch)("SELECT id, next_run_at FROM coordinator.jobs")
    }
    assert saved == {
        ids[0]: sent[ids[0]],
        ids[1]: None,  # edited: not written
        ids[2]: theirs,  # kept
        ids[4]: sent[ids[4]],
        ids[5]: sent[ids[5]],
    }
