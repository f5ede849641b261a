"""Per-job metrics move with a real daemon's runs (issue #16): runs by namespace, job
and outcome, last success and failure, durations, the armed deadline and its interval,
all from events and the snapshot: scraping sends no SQL."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from coordinator import client
from coordinator.admin.metrics import Metrics
from coordinator.db import aio

from .conftest import StartDaemon, define

if TYPE_CHECKING:
    import asyncpg

    from coordinator.embedded import StatementLog


def sample(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


async def test_metrics_move_with_runs_and_carry_job_labels(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    sql_log: StatementLog,
    database_name: str,
) -> None:
    await define(conn, "ok", namespace="ops")
    await define(conn, "bad", namespace="ops", target={"kind": "exec", "argv": ["false"]})
    await define(conn, "hourly", namespace="ops", schedule_kind="interval", schedule="1h")
    harness = await start_daemon()
    metrics = Metrics(status=partial(harness.daemon.status, deadlines=100), max_jobs=100)
    harness.daemon.events.subscribe(metrics.observe)
    for name, outcome in (("ok", "succeeded"), ("ok", "succeeded"), ("bad", "failed")):
        run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('ops', $1)", name)
        await harness.wait_event("job.run", run=run_id, outcome=outcome)

    ok = {"namespace": "ops", "job": "ok"}
    bad = {"namespace": "ops", "job": "bad"}
    assert sample(metrics, "coordinator_job_runs_total", **ok, outcome="succeeded") == 2
    assert sample(metrics, "coordinator_job_runs_total", **bad, outcome="failed") == 1
    assert sample(metrics, "coordinator_job_last_success_timestamp_seconds", **ok) is not None
    assert sample(metrics, "coordinator_job_last_failure_timestamp_seconds", **bad) is not None
    assert sample(metrics, "coordinator_job_last_failure_timestamp_seconds", **ok) is None
    assert sample(metrics, "coordinator_job_run_duration_seconds_count", **ok) == 2

    sql_log.mark()
    text = metrics.render().decode()
    assert 'coordinator_job_interval_seconds{job="hourly",namespace="ops"} 3600.0' in text
    assert 'coordinator_job_next_deadline_timestamp_seconds{job="hourly",namespace="ops"}' in text
    assert sql_log.statements(app="coordinator", db=database_name) == []


async def test_unresolved_jobs_count_a_paused_job_too(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    sql_log: StatementLog,
    database_name: str,
) -> None:
    """A run a crash left unresolved needs a person whatever its job's pause state: an
    operator who pauses the blocked job (a paused job is not loaded) must not silence
    CoordinatorUnresolvedRuns (tester-ha #9). Counted at a full refresh, after a pause
    (the refresh that reads only the paused job), and no longer once resolved; read
    from memory at scrape time, as before."""
    stuck = await define(conn, "stuck")
    parked = await define(conn, "parked", paused=True)
    runs = {}
    for job_id in (stuck, parked):
        runs[job_id] = await aio(conn.fetchval)(
            "INSERT INTO coordinator.runs (job_id, trigger, status, error_cause) "
            "VALUES ($1, 'manual', 'unresolved', 'lost') RETURNING id",
            job_id,
        )
    harness = await start_daemon(refresh_spacing=0.1)
    metrics = Metrics(status=harness.daemon.status)
    assert sample(metrics, "coordinator_unresolved_jobs") == 2

    seen = len(harness.named("refresh"))
    await aio(client.pause)(conn, "stuck")
    await harness.wait_event("refresh", count=seen + 1)
    assert harness.named("refresh")[-1].get("named") == 1  # the incremental refresh
    sql_log.mark()
    assert sample(metrics, "coordinator_unresolved_jobs") == 2
    assert harness.daemon.status().unresolved == 2
    assert sql_log.statements(app="coordinator", db=database_name) == []

    seen = len(harness.named("refresh"))
    await aio(client.resolve)(conn, runs[parked], "failed")
    await harness.wait_event("refresh", count=seen + 1)
    assert sample(metrics, "coordinator_unresolved_jobs") == 1
    await aio(client.resume)(conn, "stuck")  # loaded again, still blocked
    await harness.wait_event("refresh", count=seen + 2)
    assert sample(metrics, "coordinator_unresolved_jobs") == 1


async def test_runs_a_crash_left_are_counted_and_claims_when_granted(
    start_daemon: StartDaemon, conn: asyncpg.Connection
) -> None:
    """Runs a dead daemon left ``running`` never finish anywhere: the daemon whose start
    sweeps them counts them (cause ``lost``), per job too (tester-ha #10); and a claim is
    counted once granted, while its call still runs, not when the run ends."""
    kept = await define(conn, "kept")
    again = await define(conn, "again", idempotent=True)
    for job_id in (kept, again):
        await aio(conn.execute)(
            "INSERT INTO coordinator.runs (job_id, trigger, status, claimed_at, started_at,"
            " instance) VALUES ($1, 'manual', 'running', now(), now(), 'dead:1:x')",
            job_id,
        )
    await define(conn, "slow", target={"kind": "exec", "argv": ["sleep", "1"]})
    harness = await start_daemon(wait_ready=False)
    metrics = Metrics(status=harness.daemon.status)
    harness.daemon.events.subscribe(metrics.observe)  # before the start's sweep
    await harness.wait_event("ready")
    assert sample(metrics, "coordinator_runs_total", outcome="unresolved", cause="lost") == 1
    assert sample(metrics, "coordinator_runs_total", outcome="failed", cause="lost") == 1
    job = {"namespace": "default", "job": "again"}
    assert sample(metrics, "coordinator_job_runs_total", **job, outcome="failed") == 1
    assert sample(metrics, "coordinator_job_last_failure_timestamp_seconds", **job) is not None
    kept_runs = {"namespace": "default", "job": "kept", "outcome": "unresolved"}
    assert sample(metrics, "coordinator_job_runs_total", **kept_runs) == 1

    await harness.wait_event("job.run", job="default/again")  # its retry, claimed once
    assert sample(metrics, "coordinator_claims_total") == 1
    claims = 1
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'slow')")
    await harness.wait_event("run.started", run=run_id)
    assert sample(metrics, "coordinator_claims_total") == claims + 1  # still running
    await harness.wait_event("job.run", run=run_id)
    assert sample(metrics, "coordinator_claims_total") == claims + 1  # not again at its end
