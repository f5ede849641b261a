"""Prometheus metrics, fed the daemon's typed events and read at scrape time.

Nothing here runs on its own: counters and histograms move when the daemon emits an
event (:meth:`Metrics.observe` subscribes to its :class:`~coordinator.events.EventBus`
and matches on the event's type), and the gauges (armed deadlines, running calls, held
results, degraded) and the daemon's own statement count are read from its typed
snapshot (:class:`~coordinator.status.DaemonStatus`) when ``/metrics`` is scraped. No
timer, no SQL.

=========================  ===========================================================
event                      series
=========================  ===========================================================
``NotificationWake``       ``coordinator_wakes_total{kind="notification"}``
``DispatchWake``           ``coordinator_wakes_total{kind="dispatch"}``
``LifecycleWake``          ``coordinator_wakes_total{kind="lifecycle"}``
``Refreshed``              ``coordinator_refreshes_total``,
                           ``coordinator_refresh_duration_seconds``
``ClaimGranted``           ``coordinator_claims_total`` (counted when granted, not when
                           its run ends)
``ClaimRejected``          ``coordinator_claims_total``,
                           ``coordinator_claim_rejections_total{reason}``
``RunFinished``            ``coordinator_runs_total{outcome,cause}``,
                           ``coordinator_run_duration_seconds``,
                           ``coordinator_dispatch_lateness_seconds`` (scheduled runs)
``RunLost``                ``coordinator_runs_total{outcome,cause="lost"}`` (a run a
                           crash left, as the start found it: ``unresolved``, ``failed``
                           when retried, ``paused``; no duration: unknown)
``RunGivenBack``           ``coordinator_runs_given_back_total`` (claimed, never sent)
``ResultHeld``             ``coordinator_results_retained_total``
``ResultSaved``            ``coordinator_results_saved_total``
``ResultSpooled``          ``coordinator_results_spooled_total``
``RunFinished`` (per job)  ``coordinator_job_runs_total{namespace,job,outcome}``,
                           ``coordinator_job_last_success_timestamp_seconds``,
                           ``coordinator_job_last_failure_timestamp_seconds``,
                           ``coordinator_job_run_duration_seconds``,
                           ``coordinator_job_retries_total`` (runs that were retries)
``RunLost`` (per job)      ``coordinator_job_runs_total{namespace,job,outcome}``,
                           ``coordinator_job_last_failure_timestamp_seconds`` (retried)
``AlertSent``              ``coordinator_alerts_sent_total{namespace,job,kind,sink}``
``AlertSuppressed``        ``coordinator_alerts_suppressed_total{namespace,job,kind}``
``AlertFailed``            ``coordinator_alert_failures_total{sink}``
``RetentionPruned``        ``coordinator_retention_prunes_total``,
                           ``coordinator_retention_pruned_runs_total``
=========================  ===========================================================

From the snapshot: ``coordinator_armed_deadlines``, ``coordinator_running_calls``,
``coordinator_retained_results``, ``coordinator_degraded`` (1 while degraded; the
reasons are in ``/api/status``), ``coordinator_leading`` (1 while this daemon holds the
single-writer lock), ``coordinator_unresolved_jobs`` (jobs blocked by an unresolved
run, paused and invalid ones too: the run waits for an operator all the same),
``coordinator_workers_connected{type}``, ``coordinator_next_prune_timestamp_seconds``,
per job ``coordinator_job_next_deadline_timestamp_seconds`` and
``coordinator_job_interval_seconds``, and ``coordinator_sql_statements_total`` (counted
where the store sends; proofs of idle silence still use the server's accounting).

Per-job series carry ``namespace`` and ``job`` labels for at most ``max_jobs`` jobs (the
``metrics_max_jobs`` setting): the first ones seen keep their series; a job beyond gets
none, and the first such job is named in one ``metrics.job_limit`` warning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import attrs
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..clock import SystemWallClock, WallClock
from ..events import (
    AlertFailed,
    AlertSent,
    AlertSuppressed,
    ClaimGranted,
    ClaimRejected,
    DispatchWake,
    Event,
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
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ..log import EventLog
    from ..status import DaemonStatus

__all__ = ["CONTENT_TYPE", "DEFAULT_MAX_JOBS", "Metrics"]

# Every counter and histogram also came as a `_created` gauge family (the time it was
# made), doubling the series a scrape stores for nothing a rule here reads. The setting
# is the library's, for the process: the daemon's process is ours.
disable_created_metrics()  # type: ignore[no-untyped-call]

#: The ``Content-Type`` of :meth:`Metrics.render`'s output.
CONTENT_TYPE: Final = CONTENT_TYPE_LATEST

_NAMESPACE: Final = "coordinator"

#: Seconds. Refreshes are one statement: milliseconds, up to seconds on a busy server.
_REFRESH_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
#: Seconds. Calls range from a `true` to a nightly backup.
_RUN_BUCKETS: Final = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400,
)  # fmt: skip
#: Seconds late: the promise is "on time to within milliseconds" when idle.
_LATENESS_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
)  # fmt: skip


_GAUGES: Final = (
    ("armed_deadlines", "Jobs with an armed timer (a saved deadline)."),
    ("running_calls", "Calls running now."),
    ("retained_results", "Results the database has not acknowledged yet."),
    ("degraded", "1 while the daemon is degraded (see /api/status for why)."),
    ("leading", "1 while this daemon holds the single-writer lock."),
    (
        "unresolved_jobs",
        "Jobs blocked by an unresolved run, paused ones too (as of the last refresh).",
    ),
)
#: The default bound on jobs with per-job series (the ``metrics_max_jobs`` setting).
DEFAULT_MAX_JOBS: Final = 500


class _JobLabels:
    """Which jobs get per-job series: the first ``limit`` seen; one warning beyond."""

    def __init__(self, limit: int, log: EventLog | None) -> None:
        self.limit = limit
        self.log = log
        self._known: dict[str, tuple[str, str]] = {}
        self.refused = 0

    def __call__(self, key: str) -> tuple[str, str] | None:
        labels = self._known.get(key)
        if labels is not None:
            return labels
        if len(self._known) >= self.limit:
            self.refused += 1
            if self.refused == 1 and self.log is not None:
                self.log.warning(
                    "metrics.job_limit",
                    limit=self.limit,
                    job=key,
                    hint="jobs beyond metrics_max_jobs get no per-job series",
                )
            return None
        namespace, _, name = key.partition("/")
        labels = self._known[key] = (namespace, name)
        return labels


class _SnapshotCollector:
    """Reads the daemon's snapshot when the registry is collected (no timer)."""

    def __init__(self, owner: Metrics) -> None:
        self._owner = owner

    def describe(self) -> Iterator[Metric]:
        yield from self._families(None)

    def collect(self) -> Iterator[Metric]:
        source = self._owner.status
        yield from self._families(source() if source is not None else None)

    def _families(self, snapshot: DaemonStatus | None) -> Iterator[Metric]:
        values: tuple[float | None, ...] = (None,) * len(_GAUGES)
        if snapshot is not None:
            values = (
                snapshot.armed_deadlines,
                snapshot.running_calls,
                snapshot.held_results,
                1 if snapshot.state == "degraded" else 0,
                1 if snapshot.leading else 0,
                snapshot.unresolved,
            )
        for (name, doc), value in zip(_GAUGES, values, strict=True):
            family = GaugeMetricFamily(f"{_NAMESPACE}_{name}", doc)
            if value is not None:
                family.add_metric([], float(value))
            yield family
        statements = CounterMetricFamily(
            f"{_NAMESPACE}_sql_statements",
            "SQL statements the daemon sent, by its own count (proofs use the server's).",
        )
        if snapshot is not None:
            statements.add_metric([], float(snapshot.sql_statements))
        yield statements
        workers = GaugeMetricFamily(
            f"{_NAMESPACE}_workers_connected",
            "Worker connections serving each type (draining ones left out).",
            labels=["type"],
        )
        prune = GaugeMetricFamily(
            f"{_NAMESPACE}_next_prune_timestamp_seconds",
            "When the next retention prune is armed for (absent: off or running).",
        )
        deadline = GaugeMetricFamily(
            f"{_NAMESPACE}_job_next_deadline_timestamp_seconds",
            "A job's armed deadline.",
            labels=["namespace", "job"],
        )
        interval = GaugeMetricFamily(
            f"{_NAMESPACE}_job_interval_seconds",
            "The typical time between two deadlines of a job (interval or cron gap).",
            labels=["namespace", "job"],
        )
        if snapshot is not None:
            served: dict[str, int] = {}
            for worker in snapshot.workers:
                if not worker.draining:
                    for kind in worker.types:
                        served[kind] = served.get(kind, 0) + 1
            for kind, count in sorted(served.items()):
                workers.add_metric([kind], float(count))
            if snapshot.next_prune is not None:
                prune.add_metric([], snapshot.next_prune.timestamp())
            for armed in snapshot.deadlines:
                labels = self._owner.job_labels(armed.job)
                if labels is None:
                    continue
                deadline.add_metric(list(labels), armed.at.timestamp())
                if armed.interval_s is not None:
                    interval.add_metric(list(labels), armed.interval_s)
        yield workers
        yield prune
        yield deadline
        yield interval


class Metrics:
    """The daemon's metrics, in a private registry (nothing global is touched).

    Wire it up with ``events.subscribe(metrics.observe)`` and ``status=daemon.status``
    (for the gauges). Without ``status`` the gauges are exported without samples.
    """

    def __init__(
        self,
        *,
        status: Callable[[], DaemonStatus] | None = None,
        max_jobs: int = DEFAULT_MAX_JOBS,
        log: EventLog | None = None,
        clock: WallClock | None = None,
    ) -> None:
        #: Called at scrape time for the gauge values; ``None`` until the daemon is known.
        self.status = status
        #: Jobs that get per-job series (at most ``max_jobs``; ``log`` hears the warning).
        self.job_labels = _JobLabels(max_jobs, log)
        self.clock: WallClock = clock or SystemWallClock()
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        ns = _NAMESPACE
        self.wakes = Counter(
            "wakes", "Wakes received, by kind.", ["kind"], namespace=ns, registry=r
        )
        self.refreshes = Counter("refreshes", "Inventory refreshes done.", namespace=ns, registry=r)
        self.refresh_duration = Histogram(
            "refresh_duration_seconds",
            "Time an inventory refresh took.",
            namespace=ns,
            registry=r,
            buckets=_REFRESH_BUCKETS,
        )
        self.claims = Counter(
            "claims", "Claims answered (granted or rejected).", namespace=ns, registry=r
        )
        self.claim_rejections = Counter(
            "claim_rejections",
            "Claims the database refused, by reason.",
            ["reason"],
            namespace=ns,
            registry=r,
        )
        self.runs = Counter(
            "runs",
            "Runs finished, by outcome and error cause (cause lost: found by the start after"
            " a crash).",
            ["outcome", "cause"],
            namespace=ns, registry=r,
        )  # fmt: skip
        self.run_duration = Histogram(
            "run_duration_seconds",
            "Time a call took, from start to finish.",
            namespace=ns,
            registry=r,
            buckets=_RUN_BUCKETS,
        )
        self.lateness = Histogram(
            "dispatch_lateness_seconds",
            "Actual start of a scheduled run minus its deadline.",
            namespace=ns,
            registry=r,
            buckets=_LATENESS_BUCKETS,
        )
        self.retained = Counter(
            "results_retained",
            "Results kept in memory because the database refused them.",
            namespace=ns,
            registry=r,
        )
        self.saved = Counter(
            "results_saved", "Retained results saved later.", namespace=ns, registry=r
        )
        self.given_back = Counter(
            "runs_given_back",
            "Claimed runs never sent and given back (queued again, or the deadline kept).",
            namespace=ns,
            registry=r,
        )
        self.spooled = Counter(
            "results_spooled",
            "Results written to the spool at stop because the database still refused them.",
            namespace=ns,
            registry=r,
        )
        job = ["namespace", "job"]
        self.job_runs = Counter(
            "job_runs", "Runs finished, by job and outcome.", [*job, "outcome"],
            namespace=ns, registry=r,
        )  # fmt: skip
        self.job_last_success = Gauge(
            "job_last_success_timestamp_seconds",
            "When a run of the job last succeeded (since this daemon started).",
            job, namespace=ns, registry=r,
        )  # fmt: skip
        self.job_last_failure = Gauge(
            "job_last_failure_timestamp_seconds",
            "When a run of the job last failed or timed out (since this daemon started).",
            job, namespace=ns, registry=r,
        )  # fmt: skip
        self.job_duration = Histogram(
            "job_run_duration_seconds", "Time a call of the job took.", job,
            namespace=ns, registry=r, buckets=_RUN_BUCKETS,
        )  # fmt: skip
        self.job_retries = Counter(
            "job_retries", "Runs of the job that were retries of an earlier run.", job,
            namespace=ns, registry=r,
        )  # fmt: skip
        self.alerts_sent = Counter(
            "alerts_sent", "Alerts delivered, by job, kind and sink.", [*job, "kind", "sink"],
            namespace=ns, registry=r,
        )  # fmt: skip
        self.alerts_suppressed = Counter(
            "alerts_suppressed",
            "Alerts not sent because one of the same job and kind went out within the window.",
            [*job, "kind"], namespace=ns, registry=r,
        )  # fmt: skip
        self.alert_failures = Counter(
            "alert_failures", "Failed alert deliveries (each is retried), by sink.", ["sink"],
            namespace=ns, registry=r,
        )  # fmt: skip
        self.prunes = Counter(
            "retention_prunes", "Retention prunes done.", namespace=ns, registry=r
        )
        self.pruned = Counter(
            "retention_pruned_runs", "Runs deleted by retention.", namespace=ns, registry=r
        )
        r.register(_SnapshotCollector(self))

    # -- input --------------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        """An :class:`~coordinator.events.EventBus` subscriber (matches on type)."""
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    # -- output -------------------------------------------------------------------------

    def render(self, namespaces: frozenset[str] | None = None) -> bytes:
        """Everything, in the Prometheus text format (:data:`CONTENT_TYPE`); with
        ``namespaces`` (a scoped admin token's), the per-job series of other namespaces
        are left out (the daemon-wide series stay: they name no job)."""
        if namespaces is None:
            return generate_latest(self.registry)
        return generate_latest(_Scoped(self.registry, namespaces))

    # -- event handlers -----------------------------------------------------------------

    def _run(self, event: RunFinished) -> None:
        self.runs.labels(outcome=event.outcome, cause=event.cause or "none").inc()
        self.run_duration.observe(max(0.0, event.elapsed_s))
        if event.lateness_s is not None:
            self.lateness.observe(event.lateness_s)
        labels = self.job_labels(event.job)
        if labels is None:
            return
        self.job_runs.labels(*labels, event.outcome).inc()
        self.job_duration.labels(*labels).observe(max(0.0, event.elapsed_s))
        now = self.clock.now().timestamp()
        if event.outcome == "succeeded":
            self.job_last_success.labels(*labels).set(now)
        elif event.outcome in ("failed", "timed_out"):
            self.job_last_failure.labels(*labels).set(now)
        if event.trigger == "retry":
            self.job_retries.labels(*labels).inc()

    def _alert_sent(self, event: AlertSent) -> None:
        labels = self.job_labels(event.job)
        if labels is not None:
            self.alerts_sent.labels(*labels, event.kind, event.sink).inc()

    def _alert_suppressed(self, event: AlertSuppressed) -> None:
        labels = self.job_labels(event.job)
        if labels is not None:
            self.alerts_suppressed.labels(*labels, event.kind).inc()

    def _pruned(self, event: RetentionPruned) -> None:
        self.prunes.inc()
        self.pruned.inc(event.runs)

    def _rejected(self, event: ClaimRejected) -> None:
        self.claims.inc()
        self.claim_rejections.labels(reason=event.reason).inc()

    def _lost(self, event: RunLost) -> None:
        # As the start found it: unresolved (waits for an operator), failed (an
        # idempotent job's, retried) or paused (a recoverable job's).
        outcome = _LOST_OUTCOMES.get(event.action, event.action)
        self.runs.labels(outcome=outcome, cause="lost").inc()
        labels = self.job_labels(event.job) if event.job is not None else None
        if labels is None:
            return
        self.job_runs.labels(*labels, outcome).inc()
        if outcome == "failed":
            self.job_last_failure.labels(*labels).set(self.clock.now().timestamp())

    def _refresh(self, event: Refreshed) -> None:
        self.refreshes.inc()
        self.refresh_duration.observe(event.elapsed_ms / 1000.0)


#: What the start made of a run a crash left (``RunLost.action``), as a run's outcome.
_LOST_OUTCOMES: Final = {"unresolved": "unresolved", "retried": "failed", "paused": "paused"}

_HANDLERS: Final[dict[type[Event], Callable[[Metrics, Any], None]]] = {
    NotificationWake: lambda m, _e: m.wakes.labels(kind="notification").inc(),
    DispatchWake: lambda m, _e: m.wakes.labels(kind="dispatch").inc(),
    LifecycleWake: lambda m, _e: m.wakes.labels(kind="lifecycle").inc(),
    Refreshed: Metrics._refresh,
    RunFinished: Metrics._run,
    ClaimRejected: Metrics._rejected,
    ClaimGranted: lambda m, _e: m.claims.inc(),
    RunGivenBack: lambda m, _e: m.given_back.inc(),
    RunLost: Metrics._lost,
    ResultHeld: lambda m, _e: m.retained.inc(),
    ResultSaved: lambda m, _e: m.saved.inc(),
    ResultSpooled: lambda m, _e: m.spooled.inc(),
    AlertSent: Metrics._alert_sent,
    AlertSuppressed: Metrics._alert_suppressed,
    AlertFailed: lambda m, e: m.alert_failures.labels(sink=e.sink).inc(),
    RetentionPruned: Metrics._pruned,
}


@attrs.frozen
class _Scoped:
    """A registry's collection without the samples of namespaces outside ``namespaces``
    (what :func:`generate_latest` reads: anything with ``collect()``)."""

    registry: CollectorRegistry
    namespaces: frozenset[str]

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            kept.samples = [
                s
                for s in metric.samples
                if s.labels.get("namespace", None) in (None, *self.namespaces)
            ]
            yield kept
