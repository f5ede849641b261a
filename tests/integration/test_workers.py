"""Workers against a real daemon and PostgreSQL: availability, capacity, crashes, progress."""

from __future__ import annotations

import json
import signal
import socket
import sys
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest
import trio

from coordinator.db import aio, transaction
from coordinator.worker import Context, Worker

from .conftest import StartDaemon, define, refreshes

if TYPE_CHECKING:
    from pathlib import Path

    from coordinator.embedded import StatementLog

    from .conftest import Harness


def socket_of(harness: Harness) -> Path:
    path: Path = harness.daemon.executors["worker"].socket_path  # type: ignore[attr-defined]
    return path


async def run_worker(nursery: trio.Nursery, worker: Worker, harness: Harness) -> None:
    await nursery.start(lambda task_status: worker.run(socket_of(harness), task_status=task_status))


async def runs_of(conn: asyncpg.Connection, job_id: int) -> list[asyncpg.Record]:
    return await aio(conn.fetch)(
        "SELECT * FROM coordinator.runs WHERE job_id = $1 ORDER BY id", job_id
    )


async def test_worker_serves_manual_and_cron_jobs(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    manual = await define(
        conn, "thumbs", target={"kind": "worker", "type": "images"}, params={"size": 64}
    )
    cron = await define(
        conn,
        "sweep",
        schedule_kind="cron",
        schedule="* * * * *",
        target={"kind": "worker", "type": "images"},
    )
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET next_run_at = now() - interval '1 minute' WHERE id = $1",
        cron,
    )
    harness = await start_daemon(refresh_spacing=0.2)
    worker = Worker(worker_id="w1", capacity=4)
    seen: list[dict[str, Any]] = []

    @worker.job("images")
    async def handle(ctx: Context) -> dict[str, Any]:
        seen.append({"job": ctx.job, "params": ctx.params, "args": ctx.args})
        return {"count": 3, "extra": {"job": ctx.job}}

    await run_worker(nursery, worker, harness)
    run_id = await aio(conn.fetchval)(
        "SELECT coordinator.trigger('default', 'thumbs', '{\"force\": true}')"
    )
    await harness.wait_event("job.run", run=run_id)
    await harness.wait_event("job.run", job="default/sweep")
    [m] = await runs_of(conn, manual)
    assert (m["status"], m["count"], json.loads(m["extra"])["job"]) == ("succeeded", 3, "thumbs")
    [c] = await runs_of(conn, cron)
    assert (c["status"], c["trigger"]) == ("succeeded", "schedule")
    assert {"job": "thumbs", "params": {"size": 64}, "args": {"force": True}} in seen
    worker.stop()


@pytest.mark.slow
async def test_absent_worker_costs_no_sql_and_overdue_jobs_run_once_on_arrival(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    sql_log: StatementLog,
    database_name: str,
    nursery: trio.Nursery,
) -> None:
    await aio(conn.execute)(
        "INSERT INTO coordinator.jobs (name, schedule_kind, schedule, target, next_run_at) "
        "SELECT 'due' || g, 'cron', '0 0 1 1 *', '{\"kind\": \"worker\", \"type\": \"absent\"}', "
        "now() - interval '1 hour' FROM generate_series(1, 100) g"
    )
    harness = await start_daemon()
    assert len(harness.daemon.deadlines) == 0  # inert: nobody serves "absent"
    await trio.sleep(0.5)
    sql_log.mark()
    await trio.sleep(21.0)
    assert sql_log.statements(app="coordinator", db=database_name) == []

    calls: list[int] = []
    worker = Worker(worker_id="late", capacity=16)

    @worker.job("absent")
    async def handle(ctx: Context) -> int:
        calls.append(ctx.run_id)
        return 1

    await run_worker(nursery, worker, harness)
    await harness.wait_event("job.run", count=100, timeout=30)
    await trio.sleep(1.0)
    assert len(calls) == len(set(calls)) == 100
    statuses = await aio(conn.fetch)(
        "SELECT status, count(*) FROM coordinator.runs GROUP BY status"
    )
    assert [(r["status"], r["count"]) for r in statuses] == [("succeeded", 100)]
    # Each ran once; the next deadline is next January, armed now that a worker serves it.
    assert len(harness.daemon.deadlines) == 100
    assert refreshes(sql_log.statements(app="coordinator", db=database_name)) <= 1
    worker.stop()


async def test_a_run_triggered_before_its_worker_came_starts_when_it_connects(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    """A job defined after the daemon's last refresh, triggered while nobody serves its
    type: its run waited for the next coalesced refresh (up to 30 s) even once a worker
    of its type had connected. It starts when the worker connects, with no refresh."""
    harness = await start_daemon()  # the default spacing: the next refresh is 30 s away
    job = await define(conn, "late", target={"kind": "worker", "type": "later"})
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'late')")
    await harness.wait_event("wake", payload={"run": run_id, "job": job})
    worker = Worker(worker_id="w-late", capacity=1)

    @worker.job("later")
    async def handle(ctx: Context) -> int:
        return 1

    await run_worker(nursery, worker, harness)
    await harness.wait_event("job.run", run=run_id, timeout=60)
    names = [e["event"] for e in harness.events]
    ready = names.index("ready")
    assert "refresh" not in names[ready : names.index("job.run", ready)]
    [r] = await runs_of(conn, job)
    assert (r["id"], r["status"]) == (run_id, "succeeded")
    worker.stop()


async def test_worker_killed_mid_call_fails_the_run_and_the_job_turns_inert(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    job = await define(
        conn,
        "slow",
        schedule_kind="interval",
        schedule="1h",
        target={"kind": "worker", "type": "slow"},
    )
    harness = await start_daemon()
    module = tmp_path / "slowworker.py"
    started = tmp_path / "started"
    module.write_text(
        "import trio\nfrom pathlib import Path\nfrom coordinator.worker import Worker\n"
        "worker = Worker(worker_id='doomed')\n"
        "@worker.job('slow')\n"
        "async def slow(ctx):\n"
        f"    Path({str(started)!r}).touch()\n"
        "    await trio.sleep(60)\n"
    )
    proc = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "coordinator.worker",
            "slowworker:worker",
            "--socket",
            str(socket_of(harness)),
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    try:
        await harness.wait_event("wake", reason="workers.changed")
        run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'slow')")
        with trio.fail_after(15):
            while not started.exists():
                await trio.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        event = (await harness.wait_event("job.run", run=run_id))[0]
    finally:
        if proc.poll() is None:
            proc.kill()
        with trio.fail_after(10):
            await proc.wait()
    assert (event["outcome"], event["cause"]) == ("failed", "crashed")
    [run] = await runs_of(conn, job)
    assert (run["status"], run["error_cause"]) == ("failed", "crashed")
    assert "disconnected" in run["error_message"]
    await trio.sleep(0.3)
    assert job not in harness.daemon.deadlines  # inert until a worker returns
    assert harness.daemon.status().served_types == ()


async def test_capacity_per_worker_and_priority(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    """Capacity 2, five due jobs, two workers: never more than 2 calls per worker, and
    the interactive jobs are admitted before the background ones waiting beside them."""
    overdue = datetime.now(UTC) - timedelta(minutes=5)
    names = [
        ("b1", "background"),
        ("b2", "background"),
        ("b3", "background"),
        ("i1", "interactive"),
        ("i2", "interactive"),
    ]
    for i, (name, priority) in enumerate(names):
        job = await define(
            conn,
            name,
            schedule_kind="interval",
            schedule="1h",
            priority=priority,
            target={"kind": "worker", "type": "t"},
        )
        await aio(conn.execute)(
            "UPDATE coordinator.jobs SET next_run_at = $2 WHERE id = $1",
            job,
            overdue + timedelta(seconds=i),
        )
    harness = await start_daemon(concurrency=10)
    busy: dict[str, int] = {}
    peak: dict[str, int] = {}
    started: list[tuple[str, str]] = []
    gate = trio.Event()

    def make(worker_id: str) -> Worker:
        worker = Worker(worker_id=worker_id, capacity=2)

        @worker.job("t")
        async def handle(ctx: Context) -> int:
            started.append((worker_id, ctx.job))
            busy[worker_id] = busy.get(worker_id, 0) + 1
            peak[worker_id] = max(peak.get(worker_id, 0), busy[worker_id])
            await gate.wait()
            await trio.sleep(0.2)
            busy[worker_id] -= 1
            return 1

        return worker

    # The first worker's two slots go to the two interactive jobs, all five being due.
    await run_worker(nursery, make("w1"), harness)
    with trio.fail_after(10):
        while len(started) < 2:
            await trio.sleep(0.01)
    assert sorted(job for _, job in started) == ["i1", "i2"]
    # The second worker takes two background jobs; the third waits for a free slot.
    await run_worker(nursery, make("w2"), harness)
    with trio.fail_after(10):
        while len(started) < 4:
            await trio.sleep(0.01)
    await trio.sleep(0.3)
    assert len(started) == 4
    # (Both admitted at once, in that order; their calls may start in either order.)
    assert sorted(job for _, job in started[2:]) == ["b1", "b2"]
    gate.set()
    await harness.wait_event("job.run", count=5, timeout=20)
    assert [job for _, job in started][4] == "b3"
    assert peak == {"w1": 2, "w2": 2}


async def test_progress_is_coalesced_flagged_and_saved_with_the_result(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    job = await define(conn, "report", target={"kind": "worker", "type": "reports"})
    harness = await start_daemon()
    worker = Worker(worker_id="reporter")
    checked = trio.Event()
    mid: list[Any] = []

    @worker.job("reports")
    async def handle(ctx: Context) -> int:
        for percent in (10, 20, 30, 40):
            await ctx.progress(percent, message=f"at {percent}")
            await trio.sleep(0.12)
        await ctx.progress(25, message="went back")  # a regression, to be flagged
        await trio.sleep(0.3)
        mid.append(
            await aio(conn.fetchval)(
                "SELECT progress FROM coordinator.runs WHERE id = $1", ctx.run_id
            )
        )
        checked.set()
        await ctx.progress(100, message="done")
        return 7

    await run_worker(nursery, worker, harness)
    await harness.wait_event("wake", reason="workers.changed")
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'report')")
    await harness.wait_event("job.run", run=run_id)
    # Coalesced: within one progress interval only the first snapshot was written.
    assert mid
    assert json.loads(mid[0])["percent"] == 10
    [run] = await runs_of(conn, job)
    final = json.loads(run["progress"])
    assert final["percent"] == 100
    extra = json.loads(run["extra"])
    assert any(entry.get("regressed") for entry in extra["log"])
    assert run["count"] == 7
    worker.stop()


async def _claimed_ahead(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    nursery: trio.Nursery,
    *,
    recoverable: bool = False,
    **settings: Any,
) -> tuple[Harness, list[int], list[str], dict[str, trio.Event], dict[str, int], Worker]:
    """Three manual runs for a worker of capacity 1, with ``claim_ahead`` 2: one call
    runs (held until its gate is set), two runs are claimed and wait for the slot
    (``concurrency`` 3: they count against it). The jobs are ``recoverable`` if asked."""
    harness = await start_daemon(concurrency=3, claim_ahead=2, **settings)
    worker = Worker(worker_id="w1", capacity=1)
    started: list[str] = []
    gates = {name: trio.Event() for name in ("a", "b", "c")}
    peak = {"busy": 0, "most": 0}

    @worker.job("t")
    async def handle(ctx: Context) -> int:
        started.append(ctx.job)
        peak["busy"] += 1
        peak["most"] = max(peak["most"], peak["busy"])
        await gates[ctx.job].wait()
        peak["busy"] -= 1
        return 1

    for name in gates:
        await define(conn, name, target={"kind": "worker", "type": "t"}, recoverable=recoverable)
    await run_worker(nursery, worker, harness)
    # 'a' first, and running before 'b' and 'c' are triggered: which of three triggers
    # committed together starts first is not what these tests are about. (It flaked: 'b'
    # started first in 3 of 7 full runs on 2026-12-02. The likely cause, since fixed: a
    # run offered by its wake was due when the wake came, one a refresh read when it was
    # created, so 'b' read by a refresh could pass 'a' woken just before; see
    # test_runs_are_served_in_trigger_order_however_the_daemon_learned_of_them.)
    runs = [await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'a')")]
    with trio.fail_after(10):
        while not started:
            await trio.sleep(0.01)
    for name in ("b", "c"):
        runs.append(await aio(conn.fetchval)("SELECT coordinator.trigger('default', $1)", name))
    with trio.fail_after(10):
        while (
            await aio(conn.fetchval)(
                "SELECT count(*) FROM coordinator.runs WHERE status = 'running'"
            )
            < 3
        ):
            await trio.sleep(0.01)
    await trio.sleep(0.2)  # (a second call, were one sent, would have started by now)
    assert started == ["a"]
    return harness, runs, started, gates, peak, worker


async def test_claim_ahead_claims_runs_that_then_wait_their_turn_for_a_worker_slot(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    """With ``claim_ahead``, runs are claimed beyond the worker's free slots; the worker
    never gets more calls than its capacity, and the waiting runs start in claim order,
    each as a slot frees."""
    harness, runs, started, gates, peak, _ = await _claimed_ahead(start_daemon, conn, nursery)
    # A run waiting for a slot is not told as started (run.started) until it is sent.
    assert [e["run"] for e in harness.named("run.started")] == runs[:1]
    gates["a"].set()
    with trio.fail_after(10):
        while len(started) < 2:
            await trio.sleep(0.01)
    assert started == ["a", "b"]
    await harness.wait_event("run.started", run=runs[1])
    assert [e["run"] for e in harness.named("run.started")] == runs[:2]
    gates["b"].set()
    gates["c"].set()
    await harness.wait_event("job.run", count=3)
    assert started == ["a", "b", "c"]
    assert peak["most"] == 1
    statuses = await aio(conn.fetch)(
        "SELECT status FROM coordinator.runs WHERE id = ANY ($1::bigint[]) ORDER BY id", runs
    )
    assert [r["status"] for r in statuses] == ["succeeded"] * 3


class _AheadOfTheDatabase:
    """A wall clock a minute ahead of PostgreSQL's, as a daemon's host's may be."""

    def now(self) -> datetime:
        return datetime.now(UTC) + timedelta(minutes=1)


async def test_runs_are_served_in_trigger_order_however_the_daemon_learned_of_them(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    """A run the daemon heard of by its dispatch wake and one it read in a refresh wait
    for the same slot: the one triggered first is served first, both by the database's
    clock. Before migrations/0027 the woken run was due when its wake came, by the
    daemon's clock: a daemon a minute ahead of the database served the later run first
    (and on one clock, a run triggered within the wake's latency of another could pass
    it: the claim-ahead tests' flake of 2026-12-02)."""
    harness = await start_daemon(clock=_AheadOfTheDatabase(), refresh_spacing=0.05)
    worker = Worker(worker_id="w1", capacity=1)
    started: list[str] = []
    gate = trio.Event()

    @worker.job("t")
    async def handle(ctx: Context) -> int:
        started.append(ctx.job)
        if ctx.job == "x":
            await gate.wait()
        return 1

    ids = {
        name: await define(conn, name, target={"kind": "worker", "type": "t"})
        for name in ("x", "a", "b")
    }
    await run_worker(nursery, worker, harness)
    with trio.fail_after(10):  # every wake so far read: no refresh pending
        while [e["event"] for e in harness.events if e["event"] in ("wake", "refresh")][
            -1
        ] != "refresh":
            await trio.sleep(0.01)
    await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'x')")
    with trio.fail_after(10):
        while not started:
            await trio.sleep(0.01)
    # 'a' by its wake: it waits for the worker's one slot.
    first = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'a')")
    await harness.wait_event("wake", dispatch=first)
    # 'b' after it, with no wake of its own (a quiet session), read by a refresh of its job.
    async with transaction(conn):
        await aio(conn.execute)("SELECT set_config('coordinator.origin', 'quiet', true)")
        await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'b')")
    await aio(conn.execute)("SELECT pg_notify('coordinator', $1)", json.dumps({"job": ids["b"]}))
    await harness.wait_event("refresh", named=1, jobs=1)
    assert started == ["x"]
    gate.set()
    await harness.wait_event("job.run", count=3)
    assert started == ["x", "a", "b"]


@pytest.mark.parametrize("recoverable", [False, True], ids=["plain", "recoverable"])
async def test_runs_claimed_ahead_are_given_back_when_their_worker_leaves(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery, recoverable: bool
) -> None:
    """Runs that waited for a slot of a worker that then left were never sent: they are
    given back (``queued`` again, not failed) and run once a worker serves their type
    (before, they failed: "no worker serving 't': none is connected"). A recoverable
    job's too (before migrations/0025 they paused, to wait for a trigger)."""
    harness, runs, started, gates, _, worker = await _claimed_ahead(
        start_daemon, conn, nursery, recoverable=recoverable
    )
    worker.stop()  # bye: its call goes on, no new call comes to it
    await harness.wait_event("run.given_back", count=2)
    given = harness.named("run.given_back")
    assert sorted(e["run"] for e in given) == runs[1:]
    assert {e["became"] for e in given} == {"queued"}
    assert {e["reason"] for e in given} == {"not sent: no worker serving 't' is connected"}
    gates["a"].set()
    await harness.wait_event("job.run", run=runs[0])
    assert [e["run"] for e in harness.named("run.started")] == runs[:1]  # (never sent)
    statuses = await aio(conn.fetch)(
        "SELECT status, claimed_at, started_at FROM coordinator.runs "
        "WHERE id = ANY ($1::bigint[]) ORDER BY id",
        runs,
    )
    assert statuses[0]["status"] == "succeeded"
    assert [tuple(r) for r in statuses[1:]] == [("queued", None, None)] * 2
    # A worker comes back: the runs given back are claimed again and run.
    again = Worker(worker_id="w2", capacity=1)

    @again.job("t")
    async def handle(ctx: Context) -> int:
        started.append(ctx.job)
        return 2

    await run_worker(nursery, again, harness)
    await harness.wait_event("job.run", count=3)
    assert sorted(started) == ["a", "b", "c"]
    rows = await aio(conn.fetch)(
        "SELECT status, count FROM coordinator.runs WHERE id = ANY ($1::bigint[]) ORDER BY id",
        runs,
    )
    assert [tuple(r) for r in rows] == [("succeeded", 1), ("succeeded", 2), ("succeeded", 2)]
    assert not harness.named("job.run", outcome="failed")
    again.stop()


async def test_runs_claimed_ahead_are_given_back_when_the_lead_was_lost_meanwhile(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    """The lead lost and taken again while runs waited for a slot: another daemon may
    have led and swept them in between, so they are not sent; given back, they are
    claimed again under the lead as it is now, and each runs once."""
    harness, runs, started, gates, _, _ = await _claimed_ahead(
        start_daemon, conn, nursery, retry_cap=0.5
    )
    leader = harness.daemon.store.leader_pid
    assert leader
    await aio(conn.execute)("SELECT pg_terminate_backend($1)", leader)
    await harness.wait_event("leadership.regained")
    assert harness.daemon.store.leader_pid not in (None, 0, leader)
    for gate in gates.values():
        gate.set()
    given = await harness.wait_event("run.given_back", count=2)
    assert sorted(e["run"] for e in given) == runs[1:]
    assert {(e["reason"], e["became"]) for e in given} == {
        ("not sent: this daemon lost its leadership", "queued")
    }
    await harness.wait_event("job.run", count=3)
    assert sorted(started) == ["a", "b", "c"]
    rows = await aio(conn.fetch)(
        "SELECT status FROM coordinator.runs WHERE id = ANY ($1::bigint[]) ORDER BY id", runs
    )
    assert [r["status"] for r in rows] == ["succeeded"] * 3


async def test_a_claim_that_lands_after_the_last_worker_left_gives_the_run_back(
    start_daemon: StartDaemon, conn: asyncpg.Connection, database: str, nursery: trio.Nursery
) -> None:
    """The claim was sent while a worker served the type, and held up (the job's row
    locked by another session) until that worker had left: the run, granted but with
    nobody to call it, is given back and runs when a worker comes (before, it failed:
    "no executor available for worker:t")."""
    job = await define(conn, "late", target={"kind": "worker", "type": "t"})
    harness = await start_daemon()
    ran: list[str] = []

    def worker_named(name: str) -> Worker:
        worker = Worker(worker_id=name, capacity=1)

        @worker.job("t")
        async def handle(ctx: Context) -> int:
            ran.append(name)
            return 1

        return worker

    first = worker_named("w1")
    await run_worker(nursery, first, harness)
    await harness.wait_event("wake", reason="workers.changed")
    blocker = await aio(asyncpg.connect)(database)
    try:
        await aio(blocker.execute)("BEGIN")
        await aio(blocker.execute)(
            "SELECT 1 FROM coordinator.jobs WHERE id = $1 FOR NO KEY UPDATE", job
        )
        run = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'late')")
        with trio.fail_after(10):
            while not await aio(conn.fetchval)(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'coordinator' "
                "AND wait_event_type = 'Lock' AND query LIKE '%coordinator._claim%'"
            ):
                await trio.sleep(0.02)
        first.stop()
        await harness.wait_event("worker.disconnected", worker="w1")
    finally:
        await aio(blocker.execute)("COMMIT")
        await aio(blocker.close)()
    [given] = await harness.wait_event("run.given_back", run=run)
    assert (given["became"], given["reason"]) == (
        "queued",
        "not sent: no executor available for worker:t",
    )
    assert not harness.named("job.run")
    [row] = await runs_of(conn, job)
    assert (row["status"], row["claimed_at"], row["instance"]) == ("queued", None, None)
    await run_worker(nursery, worker_named("w2"), harness)
    await harness.wait_event("job.run", run=run, outcome="succeeded")
    assert ran == ["w2"]


async def test_a_stop_still_sends_the_runs_claimed_ahead_instead_of_failing_them(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    """Runs claimed ahead are admitted work: a stop waits for them as for calls in
    flight, sending each as a slot frees (before, a claimed run that had not been sent
    by then failed: "no worker serving ...: the daemon is stopping")."""
    harness, runs, started, gates, _, _ = await _claimed_ahead(start_daemon, conn, nursery)
    stopped: list[int | None] = []

    async def stop() -> None:
        stopped.append(await harness.stop())

    nursery.start_soon(stop)
    await harness.wait_event("stopping")
    for name in ("a", "b", "c"):
        gates[name].set()
    with trio.fail_after(15):
        while not stopped:
            await trio.sleep(0.01)
    assert stopped == [0]
    assert started == ["a", "b", "c"]
    statuses = await aio(conn.fetch)(
        "SELECT status, error_message FROM coordinator.runs WHERE id = ANY ($1::bigint[]) "
        "ORDER BY id",
        runs,
    )
    assert [(r["status"], r["error_message"]) for r in statuses] == [("succeeded", None)] * 3


async def test_a_stop_during_the_wait_for_a_busy_worker_socket_stops_at_once(
    start_daemon: StartDaemon,
) -> None:
    """Another process listens on the daemon's worker socket: the daemon waits for it to
    go (up to 45 s) before refusing to start. A stop meanwhile waited for all of it and
    ended as that refusal (exit 2); it now stops at once, cleanly."""
    harness = await start_daemon(wait_ready=False)
    # (The daemon's task has not run yet: its socket and grace are set before it looks.)
    executor: Any = harness.daemon.executors["worker"]
    executor.socket_busy_grace = 3600.0
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        squatter.bind(str(executor.socket_path))
        squatter.listen(8)
        await harness.wait_event("worker.socket_busy")
        assert await harness.stop(timeout=15) == 0
    finally:
        squatter.close()
    assert not harness.daemon.ready.is_set()
    assert harness.named("stopped")


async def test_a_result_delivered_on_the_connection_a_worker_came_back_on_is_ignored(
    start_daemon: StartDaemon, conn: asyncpg.Connection
) -> None:
    """A raw worker that lost its connection mid-call, came back with the same id and
    delivered the result it finished meanwhile was refused ("result for run N, which this
    connection was never given") and lost every call of its new connection."""
    from coordinator import client

    await define(conn, "raw", target={"kind": "worker", "type": "raw"})
    harness = await start_daemon()

    async def connect() -> trio.SocketStream:
        stream = await trio.open_unix_socket(str(socket_of(harness)))
        hello = {"v": 1, "type": "hello", "worker": "raw-1", "types": ["raw"], "capacity": 1}
        await stream.send_all(json.dumps(hello).encode() + b"\n")
        return stream

    async def next_call(stream: trio.SocketStream) -> dict[str, Any]:
        received = b""
        with trio.fail_after(10):
            while True:
                for line in received.split(b"\n")[:-1]:
                    message = json.loads(line)
                    if message["type"] == "call":
                        return message  # type: ignore[no-any-return]
                    assert message["type"] == "welcome", message
                data = await stream.receive_some(65536)
                assert data, received
                received += data

    first = await connect()
    run_id = await aio(client.trigger)(conn, "raw")
    assert (await next_call(first))["run"] == run_id
    await first.aclose()  # gone mid-call: the run ends crashed
    event = (await harness.wait_event("job.run", run=run_id))[0]
    assert event["outcome"] == "failed"
    second = await connect()
    await harness.wait_event("worker.connected", worker="raw-1", count=2)
    late = {"v": 1, "type": "result", "run": run_id, "ok": True}
    await second.send_all(json.dumps(late).encode() + b"\n")
    # The new connection goes on: its next call comes, and its result is saved.
    again = await aio(client.trigger)(conn, "raw")
    assert (await next_call(second))["run"] == again
    await second.send_all(json.dumps({**late, "run": again}).encode() + b"\n")
    event = (await harness.wait_event("job.run", run=again))[0]
    assert event["outcome"] == "succeeded"
    assert harness.named("worker.rejected") == []
    assert harness.named("worker.late_message", run=run_id)
    await second.aclose()


async def test_a_result_that_cannot_be_sent_is_not_retried(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    """A handler that did its work but returns more than a line holds, or a value JSON
    cannot encode, failed as any failure does: with --retries 2 its work was done three
    times, to end the same each time. Not retried, as a call whose args do not fit; a
    plain failure beside them still is."""
    retry = {"retries": 2, "retry_backoff": timedelta(milliseconds=50)}
    ids = {
        name: await define(conn, name, target={"kind": "worker", "type": name}, **retry)
        for name in ("big", "badkey", "flaky")
    }
    harness = await start_daemon(jitter=lambda: 0.0)
    worker = Worker(worker_id="answers", capacity=4)
    calls: list[str] = []

    @worker.job("big")
    async def big(ctx: Context) -> dict[str, Any]:
        calls.append(ctx.job)
        return {"blob": "x" * 70_000}

    @worker.job("badkey")
    async def badkey(ctx: Context) -> dict[Any, Any]:
        calls.append(ctx.job)
        return {(1, 2): "a tuple key"}

    @worker.job("flaky")
    async def flaky(ctx: Context) -> None:
        calls.append(ctx.job)
        if ctx.attempt == 1:
            raise RuntimeError("try again")

    await run_worker(nursery, worker, harness)
    for name in ids:
        await aio(conn.fetchval)("SELECT coordinator.trigger('default', $1)", name)
    # The plain failure's retry, due as soon as any retry of the others would be.
    await harness.wait_event("job.run", job="default/flaky", outcome="succeeded")
    await harness.wait_event("job.run", count=4)
    for name in ("big", "badkey"):
        [row] = await runs_of(conn, ids[name])
        assert (row["status"], row["category"], row["retryable"]) == (
            "failed",
            "invalid-input",
            False,
        )
        assert row["error_message"].endswith("; not retried")
        assert row["error_message"].startswith("result of 700" if name == "big" else "bad")
    assert sorted(calls) == ["badkey", "big", "flaky", "flaky"]
    worker.stop()


async def test_what_a_handler_says_as_it_wraps_up_after_a_timeout_is_kept(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    """A handler given cancel_delay to wrap up returned a partial count and extra, or
    raised a JobError saying why: the timed-out run had count null, extra {} and none
    of its words (a tester's finding). The status stays the daemon's."""
    from coordinator.worker import JobError

    partial = await define(
        conn, "partial", target={"kind": "worker", "type": "wrap.partial"},
        timeout=timedelta(seconds=1),
    )  # fmt: skip
    failing = await define(
        conn, "failing", target={"kind": "worker", "type": "wrap.failing"},
        timeout=timedelta(seconds=1),
    )  # fmt: skip
    harness = await start_daemon()
    worker = Worker(worker_id="wrapper", capacity=2, cancel_delay=5.0)

    @worker.job("wrap.partial")
    async def wrap_partial(ctx: Context) -> dict[str, Any]:
        await ctx.cancelled.wait()
        return {"count": 5, "extra": {"partial": True}}

    @worker.job("wrap.failing")
    async def wrap_failing(ctx: Context) -> None:
        await ctx.cancelled.wait()
        raise JobError("upstream gave up", category="external-dependency")

    await run_worker(nursery, worker, harness)
    first = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'partial')")
    second = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'failing')")
    await harness.wait_event("job.run", run=first)
    await harness.wait_event("job.run", run=second)
    [p] = await runs_of(conn, partial)
    assert (p["status"], p["count"]) == ("timed_out", 5)
    assert json.loads(p["extra"])["partial"] is True
    [f] = await runs_of(conn, failing)
    assert f["status"] == "timed_out"
    assert f["error_message"] == "timed out after 1s; the worker said: upstream gave up"


async def test_a_call_running_on_after_its_connection_closed_does_not_keep_the_worker_away(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    """An embedded worker (no orphan limit) whose call runs on in a thread after the
    daemon dropped the connection (here for ignoring its timeout's cancel) stayed away
    until the thread returned: every other type it serves went unserved (39 s in a
    tester's run; a thread of an hour, an hour). It connects again at once, with the
    slot the thread holds taken off its capacity, drops the thread's late result, and
    once the thread ended (and the connection is idle) comes back with its capacity."""
    import threading

    from coordinator.executors.worker import WorkerExecutor

    blocking = await define(
        conn,
        "blocking",
        target={"kind": "worker", "type": "blocking"},
        timeout=timedelta(seconds=1),
    )
    quick = await define(conn, "quick", target={"kind": "worker", "type": "quick"})
    harness = await start_daemon()
    executor = harness.daemon.executors["worker"]
    assert isinstance(executor, WorkerExecutor)
    executor.cancel_grace = 0.5
    release = threading.Event()
    in_thread = trio.Event()
    ended: list[int] = []
    worker = Worker(worker_id="embedded", capacity=2)
    assert worker.orphan_limit is None

    @worker.job("blocking")
    async def block(ctx: Context) -> int:
        in_thread.set()
        try:
            # A blocking library call: trio cannot cancel the thread.
            await trio.to_thread.run_sync(release.wait, 60)
        finally:
            ended.append(ctx.run_id)
        return 1

    @worker.job("quick")
    async def handle(ctx: Context) -> int:
        return 7

    try:
        await run_worker(nursery, worker, harness)
        stuck = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'blocking')")
        with trio.fail_after(10):
            await in_thread.wait()
        await harness.wait_event("worker.cancel_ignored", run=stuck)
        event = (await harness.wait_event("job.run", run=stuck))[0]
        assert event["outcome"] == "timed_out"
        # Back while the thread still runs, with one slot: the thread holds the other.
        [first, again] = await harness.wait_event("worker.connected", worker="embedded", count=2)
        assert (first["capacity"], again["capacity"]) == (2, 1)
        assert ended == []
        served = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'quick')")
        event = (await harness.wait_event("job.run", run=served))[0]
        assert event["outcome"] == "succeeded"
        assert ended == []
    finally:
        release.set()
    # Its late result is dropped, not sent on the new connection as a live call's.
    with trio.fail_after(10):
        while not ended:
            await trio.sleep(0.01)
    # Its slot free again: the idle connection makes way for one of the full capacity.
    await harness.wait_event("worker.bye", worker="embedded")
    third = (await harness.wait_event("worker.connected", worker="embedded", count=3))[2]
    assert third["capacity"] == 2
    again_served = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'quick')")
    await harness.wait_event("job.run", run=again_served)
    assert harness.named("worker.late_message", run=stuck) == []
    assert harness.named("worker.rejected") == []
    [row] = await runs_of(conn, blocking)
    assert row["status"] == "timed_out"
    assert [r["status"] for r in await runs_of(conn, quick)] == ["succeeded", "succeeded"]
    assert len(harness.named("worker.connected", worker="embedded")) == 3
    worker.stop()
