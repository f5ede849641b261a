"""Single writer (promise 9): a dead leader's claim cannot outlive the next leader's sweep.

Fencing alone is a check at the start of a claim: a claim of a leader that dies (SIGKILL:
its backends keep running the statements they were given until those end) may pass the
check, wait for a job row, and commit a ``running`` run after the next leader's crash
sweep has looked. Nobody would ever settle or sweep that run, and its job would never
run again. So a claim holds the leader's *fence* (a shared transaction-level advisory
lock) from before its check until it commits, and the sweep takes the fence exclusively
first: it waits for every claim that passed its check, and a claim that comes after it is
refused (its leader no longer holds the lock).

The race is made deterministic here: an application transaction holds the job's row, so
the old leader's claim is in flight (past its fence check, waiting for the row) when its
lock session ends and the new leader sweeps.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
import trio

from coordinator.db import aio
from coordinator.store import LOCK_CLASS, LOCK_OBJECT, ConnectionPool, LostRun, Store

from .conftest import define

_CLAIM_ONE = (
    "SELECT reason, run_id FROM coordinator._claim($1, $2, NULL, NULL, 'old', '{}', $3, $4, $5)"
)
_CLAIM_MANY = (
    "SELECT reason, run_id FROM coordinator._claim_many($1, 'old', '{}', $2, $3, $4) ORDER BY i"
)


async def _connect(database: str) -> asyncpg.Connection:
    return await aio(asyncpg.connect)(database)


async def _waiting_on_a_lock(prober: asyncpg.Connection, query_like: str) -> bool:
    count: int = await aio(prober.fetchval)(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE wait_event_type = 'Lock' AND state = 'active' AND query LIKE $1",
        query_like,
    )
    return count > 0


async def _until(condition: Any, timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        while not await condition():
            await trio.sleep(0.02)


@pytest.mark.parametrize("batch", [False, True], ids=["claim", "claim_many"])
async def test_a_claim_in_flight_when_its_leader_dies_is_swept_by_the_next_leader(
    conn: asyncpg.Connection, database: str, batch: bool
) -> None:
    jobs = [await define(conn, f"pay{i}") for i in range(2 if batch else 1)]
    runs = [
        await aio(conn.fetchval)("SELECT coordinator.trigger('default', $1)", f"pay{i}")
        for i in range(len(jobs))
    ]
    old_lock, old_claim, holder, new_lock, prober = [await _connect(database) for _ in range(5)]
    pool = ConnectionPool(database, size=1)
    new_leader = Store(pool=pool, instance="new")
    claimed: list[asyncpg.Record] = []
    lost: list[LostRun] = []
    swept = trio.Event()
    try:
        assert await aio(old_lock.fetchval)(
            "SELECT pg_try_advisory_lock($1, $2)", LOCK_CLASS, LOCK_OBJECT
        )
        old_pid = old_lock.get_server_pid()
        # An application holds the last job's row: the old leader's claim passes its fence
        # check, then waits for that row.
        await aio(holder.execute)("BEGIN")
        await aio(holder.execute)(
            "SELECT 1 FROM coordinator.jobs WHERE id = $1 FOR UPDATE", jobs[-1]
        )

        async def old_leader_claims() -> None:
            if batch:
                items = [
                    {"i": i, "job": job, "run": run, "at": None, "v": None, "now": None}
                    for i, (job, run) in enumerate(zip(jobs, runs, strict=True))
                ]
                sql, args = _CLAIM_MANY, (json.dumps(items), old_pid, LOCK_CLASS, LOCK_OBJECT)
            else:
                sql, args = _CLAIM_ONE, (jobs[0], runs[0], old_pid, LOCK_CLASS, LOCK_OBJECT)
            claimed.extend(await aio(old_claim.fetch)(sql, *args))

        async def new_leader_sweeps() -> None:
            # The lock is free once the old leader's session has ended.
            await aio(new_lock.fetchval)("SELECT pg_advisory_lock($1, $2)", LOCK_CLASS, LOCK_OBJECT)
            new_leader.leader_pid = new_lock.get_server_pid()
            lost.extend(await new_leader.sweep_lost())
            swept.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(old_leader_claims)
            await _until(lambda: _waiting_on_a_lock(prober, "%coordinator._claim%"))
            # The old leader dies: its lock session ends, its claim's backend goes on.
            await aio(old_lock.close)()
            nursery.start_soon(new_leader_sweeps)
            # The sweep has run (the race lost) or waits for the claim in flight.
            await _until(lambda: _sweep_done_or_waiting(swept, prober))
            await aio(holder.execute)("ROLLBACK")
    finally:
        await pool.close()
        for c in (old_lock, old_claim, holder, new_lock, prober):
            await aio(c.close)()

    # The claim was granted: it had passed its fence before the lock changed hands ...
    assert [r["reason"] for r in claimed] == [None] * len(jobs)
    # ... and the new leader's sweep saw every run it committed: none is left running
    # with nobody to settle it.
    statuses = await aio(conn.fetch)("SELECT id, status FROM coordinator.runs ORDER BY id")
    assert [(r["id"], r["status"]) for r in statuses] == [(run, "unresolved") for run in runs]
    assert sorted((x.run_id, x.action) for x in lost) == [(run, "unresolved") for run in runs]


async def _sweep_done_or_waiting(swept: trio.Event, prober: asyncpg.Connection) -> bool:
    return swept.is_set() or await _waiting_on_a_lock(prober, "%coordinator._sweep_lost%")


async def test_a_claim_after_the_sweep_is_fenced(conn: asyncpg.Connection, database: str) -> None:
    """The other half: a claim of the old leader that reaches its fence check only after
    the new leader swept is refused (its leader's session no longer holds the lock)."""
    job = await define(conn, "pay")
    run = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'pay')")
    old_lock, new_lock = await _connect(database), await _connect(database)
    pool = ConnectionPool(database, size=1)
    try:
        assert await aio(old_lock.fetchval)(
            "SELECT pg_try_advisory_lock($1, $2)", LOCK_CLASS, LOCK_OBJECT
        )
        old_pid = old_lock.get_server_pid()
        await aio(old_lock.close)()
        await aio(new_lock.fetchval)("SELECT pg_advisory_lock($1, $2)", LOCK_CLASS, LOCK_OBJECT)
        assert await Store(pool=pool, instance="new").sweep_lost() == []
        row = await aio(conn.fetchrow)(_CLAIM_ONE, job, run, old_pid, LOCK_CLASS, LOCK_OBJECT)
    finally:
        await pool.close()
        await aio(new_lock.close)()
    assert row["reason"] == "fenced"
    assert await aio(conn.fetchval)("SELECT status FROM coordinator.runs") == "queued"


@pytest.mark.parametrize("batch", [False, True], ids=["claim", "claim_many"])
async def test_the_leaders_probe_lock_is_the_whole_check_while_its_session_lives(
    conn: asyncpg.Connection, database: str, batch: bool
) -> None:
    """0020: the leader's session holds (class, -pid); a claim that finds it held asks
    pg_locks nothing more. Shown with a session that holds only the probe lock: its pid
    passes (the pg_locks check alone would refuse it), so the probe decided."""
    job = await define(conn, "pay")
    run = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'pay')")
    prober = await _connect(database)
    try:
        assert await aio(prober.fetchval)(
            "SELECT pg_try_advisory_lock($1, -pg_backend_pid())", LOCK_CLASS
        )
        pid = prober.get_server_pid()
        if batch:
            items = [{"i": 0, "job": job, "run": run, "at": None, "v": None, "now": None}]
            rows = await aio(conn.fetch)(
                _CLAIM_MANY, json.dumps(items), pid, LOCK_CLASS, LOCK_OBJECT
            )
        else:
            rows = [await aio(conn.fetchrow)(_CLAIM_ONE, job, run, pid, LOCK_CLASS, LOCK_OBJECT)]
    finally:
        await aio(prober.close)()
    assert [r["reason"] for r in rows] == [None]


async def test_a_leader_that_took_both_locks_is_fenced_once_its_session_ends(
    conn: asyncpg.Connection, database: str
) -> None:
    """Store.try_lead takes the single-writer lock and the probe lock; while that session
    lives its claims pass, and once it ends they are refused (both locks went with it)."""
    first = await define(conn, "pay")
    second = await define(conn, "ship")
    runs = [
        await aio(conn.fetchval)("SELECT coordinator.trigger('default', $1)", name)
        for name in ("pay", "ship")
    ]
    lock = await _connect(database)
    pool = ConnectionPool(database, size=1)
    try:
        leader = Store(pool=pool, instance="old")
        assert await leader.try_lead(lock)
        pid = lock.get_server_pid()
        assert leader.leader_pid == pid
        held = await aio(conn.fetchval)(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1"
            " AND classid = $2::oid AND objid IN ($3::oid, (-$1)::oid) AND granted",
            pid,
            LOCK_CLASS,
            LOCK_OBJECT,
        )
        assert held == 2
        alive = await aio(conn.fetchrow)(_CLAIM_ONE, first, runs[0], pid, LOCK_CLASS, LOCK_OBJECT)
        await aio(lock.close)()
        gone = await aio(conn.fetchrow)(_CLAIM_ONE, second, runs[1], pid, LOCK_CLASS, LOCK_OBJECT)
    finally:
        await pool.close()
    assert alive["reason"] is None
    assert gone["reason"] == "fenced"


async def test_a_standby_whose_waiting_session_ends_waits_again(
    conn: asyncpg.Connection, database: str, start_daemon: Any
) -> None:
    """A database restart or a failover ends the standby's waiting session: it reconnects
    with backoff and stands by again (it exited, "leadership: database unavailable"),
    then leads once the leader's lock is gone."""
    holder = await _connect(database)
    try:
        await aio(holder.fetchval)("SELECT pg_advisory_lock($1, $2)", LOCK_CLASS, LOCK_OBJECT)
        standby = await start_daemon(wait_ready=False)
        await standby.wait_event("standby")
        ended = await aio(conn.fetchval)(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND query LIKE 'SELECT pg_advisory_lock(%'"
        )
        assert ended == 1
        await standby.wait_event("startup.database_unavailable")
        await standby.wait_event("standby", count=2)
        assert not standby.done.is_set()
        assert standby.named("daemon.failed") == []
    finally:
        await aio(holder.close)()
    with trio.fail_after(15):
        await standby.daemon.ready.wait()
    assert await standby.stop() == 0


async def _lock_holder_pid(conn: asyncpg.Connection) -> int:
    pid: int = await aio(conn.fetchval)(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
        "AND classid = $1 AND objid = $2",
        LOCK_CLASS,
        LOCK_OBJECT,
    )
    return pid


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
async def test_a_result_that_comes_after_another_leaders_sweep_is_saved_or_said(
    conn: asyncpg.Connection, tmp_path: Any, start_daemon: Any, idempotent: bool
) -> None:
    """A leader whose lock session ends while a standby waits steps down; the standby
    sweeps its running run. The old leader's call goes on, and its result used to come
    back 'already' and be dropped without a word, the run left unresolved and its job
    blocked although the result was in hand (migrations/0032). Now it is saved over the
    unresolved mark, and the daemon that leads re-reads the job; a run the sweep ended
    otherwise (an idempotent job's retry) keeps that end, and the result is said."""
    marker = tmp_path / "ran"
    job_id = await define(
        conn,
        "slow",
        target={"kind": "exec", "argv": ["sh", "-c", f"sleep 1.5; echo x >> {marker}"]},
        idempotent=idempotent,
    )
    old = await start_daemon(spool_path=tmp_path / "old.jsonl")
    new = await start_daemon(wait_ready=False, spool_path=tmp_path / "new.jsonl")
    await new.wait_event("standby")
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'slow')")
    await old.wait_event("run.started", run=run_id)
    # The old leader's lock session ends (as a database restart or a cut would end it);
    # the standby takes the lock at once and sweeps the run.
    await aio(conn.fetchval)("SELECT pg_terminate_backend($1)", await _lock_holder_pid(conn))
    lost = await new.wait_event("startup.lost_run", run=run_id)
    with trio.fail_after(15):
        await new.daemon.ready.wait()
        await old.done.wait()
    assert old.named("leadership.lost")
    row = await aio(conn.fetchrow)(
        "SELECT status, error_message FROM coordinator.runs WHERE id = $1", run_id
    )
    if not idempotent:
        assert lost[0]["action"] == "unresolved"
        # Saved after all: the truth, not the sweep's guess, and the job free again.
        assert row["status"] == "succeeded", row
        assert old.named("settle.late", run=run_id, outcome="succeeded")
        assert old.named("job.run", run=run_id)
        # The leader now was told, and re-read the job (its own sessions wake nobody).
        await new.wait_event("wake", payload={"job": job_id})
        again = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'slow')")
        assert again != run_id
        await new.wait_event("job.run", run=again, timeout=15)
    else:
        # The sweep queued a retry, which the new leader runs at once: the old leader
        # stopped its copy as it stepped down (it ran beside the retry until its stop
        # timeout), and the retry's end stands; the old result is said.
        assert row["status"] != "succeeded", row
        assert old.named("leadership.stopping_calls", calls=1)
        said = old.named("settle.superseded", run=run_id)
        assert said
        assert said[0]["outcome"] == "cancelled"
        assert not old.named("job.run", run=run_id)
        retry = await aio(conn.fetchval)(
            "SELECT id FROM coordinator.runs WHERE job_id = $1 AND id > $2", job_id, run_id
        )
        await new.wait_event("job.run", run=retry, outcome="succeeded", timeout=15)
        assert marker.read_text() == "x\n"  # the retry's line only
    assert old.status == 1  # stepped down


async def test_a_retry_another_daemons_sweep_queued_runs_once_the_superseded_call_ends(
    conn: asyncpg.Connection, database: str, tmp_path: Any, start_daemon: Any
) -> None:
    """Another daemon's sweep (it led for a moment: this daemon's lock session was cut,
    and it took the lock back once the other had gone) failed this leader's running
    run of an idempotent job and queued its retry. The call's result then came back
    superseded, and the job was left as the settlement said: nothing outstanding. The
    retry stayed queued, with workers idle, until some unrelated wake (a tester saw
    1.5 min, ended by a restart). The superseded settlement now re-reads its job."""
    marker = tmp_path / "ran"
    job_id = await define(
        conn,
        "slow",
        target={"kind": "exec", "argv": ["sh", "-c", f"sleep 1.5; echo x >> {marker}"]},
        idempotent=True,
    )
    leader = await start_daemon(spool_path=tmp_path / "spool.jsonl")
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'slow')")
    await leader.wait_event("run.started", run=run_id)
    pool = ConnectionPool(database, size=1)
    try:
        lost = await Store(pool=pool, instance="other").sweep_lost()
    finally:
        await pool.close()
    assert [(x.run_id, x.action) for x in lost] == [(run_id, "retried")]
    retry = await aio(conn.fetchval)(
        "SELECT id FROM coordinator.runs WHERE job_id = $1 AND id > $2", job_id, run_id
    )
    assert retry is not None
    await leader.wait_event("settle.superseded", run=run_id, timeout=15)
    await leader.wait_event("job.run", run=retry, outcome="succeeded", timeout=15)
    assert marker.read_text() == "x\nx\n"  # the swept call's and the retry's
    assert await leader.stop() == 0


async def test_a_leader_that_steps_down_before_any_sweep_lets_its_calls_finish(
    conn: asyncpg.Connection, database: str, tmp_path: Any, start_daemon: Any
) -> None:
    """Finding the lock taken does not prove a sweep: the holder may still be starting
    up, or be this daemon's own session lingering on the server after a cut. An
    idempotent job's call is stopped only once its run shows another daemon ended it;
    here nobody sweeps, so the call finishes and its result is saved as ever (stopped
    at once, it ended `cancelled`, a tick lost without a word)."""
    await define(conn, "slow", target={"kind": "exec", "argv": ["sleep", "1.5"]}, idempotent=True)
    old = await start_daemon(spool_path=tmp_path / "old.jsonl")
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'slow')")
    await old.wait_event("run.started", run=run_id)
    # Take the lock the moment the leader's session ends, and sweep nothing.
    pid = await _lock_holder_pid(conn)
    taker = await _connect(database)
    try:
        await aio(conn.fetchval)("SELECT pg_terminate_backend($1)", pid)
        await aio(taker.fetchval)("SELECT pg_advisory_lock($1, $2)", LOCK_CLASS, LOCK_OBJECT)
        with trio.fail_after(15):
            await old.done.wait()
    finally:
        await aio(taker.close)()
    assert old.named("leadership.lost")
    assert not old.named("leadership.own_session_ended")  # another's session: not ended
    assert old.named("leadership.stopping_calls") == []
    assert (
        await aio(conn.fetchval)("SELECT status FROM coordinator.runs WHERE id = $1", run_id)
        == "succeeded"
    )
    assert old.named("job.run", run=run_id, outcome="succeeded")


class _CuttableProxy:
    """A TCP relay to the database whose :meth:`cut` drops the client side of every
    connection and leaves the server's side open: the daemon's sessions end as in a
    network cut, while the server, hearing nothing, keeps them (as it would until its
    keepalive probes gave up) -- the lock session among them, holding the lock."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.clients: list[trio.SocketStream] = []
        self.kept: list[trio.SocketStream] = []  # server sides, left open by cut()

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._relay, listeners)

    async def _relay(self, client: trio.SocketStream) -> None:
        server = await trio.open_tcp_stream(*self.upstream)
        self.clients.append(client)
        self.kept.append(server)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, client, server)
            nursery.start_soon(self._pump, server, client)

    @staticmethod
    async def _pump(source: trio.SocketStream, sink: trio.SocketStream) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while data := await source.receive_some(65536):
                await sink.send_all(data)

    async def cut(self) -> None:
        clients, self.clients = self.clients, []
        for client in clients:
            await trio.aclose_forcefully(client)

    async def aclose(self) -> None:
        for stream in self.kept:
            await trio.aclose_forcefully(stream)


async def test_a_leader_cut_off_ends_its_own_lingering_session_and_leads_on(
    conn: asyncpg.Connection, database: str, nursery: trio.Nursery, start_daemon: Any
) -> None:
    """After a network cut the server keeps the leader's lock session until its probes
    give up (about a minute). The daemon, back within that minute, found the lock taken --
    by its own dead session -- and stepped down as if another daemon led (exit 1), and
    nobody led until the server let the session go. It now recognises its own session
    (pid and start) and ends it; another daemon's is never touched (the test above)."""
    url = urlsplit(database)
    if url.hostname is None or url.port is None:
        pytest.skip("the relay needs the database over TCP (the suite's own cluster is)")
    proxy = _CuttableProxy(url.hostname, url.port)
    port = await nursery.start(proxy.serve)
    try:
        await define(conn, "after")
        leader = await start_daemon(dsn=url._replace(netloc=f"postgres@127.0.0.1:{port}").geturl())
        old_pid = await _lock_holder_pid(conn)
        await proxy.cut()
        await leader.wait_event("leadership.regained", timeout=15)
        assert leader.named("leadership.own_session_ended")
        assert not leader.named("leadership.lost")
        assert await _lock_holder_pid(conn) not in (None, old_pid)
        gone = await aio(conn.fetchval)(
            "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", old_pid
        )
        assert gone
        run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'after')")
        await leader.wait_event("job.run", run=run_id, outcome="succeeded", timeout=15)
        assert await leader.stop() == 0
    finally:
        await proxy.aclose()


async def test_a_takeover_that_finds_the_worker_socket_served_exits_1_not_2(
    conn: asyncpg.Connection, database: str, start_daemon: Any
) -> None:
    """A same-host standby taking over from a leader cut off from the database but
    alive finds the worker socket still served by it: it refused with exit 2, which the
    shipped unit never restarts (the pair was a single daemon for good), blaming "a
    daemon of another database" (a tester's finding). Exit 1 now, the words fitting."""
    import socket as stdlib_socket

    holder = await _connect(database)
    standby: Any = None
    listener = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    try:
        await aio(holder.fetchval)("SELECT pg_advisory_lock($1, $2)", LOCK_CLASS, LOCK_OBJECT)
        standby = await start_daemon(wait_ready=False)
        await standby.wait_event("standby")
        executor = standby.daemon.executors["worker"]
        executor.socket_busy_grace = 0.5
        # The old leader still serves the socket.
        listener.bind(str(executor.socket_path))
        listener.listen()
    finally:
        await aio(holder.close)()  # its lock session ends: the standby takes over
    try:
        with trio.fail_after(20):
            await standby.done.wait()
    finally:
        listener.close()
    assert standby.status == 1
    [refused] = standby.named("startup.refused")
    assert "this database's last leader, cut off from it but alive?" in refused["error"]
