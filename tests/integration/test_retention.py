"""Retention against a real PostgreSQL and daemon: the prune runs on a deadline of its
own, deletes in batches while claims go on, keeps what it must, and costs no SQL between
prunes; a job removed with its history kept."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
import trio

from coordinator import client
from coordinator.db import aio
from coordinator.errors import InvalidInput, JobNotFound

from .alerting import OffsetClock
from .conftest import StartDaemon, define

if TYPE_CHECKING:
    import asyncpg

    from coordinator.embedded import StatementLog

OLD = 50_000


async def seed(
    conn: asyncpg.Connection, job_id: int, n: int, *, age: str, status: str = "succeeded"
) -> None:
    """``n`` finished runs of the job, the newest ``age`` old, one second apart."""
    await aio(conn.execute)(
        "INSERT INTO coordinator.runs (job_id, trigger, status, created_at, started_at,"
        " finished_at)"
        " SELECT $1, 'manual', $3, t, t, t FROM ("
        "   SELECT now() - $4::text::interval - ($2 - g) * interval '1 second' AS t"
        "     FROM generate_series(1, $2) g) s",
        job_id,
        n,
        status,
        age,
    )


async def kept(conn: asyncpg.Connection, job_id: int) -> list[str]:
    rows = await aio(conn.fetch)(
        "SELECT status FROM coordinator.runs WHERE job_id = $1 ORDER BY id", job_id
    )
    return [r["status"] for r in rows]


def just_before_a_minute(seconds: float = 3.0) -> OffsetClock:
    """A wall clock ``seconds`` before the next minute starts (prune_at every minute)."""
    now = datetime.now(UTC)
    boundary = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return OffsetClock(offset=boundary - timedelta(seconds=seconds) - now)


async def test_prune_deletes_in_batches_while_claims_go_on(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    sql_log: StatementLog,
    database_name: str,
) -> None:
    old = await define(conn, "old")
    await seed(conn, old, OLD, age="60 days")
    stuck = await define(conn, "stuck")
    await aio(conn.execute)(
        "INSERT INTO coordinator.runs (job_id, trigger, status, created_at, error_cause)"
        " VALUES ($1, 'schedule', 'unresolved', now() - interval '90 days', 'lost')",
        stuck,
    )
    await seed(conn, stuck, 3, age="60 days")
    waiting = await define(conn, "waiting", paused=True)
    await aio(conn.execute)(
        "INSERT INTO coordinator.runs (job_id, trigger, status, created_at)"
        " VALUES ($1, 'manual', 'queued', now() - interval '90 days')",
        waiting,
    )
    await seed(conn, waiting, 3, age="60 days", status="failed")
    held = await define(conn, "held", target={"kind": "worker", "type": "scan"}, recoverable=True)
    await aio(conn.execute)(
        "INSERT INTO coordinator.runs (job_id, trigger, status, created_at, paused_at)"
        " VALUES ($1, 'manual', 'paused', now() - interval '90 days', now() - interval '89 days')",
        held,
    )
    await seed(conn, held, 3, age="60 days")
    capped = await define(conn, "capped", keep_last=5)
    await seed(conn, capped, 20, age="1 hour")
    young = await define(conn, "young")
    await seed(conn, young, 300, age="1 day")
    custom = await define(conn, "custom", retention=timedelta(days=1))
    await seed(conn, custom, 10, age="2 days")
    gone = await define(conn, "gone")
    await seed(conn, gone, 10, age="60 days")
    await aio(conn.execute)("SELECT coordinator.remove('default', 'gone', keep_history => true)")
    await define(conn, "ticker", keep_last=1_000_000)  # all of its runs stay

    harness = await start_daemon(clock=just_before_a_minute(), prune_at="* * * * *")
    harness.daemon.pruner.batch = 1000  # 50 batches or more: claims must get between them
    sql_log.mark()

    ticks: list[int] = []
    with trio.fail_after(120):
        while not harness.named("retention.pruned"):
            run_id: int = await aio(conn.fetchval)(
                "SELECT coordinator.trigger('default', 'ticker')"
            )
            await harness.wait_event("job.run", run=run_id)
            ticks.append(run_id)
    pruned = harness.named("retention.pruned")[0]
    assert pruned["complete"] is True
    expected = (OLD - 1) + 2 + 2 + 2 + 15 + 200 + 9 + 10
    assert pruned["runs"] == expected
    assert pruned["jobs_removed"] == 1
    assert pruned["batches"] >= OLD // 1000

    # Kept: the latest run of every job, outstanding runs (queued, unresolved, paused) whatever
    # their age, at most keep_last runs, nothing older than the retention.
    assert await kept(conn, old) == ["succeeded"]
    assert await kept(conn, stuck) == ["unresolved", "succeeded"]
    assert await kept(conn, waiting) == ["queued", "failed"]
    assert await kept(conn, held) == ["paused", "succeeded"]  # a paused recoverable run
    assert len(await kept(conn, capped)) == 5
    assert len(await kept(conn, young)) == 100
    assert len(await kept(conn, custom)) == 1
    assert await kept(conn, gone) == []
    assert (
        await aio(conn.fetchval)("SELECT count(*) FROM coordinator.jobs WHERE id = $1", gone) == 0
    )

    # Claims were served between the prune's batches (in the server's own log order).
    statements = [s.sql for s in sql_log.statements(app="coordinator", db=database_name)]
    prunes = [i for i, sql in enumerate(statements) if "coordinator._prune(" in sql]
    claims = [i for i, sql in enumerate(statements) if "coordinator._claim" in sql]
    assert len(prunes) == pruned["batches"]
    assert any(prunes[0] < i < prunes[-1] for i in claims)
    latencies = await aio(conn.fetch)(
        "SELECT extract(epoch FROM claimed_at - created_at) AS s FROM coordinator.runs"
        " WHERE id = ANY ($1::bigint[]) AND status = 'succeeded'",
        ticks,
    )
    assert len(latencies) == len(ticks)
    print(
        f"\nprune: {pruned['runs']} runs in {pruned['batches']} batches, "
        f"{pruned['elapsed_ms']:.0f} ms; {len(ticks)} manual runs meanwhile, longest "
        f"trigger-to-claim {max(r['s'] for r in latencies) * 1000:.1f} ms"
    )

    # The next prune is armed for the next minute; until then, nothing is sent.
    assert harness.daemon.status().next_prune is not None
    await trio.sleep(0.3)
    sql_log.mark()
    await trio.sleep(3.0)
    assert sql_log.statements(app="coordinator", db=database_name) == []


async def test_a_job_removed_with_its_history_kept(
    start_daemon: StartDaemon, conn: asyncpg.Connection
) -> None:
    slow = {"kind": "exec", "argv": ["sh", "-c", "sleep 1"]}
    job_id = await define(conn, "report", target=slow)
    harness = await start_daemon()
    running: int = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'report')")
    await harness.wait_event("run.started", run=running)
    await aio(conn.execute)("SELECT coordinator.remove('default', 'report', keep_history => true)")

    # Hidden: unknown to every function and listing, its name free at once.
    assert [j.name for j in await aio(client.list_jobs)(conn)] == []
    with pytest.raises(JobNotFound):
        await aio(client.get_job)(conn, "report")
    with pytest.raises(JobNotFound):
        await aio(client.trigger)(conn, "report")
    # The call that was running settles into the kept history.
    await harness.wait_event("job.run", run=running, outcome="succeeded")
    assert await kept(conn, job_id) == ["succeeded"]
    assert harness.named("settle.orphaned") == []
    assert [r.id for r in await aio(client.list_runs)(conn, job="report")] == [running]

    again = await define(conn, "report")
    assert again != job_id
    fresh: int = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'report')")
    await harness.wait_event("job.run", run=fresh, outcome="succeeded")
    assert [r.id for r in await aio(client.list_runs)(conn, job="report")] == [fresh, running]

    # Retention takes the removed job's runs, its latest too, and then the job itself;
    # the new job keeps its latest.
    report = await aio(client.prune)(conn, retention=timedelta(milliseconds=1))
    assert (report.runs, report.jobs_removed) == (1, 1)
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.jobs") == 1
    assert await kept(conn, again) == ["succeeded"]


async def test_removal_with_history_cancels_a_queued_run_and_refuses_null(
    conn: asyncpg.Connection,
) -> None:
    job_id = await define(conn, "later")
    queued: int = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'later')")
    with pytest.raises(InvalidInput, match="keep_history"), client.translate_errors():
        await aio(conn.execute)("SELECT coordinator.remove('default', 'later', NULL)")
    await aio(client.remove)(conn, "later", keep_history=True)
    row = await aio(conn.fetchrow)("SELECT * FROM coordinator.runs WHERE id = $1", queued)
    assert row["status"] == "cancelled"
    job = await aio(conn.fetchrow)("SELECT * FROM coordinator.jobs WHERE id = $1", job_id)
    assert job["removed_at"] is not None
    assert job["paused"]
    assert job["next_run_at"] is None
    # The default removal still takes everything.
    await define(conn, "later")
    await aio(client.remove)(conn, "later")
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.jobs") == 1


async def test_dry_run_lists_what_would_go_and_deletes_nothing(conn: asyncpg.Connection) -> None:
    many = await define(conn, "many")
    await seed(conn, many, 150, age="1 hour")
    few = await define(conn, "few")
    await seed(conn, few, 3, age="40 days")
    views = await aio(client.prune_preview)(conn, retention=timedelta(days=30))
    by_name: dict[str, Any] = {v.name: v for v in views}
    assert (by_name["many"].runs, by_name["many"].prunable) == (150, 50)
    assert (by_name["few"].runs, by_name["few"].prunable) == (3, 2)
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.runs") == 153
    report = await aio(client.prune)(conn, retention=timedelta(days=30), batch=7)
    assert report.runs == 52
    assert report.batches == math.ceil(52 / 7)
