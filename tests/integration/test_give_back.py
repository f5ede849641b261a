"""Giving back a claimed run that was never sent (migrations/0023): the store's side,
against a real PostgreSQL. A manual run or a retry is ``queued`` again as before its
claim; a run of the schedule is removed and its saved deadline stands; a run settled or
swept meanwhile is left as it is; give-backs and results settle together."""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
import attrs
import pytest
import trio

from coordinator.core.admission import Ticket
from coordinator.db import aio
from coordinator.errors import DatabaseError
from coordinator.model import Outcome
from coordinator.spool import HeldResult
from coordinator.store import ConnectionPool, Store

from .conftest import define

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from coordinator.model import Claim, OutcomeStatus


@asynccontextmanager
async def serving(database: str) -> AsyncIterator[Store]:
    pool = ConnectionPool(database, size=2)
    store = Store(pool=pool, instance="giver")
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(store.serve)
            yield store
            nursery.cancel_scope.cancel()
    finally:
        await pool.close()


async def claim_run(store: Store, job: int, run: int) -> Claim:
    ticket = Ticket(job_id=job, priority="background", due=0.0, run_id=run)
    result = await store.claim(ticket, workers=("t",))
    assert result.claim is not None, result.reason
    return result.claim


def held(claim: Claim, status: OutcomeStatus = "queued", message: str | None = None) -> HeldResult:
    now = datetime.now(UTC)
    return HeldResult(
        run_id=claim.run_id,
        job_id=claim.job.id,
        job_key=claim.job.key,
        schedule_version=claim.job.schedule_version,
        next_run_at=None,
        claimed_at=claim.claimed_at,
        outcome=Outcome(
            status=status,
            started_at=now,
            finished_at=now,
            error_message=message or "not sent: no worker serving 't' is connected",
        ),
    )


async def run_row(conn: asyncpg.Connection, run: int) -> dict[str, Any] | None:
    row = await aio(conn.fetchrow)(
        "SELECT status, claimed_at, started_at, instance, attempt, args, error_message "
        "FROM coordinator.runs WHERE id = $1",
        run,
    )
    return None if row is None else dict(row)


async def test_a_manual_run_given_back_is_queued_again_as_before_its_claim(
    aio_loop: Any, conn: asyncpg.Connection, database: str
) -> None:
    job = await define(conn, "m", target={"kind": "worker", "type": "t"})
    run = await aio(conn.fetchval)(
        "SELECT coordinator.trigger('default', 'm', '{\"n\": 1}'::jsonb)"
    )
    before = await run_row(conn, run)
    async with serving(database) as store:
        claim = await claim_run(store, job, run)
        claimed = await run_row(conn, run)
        assert claimed is not None
        assert claimed["status"] == "running"
        state = await store.settle(held(claim))
        assert (state.outcome, state.retry_run_id) == ("saved", run)
        assert await run_row(conn, run) == before
        # Sent again (its first answer lost): the run is armed again, nothing changes.
        again_state = await store.settle(held(claim))
        assert (again_state.outcome, again_state.retry_run_id) == ("already", run)
        assert await run_row(conn, run) == before
        # ... and is claimed again like any queued run.
        again = await claim_run(store, job, run)
        assert (again.run_id, again.attempt, dict(again.args)) == (run, 1, {"n": 1})
        # The first give-back sent once more (held, or spooled, with its answer lost)
        # does not undo that new claim: its run is running under another claim now.
        late = await store.settle(held(claim))
        assert (late.outcome, late.retry_run_id) == ("already", None)
        row = await run_row(conn, run)
        assert row is not None
        assert (row["status"], row["claimed_at"]) == ("running", again.claimed_at)


async def test_a_run_of_the_schedule_given_back_is_removed_and_its_deadline_stands(
    aio_loop: Any, conn: asyncpg.Connection, database: str
) -> None:
    job = await define(
        conn,
        "s",
        schedule_kind="cron",
        schedule="0 * * * *",
        target={"kind": "exec", "argv": ["true"]},
    )
    deadline = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET next_run_at = $2 WHERE id = $1", job, deadline
    )
    version = await aio(conn.fetchval)(
        "SELECT schedule_version FROM coordinator.jobs WHERE id = $1", job
    )

    def ticket() -> Ticket:
        return Ticket(
            job_id=job,
            priority="background",
            due=deadline.timestamp(),
            scheduled_for=deadline,
            schedule_version=version,
        )

    async with serving(database) as store:
        result = await store.claim(ticket(), workers=())
        assert result.claim is not None, result.reason
        run = result.claim.run_id
        state = await store.settle(held(result.claim))
        assert (state.outcome, state.retry_run_id, state.next_run_at) == ("saved", None, deadline)
        assert await run_row(conn, run) is None
        assert (
            await aio(conn.fetchval)("SELECT next_run_at FROM coordinator.jobs WHERE id = $1", job)
            == deadline
        )
        # Sent again (its first answer lost): its job is still found, its deadline armed.
        resent = await store.settle(held(result.claim))
        assert (resent.outcome, resent.job_id, resent.next_run_at) == ("already", job, deadline)
        # The same deadline is claimed again: a new run serves it.
        again = await store.claim(ticket(), workers=())
        assert again.claim is not None, again.reason
        assert again.claim.scheduled_for == deadline


async def test_a_run_swept_meanwhile_is_given_back_all_the_same(
    aio_loop: Any, conn: asyncpg.Connection, database: str
) -> None:
    """Another daemon's crash sweep marked it `unresolved` (it may have run), but this
    daemon knows it was never sent: it is queued again, not left blocking its job until
    an operator resolves it (migrations/0032's late path). A run the sweep ended
    otherwise keeps that end."""
    job = await define(conn, "w")
    run = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'w')")
    async with serving(database) as store:
        claim = await claim_run(store, job, run)
        await aio(conn.execute)(
            "UPDATE coordinator.runs SET status = 'unresolved', error_cause = 'lost' WHERE id = $1",
            run,
        )
        state = await store.settle(held(claim))
        assert (state.outcome, state.retry_run_id) == ("late", run)
        row = await run_row(conn, run)
        assert row is not None
        assert row["status"] == "queued"
        # Ended otherwise by the sweep (failed, say): left as it is.
        again = await claim_run(store, job, run)
        await aio(conn.execute)(
            "UPDATE coordinator.runs SET status = 'failed', error_cause = 'lost', "
            "finished_at = now() WHERE id = $1",
            run,
        )
        state = await store.settle(held(again))
        assert state.outcome == "already"
        row = await run_row(conn, run)
        assert row is not None
        assert row["status"] == "failed"


async def test_give_backs_and_results_settle_together(
    aio_loop: Any, conn: asyncpg.Connection, database: str
) -> None:
    """One batch of settlements holding give-backs and results: each gets its own."""
    jobs = [await define(conn, f"j{i}") for i in range(6)]
    runs = [
        await aio(conn.fetchval)("SELECT coordinator.trigger('default', $1)", f"j{i}")
        for i in range(6)
    ]
    async with serving(database) as store:
        claims = [await claim_run(store, j, r) for j, r in zip(jobs, runs, strict=True)]
        statuses: list[OutcomeStatus] = [
            "queued",
            "succeeded",
            "queued",
            "failed",
            "succeeded",
            "queued",
        ]
        states: dict[int, Any] = {}

        async def settle(index: int) -> None:
            states[index] = await store.settle(held(claims[index], statuses[index], "x"))

        async with trio.open_nursery() as nursery:
            for index in range(6):
                nursery.start_soon(settle, index)
    assert sorted(states) == list(range(6))
    assert all(s.outcome == "saved" for s in states.values())
    rows = await aio(conn.fetch)(
        "SELECT id, status FROM coordinator.runs WHERE id = ANY ($1::bigint[])", runs
    )
    saved = {r["id"]: r["status"] for r in rows}
    assert [saved[r] for r in runs] == statuses


async def test_a_resumed_run_is_never_given_back(
    aio_loop: Any, conn: asyncpg.Connection, database: str
) -> None:
    """A run resumed before (recoverable) pauses unsent instead; were one given back by
    mistake, the database refuses it (its first start must not be lost)."""
    job = await define(conn, "r")
    run = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'r')")
    async with serving(database) as store:
        claim = await claim_run(store, job, run)
        await aio(conn.execute)("UPDATE coordinator.runs SET resumes = 1 WHERE id = $1", run)
        with pytest.raises(DatabaseError, match="cannot be given back"):
            await store.settle(held(claim))
    row = await run_row(conn, run)
    assert row is not None
    assert row["status"] == "running"


async def test_a_recoverable_run_paused_while_claimed_is_paused_by_its_give_back(
    aio_loop: Any, conn: asyncpg.Connection, database: str
) -> None:
    """A recoverable job's run that never started is given back like any other. An
    operator's pause asked while it was claimed, before it was sent, leaves it
    ``cancel_requested``: its give-back ends it ``paused``, as pause_run pauses a queued
    run (migrations/0025), where it used to answer ``already`` and leave it so."""
    target = {"kind": "worker", "type": "t"}
    job = await define(conn, "rec", target=target, recoverable=True)
    trigger = "SELECT coordinator.trigger('default', 'rec')"
    run = await aio(conn.fetchval)(trigger)
    before = await run_row(conn, run)
    async with serving(database) as store:
        claim = await claim_run(store, job, run)
        state = await store.settle(held(claim))
        assert (state.outcome, state.retry_run_id) == ("saved", run)
        assert await run_row(conn, run) == before
        claim = await claim_run(store, job, run)
        paused = await aio(conn.fetchval)("SELECT coordinator.pause_run($1)", run)
        assert paused == "cancel_requested"
        state = await store.settle(held(claim))
        assert (state.outcome, state.retry_run_id, state.job_id) == ("paused", None, job)
        row = await run_row(conn, run)
        assert row is not None
        assert (row["status"], row["claimed_at"], row["started_at"], row["instance"]) == (
            "paused",
            None,
            None,
            None,
        )
        assert row["error_message"] == "paused by operator before it started"
        # Sent again (its first answer lost): left as it is.
        assert (await store.settle(held(claim))).outcome == "already"
        # A trigger resumes it; never started, it counts no resume.
        assert await aio(conn.fetchval)(trigger) == run
        resumed = await claim_run(store, job, run)
        assert (resumed.run_id, resumed.resumes, resumed.cursor) == (run, 0, None)
        # Paused again while claimed, its job then removed (history kept): cancelled.
        await aio(conn.fetchval)("SELECT coordinator.pause_run($1)", run)
        await aio(conn.execute)("SELECT coordinator.remove('default', 'rec', true)")
        state = await store.settle(held(resumed))
    assert (state.outcome, state.category) == ("saved", "cancellation")
    row = await run_row(conn, run)
    assert row is not None
    assert row["status"] == "cancelled"


async def test_a_tick_paused_while_claimed_spends_its_deadline_and_a_trigger_keeps_its_run(
    aio_loop: Any, conn: asyncpg.Connection, database: str
) -> None:
    """A recoverable job's tick paused while it was claimed: paused, like a paused result
    it spends the deadline it served (else that overdue deadline, armed at once, would
    resume it right away), and a trigger that queues it again later keeps its id even if
    that run is given back in turn (queued again, not removed as a fresh tick is)."""
    job = await define(
        conn,
        "rs",
        schedule_kind="cron",
        schedule="0 * * * *",
        target={"kind": "worker", "type": "t"},
        recoverable=True,
    )
    deadline = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
    later = deadline + timedelta(hours=1)
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET next_run_at = $2 WHERE id = $1", job, deadline
    )
    version = await aio(conn.fetchval)(
        "SELECT schedule_version FROM coordinator.jobs WHERE id = $1", job
    )
    ticket = Ticket(
        job_id=job,
        priority="background",
        due=deadline.timestamp(),
        scheduled_for=deadline,
        schedule_version=version,
    )
    async with serving(database) as store:
        result = await store.claim(ticket, workers=("t",))
        assert result.claim is not None, result.reason
        run = result.claim.run_id
        await aio(conn.fetchval)("SELECT coordinator.pause_run($1)", run)
        state = await store.settle(attrs.evolve(held(result.claim), next_run_at=later))
        assert (state.outcome, state.next_run_at) == ("paused", later)
        row = await run_row(conn, run)
        assert row is not None
        assert row["status"] == "paused"
        # A trigger queues it again; claimed, then given back: still that run, queued.
        assert await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'rs')") == run
        claim = await claim_run(store, job, run)
        state = await store.settle(held(claim))
        assert (state.outcome, state.retry_run_id) == ("saved", run)
        row = await run_row(conn, run)
        assert row is not None
        assert (row["status"], row["claimed_at"], row["started_at"]) == ("queued", None, None)
        # Its schedule edited while it is claimed again: it is the run a trigger asked
        # for, not a tick of the old schedule, so it is queued again still.
        claim = await claim_run(store, job, run)
        await define(
            conn,
            "rs",
            schedule_kind="cron",
            schedule="30 * * * *",
            target={"kind": "worker", "type": "t"},
            recoverable=True,
        )
        state = await store.settle(held(claim))
        assert (state.outcome, state.retry_run_id) == ("saved", run)


async def test_a_fresh_tick_given_back_is_removed_whatever_moved_its_jobs_deadline(
    aio_loop: Any, conn: asyncpg.Connection, database: str
) -> None:
    """A tick the claim made is removed when given back, also once its job's deadline
    moved on meanwhile (the job paused and resumed, dropping the ticks owed, and the
    daemon saved the next one; the schedule edited): what is owed is the job's deadline,
    not that tick. A one-shot job's tick paused while claimed, then queued again by a
    trigger, is queued again when given back, though its job has no deadline left."""
    once = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
    jobs = {
        "fresh": await define(
            conn, "fresh", schedule_kind="cron", schedule="0 * * * *",
            target={"kind": "worker", "type": "t"},
        ),
        "once": await define(
            conn, "once", schedule_kind="once", schedule=once.isoformat(),
            target={"kind": "worker", "type": "t"}, recoverable=True,
        ),
    }  # fmt: skip
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET next_run_at = $1 WHERE id = ANY ($2::bigint[])",
        once,
        list(jobs.values()),
    )
    version = 1

    def tick(job: int) -> Ticket:
        return Ticket(
            job_id=job,
            priority="background",
            due=once.timestamp(),
            scheduled_for=once,
            schedule_version=version,
        )

    async with serving(database) as store:
        fresh = await store.claim(tick(jobs["fresh"]), workers=("t",))
        assert fresh.claim is not None, fresh.reason
        later = once + timedelta(hours=2)
        await aio(conn.execute)("SELECT coordinator.pause('default', 'fresh')")
        await aio(conn.execute)("SELECT coordinator.resume('default', 'fresh')")
        await aio(conn.execute)(  # (the daemon's next refresh saves the next deadline)
            "UPDATE coordinator.jobs SET next_run_at = $2 WHERE id = $1", jobs["fresh"], later
        )
        state = await store.settle(held(fresh.claim))
        assert (state.outcome, state.retry_run_id, state.next_run_at) == ("saved", None, later)
        assert await run_row(conn, fresh.claim.run_id) is None

        first = await store.claim(tick(jobs["once"]), workers=("t",))
        assert first.claim is not None, first.reason
        run = first.claim.run_id
        await aio(conn.fetchval)("SELECT coordinator.pause_run($1)", run)
        state = await store.settle(held(first.claim))  # (no next deadline: a one-shot)
        assert (state.outcome, state.next_run_at) == ("paused", None)
        assert await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'once')") == run
        again = await claim_run(store, jobs["once"], run)
        state = await store.settle(held(again))
        assert (state.outcome, state.retry_run_id) == ("saved", run)
        row = await run_row(conn, run)
        assert row is not None
        assert row["status"] == "queued"


async def test_a_run_of_a_job_removed_meanwhile_is_cancelled_not_queued(
    aio_loop: Any, conn: asyncpg.Connection, database: str
) -> None:
    """Removed with its history kept while the run was claimed: the run ends as remove
    ends the runs it finds waiting, rather than waiting for ever on a hidden job."""
    job = await define(conn, "gone-soon", target={"kind": "worker", "type": "t"})
    run = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'gone-soon')")
    async with serving(database) as store:
        claim = await claim_run(store, job, run)
        await aio(conn.execute)("SELECT coordinator.remove('default', 'gone-soon', true)")
        state = await store.settle(held(claim))
    assert (state.outcome, state.category) == ("saved", "cancellation")
    row = await run_row(conn, run)
    assert row is not None
    assert (row["status"], row["error_message"]) == (
        "cancelled",
        "cancelled: the job was removed (history kept)",
    )


async def test_remove_waits_for_a_settlement_holding_the_job_and_cancels_what_it_queued(
    aio_loop: Any, conn: asyncpg.Connection, database: str
) -> None:
    """remove(keep_history) takes the job's row lock (``_job_id``) before it cancels the
    waiting runs, the order claims and settlements take: a run a settlement queued while
    holding that lock (given back, or a retry) is cancelled too, never left queued on a
    hidden job."""
    job = await define(conn, "racing", target={"kind": "worker", "type": "t"})
    run = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'racing')")
    await aio(conn.execute)(
        "UPDATE coordinator.runs SET status = 'running', claimed_at = now() WHERE id = $1", run
    )
    settling = await aio(asyncpg.connect)(database)
    remover = await aio(asyncpg.connect)(database)
    try:
        # A settlement in flight: the job's row locked, its run queued, not committed.
        await aio(settling.execute)("BEGIN")
        await aio(settling.execute)(
            "SELECT 1 FROM coordinator.jobs WHERE id = $1 FOR NO KEY UPDATE", job
        )
        await aio(settling.execute)(
            "UPDATE coordinator.runs SET status = 'queued', claimed_at = NULL WHERE id = $1", run
        )
        removed = trio.Event()

        async def remove() -> None:
            await aio(remover.execute)("SELECT coordinator.remove('default', 'racing', true)")
            removed.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(remove)
            with trio.fail_after(10):
                while not await aio(conn.fetchval)(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND query LIKE '%coordinator.remove%'"
                ):
                    await trio.sleep(0.02)
            assert not removed.is_set()
            await aio(settling.execute)("COMMIT")
    finally:
        await aio(settling.close)()
        await aio(remover.close)()
    row = await run_row(conn, run)
    assert row is not None
    assert (row["status"], row["error_message"]) == (
        "cancelled",
        "cancelled: the job was removed (history kept)",
    )
