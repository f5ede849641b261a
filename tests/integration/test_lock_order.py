"""Lock order of the SQL API against the daemon's: a job's row before its runs' rows.

Every claim and settlement locks the job, then the run. An operator's function that
locked the run first and the job second (cancel and resolve did, before 0016) could
deadlock against a claim of the same run. The order is observed directly: while another
transaction holds the job, the function must wait for it *without* holding the run.
"""

from __future__ import annotations

import asyncpg
import pytest
import trio

from coordinator.db import aio, transaction

from .conftest import define


async def _connect(database: str) -> asyncpg.Connection:
    return await aio(asyncpg.connect)(database)


async def _run_is_free(other: asyncpg.Connection, run_id: int) -> bool:
    """Whether nobody holds the run's row lock (tried without waiting)."""
    try:
        async with transaction(other):
            await aio(other.execute)(
                "SELECT 1 FROM coordinator.runs WHERE id = $1 FOR UPDATE NOWAIT", run_id
            )
    except asyncpg.LockNotAvailableError:
        return False
    return True


@pytest.mark.parametrize(
    ("status", "call"),
    [
        ("queued", "SELECT coordinator.cancel($1)"),
        ("unresolved", "SELECT coordinator.resolve($1, 'failed')"),
    ],
    ids=["cancel", "resolve"],
)
async def test_cancel_and_resolve_wait_for_the_job_before_taking_the_run(
    conn: asyncpg.Connection, database: str, status: str, call: str
) -> None:
    job = await define(conn, "ordered")
    run_id = await aio(conn.fetchval)(
        "INSERT INTO coordinator.runs (job_id, trigger, status) VALUES ($1, 'manual', $2) "
        "RETURNING id",
        job,
        status,
    )
    holder, operator, prober = [await _connect(database) for _ in range(3)]
    try:
        # A claim's first step: the job's row, held.
        await aio(holder.execute)("BEGIN")
        await aio(holder.execute)(
            "SELECT 1 FROM coordinator.jobs WHERE id = $1 FOR NO KEY UPDATE", job
        )
        done = trio.Event()

        async def operate() -> None:
            await aio(operator.execute)(call, run_id)
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(operate)
            # The operator's call is waiting (on the job's lock) ...
            with trio.fail_after(10):
                while not await aio(prober.fetchval)(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND query LIKE 'SELECT coordinator.%'"
                ):
                    await trio.sleep(0.02)
            assert not done.is_set()
            # ... and holds nothing of the run meanwhile: the claim could go on.
            assert await _run_is_free(prober, run_id)
            await aio(holder.execute)("ROLLBACK")
            with trio.fail_after(10):
                await done.wait()
    finally:
        for c in (holder, operator, prober):
            await aio(c.close)()
