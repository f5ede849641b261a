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
``RunFinished``            ``coordinator_claims_total`` (a granted claim, counted when
                           its run ends), ``coordinator_runs_total{outcome,cause}``,
                           ``coordinator_run_duration_seconds``,
                           ``coordinator_dispatch_lateness_seconds`` (scheduled runs)
``ClaimRejected``          ``coordinator_claims_total``,
                           ``coordinator_claim_rejections_total{reason}``
``ResultHeld``             ``coordinator_results_retained_total``
``ResultSaved``            ``coordinator_results_saved_total``
``ResultSpooled``          ``coordinator_results_spooled_total``
=========================  ===========================================================

From the snapshot: ``coordinator_armed_deadlines``, ``coordinator_running_calls``,
``coordinator_retained_results``, ``coordinator_degraded`` (1 while degraded; the
reasons are in ``/api/status``) and ``coordinator_sql_statements_total`` (counted where
the store sends; proofs of idle silence still use the server's accounting).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..events import (
    ClaimRejected,
    DispatchWake,
    Event,
    LifecycleWake,
    NotificationWake,
    Refreshed,
    ResultHeld,
    ResultSaved,
    ResultSpooled,
    RunFinished,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ..status import DaemonStatus

__all__ = ["CONTENT_TYPE", "Metrics"]

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
)


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
        values: tuple[float | None, ...] = (None, None, None, None)
        if snapshot is not None:
            values = (
                snapshot.armed_deadlines,
                snapshot.running_calls,
                snapshot.held_results,
                1 if snapshot.state == "degraded" else 0,
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


class Metrics:
    """The daemon's metrics, in a private registry (nothing global is touched).

    Wire it up with ``events.subscribe(metrics.observe)`` and ``status=daemon.status``
    (for the gauges). Without ``status`` the gauges are exported without samples.
    """

    def __init__(self, *, status: Callable[[], DaemonStatus] | None = None) -> None:
        #: Called at scrape time for the gauge values; ``None`` until the daemon is known.
        self.status = status
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
            "runs", "Runs finished, by outcome and error cause.", ["outcome", "cause"],
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
        self.spooled = Counter(
            "results_spooled",
            "Results written to the spool at stop because the database still refused them.",
            namespace=ns,
            registry=r,
        )
        r.register(_SnapshotCollector(self))

    # -- input --------------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        """An :class:`~coordinator.events.EventBus` subscriber (matches on type)."""
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    # -- output -------------------------------------------------------------------------

    def render(self) -> bytes:
        """Everything, in the Prometheus text format (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    # -- event handlers -----------------------------------------------------------------

    def _run(self, event: RunFinished) -> None:
        self.claims.inc()
        self.runs.labels(outcome=event.outcome, cause=event.cause or "none").inc()
        self.run_duration.observe(max(0.0, event.elapsed_s))
        if event.lateness_s is not None:
            self.lateness.observe(event.lateness_s)

    def _rejected(self, event: ClaimRejected) -> None:
        self.claims.inc()
        self.claim_rejections.labels(reason=event.reason).inc()

    def _refresh(self, event: Refreshed) -> None:
        self.refreshes.inc()
        self.refresh_duration.observe(event.elapsed_ms / 1000.0)


_HANDLERS: Final[dict[type[Event], Callable[[Metrics, Any], None]]] = {
    NotificationWake: lambda m, _e: m.wakes.labels(kind="notification").inc(),
    DispatchWake: lambda m, _e: m.wakes.labels(kind="dispatch").inc(),
    LifecycleWake: lambda m, _e: m.wakes.labels(kind="lifecycle").inc(),
    Refreshed: Metrics._refresh,
    RunFinished: Metrics._run,
    ClaimRejected: Metrics._rejected,
    ResultHeld: lambda m, _e: m.retained.inc(),
    ResultSaved: lambda m, _e: m.saved.inc(),
    ResultSpooled: lambda m, _e: m.spooled.inc(),
}
