"""Durability with real faults: a stopped server, a killed listener, a stop mid-run
(docs/design.md, promises 6-9)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import asyncpg
import trio

from coordinator.db import aio
from coordinator.spool import Spool

from .conftest import StartDaemon, define

if TYPE_CHECKING:
    from pathlib import Path

    from coordinator.embedded import Cluster


async def _connect(dsn: str) -> asyncpg.Connection:
    return await aio(asyncpg.connect)(dsn, server_settings={"application_name": "tests-app"})


async def _query(dsn: str, sql: str, *args: Any) -> Any:
    conn = await _connect(dsn)
    try:
        return await aio(conn.fetch)(sql, *args)
    finally:
        await aio(conn.close)()


async def _status(dsn: str, run_id: int) -> str:
    rows = await _query(dsn, "SELECT status FROM coordinator.runs WHERE id = $1", run_id)
    return str(rows[0]["status"])


async def test_server_stopped_during_a_run_result_saved_after_restart(
    start_daemon: StartDaemon, private_cluster: Cluster, fault_db: str, tmp_path: Path
) -> None:
    count_file, started = tmp_path / "count.txt", tmp_path / "started"
    conn = await _connect(fault_db)
    await define(
        conn,
        "slow",
        target={
            "kind": "exec",
            "argv": [
                "sh",
                "-c",
                f"touch {started}; sleep 3; echo x >> {count_file}; echo '{{\"count\": 7}}'",
            ],
        },
    )
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'slow')")
    await aio(conn.close)()
    harness = await start_daemon(dsn=fault_db, retry_cap=0.5)
    with trio.fail_after(15):
        while not started.exists():
            await trio.sleep(0.05)
    await trio.to_thread.run_sync(private_cluster.stop, "fast")
    await harness.wait_event("job.run", run=run_id, timeout=15)
    await harness.wait_event("settle.retained", run=run_id)
    assert harness.daemon.state == "degraded"
    await trio.sleep(1.0)
    await trio.to_thread.run_sync(private_cluster.start)
    await harness.wait_event("settle.saved", run=run_id, timeout=30)
    rows = await _query(
        fault_db, "SELECT status, count FROM coordinator.runs WHERE id = $1", run_id
    )
    assert (rows[0]["status"], rows[0]["count"]) == ("succeeded", 7)
    assert count_file.read_text().count("x") == 1
    assert not harness.done.is_set()


async def test_stop_while_server_down_spools_then_next_start_replays(
    start_daemon: StartDaemon, private_cluster: Cluster, fault_db: str, tmp_path: Path
) -> None:
    count_file, started = tmp_path / "count.txt", tmp_path / "started"
    spool_path = tmp_path / "state" / "spool.jsonl"
    conn = await _connect(fault_db)
    await define(
        conn,
        "slow",
        target={
            "kind": "exec",
            "argv": ["sh", "-c", f"touch {started}; sleep 2; echo x >> {count_file}"],
        },
    )
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'slow')")
    await aio(conn.close)()
    harness = await start_daemon(dsn=fault_db, spool_path=spool_path, retry_cap=0.5)
    with trio.fail_after(15):
        while not started.exists():
            await trio.sleep(0.05)
    await trio.to_thread.run_sync(private_cluster.stop, "fast")
    await harness.wait_event("settle.retained", run=run_id, timeout=15)
    status = await harness.stop()
    assert status == 3
    assert harness.named("settle.spooled", run=run_id)
    records = Spool(spool_path).read().records
    assert [r.run_id for r in records] == [run_id]
    # A torn last write (a crash mid-append) must not stop the replay of the rest.
    with spool_path.open("a") as f:
        f.write('{"run_id": 99, "outc')

    await trio.to_thread.run_sync(private_cluster.start)
    second = await start_daemon(dsn=fault_db, spool_path=spool_path)
    replayed = second.named("spool.replayed")
    assert replayed
    assert replayed[0]["saved"] == 1
    assert replayed[0]["corrupt"] == 1
    assert await _status(fault_db, run_id) == "succeeded"
    assert count_file.read_text().count("x") == 1
    assert not spool_path.exists()
    aside = list(spool_path.parent.glob("spool.jsonl.corrupt-*"))
    assert len(aside) == 1
    assert "torn write" in aside[0].read_text()


async def test_a_stop_on_a_database_that_does_not_answer_spools_by_its_deadline(
    start_daemon: StartDaemon, conn: asyncpg.Connection, database: str, tmp_path: Path
) -> None:
    """The database takes connections but does not answer (a lock): the flush's tries
    each waited for the store's limit, two of them, past the stop's deadline, and the
    service manager's SIGKILL came before the spool write (a tester's stop took 91 s
    under a 3 s stop timeout). Now the deadline bounds the tries: the result is spooled
    without one of them running out its time (with the lock held, a try can end only
    so, or by being cut short)."""
    started = tmp_path / "started"
    spool_path = tmp_path / "spool.jsonl"
    await define(
        conn, "brief", target={"kind": "exec", "argv": ["sh", "-c", f"touch {started}; sleep 1"]}
    )
    harness = await start_daemon(stop_timeout=1.0, spool_path=spool_path, retry_cap=60.0)
    harness.daemon.store.statement_timeout = 4.0
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'brief')")
    with trio.fail_after(10):
        while not started.exists():
            await trio.sleep(0.02)
    holder = await _connect(database)
    try:
        await aio(holder.execute)("BEGIN")
        await aio(holder.execute)("LOCK TABLE coordinator.runs IN ACCESS EXCLUSIVE MODE")
        assert await harness.stop(timeout=40) == 3
    finally:
        await aio(holder.close)()
    names = [e["event"] for e in harness.events]
    assert "settle.spooled" in names
    before = names[: names.index("settle.spooled")]
    assert "settle.retry_failed" not in before, harness.events[-20:]
    assert [r.run_id for r in Spool(spool_path).read().records] == [run_id]


async def test_listener_killed_reconnects_and_refreshes(
    start_daemon: StartDaemon, conn: asyncpg.Connection
) -> None:
    harness = await start_daemon(refresh_spacing=0.1)
    await aio(conn.execute)(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = 'coordinator' AND query LIKE 'LISTEN%'"
    )
    await harness.wait_event("listener.lost")
    # Committed while nobody listens (the listener waits before reconnecting): only the
    # refresh after reconnecting can see it.
    job = await define(conn, "missed", schedule_kind="interval", schedule="1h")
    await harness.wait_event("listener.reconnected", timeout=20)
    with trio.fail_after(10):
        while job not in harness.daemon.deadlines:
            await trio.sleep(0.02)
    assert not harness.named("wake", payload={"job": job})


async def test_manual_trigger_during_stop_stays_queued_and_runs_next_start(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    await define(
        conn, "slow", target={"kind": "exec", "argv": ["sh", "-c", f"touch {started}; sleep 1.5"]}
    )
    await define(conn, "late")
    harness = await start_daemon()
    await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'slow')")
    with trio.fail_after(10):
        while not started.exists():
            await trio.sleep(0.02)
    harness.daemon.request_stop()
    await harness.wait_event("stopping")
    late = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'late')")
    assert await harness.stop() == 0
    row = await aio(conn.fetchrow)("SELECT status FROM coordinator.runs WHERE id = $1", late)
    assert row["status"] == "queued"

    second = await start_daemon()
    await second.wait_event("job.run", run=late)
    row = await aio(conn.fetchrow)("SELECT status FROM coordinator.runs WHERE id = $1", late)
    assert row["status"] == "succeeded"


async def test_stop_timeout_cancels_running_calls(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    job = await define(
        conn, "forever", target={"kind": "exec", "argv": ["sh", "-c", f"touch {started}; sleep 60"]}
    )
    harness = await start_daemon(stop_timeout=1.0)
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'forever')")
    with trio.fail_after(10):
        while not started.exists():
            await trio.sleep(0.02)
    assert await harness.stop(timeout=15) == 0
    row = await aio(conn.fetchrow)(
        "SELECT status, error_message FROM coordinator.runs WHERE id = $1", run_id
    )
    assert row["status"] == "cancelled"
    assert "stopping" in row["error_message"]
    assert job
    # Not idempotent: not run again (it may not be safe to).
    retries = await aio(conn.fetchval)(
        "SELECT count(*) FROM coordinator.runs WHERE retry_of = $1", run_id
    )
    assert retries == 0


async def test_a_stop_queues_an_abandoned_idempotent_run_again(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """A deploy's restart left it cancelled and its work undone, where a kill -9 would
    have had the crash sweep queue it again (a tester's finding)."""
    marker = tmp_path / "ran"
    await define(
        conn,
        "again",
        idempotent=True,
        target={"kind": "exec", "argv": ["sh", "-c", f"echo x >> {marker}; sleep 60"]},
    )
    harness = await start_daemon(stop_timeout=1.0)
    run_id = await aio(conn.fetchval)(
        """SELECT coordinator.trigger('default', 'again', '{"n": 7}')"""
    )
    with trio.fail_after(10):
        while not marker.exists():
            await trio.sleep(0.02)
    assert await harness.stop(timeout=15) == 0
    row = await aio(conn.fetchrow)(
        "SELECT status, error_message FROM coordinator.runs WHERE id = $1", run_id
    )
    retry = await aio(conn.fetchrow)(
        "SELECT id, status, trigger, attempt, args FROM coordinator.runs WHERE retry_of = $1",
        run_id,
    )
    assert row["status"] == "cancelled"
    assert row["error_message"] == (
        f"cancelled: daemon stopping; queued again as run {retry['id']} (the job is idempotent)"
    )
    assert (retry["status"], retry["trigger"], retry["attempt"]) == ("queued", "retry", 2)
    assert json.loads(retry["args"]) == {"n": 7}
    (said,) = harness.named("stop.requeued")
    assert (said["run"], said["retry"]) == (run_id, retry["id"])
    # The next start runs it (and a stop abandons a retry without queuing it again).
    marker.unlink()
    second = await start_daemon(stop_timeout=1.0)
    with trio.fail_after(20):
        while not marker.exists():
            await trio.sleep(0.02)
    assert await second.stop(timeout=15) == 0
    status = await aio(conn.fetchval)(
        "SELECT status FROM coordinator.runs WHERE id = $1", retry["id"]
    )
    assert status == "cancelled"
    again = await aio(conn.fetchval)(
        "SELECT count(*) FROM coordinator.runs WHERE retry_of = $1", retry["id"]
    )
    assert again == 0
    # The daemon's, as every daemon function: not any role's to call.
    probe = f"requeue_probe_{os.getpid()}"
    await aio(conn.execute)(f"CREATE ROLE {probe} NOLOGIN")
    try:
        assert not await aio(conn.fetchval)(
            f"SELECT has_function_privilege('{probe}', "
            "'coordinator._requeue_abandoned(bigint[], integer, integer, integer)', 'EXECUTE')"
        )
    finally:
        await aio(conn.execute)(f"DROP ROLE {probe}")


async def test_database_unreachable_at_startup_waits_then_becomes_ready(
    start_daemon: StartDaemon, private_cluster: Cluster, fault_db: str
) -> None:
    await trio.to_thread.run_sync(private_cluster.stop, "fast")
    harness = await start_daemon(dsn=fault_db, wait_ready=False, retry_cap=0.5)
    await harness.wait_event("startup.database_unavailable", count=2)
    assert not harness.daemon.ready.is_set()
    assert harness.daemon.state == "degraded"
    await trio.to_thread.run_sync(private_cluster.start)
    await harness.wait_event("ready", timeout=20)
    steps = [e["event"] for e in harness.events if e["event"].startswith(("startup.", "ready"))]
    assert steps[-4:] == ["startup.lock", "startup.spool", "startup.sweep", "ready"]


async def test_requeueing_skips_a_job_triggered_meanwhile_and_a_lost_lead(
    conn: asyncpg.Connection,
) -> None:
    """A trigger() of one job at the same moment made the whole statement fail (a unique
    violation), and the other jobs' runs lost their retries with it (review)."""
    ids = {}
    for name in ("a", "b"):
        job = await define(conn, name, idempotent=True)
        ids[name] = await aio(conn.fetchval)(
            "INSERT INTO coordinator.runs (job_id, trigger, status, started_at, finished_at, "
            "error_message) VALUES ($1, 'manual', 'cancelled', now(), now(), "
            "'cancelled: daemon stopping') RETURNING id",
            job,
        )
    await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'b')")
    runs = [ids["a"], ids["b"]]
    # Fenced: a caller whose session does not hold the lock queues nothing.
    pid = await aio(conn.fetchval)("SELECT pg_backend_pid()")
    fenced = await aio(conn.fetch)(
        "SELECT * FROM coordinator._requeue_abandoned($1, $2, 4242, 1)", runs, pid
    )
    assert fenced == []
    rows = await aio(conn.fetch)(
        "SELECT * FROM coordinator._requeue_abandoned($1, NULL, 0, 0)", runs
    )
    assert [r["run_id"] for r in rows] == [ids["a"]]
    queued = await aio(conn.fetch)(
        "SELECT j.name, r.trigger FROM coordinator.runs r JOIN coordinator.jobs j "
        "ON j.id = r.job_id WHERE r.status = 'queued' ORDER BY j.name"
    )
    assert [(r["name"], r["trigger"]) for r in queued] == [("a", "retry"), ("b", "manual")]


async def test_a_database_restart_leaves_a_live_leader_leading_beside_its_standby(
    start_daemon: StartDaemon, private_cluster: Cluster, fault_db: str, tmp_path: Path
) -> None:
    """A restart ends every session at once: the standby, back first, took the lock
    (3 times of 3 for a tester), the healthy leader stepped down and its running command
    was stopped. The standby now lets the leader try first."""
    started = tmp_path / "started"
    conn = await _connect(fault_db)
    await define(
        conn,
        "slow",
        target={"kind": "exec", "argv": ["sh", "-c", f"touch {started}; sleep 6"]},
    )
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'slow')")
    await aio(conn.close)()
    # (The standby retries every half second, the leader on the default backoff: the
    # standby is back first unless it lets the leader try.)
    leader = await start_daemon(dsn=fault_db)
    standby = await start_daemon(dsn=fault_db, retry_cap=0.5, wait_ready=False)
    await standby.wait_event("standby")
    with trio.fail_after(15):
        while not started.exists():
            await trio.sleep(0.05)
    await trio.to_thread.run_sync(private_cluster.stop, "fast")
    await trio.sleep(2.5)  # (the leader's backoff grows meanwhile)
    await trio.to_thread.run_sync(private_cluster.start)
    await leader.wait_event("leadership.regained", timeout=20)
    await standby.wait_event("standby", count=2, timeout=20)
    await leader.wait_event("job.run", run=run_id, outcome="succeeded", timeout=20)
    assert leader.named("leadership.lost") == []
    assert not leader.done.is_set()
    assert standby.named("standby.yielding")
    assert not standby.daemon.ready.is_set()
    rows = await _query(fault_db, "SELECT status FROM coordinator.runs WHERE id = $1", run_id)
    assert rows[0]["status"] == "succeeded"
