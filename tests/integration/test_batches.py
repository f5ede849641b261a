"""Claims and settlements in batches (migrations/0010) keep every invariant of the
single-run path: one outstanding run per job, fencing, admission order, nothing run
twice when a batch fails, one refused result never costs the others theirs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg
import trio

from coordinator.core.admission import Ticket
from coordinator.db import aio
from coordinator.store import ConnectionPool, Store
from coordinator.worker import Context, Worker

from .conftest import StartDaemon, define

if TYPE_CHECKING:
    from pathlib import Path


def counter(tmp_path: Path, name: str) -> tuple[list[str], Path]:
    path = tmp_path / f"{name}.txt"
    return ["sh", "-c", f'echo "$COORDINATOR_RUN_ID" >> {path}'], path


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


async def until(predicate: Any, timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while not await predicate():
            await trio.sleep(0.05)


async def claims_waiting(conn: asyncpg.Connection) -> bool:
    return bool(
        await aio(conn.fetchval)(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'coordinator' "
            "AND wait_event_type = 'Lock' AND query LIKE '%coordinator._claim%'"
        )
    )


async def hold_job(database: str, job: int) -> asyncpg.Connection:
    """A session holding ``job``'s row as a claim locks it: claims of it wait."""
    blocker = await aio(asyncpg.connect)(database)
    await aio(blocker.execute)("BEGIN")
    await aio(blocker.execute)(
        "SELECT 1 FROM coordinator.jobs WHERE id = $1 FOR NO KEY UPDATE", job
    )
    return blocker


async def test_concurrent_triggers_of_many_jobs_make_one_run_each(
    start_daemon: StartDaemon, conn: asyncpg.Connection, database: str, tmp_path: Path
) -> None:
    argv, path = counter(tmp_path, "all")
    names = [f"m{i}" for i in range(60)]
    for name in names:
        await define(conn, name, target={"kind": "exec", "argv": argv})
    await start_daemon(concurrency=64)

    async def trigger_all() -> None:
        c = await aio(asyncpg.connect)(database)
        try:
            for name in names:
                await aio(c.fetchval)("SELECT coordinator.trigger('default', $1)", name)
        finally:
            await aio(c.close)()

    async with trio.open_nursery() as n:
        for _ in range(4):
            n.start_soon(trigger_all)

    async def settled() -> bool:
        left = await aio(conn.fetchval)(
            "SELECT count(*) FROM coordinator.runs WHERE status IN ('queued', 'running')"
        )
        return left == 0 and len(lines(path)) >= len(names)

    await until(settled)
    await trio.sleep(0.5)
    per_job = await aio(conn.fetch)(
        "SELECT job_id, count(*) AS n FROM coordinator.runs GROUP BY job_id"
    )
    # Four triggers of a job while its run is outstanding are that one run; a trigger
    # after it finished is a new run: at most as many runs as trigger rounds, and each
    # run ran its command exactly once.
    assert all(1 <= r["n"] <= 4 for r in per_job)
    ran = lines(path)
    assert len(ran) == len(set(ran))
    total = await aio(conn.fetchval)("SELECT count(*) FROM coordinator.runs")
    assert len(ran) == total


async def test_a_batch_is_fenced_when_its_daemon_does_not_hold_the_lock(
    aio_loop: Any, conn: asyncpg.Connection, database: str
) -> None:
    jobs = [await define(conn, f"f{i}") for i in range(5)]
    runs = [
        await aio(conn.fetchval)("SELECT coordinator.trigger('default', $1)", f"f{i}")
        for i in range(5)
    ]
    pool = ConnectionPool(database, size=2)
    store = Store(pool=pool, instance="not-leading", leader_pid=424242)  # holds no lock
    try:
        async with trio.open_nursery() as n:
            await n.start(store.serve)
            results: list[Any] = []

            async def claim(job: int, run: int) -> None:
                ticket = Ticket(job_id=job, priority="background", due=0.0, run_id=run)
                results.append(await store.claim(ticket, workers=()))

            async with trio.open_nursery() as claims:
                for job, run in zip(jobs, runs, strict=True):
                    claims.start_soon(claim, job, run)
            n.cancel_scope.cancel()
    finally:
        await pool.close()
    assert [r.reason for r in results] == ["fenced"] * 5
    statuses = await aio(conn.fetch)("SELECT status FROM coordinator.runs")
    assert {r["status"] for r in statuses} == {"queued"}


async def test_runs_start_in_admission_order_within_a_batch(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    """Eight runs wait for a worker type nobody serves; a worker with room for all of
    them connects: admission lets them all start at once, in priority then FIFO order,
    and they are claimed in one batch and called in that order."""
    names = [(f"bg{i}", "background") for i in range(4)] + [
        (f"in{i}", "interactive") for i in range(4)
    ]
    target = {"kind": "worker", "type": "ordered"}
    for name, priority in names:
        await define(conn, name, priority=priority, target=target)
    harness = await start_daemon(concurrency=64, refresh_spacing=0.1)
    for name, _priority in names:  # bg0 first, in3 last
        await aio(conn.fetchval)("SELECT coordinator.trigger('default', $1)", name)
    with trio.fail_after(20):  # every queued run is known and waits for a slot
        while harness.daemon.admission.waiting_count < len(names):
            await harness.wait_event("refresh", count=len(harness.named("refresh")) + 1)

    called: list[str] = []
    worker = Worker(worker_id="w", capacity=8)

    @worker.job("ordered")
    async def handle(ctx: Context) -> None:
        called.append(ctx.job)

    path = harness.daemon.executors["worker"].socket_path  # type: ignore[attr-defined]
    await nursery.start(lambda task_status: worker.run(path, task_status=task_status))
    await harness.wait_event("job.run", count=len(names))
    claims = [s for s in harness.events if s["event"] == "run.started"]
    order = [e["job"].removeprefix("default/") for e in claims]
    # Interactive before background; within a priority, first triggered first.
    expected = [f"in{i}" for i in range(4)] + [f"bg{i}" for i in range(4)]
    assert order == expected
    # (The worker runs its handlers concurrently, so their own order is its business.)
    assert sorted(called) == sorted(expected)
    claims_sent = harness.daemon.store.claims
    assert (claims_sent.batches, claims_sent.items) == (1, len(names))  # one statement


async def test_a_failed_batch_runs_nothing_twice(
    start_daemon: StartDaemon, conn: asyncpg.Connection, database: str, tmp_path: Path
) -> None:
    argv, path = counter(tmp_path, "once")
    gate = await define(conn, "gate", target={"kind": "exec", "argv": argv})
    names = [f"b{i}" for i in range(10)]
    for name in names:
        await define(conn, name, target={"kind": "exec", "argv": argv})
    harness = await start_daemon(concurrency=64, refresh_spacing=0.2, retry_cap=0.5)
    blocker = await hold_job(database, gate)
    try:
        await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'gate')")
        for name in names:
            await aio(conn.fetchval)("SELECT coordinator.trigger('default', $1)", name)
        await until(lambda: claims_waiting(conn))
        # The batch statement dies mid-flight: its transaction (and any claim in it) is
        # rolled back; the daemon must claim every run again, and run each once.
        await aio(conn.execute)(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'coordinator' AND query LIKE '%coordinator._claim%'"
        )
    finally:
        await aio(blocker.execute)("COMMIT")
        await aio(blocker.close)()
    assert await harness.wait_event("claim.failed")

    async def all_done() -> bool:
        left = await aio(conn.fetchval)(
            "SELECT count(*) FROM coordinator.runs WHERE status <> 'succeeded'"
        )
        return left == 0

    await until(all_done)
    ran = lines(path)
    assert len(ran) == len(names) + 1
    assert len(set(ran)) == len(ran)


async def test_one_refused_settlement_does_not_cost_the_others_theirs(
    start_daemon: StartDaemon, conn: asyncpg.Connection, database: str
) -> None:
    await aio(conn.execute)(
        """
        CREATE TABLE public.faults (active boolean NOT NULL);
        INSERT INTO public.faults VALUES (true);
        CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF (SELECT active FROM public.faults) AND NEW.status <> 'running'
               AND (SELECT name FROM coordinator.jobs WHERE id = NEW.job_id) = 'bad' THEN
                RAISE EXCEPTION 'injected settlement fault';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse BEFORE UPDATE ON coordinator.runs
            FOR EACH ROW EXECUTE FUNCTION public.refuse();
        """
    )
    # Every job sleeps a moment so that their results arrive together.
    slow = {"kind": "exec", "argv": ["sh", "-c", "sleep 0.5"]}
    names = ["bad"] + [f"good{i}" for i in range(8)]
    for name in names:
        await define(conn, name, target=slow)
    harness = await start_daemon(concurrency=64, retry_cap=0.5)
    await aio(conn.execute)(
        "SELECT coordinator.trigger('default', name) FROM coordinator.jobs ORDER BY id"
    )
    await harness.wait_event("job.run", count=len(names))
    held = harness.named("settle.retained")
    assert [e["job"] for e in held] == ["default/bad"]
    rows = await aio(conn.fetch)(
        "SELECT j.name, r.status FROM coordinator.runs r JOIN coordinator.jobs j ON j.id = r.job_id"
    )
    statuses = {r["name"]: r["status"] for r in rows}
    assert statuses.pop("bad") == "running"
    assert set(statuses.values()) == {"succeeded"}
    await aio(conn.execute)("UPDATE public.faults SET active = false")
    await harness.wait_event("settle.saved", job="default/bad")


async def test_a_claim_refused_inside_a_batch_holds_no_one_back(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    """One item of a claim batch fails (a trigger refuses to start its run); the other
    claims of the same batch start their calls, in order, without waiting for it."""
    await aio(conn.execute)(
        """
        CREATE FUNCTION public.refuse_start() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.status = 'running'
               AND (SELECT name FROM coordinator.jobs WHERE id = NEW.job_id) = 'bad' THEN
                RAISE EXCEPTION 'injected claim fault';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_start BEFORE UPDATE ON coordinator.runs
            FOR EACH ROW EXECUTE FUNCTION public.refuse_start();
        """
    )
    target = {"kind": "worker", "type": "gated"}
    await define(conn, "bad", priority="interactive", target=target)  # first in the batch
    names = [f"good{i}" for i in range(5)]
    for name in names:
        await define(conn, name, target=target)
    harness = await start_daemon(concurrency=64, refresh_spacing=0.1, retry_cap=0.5)
    for name in ["bad", *names]:
        await aio(conn.fetchval)("SELECT coordinator.trigger('default', $1)", name)
    with trio.fail_after(20):
        while harness.daemon.admission.waiting_count < 1 + len(names):
            await harness.wait_event("refresh", count=len(harness.named("refresh")) + 1)
    worker = Worker(worker_id="w", capacity=8)

    @worker.job("gated")
    async def handle(ctx: Context) -> None:
        return None

    path = harness.daemon.executors["worker"].socket_path  # type: ignore[attr-defined]
    await nursery.start(lambda task_status: worker.run(path, task_status=task_status))
    runs = await harness.wait_event("job.run", count=len(names))
    assert {e["job"] for e in runs} == {f"default/{n}" for n in names}
    failed = await harness.wait_event("claim.failed")
    assert "injected claim fault" in failed[0]["error"]
