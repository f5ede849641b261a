"""The Python client against a real PostgreSQL (asyncio coroutines, called from trio)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
import trio

from coordinator import client
from coordinator.db import aio, transaction
from coordinator.errors import (
    Conflict,
    DatabaseError,
    DatabaseUnavailable,
    InvalidInput,
    InvalidSchedule,
    JobNotFound,
    RunNotFound,
)
from coordinator.manifest import ManifestRejected, parse
from coordinator.model import Schedule, Target

CMD = Target(kind="exec", argv=("true",))
WORKER = Target(kind="worker", worker_type="t")
MANUAL = Schedule(kind="manual")


async def _define(conn: asyncpg.Connection, name: str, **kw: Any) -> int:
    kw.setdefault("schedule", MANUAL)
    kw.setdefault("target", CMD)
    return await aio(client.define_job)(conn, name=name, **kw)


async def _insert_run(conn: asyncpg.Connection, job_id: int, status: str, **cols: Any) -> int:
    names = ", ".join(["job_id", "trigger", "status", *cols])
    values = ", ".join(f"${i + 1}" for i in range(3 + len(cols)))
    return await aio(conn.fetchval)(
        f"INSERT INTO coordinator.runs ({names}) VALUES ({values}) RETURNING id",
        job_id,
        "schedule",
        status,
        *cols.values(),
    )


# --------------------------------------------------------------------------- define


async def test_define_and_show(conn: asyncpg.Connection) -> None:
    job_id = await _define(
        conn,
        "backup",
        schedule=Schedule(kind="cron", expression=" 0  3 * * * ", timezone="Europe/Berlin"),
        target=Target(kind="exec", argv=("backup.sh", "--full"), env={"A": "1"}, cwd="/srv"),
        namespace="ops",
        params={"keep": 7},
        timeout=timedelta(minutes=15),
        priority="interactive",
        idempotent=True,
    )
    job = await aio(client.get_job)(conn, "backup", namespace="ops")
    assert job.id == job_id
    assert job.key == "ops/backup"
    assert (job.schedule_kind, job.schedule, job.timezone) == ("cron", "0 3 * * *", "Europe/Berlin")
    assert job.target == {
        "kind": "exec",
        "argv": ["backup.sh", "--full"],
        "env": {"A": "1"},
        "cwd": "/srv",
    }
    assert job.params == {"keep": 7}
    assert job.timeout == timedelta(minutes=15)
    assert (job.priority, job.idempotent, job.paused) == ("interactive", True, False)
    assert job.invalid_reason is None
    assert job.last_status is None
    assert job.blocked_by is None
    assert job.state == "active"

    data = job.to_json()
    assert data["timeout"] == 900.0
    assert data["created_at"] == job.created_at.isoformat()
    json.dumps(data)


async def test_define_normalises_interval_and_instant(conn: asyncpg.Connection) -> None:
    await _define(conn, "i", schedule=Schedule(kind="interval", expression="90s"))
    await _define(conn, "o", schedule=Schedule(kind="once", expression="2030-01-01T01:00:00+01:00"))
    jobs = {j.name: j for j in await aio(client.list_jobs)(conn)}
    assert jobs["i"].schedule == "1m30s"
    assert jobs["o"].schedule == "2030-01-01T00:00:00+00:00"
    assert jobs["o"].next_run_at is not None
    assert jobs["o"].next_run_at.isoformat() == "2030-01-01T00:00:00+00:00"


@pytest.mark.parametrize(
    ("schedule", "field"),
    [
        (Schedule(kind="cron", expression="0 25 * * *"), "cron"),
        (Schedule(kind="cron", expression="@daily", timezone="Mars/Base"), "timezone"),
        (Schedule(kind="interval", expression="5 parsecs"), "every"),
        (Schedule(kind="once", expression="2030-01-01"), "at"),
    ],
)
async def test_define_rejects_invalid_schedule(
    conn: asyncpg.Connection, schedule: Schedule, field: str
) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        await _define(conn, "bad", schedule=schedule)
    assert caught.value.field == field
    assert await aio(client.list_jobs)(conn) == []


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"name": ""}, "name"),
        ({"priority": "urgent"}, "priority"),
        ({"timeout": timedelta(0)}, "timeout"),
        ({"params": {"when": object()}}, "params"),
        ({"target": Target(kind="exec")}, "target"),
        ({"target": Target(kind="worker")}, "target"),
    ],
)
async def test_define_rejects_invalid_fields(
    conn: asyncpg.Connection, kw: dict[str, Any], field: str
) -> None:
    name = kw.pop("name", "j")
    with pytest.raises(InvalidInput) as caught:
        await _define(conn, name, **kw)
    assert caught.value.field == field


async def test_a_command_jobs_params_must_fit_one_environment_variable(
    conn: asyncpg.Connection,
) -> None:
    """A command gets its params as COORDINATOR_PARAMS, one environment string of at
    most 128 KiB: bigger ones were stored, and every run then failed "Argument list too
    long: 'true'". A worker job's params travel on its socket: no such limit."""
    big = {"blob": "y" * 200_000}
    with pytest.raises(InvalidInput) as caught:
        await _define(conn, "bigparams", params=big)
    assert caught.value.field == "params"
    assert "200,012 bytes as JSON" in str(caught.value)
    assert "COORDINATOR_PARAMS" in str(caught.value)
    assert "128 KiB" in str(caught.value)
    assert await _define(conn, "fits", params={"blob": "y" * 130_000}) > 0
    # Non-ASCII text counts as the UTF-8 the command gets, not as \\uXXXX escapes
    # (50 KB of "é" was refused as 150,009 bytes).
    assert await _define(conn, "accents", params={"blob": "é" * 25_000}) > 0
    assert (
        await _define(conn, "worker", params=big, target=Target(kind="worker", worker_type="t")) > 0
    )


async def test_define_with_invalid_reason_stores_inert(conn: asyncpg.Connection) -> None:
    await _define(
        conn,
        "inert",
        schedule=Schedule(kind="cron", expression="not cron"),
        invalid_reason="cron: not cron",
    )
    job = await aio(client.get_job)(conn, "inert")
    assert (job.schedule, job.invalid_reason, job.state) == (
        "not cron",
        "cron: not cron",
        "invalid",
    )


async def test_redefine_replaces_and_bumps_version(conn: asyncpg.Connection) -> None:
    first = await _define(conn, "c", schedule=Schedule(kind="cron", expression="0 * * * *"))
    await _define(conn, "c", schedule=Schedule(kind="cron", expression="0 * * * *"), paused=True)
    job = await aio(client.get_job)(conn, "c")
    assert (job.id, job.schedule_version, job.paused) == (first, 1, True)
    # Re-defining keeps the job's paused state unless the definition says otherwise.
    await _define(conn, "c", schedule=Schedule(kind="cron", expression="*/5 * * * *"))
    job = await aio(client.get_job)(conn, "c")
    assert (job.schedule_version, job.paused) == (2, True)
    await _define(conn, "c", schedule=Schedule(kind="cron", expression="*/5 * * * *"), paused=False)
    job = await aio(client.get_job)(conn, "c")
    assert (job.schedule_version, job.paused) == (2, False)


async def test_define_in_rolled_back_transaction_leaves_nothing(conn: asyncpg.Connection) -> None:

    async def changes_its_mind() -> None:
        async with transaction(conn):
            await _define(conn, "gone")
            raise RuntimeError("the application changed its mind")

    with pytest.raises(RuntimeError):
        await changes_its_mind()
    assert await aio(client.list_jobs)(conn) == []


async def test_works_with_an_application_jsonb_codec(conn: asyncpg.Connection) -> None:
    await aio(conn.set_type_codec)(
        "jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
    )
    await _define(conn, "codec", params={"a": [1, 2]})
    run_id = await aio(client.trigger)(conn, "codec", args={"force": True})
    assert (await aio(client.get_job)(conn, "codec")).params == {"a": [1, 2]}
    assert (await aio(client.get_run)(conn, run_id)).args == {"force": True}


# --------------------------------------------------------------------------- lifecycle


async def test_trigger_pause_resume_remove(conn: asyncpg.Connection) -> None:
    await _define(conn, "m")
    run_id = await aio(client.trigger)(conn, "m", args={"force": True})
    assert await aio(client.trigger)(conn, "m") == run_id
    job = await aio(client.get_job)(conn, "m")
    assert (job.last_run, job.last_status, job.outstanding_run) == (run_id, "queued", run_id)
    assert job.blocked_by is None

    await aio(client.pause)(conn, "m")
    assert (await aio(client.get_job)(conn, "m")).paused is True
    await aio(client.pause)(conn, "m")  # already paused: a no-op
    await aio(client.resume)(conn, "m")
    assert (await aio(client.get_job)(conn, "m")).paused is False

    await aio(client.remove)(conn, "m")
    assert await aio(client.list_jobs)(conn) == []
    with pytest.raises(RunNotFound):
        await aio(client.get_run)(conn, run_id)


async def test_trigger_answer_says_whose_run_it_is_inside_a_callers_transaction_too(
    conn: asyncpg.Connection,
) -> None:
    """Inside an application's transaction the call's savepoint gives the run a
    subtransaction's id: compared with the top-level id, a run just inserted was
    answered ``created=False`` (a tester's report)."""
    await _define(conn, "tx")
    async with transaction(conn):
        made = await aio(client.trigger_answer)(conn, "tx")
        assert (made.changed, made.created, made.status) == (True, True, "queued")
    again = await aio(client.trigger_answer)(conn, "tx")
    assert again.run_id == made.run_id
    assert (again.changed, again.created) == (False, False)
    # Outside one, too; and a paused run resumed is changed, not created.
    await aio(conn.execute)(
        "UPDATE coordinator.runs SET status = 'paused' WHERE id = $1", made.run_id
    )
    async with transaction(conn), transaction(conn):  # (a savepoint of the caller's own)
        resumed = await aio(client.trigger_answer)(conn, "tx")
    assert (resumed.run_id, resumed.changed, resumed.created) == (made.run_id, True, False)
    assert resumed.resumed


async def test_trigger_answer_in_a_long_transaction_on_a_busy_cluster(
    conn: asyncpg.Connection, database: str
) -> None:
    """The savepoint's id comes after the transaction's own by every id the cluster used
    meanwhile: with 1M between them the answer was "transaction ID ... is in the future"
    (a reviewer's). Here 1.1M ids are used by another session between the two."""
    await _define(conn, "busy")
    other = await aio(asyncpg.connect)(database)
    try:
        async with transaction(conn):
            await aio(conn.fetchval)("SELECT txid_current()")  # (this transaction's id)
            await aio(other.execute)(
                "DO $$ BEGIN FOR i IN 1..1100000 LOOP PERFORM txid_current(); COMMIT;"
                " END LOOP; END $$"
            )
            made = await aio(client.trigger_answer)(conn, "busy")
            assert (made.changed, made.created) == (True, True)
    finally:
        await aio(other.close)()


@pytest.mark.parametrize("action", ["trigger", "pause", "resume", "remove", "get_job"])
async def test_unknown_job(conn: asyncpg.Connection, action: str) -> None:
    with pytest.raises(JobNotFound) as caught:
        await aio(getattr(client, action))(conn, "nope", namespace="svc")
    assert (caught.value.namespace, caught.value.name) == ("svc", "nope")
    assert str(caught.value) == "unknown job svc/nope"


async def test_trigger_args_must_be_an_object(conn: asyncpg.Connection) -> None:
    await _define(conn, "m")
    with pytest.raises(InvalidInput) as caught:
        await aio(client.trigger)(conn, "m", args=[1])  # type: ignore[arg-type]
    assert caught.value.field == "args"


# --------------------------------------------------------------------------- runs


async def test_list_jobs_shows_last_status_and_blocker(conn: asyncpg.Connection) -> None:
    a = await _define(conn, "a")
    await _define(conn, "b", namespace="other", target=WORKER)
    await _insert_run(conn, a, "succeeded")
    lost = await _insert_run(conn, a, "unresolved")
    jobs = await aio(client.list_jobs)(conn)
    assert [j.key for j in jobs] == ["default/a", "other/b"]
    assert (jobs[0].last_status, jobs[0].blocked_by, jobs[0].state) == (
        "unresolved",
        lost,
        f"blocked by run {lost}",
    )
    assert (jobs[1].last_status, jobs[1].blocked_by) == (None, None)
    assert [j.name for j in await aio(client.list_jobs)(conn, namespace="other")] == ["b"]
    assert await aio(client.list_jobs)(conn, namespace="none") == []


async def test_list_and_get_runs(conn: asyncpg.Connection) -> None:
    a = await _define(conn, "a")
    b = await _define(conn, "b", namespace="other")
    done = await _insert_run(conn, a, "succeeded", count=3, extra='{"files": 1}')
    failed = await _insert_run(conn, a, "failed", error_cause="handler", error_message="boom")
    queued = await aio(client.trigger)(conn, "b", namespace="other")

    runs = await aio(client.list_runs)(conn)
    assert [r.id for r in runs] == [queued, failed, done]
    assert [r.id for r in await aio(client.list_runs)(conn, job="a")] == [failed, done]
    assert [r.id for r in await aio(client.list_runs)(conn, namespace="other")] == [queued]
    assert [r.id for r in await aio(client.list_runs)(conn, status="failed")] == [failed]
    assert [r.id for r in await aio(client.list_runs)(conn, limit=1)] == [queued]
    assert [r.id for r in await aio(client.list_runs)(conn, job="b", namespace="other")] == [queued]
    assert await aio(client.list_runs)(conn, job="a", status="queued") == []
    with pytest.raises(JobNotFound, match="default/b"):  # b lives in "other"
        await aio(client.list_runs)(conn, job="b")
    with pytest.raises(InvalidInput, match="status"):
        await aio(client.list_runs)(conn, status="weird")
    with pytest.raises(InvalidInput, match="limit"):
        await aio(client.list_runs)(conn, limit=0)

    run = await aio(client.get_run)(conn, done)
    assert (run.job_id, run.job_key, run.status, run.count, run.extra) == (
        a,
        "default/a",
        "succeeded",
        3,
        {"files": 1},
    )
    other = await aio(client.get_run)(conn, queued)
    assert (other.job_id, other.trigger, other.args, other.outstanding) == (b, "manual", {}, True)
    data = run.to_json()
    assert {
        "id",
        "job",
        "namespace",
        "status",
        "trigger",
        "scheduled_for",
        "started_at",
        "finished_at",
        "count",
        "extra",
        "error_cause",
        "error_message",
    } <= set(data)
    json.dumps(data)
    with pytest.raises(RunNotFound, match="unknown run 999"):
        await aio(client.get_run)(conn, 999)


async def test_resolve(conn: asyncpg.Connection) -> None:
    a = await _define(conn, "a")
    lost = await _insert_run(conn, a, "unresolved", error_cause="lost")
    retry = await aio(client.resolve)(conn, lost, "retry")
    assert retry != lost
    assert (await aio(client.get_run)(conn, lost)).status == "failed"
    new = await aio(client.get_run)(conn, retry)
    assert (new.trigger, new.status, new.attempt) == ("retry", "queued", 2)

    with pytest.raises(Conflict, match="only unresolved runs"):
        await aio(client.resolve)(conn, retry, "failed")
    with pytest.raises(RunNotFound):
        await aio(client.resolve)(conn, 999, "failed")
    with pytest.raises(InvalidInput, match="outcome"):
        await aio(client.resolve)(conn, lost, "maybe")

    await aio(conn.execute)(
        "UPDATE coordinator.runs SET status = 'unresolved' WHERE id = $1", retry
    )
    assert await aio(client.resolve)(conn, retry, "succeeded") == retry
    assert (await aio(client.get_run)(conn, retry)).status == "succeeded"


async def test_wait_for_run_returns_terminal_state(conn: asyncpg.Connection, database: str) -> None:
    await _define(conn, "w")
    run_id = await aio(client.trigger)(conn, "w")
    other = await aio(asyncpg.connect)(database)
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:

                async def finish() -> None:
                    await trio.sleep(0.3)
                    await aio(other.execute)(
                        "UPDATE coordinator.runs SET status = 'succeeded' WHERE id = $1", run_id
                    )

                nursery.start_soon(finish)
                run = await aio(client.wait_for_run)(conn, run_id, poll=(0.01, 0.05))
    finally:
        await aio(other.close)()
    assert run.status == "succeeded"


async def test_wait_for_run_gives_up(conn: asyncpg.Connection) -> None:
    await _define(conn, "w")
    run_id = await aio(client.trigger)(conn, "w")
    with trio.fail_after(20), pytest.raises(client.WaitTimeout) as caught:
        await aio(client.wait_for_run)(conn, run_id, max_wait=0.2)
    assert caught.value.run.status == "queued"
    assert str(caught.value) == f"run {run_id} is still queued after 200ms"


async def test_wait_for_run_stops_at_unresolved(conn: asyncpg.Connection) -> None:
    a = await _define(conn, "a")
    lost = await _insert_run(conn, a, "unresolved")
    with trio.fail_after(20):
        assert (await aio(client.wait_for_run)(conn, lost)).status == "unresolved"


# --------------------------------------------------------------------------- sync

MANIFEST = """
namespace = "svc"

[[jobs]]
name = "nightly"
cron = "0 2 * * *"
timeout = "1h"
command = ["nightly.sh"]

[[jobs]]
name = "reindex"
every = "6h"
worker = "search"
"""


async def _jobs(conn: asyncpg.Connection, namespace: str = "svc") -> dict[str, client.JobView]:
    return {j.name: j for j in await aio(client.list_jobs)(conn, namespace=namespace)}


async def test_sync_creates_updates_and_pauses_missing(conn: asyncpg.Connection) -> None:
    await _define(conn, "old", namespace="svc")
    await _define(conn, "elsewhere", namespace="keep")
    result = await aio(client.sync_manifest)(conn, parse(MANIFEST))
    assert result == client.SyncResult(namespace="svc", created=2, updated=0, paused=1)
    jobs = await _jobs(conn)
    assert jobs["old"].paused is True
    assert jobs["nightly"].timeout == timedelta(hours=1)
    assert jobs["reindex"].target == {"kind": "worker", "type": "search"}
    assert (await aio(client.get_job)(conn, "elsewhere", namespace="keep")).paused is False

    changed = MANIFEST.replace('every = "6h"', 'every = "30m"')
    result = await aio(client.sync_manifest)(conn, parse(changed))
    assert (result.created, result.updated, result.paused) == (0, 2, 0)
    # Of the two updated, one was already as listed: the dry run's words, for scripts.
    assert (result.changed, result.unchanged) == (1, 1)
    assert result.to_json()["changed"] == 1
    again = await aio(client.sync_manifest)(conn, parse(changed))
    assert (again.updated, again.changed, again.unchanged) == (2, 0, 2)
    jobs = await _jobs(conn)
    assert (jobs["reindex"].schedule, jobs["reindex"].schedule_version) == ("30m", 2)
    assert jobs["nightly"].schedule_version == 1


async def test_an_unchanged_manifest_writes_nothing_and_wakes_nothing(
    conn: asyncpg.Connection, database: str
) -> None:
    """Syncing the same manifest again changes no row (no new row version, no
    updated_at) and sends no wake (0030): a manifest applied on every deploy costs the
    daemon no refresh. The answer is as ever: every listed job that existed is
    "updated"."""
    await _define(conn, "old", namespace="svc", paused=True)  # paused: nothing to pause
    first = await aio(client.sync_manifest)(conn, parse(MANIFEST))
    assert (first.created, first.updated, first.paused) == (2, 0, 0)
    rows = "SELECT name, xmin::text AS v, updated_at FROM coordinator.jobs ORDER BY name"
    before = [tuple(r) for r in await aio(conn.fetch)(rows)]

    notes: list[str] = []
    listener = await aio(asyncpg.connect)(database)
    try:
        marker = trio.Event()

        def heard(_conn: object, _pid: int, _channel: str, payload: str) -> None:
            notes.append(payload)
            if payload == "marker":
                marker.set()

        await aio(listener.add_listener)("coordinator", heard)
        again = await aio(client.sync_manifest)(conn, parse(MANIFEST))
        # Notifications reach a listener in commit order: once the marker sent after
        # the sync arrives, a wake of the sync's would have arrived before it.
        await aio(conn.execute)("SELECT pg_notify('coordinator', 'marker')")
        with trio.fail_after(10):
            await marker.wait()
    finally:
        await aio(listener.close)()
    assert (again.created, again.updated, again.paused) == (0, 2, 0)
    assert [tuple(r) for r in await aio(conn.fetch)(rows)] == before
    assert notes == ["marker"]

    # A change is still written, and only the changed job.
    changed = MANIFEST.replace('every = "6h"', 'every = "30m"')
    result = await aio(client.sync_manifest)(conn, parse(changed))
    assert (result.created, result.updated, result.paused) == (0, 2, 0)
    after = {r["name"]: r["v"] for r in await aio(conn.fetch)(rows)}
    assert after["reindex"] != dict((n, v) for n, v, _ in before)["reindex"]
    assert after["nightly"] == dict((n, v) for n, v, _ in before)["nightly"]


async def test_sync_empty_manifest_pauses_everything(conn: asyncpg.Connection) -> None:
    await aio(client.sync_manifest)(conn, parse(MANIFEST))
    result = await aio(client.sync_manifest)(conn, parse('namespace = "svc"\njobs = []\n'))
    assert (result.created, result.updated, result.paused) == (0, 0, 2)
    assert all(j.paused for j in (await _jobs(conn)).values())
    # History is kept: the jobs are still there.
    assert set(await _jobs(conn)) == {"nightly", "reindex"}


BROKEN = (
    MANIFEST
    + """
[[jobs]]
name = "bad-cron"
cron = "0 25 * * *"
worker = "w"

[[jobs]]
name = "both"
manual = true
worker = "w"
command = ["x"]

[[jobs]]
name = "no-target"
every = "5m"
"""
)


async def test_sync_stores_invalid_entries_inert(conn: asyncpg.Connection) -> None:
    manifest = parse(BROKEN)
    assert [(p.job, p.field) for p in manifest.problems] == [
        ("bad-cron", "cron"),
        ("both", "command"),
        ("no-target", "command"),
    ]
    result = await aio(client.sync_manifest)(conn, manifest)
    assert (result.created, result.updated, result.paused) == (5, 0, 0)
    jobs = await _jobs(conn)
    assert jobs["nightly"].invalid_reason is None
    assert jobs["bad-cron"].invalid_reason is not None
    assert jobs["bad-cron"].invalid_reason.startswith("cron: hour field '25'")
    assert jobs["bad-cron"].schedule == "0 25 * * *"
    assert jobs["both"].invalid_reason is not None
    assert jobs["no-target"].invalid_reason is not None


async def test_sync_strict_applies_nothing(conn: asyncpg.Connection) -> None:
    await _define(conn, "old", namespace="svc")
    with pytest.raises(ManifestRejected) as caught:
        await aio(client.sync_manifest)(conn, parse(BROKEN, source="m.toml"), strict=True)
    assert str(caught.value) == (
        "m.toml: 3 problems in the manifest; nothing applied "
        "(fix them, or store those entries inert with --allow-invalid)"
    )
    jobs = await _jobs(conn)
    assert list(jobs) == ["old"]
    assert jobs["old"].paused is False
    # A clean manifest applies under strict too.
    result = await aio(client.sync_manifest)(conn, parse(MANIFEST), strict=True)
    assert result.created == 2


async def test_sync_entries_directly(conn: asyncpg.Connection) -> None:
    entry = client.job_entry(
        name="x", schedule=Schedule(kind="interval", expression="90s"), target=WORKER
    )
    assert entry["schedule"] == "1m30s"
    result = await aio(client.sync)(conn, "apps", [entry])
    assert result.created == 1
    with pytest.raises(InvalidInput, match="listed twice"):
        await aio(client.sync)(conn, "apps", [entry, entry])
    with pytest.raises(InvalidInput, match="namespace"):
        await aio(client.sync)(conn, "", [entry])


async def test_sync_in_rolled_back_transaction_changes_nothing(conn: asyncpg.Connection) -> None:
    await _define(conn, "old", namespace="svc")
    tx = conn.transaction()
    await aio(tx.start)()
    await aio(client.sync_manifest)(conn, parse(MANIFEST))
    await aio(tx.rollback)()
    jobs = await _jobs(conn)
    assert list(jobs) == ["old"]
    assert jobs["old"].paused is False


# --------------------------------------------------------------------------- errors


async def test_closed_connection_is_database_unavailable(database: str, aio_loop: Any) -> None:
    c = await aio(asyncpg.connect)(database)
    await aio(c.close)()
    with pytest.raises(DatabaseUnavailable):
        await aio(client.list_jobs)(c)


async def test_missing_schema_says_migrate(pg_server: Any, aio_loop: Any) -> None:
    c = await aio(asyncpg.connect)(pg_server.admin_dsn)
    try:
        with pytest.raises(DatabaseError, match="coordinator migrate"):
            await aio(client.list_jobs)(c)
    finally:
        await aio(c.close)()


# --------------------------------------------------------------------------- recoverable


async def test_recoverable_is_for_worker_jobs_only(conn: asyncpg.Connection) -> None:
    job_id = await _define(conn, "scan", target=WORKER, recoverable=True)
    view = await aio(client.get_job)(conn, "scan")
    assert (view.id, view.recoverable, view.to_json()["recoverable"]) == (job_id, True, True)
    with pytest.raises(InvalidInput) as info:
        await _define(conn, "cmd", recoverable=True)
    assert str(info.value) == (
        "recoverable: only a worker job can be recoverable (a command cannot hand back a cursor)"
    )
    # The database says the same to any other writer, in one line naming the field.
    with pytest.raises(asyncpg.InvalidParameterValueError) as raw:
        await aio(conn.execute)(
            "SELECT coordinator.define_job(name => 'cmd', schedule_kind => 'manual', "
            'target => \'{"kind": "exec", "argv": ["true"]}\', recoverable => true)'
        )
    assert raw.value.column_name == "recoverable"
    with pytest.raises(asyncpg.CheckViolationError) as check:
        await aio(conn.execute)(
            'UPDATE coordinator.jobs SET target = \'{"kind": "exec", "argv": ["x"]}\' '
            "WHERE id = $1",
            job_id,
        )
    assert check.value.constraint_name == "jobs_recoverable_check"
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.jobs") == 1
    # Redefined without it, the job is no longer recoverable.
    await _define(conn, "scan", target=WORKER)
    assert (await aio(client.get_job)(conn, "scan")).recoverable is False


async def test_a_paused_run_queued_again_keeps_no_error(conn: asyncpg.Connection) -> None:
    """A trigger queues a paused run again (to resume from its cursor): the pause's words
    are no longer its error while it waits (0029; the claim cleared them, not the
    trigger, so `runs show --json` and the API showed them until then)."""
    await _define(conn, "scan", target=WORKER, recoverable=True, paused=True)
    run_id = await aio(client.trigger)(conn, "scan")
    assert await aio(client.pause_run)(conn, run_id) == "paused"
    paused = await aio(client.get_run)(conn, run_id)
    assert paused.error_message == "paused by operator before it started"
    assert await aio(client.trigger)(conn, "scan") == run_id
    row = await aio(conn.fetchrow)(
        "SELECT status, error_cause, error_message, paused_at FROM coordinator.runs WHERE id = $1",
        run_id,
    )
    assert (row["status"], row["error_cause"], row["error_message"]) == ("queued", None, None)
    assert row["paused_at"] == paused.paused_at  # when it was paused: still true
    assert (await aio(client.get_run)(conn, run_id)).to_json()["error_message"] is None


async def test_pause_and_cancel_of_queued_and_paused_runs(conn: asyncpg.Connection) -> None:
    job_id = await _define(conn, "scan", target=WORKER, recoverable=True, paused=True)
    run_id = await aio(client.trigger)(conn, "scan")
    assert await aio(client.pause_run)(conn, run_id) == "paused"
    run = await aio(client.get_run)(conn, run_id)
    assert (run.status, run.error_message) == ("paused", "paused by operator before it started")
    assert run.paused_at is not None
    # wait_for_run stops at a paused run: it waits for a trigger, not for time.
    assert (await aio(client.wait_for_run)(conn, run_id, max_wait=5)).status == "paused"
    view = await aio(client.get_job)(conn, "scan")
    assert view.outstanding_status == "paused"
    assert (await aio(client.summary)(conn))["outstanding"] == {"paused": 1}
    await aio(client.cancel_run)(conn, run_id)
    run = await aio(client.get_run)(conn, run_id)
    assert (run.status, run.paused_at) == ("cancelled", None)
    # The job is free again: the next trigger starts afresh.
    fresh = await aio(client.trigger)(conn, "scan")
    assert fresh != run_id
    await aio(conn.execute)(
        "UPDATE coordinator.runs SET status = 'unresolved' WHERE id = $1", fresh
    )
    with pytest.raises(Conflict, match="only queued or paused runs can be cancelled"):
        await aio(client.cancel_run)(conn, fresh)
    assert (await aio(client.get_job)(conn, "scan")).id == job_id


async def test_sync_and_runs_show_the_new_fields(conn: asyncpg.Connection) -> None:
    manifest = parse(
        'namespace = "ops"\n[[jobs]]\nname = "scan"\nmanual = true\nworker = "scan"\n'
        "recoverable = true\n"
    )
    await aio(client.sync_manifest)(conn, manifest)
    view = await aio(client.get_job)(conn, "scan", namespace="ops")
    assert view.recoverable is True
    run_id = await _insert_run(
        conn,
        view.id,
        "paused",
        cursor='{"after": 9}',
        count=9,
        resumes=2,
        finding_counts='{"warning": 3}',
    )
    run = await aio(client.get_run)(conn, run_id)
    assert (run.cursor, run.count, run.resumes, run.finding_counts) == (
        {"after": 9},
        9,
        2,
        {"warning": 3},
    )
    shown = run.to_json()
    assert (shown["cursor"], shown["finding_counts"]) == ({"after": 9}, {"warning": 3})
    listed = await aio(client.list_runs)(conn, status="paused")
    assert [r.id for r in listed] == [run_id]
    with pytest.raises(InvalidInput, match="severity"):
        await aio(client.list_findings)(conn, run_id, severity="fatal")
    with pytest.raises(InvalidInput, match="limit"):
        await aio(client.list_findings)(conn, run_id, limit=0)
    assert (await aio(client.list_findings)(conn, run_id)).findings == ()


async def test_resume_run_resumes_only_a_paused_run(conn: asyncpg.Connection) -> None:
    job_id = await _define(conn, "scan", target=WORKER, recoverable=True, paused=True)
    run_id = await aio(client.trigger)(conn, "scan")
    with pytest.raises(Conflict, match=f"run {run_id} is queued, not paused"):
        await aio(client.resume_run)(conn, run_id)
    assert await aio(client.pause_run)(conn, run_id) == "paused"
    paused = await aio(client.get_job)(conn, "scan")
    assert paused.outstanding_paused_at == (await aio(client.get_run)(conn, run_id)).paused_at
    assert paused.outstanding_paused_at is not None
    assert paused.outstanding_attempt == 1
    assert await aio(client.resume_run)(conn, run_id) == run_id
    view = await aio(client.get_job)(conn, "scan")
    assert (view.outstanding_run, view.outstanding_status) == (run_id, "queued")
    # Once it is over, a Resume starts nothing (a plain trigger would start a new run).
    await aio(client.cancel_run)(conn, run_id)
    with pytest.raises(Conflict, match="cancelled, not paused"):
        await aio(client.resume_run)(conn, run_id)
    assert (
        await aio(conn.fetchval)("SELECT count(*) FROM coordinator.runs WHERE job_id = $1", job_id)
        == 1
    )
    with pytest.raises(RunNotFound):
        await aio(client.resume_run)(conn, 999_999)


async def test_findings_newest_first_by_pages(conn: asyncpg.Connection) -> None:
    job_id = await _define(conn, "scan", target=WORKER, recoverable=True)
    run_id = await _insert_run(conn, job_id, "paused", finding_counts='{"info": 5}')
    await aio(conn.execute)(
        "INSERT INTO coordinator.findings (run_id, kind, resource_id, severity, detail)"
        " SELECT $1, 'k', 'r' || i, CASE WHEN i % 2 = 0 THEN 'info' ELSE 'error' END, '{}'"
        "   FROM generate_series(1, 5) i",
        run_id,
    )
    first = await aio(client.list_findings)(conn, run_id, limit=2, newest_first=True)
    assert [f.resource_id for f in first.findings] == ["r5", "r4"]
    assert (first.next_after, first.next_before) == (None, first.findings[-1].id)
    rest = await aio(client.list_findings)(
        conn, run_id, limit=5, newest_first=True, before=first.next_before
    )
    assert [f.resource_id for f in rest.findings] == ["r3", "r2", "r1"]
    assert rest.next_before is None
    errors = await aio(client.list_findings)(conn, run_id, newest_first=True, severity="error")
    assert [f.resource_id for f in errors.findings] == ["r5", "r3", "r1"]
    with pytest.raises(InvalidInput, match="before"):
        await aio(client.list_findings)(conn, run_id, before=3)
    with pytest.raises(InvalidInput, match="after"):
        await aio(client.list_findings)(conn, run_id, after=1, newest_first=True)


async def test_the_demo_says_a_run_removed_with_its_job_is_gone_and_goes_on(
    conn: asyncpg.Connection,
) -> None:
    """A job removed while its run ended (logged as ``job.run`` after ``settle.orphaned``)
    left nothing for the demo to read: the demo's follower stopped the demo, which then
    deleted its directory. It says so in a line and follows the next run."""
    from coordinator.demo import OutputFollower

    job = await _define(conn, "kept")
    kept = await _insert_run(conn, job, "succeeded")
    follower = OutputFollower()
    lines: list[str] = []
    follower.observe({"event": "job.run", "run": kept + 1000})
    follower.observe({"event": "job.run", "run": kept})
    with trio.move_on_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follower.follow, conn, lines.append)
            while len(lines) < 2:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert lines[0] == f"demo: run {kept + 1000} ended, and is gone: its job was removed with it"
    assert lines[1].startswith(f"demo: run {kept} default/kept (schedule) succeeded")


async def test_listing_a_namespace_no_job_could_have_is_refused(conn: asyncpg.Connection) -> None:
    """``jobs list -n "bad ns"`` said "no jobs", where ``jobs define -n "bad ns"`` refused."""
    with pytest.raises(InvalidInput, match=r"^namespace: 'bad ns': use letters"):
        await aio(client.list_jobs)(conn, namespace="bad ns")
    with pytest.raises(InvalidInput, match=r"^namespace: 'bad ns': use letters"):
        await aio(client.list_runs)(conn, namespace="bad ns")
    assert await aio(client.list_jobs)(conn, namespace="good") == []
    with pytest.raises(InvalidInput, match=r"^namespace: 'bad ns': use letters"):
        await aio(client.get_job)(conn, "x", namespace="bad ns")


async def test_a_nul_in_a_name_is_named_as_the_name(conn: asyncpg.Connection) -> None:
    """(The admin API answered ``GET /api/jobs/default/a%00b`` with "value: invalid byte
    sequence for encoding UTF8: 0x00".)"""
    with pytest.raises(InvalidInput) as info:
        await aio(client.get_job)(conn, "a\x00b")
    assert str(info.value) == "name: NUL (U+0000) is not allowed"
    with pytest.raises(InvalidInput) as info:
        await aio(client.get_job)(conn, "a", namespace="n\x00s")
    # (Refused before the query since a namespace is checked first, in the rule's words.)
    assert str(info.value) == (
        "namespace: 'n\\x00s': use letters, digits, '.', '_' and '-', "
        "starting with a letter or a digit"
    )


async def test_the_summary_counts_what_a_refresh_loads(conn: asyncpg.Connection) -> None:
    """loadable follows the refresh's rule: a manual job with a run outstanding is loaded
    (counted as manual-only, `status` explained it as a job the daemon had run when it
    had run nothing), a served one-shot job is not."""
    await _define(conn, "idle")  # manual, nothing queued: not loaded
    await _define(conn, "queued")
    await aio(client.trigger)(conn, "queued")
    await _define(conn, "hourly", schedule=Schedule(kind="interval", expression="1h"))
    served = await _define(
        conn, "once", schedule=Schedule(kind="once", expression="2026-01-01T00:00:00Z")
    )
    await aio(conn.execute)("UPDATE coordinator.jobs SET next_run_at = NULL WHERE id = $1", served)
    summary = await aio(client.summary)(conn)
    assert (summary["jobs"], summary["loadable"], summary["manual"], summary["done"]) == (
        4,
        2,  # hourly, and queued for its run
        1,  # idle
        1,  # once, served
    )


async def test_a_nul_character_is_named_where_it_is(conn: asyncpg.Connection) -> None:
    """PostgreSQL's jsonb cannot hold U+0000, and its words ("unsupported Unicode escape
    sequence") did not say which character or where."""
    await _define(conn, "nul")
    with pytest.raises(InvalidInput) as caught:
        await aio(client.trigger)(conn, "nul", args={"s": "\U0001f600\x00x"})
    assert str(caught.value) == (
        "args: contains the character U+0000 (NUL) at args.s, which PostgreSQL cannot store"
    )
    with pytest.raises(InvalidInput) as caught:
        await _define(conn, "nul2", params={"deep": ["ok", {"k\x00": 1}]})
    assert str(caught.value) == (
        "params: contains the character U+0000 (NUL) at params.deep[1] (a key), which "
        "PostgreSQL cannot store"
    )
