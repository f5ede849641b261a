"""What a job does with time it did not run in, against a real daemon and PostgreSQL
(docs/design.md, "Misfires and overruns"; README, "Jobs").

* misfire: an overdue deadline runs once (``run-once``, the default) or, with ``skip``,
  is skipped when it is later than the grace, logged, and the next deadline computed
  from now;
* overruns: ticks that fall while a scheduled run is still going are skipped, never
  queued, and logged with how many;
* un-pausing forgets the deadline saved before the pause, whoever un-pauses (define_job,
  sync, plain SQL), and re-defining keeps a job's paused state unless told otherwise.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
import attrs
import pytest
import trio

from coordinator import client
from coordinator.db import aio
from coordinator.model import Schedule, Target

from .conftest import StartDaemon, define

if TYPE_CHECKING:
    from pathlib import Path

EXEC = {"kind": "exec", "argv": ["true"]}


async def runs_of(conn: asyncpg.Connection, job_id: int) -> list[asyncpg.Record]:
    return await aio(conn.fetch)(
        "SELECT * FROM coordinator.runs WHERE job_id = $1 ORDER BY id", job_id
    )


async def job_row(conn: asyncpg.Connection, job_id: int) -> asyncpg.Record:
    row: asyncpg.Record = await aio(conn.fetchrow)(
        "SELECT * FROM coordinator.jobs WHERE id = $1", job_id
    )
    return row


async def set_deadline(conn: asyncpg.Connection, job_id: int, at: datetime) -> None:
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET next_run_at = $2 WHERE id = $1", job_id, at
    )


# -- misfires ------------------------------------------------------------------------------


async def test_misfire_skip_runs_within_the_grace_skips_beyond_it_default_runs_once(
    start_daemon: StartDaemon, conn: asyncpg.Connection
) -> None:
    skip = {"misfire": "skip", "misfire_grace": timedelta(hours=1)}
    within = await define(conn, "within", schedule_kind="interval", schedule="1h", **skip)
    beyond = await define(conn, "beyond", schedule_kind="interval", schedule="1h", **skip)
    default = await define(conn, "default", schedule_kind="interval", schedule="1h")
    began = datetime.now(UTC)
    await set_deadline(conn, within, began - timedelta(minutes=30))
    stale = began - timedelta(hours=2)
    await set_deadline(conn, beyond, stale)
    await set_deadline(conn, default, began - timedelta(hours=5))

    harness = await start_daemon()
    await harness.wait_event("job.run", job="default/within")
    await harness.wait_event("job.run", job="default/default")  # unchanged: runs once
    [skipped] = await harness.wait_event("job.misfire_skipped")

    assert skipped["job"] == "default/beyond"
    assert skipped["deadline"] == stale
    assert skipped["late_s"] >= 7200  # how late it was when the daemon came to it
    assert await runs_of(conn, beyond) == []
    # The next deadline is computed from now (the daemon's now, at the claim).
    saved = (await job_row(conn, beyond))["next_run_at"]
    assert saved == skipped["next"]
    assert saved >= began + timedelta(hours=1)
    assert harness.daemon.deadlines.get(beyond) == saved.timestamp()
    assert [r["trigger"] for r in await runs_of(conn, within)] == ["schedule"]
    assert len(await runs_of(conn, default)) == 1


async def test_misfire_and_retry_policies_are_checked_by_the_database(
    conn: asyncpg.Connection,
) -> None:
    for kw, field in (
        ({"misfire": "skip"}, "misfire_grace"),
        ({"misfire_grace": timedelta(minutes=5)}, "misfire_grace"),
        ({"misfire": "later", "misfire_grace": timedelta(minutes=5)}, "misfire"),
        ({"misfire": "skip", "misfire_grace": timedelta(milliseconds=999)}, "misfire_grace"),
        ({"retries": 101}, "retries"),
        ({"retry_backoff": timedelta(0)}, "retry_backoff"),
        ({"retry_max_delay": timedelta(days=3651)}, "retry_max_delay"),
    ):
        with pytest.raises(asyncpg.InvalidParameterValueError) as refused:
            await define(conn, "bad", **kw)
        assert refused.value.column_name == field, kw
        assert str(refused.value).startswith(f"{field}: ")
    # A plain INSERT meets the table's checks.
    with pytest.raises(asyncpg.CheckViolationError) as violated:
        await aio(conn.execute)(
            "INSERT INTO coordinator.jobs (name, schedule_kind, target, misfire) "
            "VALUES ('bad', 'manual', '{}', 'skip')"
        )
    assert violated.value.constraint_name == "jobs_misfire_grace_check"
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.jobs") == 0


# -- overruns ------------------------------------------------------------------------------


@attrs.define
class FastClock:
    """Wall time that runs 60 times faster than trio's clock: a minute of a cron job's
    schedule passes in a second, so a run can overrun ticks without the test waiting
    minutes. Injected like any clock (STYLE.md, "Two clocks")."""

    origin: datetime
    start: float = attrs.field(factory=trio.current_time)

    def now(self) -> datetime:
        return self.origin + timedelta(seconds=60 * (trio.current_time() - self.start))


async def test_a_scheduled_run_overrunning_ticks_logs_them_and_nothing_queues(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    calls = tmp_path / "calls"
    job = await define(
        conn,
        "minutely",
        schedule_kind="cron",
        schedule="* * * * *",
        # 2.5 s of trio time: 150 s of the job's wall time, so at least two ticks fall.
        target={"kind": "exec", "argv": ["sh", "-c", f"echo x >> {calls}; sleep 2.5"]},
    )
    clock = FastClock(origin=datetime.now(UTC))
    tick = clock.origin.replace(second=0, microsecond=0)  # overdue now: it runs at once
    await set_deadline(conn, job, tick)
    harness = await start_daemon(clock=clock)
    [finished] = await harness.wait_event("job.run", job="default/minutely", timeout=30)
    [skipped] = await harness.wait_event("job.tick_skipped")

    runs = await runs_of(conn, job)
    [run] = [r for r in runs if r["scheduled_for"] == tick]
    assert run["trigger"] == "schedule"
    started, ended = run["started_at"], run["finished_at"]
    # The minute boundaries in (started, ended]: what the run made the job skip.
    first_minute = math.floor(started.timestamp() / 60) + 1
    last_minute = math.floor(ended.timestamp() / 60)
    assert last_minute - first_minute + 1 >= 2
    assert skipped["run"] == run["id"] == finished["run"]
    assert skipped["missed"] == last_minute - first_minute + 1
    assert skipped["first"] == datetime.fromtimestamp(first_minute * 60, UTC)
    assert skipped["last"] == datetime.fromtimestamp(last_minute * 60, UTC)
    # Nothing queued up, no catch-up: the next run is for the first tick after the run's
    # end (one real second later on this clock, so a slow machine may see it already).
    next_tick = datetime.fromtimestamp((last_minute + 1) * 60, UTC)
    assert [r["scheduled_for"] for r in runs if r is not run] in ([], [next_tick])
    if len(runs) == 1:
        # That next deadline is saved and armed.
        saved = (await job_row(conn, job))["next_run_at"]
        assert saved == next_tick
        assert harness.daemon.deadlines.get(job) == saved.timestamp()
    # (The next run, if claimed already, may not have spawned its command yet.)
    assert calls.read_text().count("x") in ({1} if len(runs) == 1 else {1, 2})


# -- un-pausing ----------------------------------------------------------------------------


async def _sync(conn: asyncpg.Connection, entries: list[dict[str, Any]]) -> None:
    await aio(client.sync)(conn, "ns", entries)


def _entry(name: str) -> dict[str, Any]:
    return client.job_entry(
        name=name,
        schedule=Schedule(kind="interval", expression="1h"),
        target=Target(kind="exec", argv=("true",)),
    )


async def test_unpausing_by_define_sync_or_plain_sql_forgets_the_stale_deadline(
    start_daemon: StartDaemon, conn: asyncpg.Connection
) -> None:
    by_define = await define(conn, "by-define", schedule_kind="interval", schedule="1h")
    by_sql = await define(conn, "by-sql", schedule_kind="cron", schedule="*/5 * * * *")
    once_at = datetime.now(UTC) - timedelta(minutes=10)
    one_shot = await define(conn, "one-shot", schedule_kind="once", schedule=once_at.isoformat())
    await _sync(conn, [_entry("by-sync")])
    by_sync = await aio(conn.fetchval)("SELECT id FROM coordinator.jobs WHERE name = 'by-sync'")
    await aio(conn.execute)("SELECT coordinator.pause('default', 'by-define')")
    await aio(conn.execute)("SELECT coordinator.pause('default', 'by-sql')")
    await aio(conn.execute)("SELECT coordinator.pause('default', 'one-shot')")
    await _sync(conn, [])  # by-sync is no longer declared: sync pauses it
    stale = datetime.now(UTC) - timedelta(hours=3)
    for job in (by_define, by_sql, by_sync):
        await set_deadline(conn, job, stale)  # saved before (or during) the pause

    harness = await start_daemon(refresh_spacing=0.1)
    began = datetime.now(UTC)
    await define(conn, "by-define", schedule_kind="interval", schedule="1h", paused=False)
    await _sync(conn, [_entry("by-sync")])  # listed again: resumed
    await aio(conn.execute)("UPDATE coordinator.jobs SET paused = false WHERE name = 'by-sql'")
    await aio(conn.execute)("UPDATE coordinator.jobs SET paused = false WHERE name = 'one-shot'")

    await harness.wait_event("job.run", job="default/one-shot")  # its instant is owed
    with trio.fail_after(15):
        while not all(job in harness.daemon.deadlines for job in (by_define, by_sql, by_sync)):
            await harness.wait_event("refresh", count=len(harness.named("refresh")) + 1)
    for job in (by_define, by_sql, by_sync):
        row = await job_row(conn, job)
        assert not row["paused"]
        assert row["next_run_at"] > began  # computed afresh, not the stale one
        assert harness.daemon.deadlines.get(job) == row["next_run_at"].timestamp()
        assert await runs_of(conn, job) == []
    assert [r["scheduled_for"] for r in await runs_of(conn, one_shot)] == [
        datetime.fromisoformat(once_at.isoformat())
    ]


async def test_redefining_keeps_a_pause_unless_the_definition_says_otherwise(
    conn: asyncpg.Connection,
) -> None:
    job = await define(conn, "kept", schedule_kind="interval", schedule="1h")
    stale = datetime.now(UTC) - timedelta(hours=3)
    await set_deadline(conn, job, stale)
    await aio(conn.execute)("SELECT coordinator.pause('default', 'kept')")
    # Re-defined (a deploy), nothing said about pausing: still paused, deadline untouched.
    await define(conn, "kept", schedule_kind="interval", schedule="1h", timeout=timedelta(1))
    row = await job_row(conn, job)
    assert (row["paused"], row["next_run_at"], row["timeout"]) == (True, stale, timedelta(1))

    # A manifest that lists an operator-paused job without `paused` keeps the pause...
    await _sync(conn, [_entry("ops")])
    await aio(conn.execute)("SELECT coordinator.pause('ns', 'ops')")
    await _sync(conn, [_entry("ops")])
    assert (await aio(client.get_job)(conn, "ops", namespace="ns")).paused
    # ...and so does an operator's pause of a job sync had paused for being missing.
    await _sync(conn, [])
    await aio(conn.execute)("SELECT coordinator.pause('ns', 'ops')")
    await _sync(conn, [_entry("ops")])
    assert (await aio(client.get_job)(conn, "ops", namespace="ns")).paused
    # `paused = false` in the declaration resumes it.
    await _sync(conn, [{**_entry("ops"), "paused": False}])
    assert not (await aio(client.get_job)(conn, "ops", namespace="ns")).paused


async def test_sync_carries_the_retry_and_misfire_policies(conn: asyncpg.Connection) -> None:
    entry = client.job_entry(
        name="policies",
        schedule=Schedule(kind="cron", expression="0 3 * * *"),
        target=Target(kind="exec", argv=("true",)),
        retries=4,
        retry_backoff=timedelta(seconds=10),
        retry_max_delay=timedelta(minutes=10),
        misfire="skip",
        misfire_grace=timedelta(minutes=5),
    )
    await _sync(conn, [entry])
    job = await aio(client.get_job)(conn, "policies", namespace="ns")
    assert (job.retries, job.retry_backoff, job.retry_max_delay) == (
        4,
        timedelta(seconds=10),
        timedelta(minutes=10),
    )
    assert (job.misfire, job.misfire_grace) == ("skip", timedelta(minutes=5))
    assert json.loads(json.dumps(job.to_json()))["misfire_grace"] == 300.0
    # Absent from the next declaration: back to the defaults, like any field.
    await _sync(conn, [_entry("policies")])
    job = await aio(client.get_job)(conn, "policies", namespace="ns")
    assert (job.retries, job.misfire, job.misfire_grace) == (0, "run-once", None)
