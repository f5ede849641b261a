"""Recoverable runs against a real daemon and PostgreSQL (docs/design.md, "Recoverable
runs"): durable checkpoints, pause -> paused -> resume (same run, cursor and counter),
stops and lost workers that pause, ticks that resume, findings recorded once."""

from __future__ import annotations

import json
import signal
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio

from coordinator import client
from coordinator.daemon import EXIT_SPOOLED
from coordinator.db import aio
from coordinator.errors import Conflict, RunNotFound
from coordinator.spool import Spool
from coordinator.worker import Context, Paused, Worker

from .conftest import StartDaemon, define

if TYPE_CHECKING:
    from pathlib import Path

    import asyncpg

    from coordinator.embedded import StatementLog

    from .conftest import Harness

#: Items a scan walks, and how many a batch holds (one checkpoint per batch).
ITEMS = 200
BATCH = 10


def socket_of(harness: Harness) -> Path:
    path: Path = harness.daemon.executors["worker"].socket_path  # type: ignore[attr-defined]
    return path


def tune(harness: Harness, **settings: float) -> None:
    """Shorten the worker executor's intervals for a test (checkpoint_interval,
    cancel_grace)."""
    executor = harness.daemon.executors["worker"]
    for name, value in settings.items():
        setattr(executor, name, value)


async def run_worker(nursery: trio.Nursery, worker: Worker, harness: Harness) -> None:
    await nursery.start(lambda task_status: worker.run(socket_of(harness), task_status=task_status))


async def run_row(conn: asyncpg.Connection, run_id: int) -> dict[str, Any]:
    row = await aio(conn.fetchrow)(
        "SELECT status, cursor::text AS cursor, count, resumes, error_message, paused_at, "
        "finished_at, finding_counts::text AS finding_counts, last_progress_at "
        "FROM coordinator.runs WHERE id = $1",
        run_id,
    )
    out = dict(row)
    out["cursor"] = json.loads(row["cursor"]) if row["cursor"] is not None else None
    out["finding_counts"] = json.loads(row["finding_counts"] or "{}")
    return out


async def wait_run(
    conn: asyncpg.Connection, run_id: int, predicate: Any, timeout: float = 20.0
) -> dict[str, Any]:
    with trio.fail_after(timeout):
        while True:
            row = await run_row(conn, run_id)
            if predicate(row):
                return row
            await trio.sleep(0.05)


async def recoverable(conn: asyncpg.Connection, name: str = "scan", **kw: Any) -> int:
    return await define(
        conn, name, target={"kind": "worker", "type": "scan"}, recoverable=True, **kw
    )


@attrs.define
class Scan:
    """A keyset-style scan over ``range(ITEMS)``: a batch, its findings (every multiple
    of 7 is a finding), a checkpoint; it pauses at a batch boundary when asked."""

    #: (run id, cursor, count) at every call's start.
    starts: list[tuple[int, Any, Any]] = attrs.field(factory=list)
    #: Batches done, across calls.
    batches: int = 0
    #: Batches to do before the scan waits at ``gate`` (None: never waits).
    hold_after: int | None = None
    gate: trio.Event = attrs.field(factory=trio.Event)
    #: Seconds between batches.
    pace: float = 0.01
    #: Ignore ``ctx.cancelled`` (a handler that does not pause by itself).
    stubborn: bool = False

    def worker(self, worker_id: str = "scanner", **kw: Any) -> Worker:
        worker = Worker(worker_id=worker_id, capacity=2, **kw)

        @worker.job("scan")
        async def scan(ctx: Context) -> None:
            self.starts.append((ctx.run_id, ctx.cursor, ctx.count))
            position = ctx.cursor or 0
            while position < ITEMS:
                if ctx.cancelled.is_set() and not self.stubborn:
                    raise Paused()
                if self.hold_after is not None and self.batches >= self.hold_after:
                    await self.gate.wait()
                batch = range(position, min(position + BATCH, ITEMS))
                for item in batch:
                    if item % 7 == 0:
                        await ctx.finding(
                            "seven", f"item-{item}", severity="warning", detail={"item": item}
                        )
                position = batch[-1] + 1
                await ctx.checkpoint(position, count=len(batch))
                self.batches += 1
                await trio.sleep(self.pace)

        return worker


SEVENS = len([i for i in range(ITEMS) if i % 7 == 0])


async def test_a_forged_pause_wake_stops_no_call(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    """Any role may ``NOTIFY coordinator``: ``{"pause": N}`` stopped the call of run N
    whatever its status (a helper cancelled another namespace's call with it, as a role
    that could not even read the schema). The daemon now reads the run's status first:
    only ``pause_run``'s ``cancel_requested`` stops it."""
    await recoverable(conn)
    harness = await start_daemon()
    scan = Scan(hold_after=2)
    await run_worker(nursery, scan.worker(), harness)
    run_id = await aio(client.trigger)(conn, "scan")
    await wait_run(conn, run_id, lambda r: r["cursor"] == 2 * BATCH)
    await aio(conn.execute)("SELECT pg_notify('coordinator', $1)", json.dumps({"pause": run_id}))
    await harness.wait_event("wake.pause_refused", run=run_id, status="running")
    assert not harness.named("run.stop_requested")
    assert (await run_row(conn, run_id))["status"] == "running"
    # The operator's pause, through its function, still stops it at once.
    assert await aio(client.pause_run)(conn, run_id) == "cancel_requested"
    await harness.wait_event("run.stop_requested", run=run_id, reason="pause")
    scan.gate.set()
    event = (await harness.wait_event("job.run", run=run_id))[0]
    assert event["outcome"] == "paused"


async def test_checkpoints_pause_and_a_trigger_resumes_the_same_run(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    job = await recoverable(conn)
    harness = await start_daemon()
    tune(harness, checkpoint_interval=0.2)
    scan = Scan(hold_after=6)
    await run_worker(nursery, scan.worker(), harness)
    run_id = await aio(client.trigger)(conn, "scan")
    # Checkpoints are saved while the call runs.
    saved = await wait_run(conn, run_id, lambda r: r["cursor"] == 6 * BATCH)
    assert saved["status"] == "running"
    assert saved["count"] == 6 * BATCH
    assert saved["last_progress_at"] is not None
    assert saved["finding_counts"] == {"warning": len([i for i in range(60) if i % 7 == 0])}

    assert await aio(client.pause_run)(conn, run_id) == "cancel_requested"
    assert (await run_row(conn, run_id))["status"] == "cancel_requested"
    scan.gate.set()  # the handler sees ctx.cancelled at its next batch boundary
    event = (await harness.wait_event("job.run", run=run_id))[0]
    assert event["outcome"] == "paused"
    paused = await run_row(conn, run_id)
    assert paused["status"] == "paused"
    assert paused["error_message"] == "paused by operator"
    assert paused["finished_at"] is None
    assert paused["paused_at"] is not None
    cursor = paused["cursor"]
    assert isinstance(cursor, int)
    assert 6 * BATCH <= cursor < ITEMS
    assert paused["count"] == cursor  # one per item
    assert event["cursor_bytes"] == len(json.dumps(cursor))
    assert harness.named("run.stop_requested", run=run_id, reason="pause")
    # A paused run is outstanding: the job's state says so, nothing else starts.
    view = await aio(client.get_job)(conn, "scan")
    assert (view.outstanding_run, view.outstanding_status) == (run_id, "paused")
    assert view.state == f"run {run_id} paused"

    # The trigger resumes that run: same id, from its cursor, the counter continuing.
    assert await aio(client.trigger)(conn, "scan") == run_id
    done = (await harness.wait_event("job.run", run=run_id, count=2))[1]
    assert done["outcome"] == "succeeded"
    assert done["completed"] is True
    assert done["resumes"] == 1
    assert scan.starts == [(run_id, None, None), (run_id, cursor, cursor)]
    final = await run_row(conn, run_id)
    assert final["status"] == "succeeded"
    assert (final["cursor"], final["count"], final["resumes"]) == (ITEMS, ITEMS, 1)
    assert final["finding_counts"] == {"warning": SEVENS}
    runs = await aio(conn.fetch)("SELECT id FROM coordinator.runs WHERE job_id = $1", job)
    assert [r["id"] for r in runs] == [run_id]
    page = await aio(client.list_findings)(conn, run_id, limit=1000)
    assert sorted(f.resource_id for f in page.findings) == sorted(
        f"item-{i}" for i in range(ITEMS) if i % 7 == 0
    )
    assert page.next_after is None


async def test_findings_are_recorded_once_and_paged(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    await recoverable(conn)
    harness = await start_daemon()
    tune(harness, checkpoint_interval=0.1)
    worker = Worker(worker_id="finder")

    @worker.job("scan")
    async def scan(ctx: Context) -> None:
        for round_ in range(3):  # the same findings three times: recorded once
            for i in range(30):
                severity = ("info", "warning", "error", "data_loss")[i % 4]
                await ctx.finding("check", f"r{i}", severity=severity, detail={"round": round_})
            await ctx.checkpoint(round_, count=30)
            await trio.sleep(0.15)

    await run_worker(nursery, worker, harness)
    run_id = await aio(client.trigger)(conn, "scan")
    await harness.wait_event("job.run", run=run_id)
    row = await run_row(conn, run_id)
    assert row["finding_counts"] == {"info": 8, "warning": 8, "error": 7, "data_loss": 7}
    first = await aio(client.list_findings)(conn, run_id, limit=20)
    assert len(first.findings) == 20
    assert first.next_after == first.findings[-1].id
    rest = await aio(client.list_findings)(conn, run_id, after=first.next_after, limit=20)
    assert len(rest.findings) == 10
    assert rest.next_after is None
    # The first report of each finding is the one kept.
    assert {f.detail["round"] for f in (*first.findings, *rest.findings)} == {0}
    losses = await aio(client.list_findings)(conn, run_id, severity="data_loss")
    assert [f.resource_id for f in losses.findings] == [f"r{i}" for i in range(3, 30, 4)]
    with pytest.raises(RunNotFound):
        await aio(client.list_findings)(conn, 999_999)


async def test_twenty_concurrent_triggers_of_a_paused_or_running_run_make_one_run(
    aio_loop: Any, database: str, conn: asyncpg.Connection
) -> None:
    import asyncpg as pg

    job = await recoverable(conn)
    paused_id = await aio(conn.fetchval)(
        "INSERT INTO coordinator.runs (job_id, trigger, status, cursor, count, started_at) "
        "VALUES ($1, 'manual', 'paused', '{\"after\": 40}', 40, now()) RETURNING id",
        job,
    )
    conns = [
        await aio(pg.connect)(database, server_settings={"application_name": "tests-app"})
        for _ in range(20)
    ]
    try:

        async def one(c: asyncpg.Connection, start: trio.Event, answers: list[int]) -> None:
            await start.wait()
            answers.append(await aio(client.trigger)(c, "scan"))

        for expected_status in ("queued", "running"):
            answers: list[int] = []
            start = trio.Event()
            async with trio.open_nursery() as nursery:
                for c in conns:
                    nursery.start_soon(one, c, start, answers)
                start.set()
            assert answers == [paused_id] * 20
            rows = await aio(conn.fetch)(
                "SELECT id, status, cursor::text AS cursor, count FROM coordinator.runs "
                "WHERE job_id = $1",
                job,
            )
            assert [(r["id"], r["status"]) for r in rows] == [(paused_id, expected_status)]
            assert (json.loads(rows[0]["cursor"]), rows[0]["count"]) == ({"after": 40}, 40)
            # Next round: the run is running (claimed); triggers leave it as it is.
            await aio(conn.execute)(
                "UPDATE coordinator.runs SET status = 'running' WHERE id = $1", paused_id
            )
    finally:
        for c in conns:
            await aio(c.close)()


async def test_graceful_stop_pauses_and_the_next_start_resumes_on_trigger(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    await recoverable(conn)
    first = await start_daemon()
    tune(first, checkpoint_interval=0.2)
    scan = Scan(hold_after=4)
    worker = scan.worker()
    await run_worker(nursery, worker, first)
    run_id = await aio(client.trigger)(conn, "scan")
    await wait_run(conn, run_id, lambda r: r["cursor"] == 4 * BATCH)
    with trio.fail_after(30):
        async with trio.open_nursery() as inner:
            inner.start_soon(first.stop)
            await first.wait_event("run.stop_requested", run=run_id, reason="stopping")
            scan.gate.set()
    assert first.status == 0
    event = first.named("job.run", run=run_id)[0]
    assert (event["outcome"], event["error"]) == ("paused", "paused: the daemon is stopping")
    paused = await run_row(conn, run_id)
    assert paused["status"] == "paused"
    cursor = paused["cursor"]
    assert cursor >= 4 * BATCH
    worker.stop()

    second = await start_daemon()
    assert second.named("startup.lost_run") == []
    scan2 = Scan()
    await run_worker(nursery, scan2.worker("scanner-2"), second)
    await trio.sleep(0.3)
    assert scan2.starts == []  # not resumed by the start itself
    assert await aio(client.trigger)(conn, "scan") == run_id
    done = (await second.wait_event("job.run", run=run_id))[0]
    assert done["outcome"] == "succeeded"
    assert scan2.starts == [(run_id, cursor, cursor)]
    final = await run_row(conn, run_id)
    assert (final["status"], final["cursor"], final["count"]) == ("succeeded", ITEMS, ITEMS)
    assert final["finding_counts"] == {"warning": SEVENS}


async def test_a_worker_s_own_stop_pauses_its_recoverable_calls_at_their_boundary(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    """The daemon's stop asks recoverable calls to pause; the worker's own stop (its
    SIGTERM) did not: an hours-long scan ran on, and the stopping worker with it, until a
    second signal broke the connection. It asks them too: the handler sees
    ``ctx.cancelled`` (``stopping``), pauses at its boundary, and the worker leaves."""
    await recoverable(conn)
    harness = await start_daemon()
    tune(harness, checkpoint_interval=0.1)
    reasons: list[str | None] = []
    worker = Worker(worker_id="leaving", capacity=2, pause_grace=60)  # (no grace runs out)

    @worker.job("scan")
    async def scan(ctx: Context) -> None:
        position = ctx.cursor or 0
        while position < ITEMS:
            if position == 4 * BATCH:
                await ctx.cancelled.wait()  # a long stretch of work, until asked
            if ctx.cancelled.is_set():
                reasons.append(ctx.cancel_reason)
                raise Paused()
            position += BATCH
            await ctx.checkpoint(position, count=BATCH)

    left = trio.Event()

    async def serve(task_status: trio.TaskStatus[None]) -> None:
        await worker.run(socket_of(harness), task_status=task_status)
        left.set()

    await nursery.start(serve)
    run_id = await aio(client.trigger)(conn, "scan")
    await wait_run(conn, run_id, lambda r: r["cursor"] == 4 * BATCH)
    worker.stop()
    event = (await harness.wait_event("job.run", run=run_id))[0]
    assert (event["outcome"], event["error"]) == ("paused", "paused by the worker")
    with trio.fail_after(10):
        await left.wait()  # the daemon closed the connection once the result was in
    assert reasons == ["stopping"]
    row = await run_row(conn, run_id)
    assert (row["status"], row["cursor"], row["count"]) == ("paused", 4 * BATCH, 4 * BATCH)


async def test_a_worker_killed_mid_call_pauses_the_run_at_its_last_cursor(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    job = await recoverable(conn)
    harness = await start_daemon()
    tune(harness, checkpoint_interval=0.1)
    module = tmp_path / "scanworker.py"
    marker = tmp_path / "checkpointed"
    module.write_text(
        "import trio\nfrom pathlib import Path\nfrom coordinator.worker import Worker\n"
        "worker = Worker(worker_id='doomed')\n"
        "@worker.job('scan')\n"
        "async def scan(ctx):\n"
        "    await ctx.checkpoint({'after': 'k-17'}, count=17)\n"
        "    await ctx.finding('odd', 'k-3', severity='error')\n"
        "    await ctx.checkpoint({'after': 'k-42'}, count=25)\n"
        f"    Path({str(marker)!r}).touch()\n"
        "    await trio.sleep(60)\n"
    )
    proc = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "coordinator.worker",
            "scanworker:worker",
            "--socket",
            str(socket_of(harness)),
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    try:
        await harness.wait_event("wake", reason="workers.changed")
        run_id = await aio(client.trigger)(conn, "scan")
        with trio.fail_after(15):
            while not marker.exists():
                await trio.sleep(0.02)
        await wait_run(conn, run_id, lambda r: r["cursor"] == {"after": "k-42"})
        proc.send_signal(signal.SIGKILL)
        event = (await harness.wait_event("job.run", run=run_id))[0]
    finally:
        if proc.poll() is None:
            proc.kill()
        with trio.fail_after(10):
            await proc.wait()
    assert event["outcome"] == "paused"
    assert "cause" not in event
    row = await run_row(conn, run_id)
    assert row["status"] == "paused"
    assert "paused: worker doomed disconnected" in row["error_message"]
    assert (row["cursor"], row["count"]) == ({"after": "k-42"}, 42)
    assert row["finding_counts"] == {"error": 1}
    view = await aio(client.get_job)(conn, "scan")
    assert (view.id, view.outstanding_status) == (job, "paused")


async def test_a_worker_that_ignores_the_pause_is_paused_at_its_last_cursor(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    """Two workers ignore the pause: an SDK handler (cancelled after its pause grace, the
    call ends paused at its last checkpoint) and a raw one that never answers (the daemon
    disconnects it after the cancel grace; the run pauses at its last cursor)."""
    await recoverable(conn, "sdk")
    await define(conn, "raw", target={"kind": "worker", "type": "raw"}, recoverable=True)
    harness = await start_daemon()
    tune(harness, checkpoint_interval=0.1, cancel_grace=0.5)

    stubborn = Scan(hold_after=3, stubborn=True)
    await run_worker(nursery, stubborn.worker(pause_grace=0.2), harness)
    sdk_run = await aio(client.trigger)(conn, "sdk")
    await wait_run(conn, sdk_run, lambda r: r["cursor"] == 3 * BATCH)
    assert await aio(client.pause_run)(conn, sdk_run) == "cancel_requested"
    event = (await harness.wait_event("job.run", run=sdk_run))[0]
    assert event["outcome"] == "paused"
    row = await run_row(conn, sdk_run)
    assert (row["status"], row["cursor"], row["error_message"]) == (
        "paused",
        3 * BATCH,
        "paused by operator",
    )
    assert harness.named("worker.cancel_ignored") == []

    stream = await trio.open_unix_socket(str(socket_of(harness)))

    async def send(message: dict[str, Any]) -> None:
        await stream.send_all(json.dumps({"v": 1, **message}).encode() + b"\n")

    await send({"type": "hello", "worker": "raw-1", "types": ["raw"], "capacity": 1})
    await harness.wait_event("worker.connected", worker="raw-1")
    raw_run = await aio(client.trigger)(conn, "raw")
    received = b""
    with trio.fail_after(10):
        while b'"call"' not in received:
            received += await stream.receive_some(65536)
    await send({"type": "checkpoint", "run": raw_run, "cursor": [3, "c"], "count": 3})
    await wait_run(conn, raw_run, lambda r: r["cursor"] == [3, "c"])
    assert await aio(client.pause_run)(conn, raw_run) == "cancel_requested"
    event = (await harness.wait_event("job.run", run=raw_run))[0]
    assert event["outcome"] == "paused"
    assert harness.named("worker.cancel_ignored", run=raw_run, reason="pause")
    row = await run_row(conn, raw_run)
    assert (row["status"], row["cursor"], row["count"]) == ("paused", [3, "c"], 3)
    assert "ignored the cancel" in row["error_message"]
    await stream.aclose()


async def test_a_recoverable_timeout_pauses_instead_of_failing(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    await recoverable(conn, timeout=timedelta(seconds=1))
    harness = await start_daemon()
    scan = Scan(hold_after=2)  # then it waits, never at a batch boundary again
    await run_worker(nursery, scan.worker(pause_grace=0.3), harness)
    run_id = await aio(client.trigger)(conn, "scan")
    event = (await harness.wait_event("job.run", run=run_id))[0]
    assert event["outcome"] == "paused"
    assert event["error"].startswith("paused: timed out after 1s")
    row = await run_row(conn, run_id)
    assert row["status"] == "paused"
    assert (row["cursor"], row["count"]) == (2 * BATCH, 2 * BATCH)


async def test_a_scheduled_tick_resumes_a_paused_run_but_a_paused_job_never_does(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    job = await recoverable(conn, schedule_kind="interval", schedule="1h")
    held = await recoverable(conn, "held", schedule_kind="interval", schedule="1h", paused=True)
    ids = {}
    for job_id in (job, held):
        ids[job_id] = await aio(conn.fetchval)(
            "INSERT INTO coordinator.runs (job_id, trigger, status, cursor, count, started_at, "
            "paused_at) VALUES ($1, 'manual', 'paused', '150', 150, now(), now()) RETURNING id",
            job_id,
        )
        await aio(conn.execute)(
            "UPDATE coordinator.jobs SET next_run_at = now() - interval '1 second' WHERE id = $1",
            job_id,
        )
    harness = await start_daemon()
    scan = Scan()
    await run_worker(nursery, scan.worker(), harness)
    done = (await harness.wait_event("job.run", run=ids[job]))[0]
    assert done["outcome"] == "succeeded"
    assert scan.starts == [(ids[job], 150, 150)]
    row = await run_row(conn, ids[job])
    assert (row["status"], row["cursor"], row["count"], row["resumes"]) == (
        "succeeded",
        ITEMS,
        ITEMS,
        1,
    )
    next_at = await aio(conn.fetchval)(
        "SELECT next_run_at > now() + interval '50 minutes' FROM coordinator.jobs WHERE id = $1",
        job,
    )
    assert next_at
    await trio.sleep(0.5)
    assert (await run_row(conn, ids[held]))["status"] == "paused"
    assert len(scan.starts) == 1


async def test_a_tick_resumes_a_run_paused_before_it_started_and_it_starts_then(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    """A queued run an operator paused never started: the tick that resumes it starts
    it, as a trigger would (migrations/0024): a start, a duration, no resume counted."""
    job = await recoverable(conn, schedule_kind="interval", schedule="1h")
    run = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'scan')")
    assert await aio(conn.fetchval)("SELECT coordinator.pause_run($1)", run) == "paused"
    assert (
        await aio(conn.fetchval)("SELECT started_at FROM coordinator.runs WHERE id = $1", run)
        is None
    )
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET next_run_at = now() - interval '1 second' WHERE id = $1",
        job,
    )
    harness = await start_daemon()
    scan = Scan()
    await run_worker(nursery, scan.worker(), harness)
    done = (await harness.wait_event("job.run", run=run))[0]
    assert done["outcome"] == "succeeded"
    assert scan.starts == [(run, None, None)]
    row = await aio(conn.fetchrow)(
        "SELECT status, resumes, started_at, finished_at, trigger FROM coordinator.runs "
        "WHERE id = $1",
        run,
    )
    assert (row["status"], row["resumes"], row["trigger"]) == ("succeeded", 0, "manual")
    assert row["started_at"] is not None
    assert row["started_at"] <= row["finished_at"]


async def test_pause_refuses_bad_requests_and_disturbs_nothing(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    """A cursor over 16 KiB and an unknown severity are refused in the handler (one
    clear ValueError each; the call goes on); pausing a run of a job that is not
    recoverable, a finished run or an unknown one is refused with a clear error."""
    await recoverable(conn)
    await define(conn, "plain", target={"kind": "worker", "type": "plain"})
    harness = await start_daemon()
    tune(harness, checkpoint_interval=0.1)
    errors: list[str] = []
    gate = trio.Event()
    worker = Worker(worker_id="careful")

    @worker.job("scan")
    async def scan(ctx: Context) -> int:
        await ctx.checkpoint("small", count=1)
        for bad in (
            lambda: ctx.checkpoint("x" * (16 * 1024 + 1)),
            lambda: ctx.finding("check", "r1", severity="fatal"),
            lambda: ctx.finding("", "r1"),
            lambda: ctx.checkpoint("fine", count=True),  # type: ignore[arg-type]
        ):
            try:
                await bad()
            except ValueError as exc:
                errors.append(str(exc))
        await ctx.finding("check", "r2", severity="info")
        await ctx.checkpoint("last", count=1)
        return 0

    @worker.job("plain")
    async def plain(ctx: Context) -> int:
        await gate.wait()
        return 1

    await run_worker(nursery, worker, harness)
    run_id = await aio(client.trigger)(conn, "scan")
    event = (await harness.wait_event("job.run", run=run_id))[0]
    assert event["outcome"] == "succeeded"
    assert errors == [
        "checkpoint: 'cursor' is 16387 bytes as JSON; the limit is 16384",
        "finding: 'severity' must be one of info, warning, error, data_loss, not 'fatal'",
        "finding: 'kind' must be a non-empty string",
        "checkpoint: 'count' must be a 64-bit integer, not true",  # (the protocol's words: JSON's)
    ]
    row = await run_row(conn, run_id)
    assert (row["cursor"], row["count"], row["finding_counts"]) == ("last", 2, {"info": 1})

    plain_run = await aio(client.trigger)(conn, "plain")
    await harness.wait_event("run.started", run=plain_run)
    with pytest.raises(Conflict, match="not recoverable"):
        await aio(client.pause_run)(conn, plain_run)
    with pytest.raises(Conflict, match=f"run {run_id} is succeeded: only a running or queued"):
        await aio(client.pause_run)(conn, run_id)
    with pytest.raises(RunNotFound):
        await aio(client.pause_run)(conn, 999_999)
    assert (await run_row(conn, plain_run))["status"] == "running"
    gate.set()
    assert (await harness.wait_event("job.run", run=plain_run))[0]["outcome"] == "succeeded"


async def test_a_paused_result_the_database_refuses_is_spooled_and_replayed_exactly(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """The held-result path carries the new outcome and the cursor: a paused result the
    database refuses at stop goes to the spool with its cursor, counter and unwritten
    findings, and the next start saves exactly that."""
    await recoverable(conn)
    spool_path = tmp_path / "state" / "spool.jsonl"
    await aio(conn.execute)(
        """
        CREATE TABLE public.faults (active boolean NOT NULL);
        INSERT INTO public.faults VALUES (true);
        CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF (SELECT active FROM public.faults) AND NEW.status = 'paused' THEN
                RAISE EXCEPTION 'injected settlement fault';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse BEFORE UPDATE ON coordinator.runs
            FOR EACH ROW EXECUTE FUNCTION public.refuse();
        """
    )
    harness = await start_daemon(spool_path=spool_path, retry_cap=0.2, stop_timeout=3)
    tune(harness, checkpoint_interval=30)  # the first write only; the rest waits
    worker = Worker(worker_id="w", pause_grace=0.2)
    reached = trio.Event()

    @worker.job("scan")
    async def scan(ctx: Context) -> None:
        await ctx.checkpoint({"page": "p1"}, count=5)
        await ctx.checkpoint({"page": "p2", "nested": [1.5, None, "é"]}, count=7)
        await ctx.finding("gap", "g1", severity="data_loss", detail={"lost": 3})
        await ctx.checkpoint({"page": "p2", "nested": [1.5, None, "é"]})
        reached.set()
        await trio.sleep_forever()

    await run_worker(nursery, worker, harness)
    run_id = await aio(client.trigger)(conn, "scan")
    with trio.fail_after(10):
        await reached.wait()
    await trio.sleep(0.2)
    assert await harness.stop() == EXIT_SPOOLED
    [record] = Spool(spool_path).read().records
    assert record.run_id == run_id
    assert record.outcome.status == "paused"
    assert record.outcome.cursor is not None
    assert record.outcome.cursor.value == {"page": "p2", "nested": [1.5, None, "é"]}
    assert record.outcome.count == 12
    assert [(f.kind, f.resource_id, f.severity) for f in record.outcome.findings] == [
        ("gap", "g1", "data_loss")
    ]
    assert (await run_row(conn, run_id))["status"] == "running"
    worker.stop()

    await aio(conn.execute)("UPDATE public.faults SET active = false")
    second = await start_daemon(spool_path=spool_path)
    assert second.named("spool.replayed")[0]["saved"] == 1
    row = await run_row(conn, run_id)
    assert row["status"] == "paused"
    assert row["cursor"] == {"page": "p2", "nested": [1.5, None, "é"]}
    assert row["count"] == 12
    assert row["finding_counts"] == {"data_loss": 1}
    assert row["error_message"] == "paused: the daemon is stopping"


async def test_checkpoint_writes_are_coalesced_one_statement_each(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    nursery: trio.Nursery,
    sql_log: StatementLog,
    database_name: str,
) -> None:
    """Hundreds of checkpoints and findings in about a second: at most one write per
    interval (plus the first), each one statement; the last cursor goes with the result."""
    await recoverable(conn)
    harness = await start_daemon()
    interval = 0.25
    tune(harness, checkpoint_interval=interval)
    worker = Worker(worker_id="fast")
    elapsed: list[float] = []

    @worker.job("scan")
    async def scan(ctx: Context) -> None:
        began = trio.current_time()
        for i in range(300):
            if i % 3 == 0:
                await ctx.finding("third", f"i{i}", severity="info")
            await ctx.checkpoint(i + 1, count=1)
            await trio.sleep(0.003)
        elapsed.append(trio.current_time() - began)

    await run_worker(nursery, worker, harness)
    sql_log.mark()
    run_id = await aio(client.trigger)(conn, "scan")
    await harness.wait_event("job.run", run=run_id)
    writes = [
        s
        for s in sql_log.statements(app="coordinator", db=database_name)
        if "coordinator._checkpoint(" in s.sql
    ]
    assert 1 <= len(writes) <= elapsed[0] / interval + 2
    row = await run_row(conn, run_id)
    assert (row["cursor"], row["count"], row["finding_counts"]) == (300, 300, {"info": 100})


async def test_a_retry_of_a_failed_recoverable_run_goes_on_from_its_cursor(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    """A recoverable run that fails by itself keeps its cursor; with retries, the retry
    (a new run, attempt 2) starts from that cursor and counter rather than from scratch."""
    await recoverable(conn, retries=1, retry_backoff=timedelta(seconds=1))
    harness = await start_daemon()
    tune(harness, checkpoint_interval=0.1)
    starts: list[tuple[int, Any, Any, int]] = []
    worker = Worker(worker_id="flaky")

    @worker.job("scan")
    async def scan(ctx: Context) -> None:
        starts.append((ctx.run_id, ctx.cursor, ctx.count, ctx.attempt))
        position = ctx.cursor or 0
        while position < 60:
            position += 10
            await ctx.checkpoint(position, count=10)
            if position == 30 and ctx.attempt == 1:
                raise RuntimeError("the disk went away")

    await run_worker(nursery, worker, harness)
    first = await aio(client.trigger)(conn, "scan")
    failed = (await harness.wait_event("job.run", run=first))[0]
    assert failed["outcome"] == "failed"
    retry = failed["retry"]
    assert isinstance(retry, int)
    done = (await harness.wait_event("job.run", run=retry, timeout=30))[0]
    assert (done["outcome"], done["completed"]) == ("succeeded", True)
    assert starts == [(first, None, None, 1), (retry, 30, 30, 2)]
    failed_row = await run_row(conn, first)
    assert (failed_row["status"], failed_row["cursor"], failed_row["count"]) == ("failed", 30, 30)
    retry_row = await run_row(conn, retry)
    assert (retry_row["status"], retry_row["cursor"], retry_row["count"]) == ("succeeded", 60, 60)
