"""Metrics: which typed event moves which series (no daemon, no clock, no SQL)."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import attrs
import pytest
from prometheus_client.parser import text_string_to_metric_families

from coordinator.admin.metrics import Metrics
from coordinator.events import (
    AlertFailed,
    AlertSent,
    AlertSuppressed,
    ClaimGranted,
    ClaimRejected,
    DispatchWake,
    EventBus,
    LifecycleWake,
    NotificationWake,
    Refreshed,
    ResultHeld,
    ResultSaved,
    ResultSpooled,
    RetentionPruned,
    RunFinished,
    RunGivenBack,
    RunLost,
    RunStarted,
)
from coordinator.log import EventLog
from coordinator.status import ArmedDeadline, DaemonStatus, WorkerView


def value(m: Metrics, name: str, **labels: str) -> float:
    sample = m.registry.get_sample_value(name, labels)
    return 0.0 if sample is None else sample


def run(**fields: object) -> RunFinished:
    base: dict[str, object] = {
        "job": "default/a",
        "job_id": 1,
        "run": 1,
        "trigger": "manual",
        "outcome": "succeeded",
        "elapsed_ms": 10.0,
    }
    return RunFinished(**{**base, **fields})  # type: ignore[arg-type]


def status(**fields: object) -> DaemonStatus:
    base: dict[str, object] = {
        "state": "ready",
        "instance": "h:1:x",
        "uptime_s": 1.0,
        "leading": True,
        "jobs": 0,
        "armed_deadlines": 0,
    }
    return DaemonStatus(**{**base, **fields})  # type: ignore[arg-type]


def test_wakes_by_kind() -> None:
    m = Metrics()
    m.observe(NotificationWake(payload={"job": 3}))
    m.observe(DispatchWake(dispatch=12, job_id=3))
    m.observe(LifecycleWake(reason="workers.changed"))
    m.observe(LifecycleWake(reason="listener.reconnected", urgent=True))
    assert value(m, "coordinator_wakes_total", kind="notification") == 1
    assert value(m, "coordinator_wakes_total", kind="dispatch") == 1
    assert value(m, "coordinator_wakes_total", kind="lifecycle") == 2


def test_refresh_counts_and_duration() -> None:
    m = Metrics()
    m.observe(Refreshed(jobs=3, armed=2, elapsed_ms=4.5))
    m.observe(Refreshed(jobs=3, armed=2, elapsed_ms=120.0))
    assert value(m, "coordinator_refreshes_total") == 2
    assert value(m, "coordinator_refresh_duration_seconds_count") == 2
    assert value(m, "coordinator_refresh_duration_seconds_sum") == pytest.approx(0.1245)
    assert value(m, "coordinator_refresh_duration_seconds_bucket", le="0.005") == 1


def test_run_finished_moves_runs_claims_duration_and_lateness() -> None:
    m = Metrics()
    m.observe(run(trigger="schedule", elapsed_ms=1500.0, lateness_ms=3.0))
    # A manual run has no lateness; a failed one has a cause.
    m.observe(run(run=2, outcome="failed", cause="handler", elapsed_ms=20.0))
    assert value(m, "coordinator_runs_total", outcome="succeeded", cause="none") == 1
    assert value(m, "coordinator_runs_total", outcome="failed", cause="handler") == 1
    assert value(m, "coordinator_run_duration_seconds_count") == 2
    assert value(m, "coordinator_run_duration_seconds_sum") == pytest.approx(1.52)
    assert value(m, "coordinator_dispatch_lateness_seconds_count") == 1
    assert value(m, "coordinator_dispatch_lateness_seconds_sum") == pytest.approx(0.003)
    assert value(m, "coordinator_dispatch_lateness_seconds_bucket", le="0.0025") == 0
    assert value(m, "coordinator_dispatch_lateness_seconds_bucket", le="0.005") == 1


def test_claims_are_counted_when_answered_not_when_their_run_ends() -> None:
    """``coordinator_claims_total`` counted a granted claim at its run's end (and a
    give-back again): a claim whose call still ran was not in it, and the rate lagged by
    the calls' length (tester-ha #10). Now: granted or refused, when answered."""
    m = Metrics()
    m.observe(ClaimGranted(job_id=1, run=1, trigger="manual"))
    assert value(m, "coordinator_claims_total") == 1  # running: counted
    m.observe(run())
    m.observe(RunGivenBack(job="default/a", job_id=1, run=1, trigger="manual", reason="x"))
    assert value(m, "coordinator_claims_total") == 1  # its end counts no second claim
    m.observe(ClaimRejected(job_id=1, run=None, reason="outstanding"))
    assert value(m, "coordinator_claims_total") == 2
    assert value(m, "coordinator_runs_given_back_total") == 1


def test_runs_the_start_found_lost_are_counted_as_runs() -> None:
    """A crash's runs never finished here: the daemon whose sweep finds them counts them
    (cause ``lost``) as what the sweep made of them, per job too, and an idempotent job's
    lost attempt is its last failure (tester-ha #10). No duration: it is unknown."""
    m = Metrics(clock=FixedClock(datetime(2026, 1, 1, tzinfo=UTC)))
    m.observe(RunLost(run=1, job_id=1, job="ops/a", action="unresolved"))
    m.observe(RunLost(run=2, job_id=2, job="ops/b", action="retried"))
    m.observe(RunLost(run=3, job_id=3, job="ops/c", action="paused"))
    m.observe(RunLost(run=4, job_id=4, action="unresolved"))  # job unknown: all jobs only
    assert value(m, "coordinator_runs_total", outcome="unresolved", cause="lost") == 2
    assert value(m, "coordinator_runs_total", outcome="failed", cause="lost") == 1
    assert value(m, "coordinator_runs_total", outcome="paused", cause="lost") == 1
    per_job = "coordinator_job_runs_total"
    assert value(m, per_job, namespace="ops", job="a", outcome="unresolved") == 1
    assert value(m, per_job, namespace="ops", job="b", outcome="failed") == 1
    assert value(m, per_job, namespace="ops", job="c", outcome="paused") == 1
    failure = "coordinator_job_last_failure_timestamp_seconds"
    at = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    assert value(m, failure, namespace="ops", job="b") == at
    assert m.registry.get_sample_value(failure, {"namespace": "ops", "job": "a"}) is None
    assert value(m, "coordinator_run_duration_seconds_count") == 0
    assert value(m, "coordinator_claims_total") == 0


def test_claim_rejections_by_reason() -> None:
    m = Metrics()
    m.observe(ClaimRejected(job_id=1, run=None, reason="outstanding"))
    m.observe(ClaimRejected(job_id=1, run=None, reason="outstanding"))
    m.observe(ClaimRejected(job_id=2, run=7, reason="paused"))
    assert value(m, "coordinator_claim_rejections_total", reason="outstanding") == 2
    assert value(m, "coordinator_claim_rejections_total", reason="paused") == 1
    assert value(m, "coordinator_claims_total") == 3


def test_settlement_counters() -> None:
    m = Metrics()
    m.observe(ResultHeld(job="default/a", run=1, error="down"))
    m.observe(ResultHeld(job="default/b", run=2, error="down"))
    m.observe(ResultSaved(job="default/a", run=1, attempts=3, outcome="saved"))
    m.observe(ResultSpooled(job="default/b", run=2, spool="/x"))
    assert value(m, "coordinator_results_retained_total") == 2
    assert value(m, "coordinator_results_saved_total") == 1
    assert value(m, "coordinator_results_spooled_total") == 1


def test_events_without_a_series_change_nothing() -> None:
    m = Metrics()
    before = m.render()
    m.observe(RunStarted(job="default/a", job_id=1, run=1, trigger="manual", attempt=1))
    assert m.render() == before


def test_snapshot_series_read_at_scrape_time_only() -> None:
    calls: list[int] = []
    current = status(armed_deadlines=5, sql_statements=42)

    def snapshot() -> DaemonStatus:
        calls.append(1)
        return current

    m = Metrics()
    # Without a source the gauges are declared but have no samples.
    assert m.registry.get_sample_value("coordinator_armed_deadlines") is None
    m.status = snapshot
    assert calls == []
    assert value(m, "coordinator_armed_deadlines") == 5
    assert value(m, "coordinator_running_calls") == 0
    assert value(m, "coordinator_retained_results") == 0
    assert value(m, "coordinator_degraded") == 0
    assert value(m, "coordinator_sql_statements_total") == 42
    current = status(state="degraded", degraded=("refresh: read-only",))
    assert value(m, "coordinator_armed_deadlines") == 0
    assert value(m, "coordinator_degraded") == 1
    assert calls


def test_render_parses_with_prometheus_parser() -> None:
    m = Metrics(status=lambda: status(armed_deadlines=1))
    m.observe(run())
    families = {f.name: f for f in text_string_to_metric_families(m.render().decode())}
    expected = {
        "coordinator_wakes",
        "coordinator_refreshes",
        "coordinator_refresh_duration_seconds",
        "coordinator_claims",
        "coordinator_claim_rejections",
        "coordinator_runs",
        "coordinator_run_duration_seconds",
        "coordinator_dispatch_lateness_seconds",
        "coordinator_results_retained",
        "coordinator_results_saved",
        "coordinator_results_spooled",
        "coordinator_sql_statements",
        "coordinator_armed_deadlines",
        "coordinator_running_calls",
        "coordinator_retained_results",
        "coordinator_degraded",
    }
    assert expected <= set(families)
    runs = [s for s in families["coordinator_runs"].samples if s.name == "coordinator_runs_total"]
    assert [(s.labels, s.value) for s in runs] == [({"outcome": "succeeded", "cause": "none"}, 1)]


def test_private_registries_do_not_collide() -> None:
    a, b = Metrics(), Metrics()
    a.observe(Refreshed(jobs=0, armed=0, elapsed_ms=1.0))
    assert value(a, "coordinator_refreshes_total") == 1
    assert value(b, "coordinator_refreshes_total") == 0


def test_as_an_event_bus_subscriber_whatever_the_log_level() -> None:
    m = Metrics()
    bus = EventBus(log=EventLog(stream=io.StringIO(), level="error"))
    bus.subscribe(m.observe)
    bus.emit(ClaimRejected(job_id=1, run=None, reason="deadline"))
    bus.emit(DispatchWake(dispatch=3, job_id=1))  # a debug-level event
    assert value(m, "coordinator_claim_rejections_total", reason="deadline") == 1
    assert value(m, "coordinator_wakes_total", kind="dispatch") == 1


@attrs.frozen
class _Renamed:
    """Not an Event: a subscriber never matches on anything but the type."""

    NAME = "job.run"


def test_a_lookalike_record_is_ignored() -> None:
    m = Metrics()
    m.observe(_Renamed())  # type: ignore[arg-type]
    assert value(m, "coordinator_runs_total", outcome="succeeded", cause="none") == 0


# -- per job --------------------------------------------------------------------------------


@attrs.define(eq=False)
class FixedClock:
    at: datetime

    def now(self) -> datetime:
        return self.at


def test_runs_carry_namespace_and_job_labels_with_last_success_and_failure() -> None:
    clock = FixedClock(datetime(2026, 5, 1, tzinfo=UTC))
    m = Metrics(clock=clock)
    m.observe(run(job="ops/backup", elapsed_ms=2000.0))
    clock.at += timedelta(hours=1)
    m.observe(run(job="ops/backup", run=2, outcome="failed", cause="handler"))
    m.observe(run(job="ops/backup", run=3, outcome="timed_out", cause="timeout", trigger="retry"))
    m.observe(run(job="billing/invoice", run=4))
    job = {"namespace": "ops", "job": "backup"}
    assert value(m, "coordinator_job_runs_total", **job, outcome="succeeded") == 1
    assert value(m, "coordinator_job_runs_total", **job, outcome="failed") == 1
    assert value(m, "coordinator_job_runs_total", **job, outcome="timed_out") == 1
    assert value(m, "coordinator_job_last_success_timestamp_seconds", **job) == (
        datetime(2026, 5, 1, tzinfo=UTC).timestamp()
    )
    assert value(m, "coordinator_job_last_failure_timestamp_seconds", **job) == (
        clock.at.timestamp()
    )
    assert value(m, "coordinator_job_run_duration_seconds_count", **job) == 3
    assert value(m, "coordinator_job_retries_total", **job) == 1
    assert (
        value(
            m, "coordinator_job_runs_total", namespace="billing", job="invoice", outcome="succeeded"
        )
        == 1
    )


def test_a_scoped_token_sees_the_per_job_series_of_its_namespaces_only() -> None:
    m = Metrics()
    m.observe(run(job="ops/backup"))
    m.observe(run(job="billing/invoice", run=2, outcome="failed", cause="handler"))
    m.observe(run(job="reports/daily", run=3))

    def namespaces(text: bytes) -> set[str]:
        return {
            s.labels["namespace"]
            for f in text_string_to_metric_families(text.decode())
            for s in f.samples
            if "namespace" in s.labels
        }

    assert namespaces(m.render()) == {"ops", "billing", "reports"}
    scoped = m.render(frozenset({"billing", "reports"}))
    assert namespaces(scoped) == {"billing", "reports"}
    assert b"backup" not in scoped
    # The daemon-wide series stay (they name no job).
    families = {f.name: f for f in text_string_to_metric_families(scoped.decode())}
    assert sum(s.value for s in families["coordinator_runs"].samples) == 3
    assert namespaces(m.render(frozenset())) == set()


def test_beyond_the_job_limit_new_jobs_get_no_series_and_one_warning() -> None:
    records: list[dict[str, object]] = []
    log = EventLog(stream=io.StringIO())
    log.observers.append(records.append)
    m = Metrics(max_jobs=2, log=log)
    for i in range(5):
        m.observe(run(job=f"ns/job{i}", run=i))
    m.observe(run(job="ns/job0", run=9))  # a known job keeps counting
    families = {f.name: f for f in text_string_to_metric_families(m.render().decode())}
    jobs = {s.labels["job"] for s in families["coordinator_job_runs"].samples}
    assert jobs == {"job0", "job1"}
    assert (
        value(m, "coordinator_job_runs_total", namespace="ns", job="job0", outcome="succeeded") == 2
    )
    warnings = [r for r in records if r["event"] == "metrics.job_limit"]
    assert len(warnings) == 1
    assert warnings[0]["job"] == "ns/job2"
    # Every run still counts in the series without job labels.
    assert value(m, "coordinator_runs_total", outcome="succeeded", cause="none") == 6


def test_alerts_and_retention_series() -> None:
    m = Metrics()
    at = datetime(2026, 5, 1, tzinfo=UTC)
    m.observe(AlertSent(job="ops/backup", job_id=1, kind="failed", run=1, sink="email", attempts=1))
    m.observe(
        AlertSent(job="ops/backup", job_id=1, kind="failed", run=1, sink="webhook", attempts=2)
    )
    for run_id in (2, 3):
        m.observe(AlertSuppressed(job="ops/backup", job_id=1, kind="failed", run=run_id, until=at))
    m.observe(
        AlertFailed(job="ops/backup", kind="failed", run=1, sink="webhook", error="503", attempt=1)
    )
    m.observe(RetentionPruned(runs=1234, jobs_removed=0, batches=2, elapsed_ms=5.0, complete=True))
    job = {"namespace": "ops", "job": "backup", "kind": "failed"}
    assert value(m, "coordinator_alerts_sent_total", **job, sink="email") == 1
    assert value(m, "coordinator_alerts_sent_total", **job, sink="webhook") == 1
    assert value(m, "coordinator_alerts_suppressed_total", **job) == 2
    assert value(m, "coordinator_alert_failures_total", sink="webhook") == 1
    assert value(m, "coordinator_retention_prunes_total") == 1
    assert value(m, "coordinator_retention_pruned_runs_total") == 1234


def test_snapshot_gauges_per_job_and_workers_by_type() -> None:
    at = datetime(2026, 5, 1, 3, 17, tzinfo=UTC)
    connected = datetime(2026, 5, 1, tzinfo=UTC)
    workers = tuple(
        WorkerView(
            id=f"w{i}",
            types=types,
            capacity=1,
            busy=0,
            draining=draining,
            transport="unix",
            peer="",
            connected_at=connected,
        )
        for i, (types, draining) in enumerate(
            [(("search", "mail"), False), (("search",), False), (("mail",), True)]
        )
    )
    snapshot = status(
        leading=True,
        unresolved=2,
        next_prune=at,
        workers=workers,
        deadlines=(
            ArmedDeadline(job="ops/backup", at=at, interval_s=86400.0),
            ArmedDeadline(job="ops/once", at=at),
            ArmedDeadline(job="ops/third", at=at, interval_s=60.0),
        ),
    )
    m = Metrics(status=lambda: snapshot, max_jobs=2)
    backup = {"namespace": "ops", "job": "backup"}
    assert value(m, "coordinator_job_next_deadline_timestamp_seconds", **backup) == at.timestamp()
    assert value(m, "coordinator_job_interval_seconds", **backup) == 86400
    assert (
        m.registry.get_sample_value(
            "coordinator_job_interval_seconds", {"namespace": "ops", "job": "once"}
        )
        is None
    )
    # Bounded like the event-driven series: the third job gets none.
    assert (
        m.registry.get_sample_value(
            "coordinator_job_next_deadline_timestamp_seconds", {"namespace": "ops", "job": "third"}
        )
        is None
    )
    assert value(m, "coordinator_workers_connected", type="search") == 2
    assert value(m, "coordinator_workers_connected", type="mail") == 1
    assert value(m, "coordinator_leading") == 1
    assert value(m, "coordinator_unresolved_jobs") == 2
    assert value(m, "coordinator_next_prune_timestamp_seconds") == at.timestamp()


def test_no_created_series_doubles_the_scrape() -> None:
    """Counters and histograms came with a `_created` gauge family each (prometheus_client's
    default), doubling the series a scrape stores."""
    text = Metrics().render().decode()
    assert "_created" not in text
    assert "coordinator_runs_total" in text or "coordinator_claims_total" in text
