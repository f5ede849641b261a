"""Faults that used to stop the daemon, lose a result or starve a job (issue #11), each
reproduced against a real PostgreSQL. After each: the daemon still serves (or exited
with its documented status having lost nothing), and the faulted job recovers once the
fault is removed."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest
import trio

from coordinator.daemon import EXIT_LOST
from coordinator.daemon.settlement import FLUSH_PAUSE
from coordinator.db import aio
from coordinator.model import Outcome
from coordinator.spool import HeldResult, Spool

from .conftest import StartDaemon, define

if TYPE_CHECKING:
    from coordinator.embedded import Cluster


def counter(tmp_path: Path, name: str) -> tuple[list[str], Path]:
    path = tmp_path / f"{name}.txt"
    return ["sh", "-c", f'echo "$COORDINATOR_RUN_ID" >> {path}'], path


def executions(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


async def until(predicate: Any, timeout: float = 20.0) -> None:
    with trio.fail_after(timeout):
        while not await predicate():
            await trio.sleep(0.05)


async def connect(dsn: str) -> asyncpg.Connection:
    return await aio(asyncpg.connect)(dsn, server_settings={"application_name": "tests-app"})


# -- 1. ordinary database errors ---------------------------------------------------------------


async def test_a_deadlock_in_the_first_refresh_is_retried_at_once(
    start_daemon: StartDaemon, conn: asyncpg.Connection, database: str
) -> None:
    b = await define(conn, "b", schedule_kind="interval", schedule="1h")
    a = await define(conn, "a", schedule_kind="interval", schedule="1h")
    app = await connect(database)
    try:
        # The daemon's backend must be the one that detects the deadlock (the default
        # 1 s); ours waits longer, so the test does not depend on who waited first.
        await aio(app.execute)("SET deadlock_timeout = '20s'")
        await aio(app.execute)("BEGIN")
        await aio(app.execute)("UPDATE coordinator.jobs SET updated_at = now() WHERE id = $1", a)
        harness = await start_daemon(wait_ready=False)

        async def daemon_waits_on_a() -> bool:
            return bool(
                await aio(conn.fetchval)(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                    "'coordinator' AND wait_event_type = 'Lock' AND query LIKE '%UPDATE%'"
                )
            )

        await until(daemon_waits_on_a)
        # Now the application takes b, which the daemon's refresh holds: a deadlock.
        await aio(app.execute)("UPDATE coordinator.jobs SET updated_at = now() WHERE id = $1", b)
        await aio(app.execute)("COMMIT")
    finally:
        await aio(app.close)()
    failed = await harness.wait_event("startup.refresh.failed")
    assert failed[0]["kind"] == "conflict"
    assert failed[0]["retry_s"] == 0
    assert "deadlock" in failed[0]["error"]
    with trio.fail_after(20):
        await harness.daemon.ready.wait()
    assert a in harness.daemon.deadlines
    assert b in harness.daemon.deadlines
    assert not harness.done.is_set()


async def test_a_read_only_database_degrades_and_recovers(
    start_daemon: StartDaemon, private_cluster: Cluster, fault_db: str, tmp_path: Path
) -> None:
    argv, path = counter(tmp_path, "ro")
    harness = await start_daemon(dsn=fault_db, refresh_spacing=0.2, retry_cap=0.5)
    admin = await connect(fault_db)
    await aio(admin.execute)("ALTER DATABASE postgres SET default_transaction_read_only = on")
    await aio(admin.close)()
    await trio.to_thread.run_sync(private_cluster.stop, "fast")
    await trio.to_thread.run_sync(private_cluster.start)
    app = await connect(fault_db)
    try:
        await aio(app.execute)("SET default_transaction_read_only = off")
        job = await define(
            app,
            "after",
            schedule_kind="interval",
            schedule="1s",
            target={"kind": "exec", "argv": argv},
        )
        # (Waited out like a server away: a database that takes no writes is a state of
        # the server, not a refusal of what was sent.)
        failed = await harness.wait_event("refresh.failed", kind="unavailable", timeout=30)
        assert "read-only" in failed[0]["error"]
        await trio.sleep(1.0)
        status = harness.daemon.status()
        assert status.state == "degraded"
        assert any("read-only" in reason for reason in status.degraded)
        assert not harness.done.is_set()
        # The fault is removed: the daemon's sessions are read-write again after they
        # reconnect, and the job it could not arm runs.
        await aio(app.execute)("ALTER DATABASE postgres RESET default_transaction_read_only")
        await aio(app.execute)(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'coordinator'"
        )
    finally:
        await aio(app.close)()
    await until(lambda: _true(executions(path) >= 1), timeout=40)
    assert job in harness.daemon.deadlines or executions(path) >= 1
    await harness.wait_event("refresh.recovered", timeout=30)
    assert not harness.done.is_set()


async def _true(value: bool) -> bool:
    return value


async def _running_result(conn: asyncpg.Connection, name: str) -> HeldResult:
    """A manual job with a run left ``running``, and that run's success as the spool
    would hold it."""
    job = await define(conn, name)
    run_id = await aio(conn.fetchval)(
        "INSERT INTO coordinator.runs (job_id, trigger, status, claimed_at, started_at) "
        "VALUES ($1, 'manual', 'running', now(), now()) RETURNING id",
        job,
    )
    now = datetime.now(UTC)
    return HeldResult(
        run_id=run_id,
        job_id=job,
        job_key=f"default/{name}",
        schedule_version=1,
        next_run_at=None,
        outcome=Outcome(status="succeeded", started_at=now, finished_at=now),
    )


async def test_a_spooled_record_the_database_refuses_is_set_aside_once(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    poisoned = await _running_result(conn, "poisoned")
    run_id = poisoned.run_id
    spool_path = tmp_path / "state" / "spool.jsonl"
    # A record with a valid checksum whose status PostgreSQL rejects (a check violation).
    line = json.dumps({**poisoned.to_json(), "outcome": {
        **poisoned.to_json()["outcome"], "status": "bogus"}}, separators=(",", ":"))  # fmt: skip
    import zlib

    spool_path.parent.mkdir(parents=True)
    spool_path.write_text(f"{line}\t{zlib.crc32(line.encode()):08x}\n")

    harness = await start_daemon(spool_path=spool_path, retry_cap=0.2)
    rejected = harness.named("spool.rejected", run=run_id)
    assert rejected
    assert "check" in rejected[0]["error"]
    replayed = harness.named("spool.replayed")[0]
    assert replayed["rejected"] == 1
    aside = Path(replayed["rejected_file"])
    assert line.encode() in await trio.Path(aside).read_bytes()
    assert not spool_path.exists()
    row = await aio(conn.fetchrow)(
        "SELECT status, error_message FROM coordinator.runs WHERE id = $1", run_id
    )
    assert row["status"] == "unresolved"
    assert "could not be saved from the spool" in row["error_message"]
    # The next start has nothing left to replay: no crash loop.
    await harness.stop()
    second = await start_daemon(spool_path=spool_path)
    assert second.named("startup.spool", records=0)


async def test_a_read_only_database_at_start_keeps_the_spool_whole_until_it_takes_writes(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """A database that takes no writes (a standby, default_transaction_read_only) made the
    replay set the record aside as rejected, fail to mark its run, and start over: a new
    rejected file at each attempt, no line saying so, while the result was good."""
    record = await _running_result(conn, "spooled")
    run_id = record.run_id
    state = tmp_path / "state"
    spool_path = state / "spool.jsonl"
    Spool(spool_path).append([record])
    name = await aio(conn.fetchval)("SELECT current_database()")
    await aio(conn.execute)(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    try:
        harness = await start_daemon(spool_path=spool_path, retry_cap=0.2, wait_ready=False)
        await harness.wait_event("startup.database_unavailable", count=2)
        assert not harness.named("spool.rejected")
        assert sorted(p.name for p in state.iterdir()) == ["spool.jsonl"]
    finally:
        await aio(conn.execute)(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
    with trio.fail_after(30):
        await harness.daemon.ready.wait()
    assert harness.named("spool.replayed")[-1]["saved"] == 1
    status = await aio(conn.fetchval)("SELECT status FROM coordinator.runs WHERE id = $1", run_id)
    assert status == "succeeded"
    assert not spool_path.exists()
    assert [p.name for p in state.iterdir() if "rejected" in p.name] == []


# -- 2. huge durations -------------------------------------------------------------------------


async def test_an_interval_too_long_for_a_datetime_makes_only_its_job_inert(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    argv, path = counter(tmp_path, "fine")
    # A row the front doors would refuse, as a superuser can still write it (the check
    # is a trigger, and replica mode skips triggers) or an old version stored it.
    await aio(conn.execute)("SET session_replication_role = replica")
    await aio(conn.execute)(
        "INSERT INTO coordinator.jobs (name, schedule_kind, schedule, target) "
        """VALUES ('huge', 'interval', '3000000d', '{"kind": "exec", "argv": ["true"]}')"""
    )
    await aio(conn.execute)("SET session_replication_role = origin")
    await define(
        conn, "fine", schedule_kind="interval", schedule="1s", target={"kind": "exec", "argv": argv}
    )
    harness = await start_daemon()
    await until(lambda: _true(executions(path) >= 2), timeout=20)
    reason = await aio(conn.fetchval)(
        "SELECT invalid_reason FROM coordinator.jobs WHERE name = 'huge'"
    )
    assert reason
    (said,) = harness.named("job.invalid")
    assert said["job"] == "default/huge"  # (by name too: it said only job_id)
    assert not harness.done.is_set()
    # Fixed by an operator: the job runs.
    await aio(conn.execute)(
        "SELECT coordinator.define_job(name => 'huge', schedule_kind => 'interval', "
        """schedule => '1h', target => '{"kind": "exec", "argv": ["true"]}')"""
    )
    await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'huge')")
    await harness.wait_event("job.run", job="default/huge")


# -- 3. a forged NOTIFY ------------------------------------------------------------------------


async def test_forged_notifications_never_starve_a_job(
    start_daemon: StartDaemon, conn: asyncpg.Connection, database: str, tmp_path: Path
) -> None:
    argv, path = counter(tmp_path, "tick")
    job = await define(
        conn, "tick", schedule_kind="interval", schedule="1s", target={"kind": "exec", "argv": argv}
    )
    await aio(conn.execute)("DROP ROLE IF EXISTS forger")
    await aio(conn.execute)("CREATE ROLE forger LOGIN")  # no rights on the schema at all
    harness = await start_daemon(refresh_spacing=0.5)
    await until(lambda: _true(executions(path) >= 1))
    base, _, rest = database.partition("://")
    dsn = f"{base}://forger@{rest.partition('@')[2]}"
    forger = await aio(asyncpg.connect)(dsn)
    payloads = [
        {"dispatch": True, "run": 1, "job": job, "worker": "nope", "priority": "background"},
        {"dispatch": True, "run": 999999, "job": job, "worker": None, "priority": "interactive"},
        {"dispatch": True, "run": 1, "job": 424242, "worker": "nope", "priority": "background"},
        {"dispatch": True, "run": 7, "job": 424243, "worker": None, "priority": "background"},
        "not json at all",
        {"job": "drop table"},
        # Its time (0027's "at") too big for a float division, or in the future.
        '{"dispatch": true, "run": 8, "job": 424244, "worker": null, '
        '"priority": "background", "at": 1' + "0" * 400 + "}",
        {
            "dispatch": True,
            "run": 9,
            "job": job,
            "worker": None,
            "priority": "background",
            "at": 2**62,
        },
        {"pause": 1},
    ]
    try:
        for _ in range(3):
            for payload in payloads:
                text = payload if isinstance(payload, str) else json.dumps(payload)
                await aio(forger.execute)("SELECT pg_notify('coordinator', $1)", text)
            await trio.sleep(0.3)
    finally:
        await aio(forger.close)()
    before = executions(path)
    await until(lambda: _true(executions(path) >= before + 3), timeout=20)
    # Still scheduled: armed, or in a call. Polled, because between a call's end and its
    # batched settlement the job is briefly neither (the settlement re-arms it).
    await until(
        lambda: _true(job in harness.daemon.deadlines or bool(harness.daemon.status().running))
    )
    assert harness.named("wake.ignored")
    assert not harness.done.is_set()
    await aio(conn.execute)("DROP ROLE forger")


# -- 4. the spool cannot be written ------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
async def test_a_full_disk_at_stop_names_the_runs_it_could_not_keep(
    start_daemon: StartDaemon, private_cluster: Cluster, fault_db: str, tmp_path: Path
) -> None:
    state = tmp_path / "full"
    state.mkdir()
    await trio.run_process(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(state)])
    try:
        with (state / "filler").open("wb") as f, pytest.raises(OSError, match="No space"):
            f.write(b"x" * 128 * 1024)
        started = tmp_path / "started"
        app = await connect(fault_db)
        await define(
            app,
            "slow",
            target={"kind": "exec", "argv": ["sh", "-c", f"touch {started}; sleep 1"]},
        )
        run_id = await aio(app.fetchval)("SELECT coordinator.trigger('default', 'slow')")
        await aio(app.close)()
        harness = await start_daemon(
            dsn=fault_db, spool_path=state / "spool.jsonl", retry_cap=0.2, stop_timeout=2.0
        )
        with trio.fail_after(15):
            while not await trio.Path(started).exists():
                await trio.sleep(0.02)
        await trio.to_thread.run_sync(private_cluster.stop, "fast")
        await harness.wait_event("settle.retained", run=run_id)
        assert await harness.stop(timeout=30) == EXIT_LOST
        failed = harness.named("spool.write_failed")
        # Said once: the flush tries every 0.5 s until its deadline (2 s here), and a
        # tester's log had both lines every half second ("40 lines in 10 s").
        assert len(failed) == 1, failed
        assert "No space left" in failed[0]["error"]
        since_stop = harness.events[harness.events.index(harness.named("stopping")[0]) :]
        flush_tries = [
            e
            for e in since_stop
            if e.get("event") == "settle.retry_failed" and e["retry_s"] == FLUSH_PAUSE
        ]
        assert len(flush_tries) == 1, since_stop
        stopped = harness.named("stopped")
        assert len(stopped) == 1, harness.events[-5:]
        # Nothing after the last line (a background retry cut short by the stop was
        # logged as failing after it).
        said = [e for e in harness.events if e["level"] != "debug"]
        assert said[-1]["event"] == "stopped", said[-5:]
        assert (stopped[0]["lost"], stopped[0]["exit_code"]) == (str(run_id), EXIT_LOST)
        assert not (state / "spool.jsonl").exists()
        assert list(state.glob(".spool.jsonl.tmp")) == []  # no half-written leftovers
    finally:
        await trio.run_process(["umount", str(state)], check=False)
    # Nothing was guessed: the next start finds the run's outcome unknown.
    await trio.to_thread.run_sync(private_cluster.start)
    second = await start_daemon(dsn=fault_db)
    assert second.named("startup.lost_run", run=run_id, action="unresolved")


# -- 7. permissions ----------------------------------------------------------------------------


def test_spool_files_are_private_and_corrupt_lines_kept_byte_exact(tmp_path: Path) -> None:
    from coordinator.clock import SystemWallClock

    old = os.umask(0)
    try:
        spool = Spool(tmp_path / "state" / "spool.jsonl")
        now = datetime.now(UTC)
        spool.append(
            [
                HeldResult(
                    run_id=1,
                    job_key="default/a",
                    schedule_version=1,
                    next_run_at=now + timedelta(hours=1),
                    outcome=Outcome(status="failed", started_at=now, finished_at=now),
                )
            ]
        )
        # Nobody else lists or writes it; the embedded cluster's user passes through.
        assert (tmp_path / "state").stat().st_mode & 0o777 == 0o711
        assert spool.path.stat().st_mode & 0o777 == 0o600
        raw = b"\xff\xfe not utf-8 \x00 at all\tdeadbeef"
        with spool.path.open("ab") as f:
            f.write(raw + b"\n")
        contents = spool.read()
        assert [r.run_id for r in contents.records] == [1]
        aside = spool.set_aside(contents.corrupt, SystemWallClock(), "corrupt")
        assert aside is not None
        assert aside.stat().st_mode & 0o777 == 0o600
        assert raw in aside.read_bytes()
    finally:
        os.umask(old)


# -- 8. a connection is never shared -----------------------------------------------------------


async def test_fast_restarts_under_load_lose_nothing_and_share_no_connection(
    start_daemon: StartDaemon, private_cluster: Cluster, fault_db: str, tmp_path: Path
) -> None:
    names = [f"j{i}" for i in range(8)]
    app = await connect(fault_db)
    for name in names:
        argv, _ = counter(tmp_path, name)
        await define(
            app,
            name,
            schedule_kind="interval",
            schedule="1s",
            target={"kind": "exec", "argv": argv},
        )
    await aio(app.close)()
    harness = await start_daemon(dsn=fault_db, refresh_spacing=0.5, retry_cap=0.5)
    for _ in range(3):
        await trio.sleep(1.5)
        await trio.to_thread.run_sync(private_cluster.stop, "fast")
        await trio.to_thread.run_sync(private_cluster.start)
    await trio.sleep(3.0)
    assert not harness.done.is_set()
    errors = [e for e in harness.events if "another operation is in progress" in str(e)]
    assert errors == []
    assert await harness.stop() in (0, 3)
    # Every run that ended is saved or was spooled; none is left running by this daemon.
    app = await connect(fault_db)
    try:
        running = await aio(app.fetchval)(
            "SELECT count(*) FROM coordinator.runs WHERE status = 'running'"
        )
    finally:
        await aio(app.close)()
    spooled = {e["run"] for e in harness.named("settle.spooled")}
    assert running <= len(spooled)
    for name in names:
        assert executions(tmp_path / f"{name}.txt") >= 1


async def test_the_daemons_sessions_ask_the_server_to_probe_them_too(
    aio_loop: Any, database: str
) -> None:
    """A session whose daemon's host vanished lingered on the server for its kernel's
    default keepalive, two hours, holding the single-writer lock: the daemon that came
    back as a standby waited that long for its own dead session."""
    from coordinator.db import APP_CLI, APP_DAEMON, close_quietly, connect

    names = ["tcp_keepalives_count", "tcp_keepalives_idle", "tcp_keepalives_interval",
             "tcp_user_timeout"]  # fmt: skip
    query = "SELECT name, setting FROM pg_settings WHERE name = ANY ($1) ORDER BY name"
    daemon = await connect(database, application_name=APP_DAEMON, daemon=True)
    cli = await connect(database, application_name=APP_CLI)
    try:
        if await aio(daemon.fetchval)("SELECT inet_server_addr() IS NULL"):
            pytest.skip("a Unix socket: the server ignores keepalive settings there")
        ours = {r["name"]: r["setting"] for r in await aio(daemon.fetch)(query, names)}
        assert ours == {
            "tcp_keepalives_count": "3",
            "tcp_keepalives_idle": "30",
            "tcp_keepalives_interval": "10",
            "tcp_user_timeout": "60000",
        }
        # (Only the daemon's: a command's session keeps the server's defaults.)
        theirs = {r["name"]: r["setting"] for r in await aio(cli.fetch)(query, names)}
        assert theirs["tcp_keepalives_idle"] != "30"
    finally:
        await close_quietly(daemon)
        await close_quietly(cli)


async def test_a_standby_saves_its_spool_while_it_waits(
    start_daemon: StartDaemon, conn: asyncpg.Connection, database: str, tmp_path: Path
) -> None:
    """A daemon that spooled a result at its stop and came back as a standby kept it
    unseen until it led again, while the leader's sweep had marked the run unresolved
    and alerted a crash (a tester's finding). It is saved over that mark now, while the
    standby waits; a standby without a spool stays silent."""
    from coordinator.store import LOCK_CLASS, LOCK_OBJECT

    held = await _running_result(conn, "spooled")
    # The leader's sweep marked it (the daemon that spooled it was gone).
    await aio(conn.execute)(
        "UPDATE coordinator.runs SET status = 'unresolved', finished_at = now(),"
        " error_message = 'lost: swept' WHERE id = $1",
        held.run_id,
    )
    spool_path = tmp_path / "state" / "spool.jsonl"
    Spool(spool_path).append([held])
    holder = await aio(asyncpg.connect)(database)
    try:
        await aio(holder.fetchval)("SELECT pg_advisory_lock($1, $2)", LOCK_CLASS, LOCK_OBJECT)
        standby = await start_daemon(spool_path=spool_path, wait_ready=False)
        await standby.wait_event("standby")
        await standby.wait_event("spool.replayed", timeout=15)
        assert standby.named("settle.late", run=held.run_id)
        row = await aio(conn.fetchrow)(
            "SELECT status FROM coordinator.runs WHERE id = $1", held.run_id
        )
        assert row["status"] == "succeeded"
        assert not spool_path.exists()
        assert not standby.daemon.ready.is_set()
        # Without a spool, standing by again says and sends nothing more.
        other = await start_daemon(spool_path=tmp_path / "none.jsonl", wait_ready=False)
        await other.wait_event("standby")
        assert other.named("standby.spool") == []
    finally:
        await aio(holder.close)()
