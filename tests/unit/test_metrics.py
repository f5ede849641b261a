"""Metrics: which logged event moves which series (no daemon, no clock, no SQL)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from prometheus_client.parser import text_string_to_metric_families

from coordinator.admin.metrics import Metrics
from coordinator.log import EventLog


def value(m: Metrics, name: str, **labels: str) -> float:
    sample = m.registry.get_sample_value(name, labels)
    return 0.0 if sample is None else sample


def event(name: str, **fields: Any) -> dict[str, Any]:
    return {"ts": "2026-01-01T00:00:00.000+00:00", "level": "info", "event": name, **fields}


@attrs.frozen
class Snapshot:
    armed_deadlines: int
    running_calls: int
    retained_results: int


def test_wakes_by_kind() -> None:
    m = Metrics()
    m.observe(event("wake", payload={"table": "jobs"}))
    m.observe(event("wake", dispatch=12))
    m.observe(event("wake", reason="worker.connected"))
    m.observe(event("wake", reason="listener.reconnected", urgent=True))
    assert value(m, "coordinator_wakes_total", kind="notification") == 1
    assert value(m, "coordinator_wakes_total", kind="dispatch") == 1
    assert value(m, "coordinator_wakes_total", kind="lifecycle") == 2


def test_refresh_counts_and_duration() -> None:
    m = Metrics()
    m.observe(event("refresh", jobs=3, armed=2, elapsed_ms=4.5))
    m.observe(event("refresh", jobs=3, armed=2, elapsed_ms=120.0))
    assert value(m, "coordinator_refreshes_total") == 2
    assert value(m, "coordinator_refresh_duration_seconds_count") == 2
    assert value(m, "coordinator_refresh_duration_seconds_sum") == pytest.approx(0.1245)
    assert value(m, "coordinator_refresh_duration_seconds_bucket", le="0.005") == 1


def test_job_run_moves_runs_claims_duration_and_lateness() -> None:
    m = Metrics()
    m.observe(
        event(
            "job.run",
            job="default/a",
            run=1,
            trigger="schedule",
            outcome="succeeded",
            elapsed_ms=1500.0,
            lateness_ms=3.0,
        )
    )
    # A manual run has no lateness; a failed one has a cause.
    m.observe(
        event(
            "job.run",
            job="default/b",
            run=2,
            trigger="manual",
            outcome="failed",
            cause="handler",
            elapsed_ms=20.0,
        )
    )
    assert value(m, "coordinator_runs_total", outcome="succeeded", cause="none") == 1
    assert value(m, "coordinator_runs_total", outcome="failed", cause="handler") == 1
    assert value(m, "coordinator_claims_total") == 2
    assert value(m, "coordinator_run_duration_seconds_count") == 2
    assert value(m, "coordinator_run_duration_seconds_sum") == pytest.approx(1.52)
    assert value(m, "coordinator_dispatch_lateness_seconds_count") == 1
    assert value(m, "coordinator_dispatch_lateness_seconds_sum") == pytest.approx(0.003)
    assert value(m, "coordinator_dispatch_lateness_seconds_bucket", le="0.0025") == 0
    assert value(m, "coordinator_dispatch_lateness_seconds_bucket", le="0.005") == 1


def test_claim_rejections_by_reason() -> None:
    m = Metrics()
    m.observe(event("claim.rejected", job_id=1, reason="outstanding"))
    m.observe(event("claim.rejected", job_id=1, reason="outstanding"))
    m.observe(event("claim.rejected", job_id=2, reason="paused"))
    assert value(m, "coordinator_claim_rejections_total", reason="outstanding") == 2
    assert value(m, "coordinator_claim_rejections_total", reason="paused") == 1
    assert value(m, "coordinator_claims_total") == 3


def test_settlement_counters() -> None:
    m = Metrics()
    m.observe(event("settle.retained", job="default/a", run=1, error="down"))
    m.observe(event("settle.retained", job="default/b", run=2, error="down"))
    m.observe(event("settle.saved", job="default/a", run=1, attempts=3, outcome="saved"))
    m.observe(event("settle.spooled", job="default/b", run=2, spool="/x"))
    assert value(m, "coordinator_results_retained_total") == 2
    assert value(m, "coordinator_results_saved_total") == 1
    assert value(m, "coordinator_results_spooled_total") == 1


def test_sql_statements_counted_from_calls_and_events() -> None:
    m = Metrics()
    m.count_statement()
    m.count_statement(3)
    m.observe(event("sql"))
    m.observe(event("sql", statements=2))
    assert value(m, "coordinator_sql_statements_total") == 7


def test_unrelated_and_odd_records_are_ignored() -> None:
    m = Metrics()
    before = m.render()
    m.observe(event("ready", jobs=1))
    m.observe({"no": "event"})
    m.observe(event("refresh", elapsed_ms="soon"))  # a malformed field: counted, not timed
    m.observe(event("job.run", outcome="succeeded", elapsed_ms=float("nan"), lateness_ms=None))
    assert value(m, "coordinator_refreshes_total") == 1
    assert value(m, "coordinator_refresh_duration_seconds_count") == 0
    assert value(m, "coordinator_run_duration_seconds_count") == 0
    assert before != m.render()


def test_gauges_read_at_scrape_time_only() -> None:
    calls: list[int] = []
    current = Snapshot(armed_deadlines=5, running_calls=2, retained_results=1)

    def snapshot() -> Snapshot:
        calls.append(1)
        return current

    m = Metrics()
    # Without a source the gauges are declared but have no samples.
    assert m.registry.get_sample_value("coordinator_armed_deadlines") is None
    m.gauges = snapshot
    assert calls == []
    assert value(m, "coordinator_armed_deadlines") == 5
    assert value(m, "coordinator_running_calls") == 2
    assert value(m, "coordinator_retained_results") == 1
    current = Snapshot(armed_deadlines=0, running_calls=0, retained_results=0)
    assert value(m, "coordinator_armed_deadlines") == 0


def test_render_parses_with_prometheus_parser() -> None:
    m = Metrics(gauges=lambda: Snapshot(armed_deadlines=1, running_calls=0, retained_results=0))
    m.observe(event("job.run", outcome="succeeded", elapsed_ms=10.0))
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
    }
    assert expected <= set(families)
    runs = [s for s in families["coordinator_runs"].samples if s.name == "coordinator_runs_total"]
    assert [(s.labels, s.value) for s in runs] == [({"outcome": "succeeded", "cause": "none"}, 1)]


def test_private_registries_do_not_collide() -> None:
    a, b = Metrics(), Metrics()
    a.observe(event("refresh", elapsed_ms=1.0))
    assert value(a, "coordinator_refreshes_total") == 1
    assert value(b, "coordinator_refreshes_total") == 0


def test_as_an_event_log_observer() -> None:
    m = Metrics()
    log = EventLog(stream=_Null())
    log.observers.append(m.observe)
    log.info("claim.rejected", job_id=1, reason="deadline")
    log.debug("wake", reason="worker.connected")
    assert value(m, "coordinator_claim_rejections_total", reason="deadline") == 1
    # Observers see events below the written level too: debug wakes are still counted.
    assert value(m, "coordinator_wakes_total", kind="lifecycle") == 1


class _Null:
    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass
