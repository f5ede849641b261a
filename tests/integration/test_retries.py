"""Attempts and retries against a real daemon and PostgreSQL (docs/design.md, "Retries").

A failed or timed-out run is retried while its job's attempts remain: a new run (trigger
``retry``, attempt + 1, linked to the run it retries) queued with a saved due time,
armed like any deadline: waiting for it costs no SQL, survives a restart, and passes
admission like any other work. Real commands and a real worker process (the raw wire
protocol, no SDK) say what may be retried.
"""

from __future__ import annotations

import json
import random
import sys
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import trio

from coordinator import client
from coordinator.core.admission import Ticket
from coordinator.db import aio
from coordinator.model import Outcome
from coordinator.spool import HeldResult
from coordinator.store import ConnectionPool, Store

from .conftest import StartDaemon, define

if TYPE_CHECKING:
    from pathlib import Path

    import asyncpg

    from coordinator.embedded import StatementLog

#: Retry delays are arithmetic on saved timestamps (microseconds, via float seconds).
EXACT = timedelta(milliseconds=1)


async def runs_of(conn: asyncpg.Connection, job_id: int) -> list[asyncpg.Record]:
    return await aio(conn.fetch)(
        "SELECT * FROM coordinator.runs WHERE job_id = $1 ORDER BY id", job_id
    )


def daemon_statements(log: StatementLog, db: str) -> list[str]:
    """What the daemon sent, each statement named by what it is."""
    kinds = []
    for statement in log.statements(app="coordinator", db=db):
        sql = statement.sql
        if "coordinator._claim" in sql:
            kinds.append("claim")
        elif "coordinator._settle" in sql:
            kinds.append("settle")
        elif "LEFT JOIN coordinator.runs r" in sql:
            kinds.append("refresh")
        else:
            kinds.append(" ".join(sql.split())[:60])
    return kinds


def failing_until(tmp_path: Path, good_attempt: int) -> list[str]:
    """A command that fails (exit 1) before its ``good_attempt``-th call, then succeeds;
    each call appends its attempt number to ``calls.txt``."""
    calls = tmp_path / "calls.txt"
    return [
        "sh",
        "-c",
        f'echo "$COORDINATOR_ATTEMPT" >> {calls}; [ "$COORDINATOR_ATTEMPT" -ge {good_attempt} ]',
    ]


async def trigger(conn: asyncpg.Connection, name: str) -> int:
    run_id: int = await aio(conn.fetchval)("SELECT coordinator.trigger('default', $1)", name)
    return run_id


# -- the timeline ------------------------------------------------------------------------


async def test_failing_twice_then_succeeding_retries_with_growing_delays_and_no_sql_between(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    sql_log: StatementLog,
    database_name: str,
    tmp_path: Path,
) -> None:
    job = await define(
        conn,
        "flaky",
        target={"kind": "exec", "argv": failing_until(tmp_path, 3)},
        retries=3,
        retry_backoff=timedelta(seconds=1),
    )
    harness = await start_daemon(jitter=random.Random(7).random)
    sql_log.mark()
    first = await trigger(conn, "flaky")
    await harness.wait_event("job.run", outcome="succeeded", timeout=30)

    runs = await runs_of(conn, job)
    assert [(r["attempt"], r["trigger"], r["status"]) for r in runs] == [
        (1, "manual", "failed"),
        (2, "retry", "failed"),
        (3, "retry", "succeeded"),
    ]  # one success, no fourth attempt
    assert runs[0]["id"] == first
    assert [r["retry_of"] for r in runs] == [None, runs[0]["id"], runs[1]["id"]]
    assert [r["category"] for r in runs] == ["unknown", "unknown", None]
    assert (tmp_path / "calls.txt").read_text().split() == ["1", "2", "3"]

    # Delays: 1 s, then 2 s, each less up to a quarter (the injected jitter, one draw per
    # settled call, in order), counted from the failed attempt's end.
    jitter = random.Random(7)
    first_delay = timedelta(seconds=1 * (1 - 0.25 * jitter.random()))
    second_delay = timedelta(seconds=2 * (1 - 0.25 * jitter.random()))
    assert abs(runs[1]["due_at"] - (runs[0]["finished_at"] + first_delay)) < EXACT
    assert abs(runs[2]["due_at"] - (runs[1]["finished_at"] + second_delay)) < EXACT
    assert second_delay > first_delay
    for run in runs[1:]:
        assert run["started_at"] >= run["due_at"]  # never before its saved time
    events = harness.named("job.run")
    assert [(e["attempt"], e.get("retry")) for e in events] == [
        (1, runs[1]["id"]),
        (2, runs[2]["id"]),
        (3, None),
    ]
    assert events[0]["retry_at"] == runs[1]["due_at"]

    # Two statements per attempt, and nothing at all while a retry waits: the retry
    # rides the failed attempt's settlement and its due time is a timer, not a poll.
    assert daemon_statements(sql_log, database_name) == ["claim", "settle"] * 3
    print("\nattempt  due (saved)      started          finished  (UTC)")
    for run in runs:
        due, started, finished = (
            run[k].strftime("%H:%M:%S.%f")[:-3] if run[k] else "-"
            for k in ("due_at", "started_at", "finished_at")
        )
        print(f"{run['attempt']:>7}  {due:<15}  {started:<15}  {finished}")


async def test_retries_exhausted_then_the_next_tick_runs_as_usual(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    job = await define(
        conn,
        "doomed",
        schedule_kind="interval",
        schedule="2s",
        target={"kind": "exec", "argv": ["sh", "-c", "exit 3"]},
        retries=2,
        retry_backoff=timedelta(milliseconds=200),
    )
    tick = datetime.now(UTC) - timedelta(seconds=1)
    await aio(conn.execute)("UPDATE coordinator.jobs SET next_run_at = $2 WHERE id = $1", job, tick)
    harness = await start_daemon()
    await harness.wait_event("job.run", count=4, timeout=30)

    runs = (await runs_of(conn, job))[:4]
    assert [(r["attempt"], r["trigger"]) for r in runs] == [
        (1, "schedule"),
        (2, "retry"),
        (3, "retry"),
        (1, "schedule"),
    ]
    # Exactly retries + 1 attempts served the first tick; the last one is marked.
    assert [r["scheduled_for"] for r in runs[:3]] == [tick] * 3
    assert [r["exhausted"] for r in runs] == [False, False, True, False]
    assert all(r["status"] == "failed" for r in runs[:3])
    # The job went on with its schedule: the next deadline counted from the last attempt.
    assert runs[3]["scheduled_for"] == runs[2]["finished_at"] + timedelta(seconds=2)
    last = harness.named("job.run", run=runs[2]["id"])[0]
    assert (last["exhausted"], last.get("retry")) == (True, None)

    # `runs list --status failed` shows the last attempt, marked.
    failed = await aio(client.list_runs)(conn, job="doomed", status="failed")
    marked = [r for r in failed if r.id == runs[2]["id"]]
    assert marked[0].exhausted
    assert marked[0].retry_of == runs[1]["id"]
    assert [r.id for r in await aio(client.run_chain)(conn, runs[1]["id"])] == [
        r["id"] for r in runs[:3]
    ]


async def test_restart_between_attempts_runs_the_retry_at_its_saved_time_once(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    sql_log: StatementLog,
    database_name: str,
    tmp_path: Path,
) -> None:
    backoff = timedelta(seconds=6)  # ample: the restart must come before the retry is due
    job = await define(
        conn,
        "phoenix",
        target={"kind": "exec", "argv": failing_until(tmp_path, 2)},
        retries=1,
        retry_backoff=backoff,
    )
    harness = await start_daemon(jitter=lambda: 0.0)
    first = await trigger(conn, "phoenix")
    await harness.wait_event("job.run", run=first)
    await harness.stop()

    failed, retry = await runs_of(conn, job)
    assert (retry["status"], retry["due_at"]) == ("queued", failed["finished_at"] + backoff)
    sql_log.mark()
    restarted = await start_daemon(jitter=lambda: 0.0)
    # The first refresh found the retry and armed its saved time: it did not run it at once.
    assert restarted.daemon.deadlines.get(job) == retry["due_at"].timestamp()
    await restarted.wait_event("job.run", run=retry["id"], timeout=30)

    runs = await runs_of(conn, job)
    assert [(r["attempt"], r["status"]) for r in runs] == [(1, "failed"), (2, "succeeded")]
    assert runs[1]["started_at"] >= retry["due_at"]
    assert (tmp_path / "calls.txt").read_text().split() == ["1", "2"]  # once
    sent = daemon_statements(sql_log, database_name)
    assert (sent.count("refresh"), sent.count("claim"), sent.count("settle")) == (1, 1, 1)


async def test_a_due_retry_waits_for_a_free_slot(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """Two slots, both held when the retry falls due: it waits for one, like any work."""
    release, fail_now = tmp_path / "release", tmp_path / "fail-now"
    wait_for = 'while [ ! -e "$0" ]; do sleep 0.02; done'
    script = f'[ "$COORDINATOR_ATTEMPT" -ge 2 ] && exit 0; {wait_for}; exit 1'
    flaky = await define(
        conn,
        "flaky",
        target={"kind": "exec", "argv": ["sh", "-c", script, str(fail_now)]},
        retries=1,
        retry_backoff=timedelta(milliseconds=300),
    )
    for name in ("blocker", "late"):
        await define(
            conn, name, target={"kind": "exec", "argv": ["sh", "-c", wait_for, str(release)]}
        )
    harness = await start_daemon(concurrency=2, jitter=lambda: 0.0)
    first = await trigger(conn, "flaky")
    blocker = await trigger(conn, "blocker")
    await harness.wait_event("run.started", run=blocker)
    late = await trigger(conn, "late")  # no slot: waits in admission
    fail_now.touch()  # the first attempt fails; its slot goes to `late` at once
    await harness.wait_event("job.run", run=first)
    await harness.wait_event("run.started", run=late)
    retry = (await runs_of(conn, flaky))[1]
    while datetime.now(UTC) < retry["due_at"] + timedelta(milliseconds=300):
        await trio.sleep(0.05)
    # Due, but both slots are held: it is offered, not started.
    assert harness.named("run.started", run=retry["id"]) == []
    release.touch()
    # Settlements go in batches: the retry's may be saved before the others'. Wait for all.
    for run in (retry["id"], blocker, late):
        await harness.wait_event("job.run", run=run)
    done = {r["id"]: r for r in await aio(conn.fetch)("SELECT * FROM coordinator.runs")}
    assert done[retry["id"]]["status"] == "succeeded"
    assert done[retry["id"]]["started_at"] >= min(
        done[blocker]["finished_at"], done[late]["finished_at"]
    )


# -- what may be retried -----------------------------------------------------------------


async def test_command_exit_status_75_asks_for_a_retry_and_others_follow_the_policy(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    fast = {"retries": 1, "retry_backoff": timedelta(milliseconds=100)}
    jobs = {
        # exit 75 (EX_TEMPFAIL) once, then success
        "tempfail": ('[ "$COORDINATOR_ATTEMPT" -ge 2 ] || exit 75', fast),
        # any other status: the policy (retried while attempts remain), category unknown
        "plain": ("exit 3", fast),
        # killed by a signal: it crashed
        "killed": ("kill -KILL $$", fast),
        # no retries: exit 75 cannot make attempts the job does not have
        "alone": ("exit 75", {}),
    }
    ids = {}
    for name, (script, policy) in jobs.items():
        ids[name] = await define(
            conn, name, target={"kind": "exec", "argv": ["sh", "-c", script]}, **policy
        )
    harness = await start_daemon(jitter=lambda: 0.0)
    for name in jobs:
        await trigger(conn, name)
    await harness.wait_event("job.run", count=7, timeout=30)  # 2 + 2 + 2 + 1
    await harness.wait_event("job.run", job="default/alone")

    def shape(rows: list[asyncpg.Record]) -> list[tuple[Any, ...]]:
        return [(r["status"], r["category"], r["retryable"], r["exhausted"]) for r in rows]

    assert shape(await runs_of(conn, ids["tempfail"])) == [
        ("failed", "external-dependency", True, False),
        ("succeeded", None, None, False),
    ]
    assert shape(await runs_of(conn, ids["plain"])) == [
        ("failed", "unknown", None, False),
        ("failed", "unknown", None, True),
    ]
    assert shape(await runs_of(conn, ids["killed"])) == [
        ("failed", "provider-failure", None, False),
        ("failed", "provider-failure", None, True),
    ]
    assert shape(await runs_of(conn, ids["alone"])) == [
        ("failed", "external-dependency", True, False)
    ]
    # `runs list --category` finds them by it.
    by_category = await aio(client.list_runs)(conn, category="provider-failure")
    assert {r.job for r in by_category} == {"killed"}


RAW_WORKER = r"""
import json, socket, sys

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
stream = sock.makefile("rwb", buffering=0)

def send(message):
    stream.write(json.dumps({"v": 1, **message}).encode() + b"\n")

# What each job's failing call says (a second attempt of any job succeeds).
SAYS = {
    "strict": {"error": "row 3: no such customer", "retryable": False,
               "category": "invalid-input"},
    "policy": {"error": "row 3: no such customer", "category": "invalid-input"},
    "forced": {"error": "the index was rebuilding", "retryable": True,
               "category": "invalid-input"},
    "busy": {"error": "the bank's API said 503", "category": "external-dependency"},
    "novel": {"error": "over quota", "category": "quota-exceeded"},
}
send({"type": "hello", "worker": "raw-1", "types": ["raw"], "capacity": 4})
for line in stream:
    message = json.loads(line)
    if message["type"] == "call":
        if message["attempt"] >= 2:
            send({"type": "result", "run": message["run"], "ok": True})
        else:
            send({"type": "result", "run": message["run"], "ok": False,
                  **SAYS[message["job"]]})
    elif message["type"] == "error":
        sys.exit(message["message"])
"""


async def test_a_worker_result_says_what_may_be_retried(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    names = ("strict", "policy", "forced", "busy", "novel")
    ids = {
        name: await define(
            conn,
            name,
            target={"kind": "worker", "type": "raw"},
            retries=2,
            retry_backoff=timedelta(milliseconds=100),
        )
        for name in names
    }
    harness = await start_daemon(jitter=lambda: 0.0)
    script = tmp_path / "raw_worker.py"
    script.write_text(RAW_WORKER)
    socket_path = harness.daemon.executors["worker"].socket_path  # type: ignore[attr-defined]
    process = await trio.lowlevel.open_process([sys.executable, str(script), str(socket_path)])
    try:
        await harness.wait_event("worker.connected")
        for name in names:
            await trigger(conn, name)
        await harness.wait_event("job.run", count=len(names) + 3, timeout=30)
        await harness.wait_event("job.run", outcome="succeeded", count=3)
    finally:
        process.kill()
        await process.wait()

    def shape(rows: list[asyncpg.Record]) -> list[tuple[Any, ...]]:
        return [(r["status"], r["category"], r["retryable"]) for r in rows]

    # retryable: false stops retries whatever the job allows.
    assert shape(await runs_of(conn, ids["strict"])) == [("failed", "invalid-input", False)]
    # No word on it: the policy does not retry invalid input (the same input fails again)...
    assert shape(await runs_of(conn, ids["policy"])) == [("failed", "invalid-input", None)]
    # ...unless the worker says it may help; other categories are retried.
    assert shape(await runs_of(conn, ids["forced"])) == [
        ("failed", "invalid-input", True),
        ("succeeded", None, None),
    ]
    assert shape(await runs_of(conn, ids["busy"])) == [
        ("failed", "external-dependency", None),
        ("succeeded", None, None),
    ]
    # A category this daemon does not know is kept in extra and recorded as unknown.
    novel = await runs_of(conn, ids["novel"])
    assert shape(novel) == [("failed", "unknown", None), ("succeeded", None, None)]
    assert json.loads(novel[0]["extra"])["category_reported"] == "quota-exceeded"
    assert novel[0]["error_message"] == "over quota"


# -- settlement paths ----------------------------------------------------------------------


async def test_a_settlement_sent_again_returns_the_retry_it_queued(
    start_daemon: StartDaemon, conn: asyncpg.Connection
) -> None:
    """A commit whose acknowledgement was lost is re-sent: the second answer is
    ``already`` and still names the waiting retry, so the daemon arms it."""
    job = await define(conn, "twice", retries=1, retry_backoff=timedelta(hours=1))
    harness = await start_daemon()
    await harness.stop()  # borrow its DSN only
    pool = ConnectionPool(harness.daemon.store.pool.dsn)
    store = Store(pool=pool, instance="test")
    run_id = await trigger(conn, "twice")
    try:
        granted = await store.claim(
            Ticket(job_id=job, priority="background", due=0.0, run_id=run_id),
            workers=[],
            now=datetime.now(UTC),
        )
        assert granted.claim is not None
        now = datetime.now(UTC)
        held = HeldResult(
            run_id=run_id,
            job_id=job,
            job_key="default/twice",
            schedule_version=1,
            next_run_at=None,
            outcome=Outcome(
                status="failed",
                started_at=now,
                finished_at=now,
                error_cause="handler",
                error_message="exit status 1",
            ),
            retry_jitter=0.5,
        )
        first = await store.settle(held)
        again = await store.settle(held)
    finally:
        await pool.close()
    assert (first.outcome, again.outcome) == ("saved", "already")
    assert first.retry_run_id is not None
    assert (again.retry_run_id, again.retry_due_at) == (first.retry_run_id, first.retry_due_at)
    assert first.retry_due_at == now + timedelta(minutes=52, seconds=30)  # 1 h less 1/8
    assert len(await runs_of(conn, job)) == 2  # one retry, whatever the re-sends


REFUSE_SETTLEMENTS = """
CREATE TABLE public.faults (active boolean NOT NULL);
INSERT INTO public.faults VALUES (true);
CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT active FROM public.faults) AND NEW.status = 'failed' THEN
        RAISE EXCEPTION 'injected settlement fault';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse BEFORE UPDATE ON coordinator.runs
    FOR EACH ROW EXECUTE FUNCTION public.refuse();
"""


async def test_a_held_failure_queues_its_retry_once_saved(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    await aio(conn.execute)(REFUSE_SETTLEMENTS)
    job = await define(
        conn,
        "held",
        target={"kind": "exec", "argv": failing_until(tmp_path, 2)},
        retries=1,
        retry_backoff=timedelta(milliseconds=200),
    )
    harness = await start_daemon(retry_cap=0.5)
    first = await trigger(conn, "held")
    await harness.wait_event("settle.retained", run=first)
    assert len(await runs_of(conn, job)) == 1  # nothing queued while the result is held
    await aio(conn.execute)("UPDATE public.faults SET active = false")
    await harness.wait_event("settle.saved", run=first)
    retry = (await runs_of(conn, job))[1]
    await harness.wait_event("job.run", run=retry["id"])  # armed from the saved result
    assert [r["status"] for r in await runs_of(conn, job)] == ["failed", "succeeded"]


async def test_cancelling_a_waiting_retry_ends_the_chain_without_rerunning_its_tick(
    start_daemon: StartDaemon, conn: asyncpg.Connection
) -> None:
    job = await define(
        conn,
        "hourly",
        schedule_kind="interval",
        schedule="1h",
        target={"kind": "exec", "argv": ["false"]},
        retries=3,
        retry_backoff=timedelta(hours=1),
    )
    tick = datetime.now(UTC) - timedelta(seconds=1)
    await aio(conn.execute)("UPDATE coordinator.jobs SET next_run_at = $2 WHERE id = $1", job, tick)
    harness = await start_daemon(refresh_spacing=0.1)
    [failed] = await harness.wait_event("job.run", job="default/hourly")
    assert harness.daemon.deadlines.get(job) == failed["retry_at"].timestamp()
    began = datetime.now(UTC)
    await aio(client.cancel_run)(conn, failed["retry"])
    with trio.fail_after(15):
        while harness.daemon.deadlines.get(job) in (None, failed["retry_at"].timestamp()):
            await harness.wait_event("refresh", count=len(harness.named("refresh")) + 1)
    row = await aio(conn.fetchrow)("SELECT next_run_at FROM coordinator.jobs WHERE id = $1", job)
    # From now, not the old tick. (The cancel cleared the deadline: the daemon counts
    # the next one from that change, to its second.)
    assert row["next_run_at"] >= began.replace(microsecond=0) + timedelta(hours=1)
    assert harness.daemon.deadlines.get(job) == row["next_run_at"].timestamp()
    runs = await runs_of(conn, job)
    assert [(r["trigger"], r["status"], r["category"]) for r in runs] == [
        ("schedule", "failed", "unknown"),
        ("retry", "cancelled", "cancellation"),
    ]


async def test_removing_a_job_removes_its_chain_of_attempts(conn: asyncpg.Connection) -> None:
    job = await define(conn, "chained")
    first = await aio(conn.fetchval)(
        "INSERT INTO coordinator.runs (job_id, trigger, status) VALUES ($1, 'manual', 'failed') "
        "RETURNING id",
        job,
    )
    await aio(conn.execute)(
        "INSERT INTO coordinator.runs (job_id, trigger, status, attempt, retry_of, due_at) "
        "VALUES ($1, 'retry', 'queued', 2, $2, now() + interval '1 hour')",
        job,
        first,
    )
    await aio(conn.execute)("SELECT coordinator.remove('default', 'chained')")
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.runs") == 0


async def test_a_retry_moved_by_an_application_runs_at_its_new_saved_time(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """Plain SQL moves a waiting retry's due time: the update's dispatch wake is only a
    hint; the claim refuses a due time still ahead (``not_due``) and the job is read again
    and armed at the saved time; moved to now, it runs."""
    job = await define(
        conn,
        "moved",
        target={"kind": "exec", "argv": failing_until(tmp_path, 2)},
        retries=1,
        retry_backoff=timedelta(hours=1),
    )
    harness = await start_daemon(refresh_spacing=0.1)
    first = await trigger(conn, "moved")
    [failed] = await harness.wait_event("job.run", run=first)
    later = await aio(conn.fetchval)(
        "UPDATE coordinator.runs SET due_at = now() + interval '2 hours' WHERE id = $1 "
        "RETURNING due_at",
        failed["retry"],
    )
    await harness.wait_event("claim.rejected", run=failed["retry"], reason="not_due")
    with trio.fail_after(15):
        while harness.daemon.deadlines.get(job) != later.timestamp():
            await harness.wait_event("refresh", count=len(harness.named("refresh")) + 1)
    sooner = await aio(conn.fetchval)(
        "UPDATE coordinator.runs SET due_at = now() WHERE id = $1 RETURNING due_at",
        failed["retry"],
    )
    await harness.wait_event("job.run", run=failed["retry"], timeout=30)
    retry = (await runs_of(conn, job))[1]
    assert (retry["status"], retry["due_at"]) == ("succeeded", sooner)
    assert retry["started_at"] >= sooner
