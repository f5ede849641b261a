"""Prometheus metrics, fed by the daemon's event log and read at scrape time.

Nothing here runs on its own: counters and histograms move when the daemon logs an event
(:meth:`Metrics.observe` is an :class:`~coordinator.log.EventLog` observer), and the
gauges (armed deadlines, running calls, retained results) are read from a daemon
snapshot when ``/metrics`` is scraped. No timer, no SQL.

Event to series (field names as :mod:`coordinator.daemon` logs them):

======================  ===============================================================
``wake``                ``coordinator_wakes_total{kind}``: ``notification`` (has
                        ``payload``), ``dispatch`` (has ``dispatch``), else ``lifecycle``
``refresh``             ``coordinator_refreshes_total``,
                        ``coordinator_refresh_duration_seconds`` (``elapsed_ms``)
``job.run``             ``coordinator_claims_total`` (a run was claimed; counted when its
                        call is logged), ``coordinator_runs_total{outcome,cause}``,
                        ``coordinator_run_duration_seconds`` (``elapsed_ms``),
                        ``coordinator_dispatch_lateness_seconds`` (``lateness_ms``:
                        actual start minus deadline; scheduled runs only)
``claim.rejected``      ``coordinator_claims_total`` and
                        ``coordinator_claim_rejections_total{reason}``
``settle.retained``     ``coordinator_results_retained_total``
``settle.saved``        ``coordinator_results_saved_total`` (a retained result saved later)
``settle.spooled``      ``coordinator_results_spooled_total``
``sql``                 ``coordinator_sql_statements_total`` (by ``statements``, default 1)
======================  ===============================================================

``coordinator_sql_statements_total`` is the daemon's own count of statements it sent, for
dashboards; the store calls :meth:`Metrics.count_statement` per statement (or logs an
``sql`` event). Proofs of idle silence still use the server's accounting.

The observer only sees what the log passes on: events below the log level are dropped
before observers run, and ``wake`` is logged at ``debug`` for lifecycle wakes and
dispatches, so at the default level those wakes are not counted.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

__all__ = ["CONTENT_TYPE", "Gauges", "Metrics"]

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


class Gauges(Protocol):
    """What the gauges read from the daemon at scrape time."""

    @property
    def armed_deadlines(self) -> int: ...
    @property
    def running_calls(self) -> int: ...
    @property
    def retained_results(self) -> int: ...


_GAUGES: Final = (
    ("armed_deadlines", "Jobs with an armed timer (a saved deadline)."),
    ("running_calls", "Calls running now."),
    ("retained_results", "Results the database has not acknowledged yet."),
)


class _GaugeCollector:
    """Reads the daemon's snapshot when the registry is collected (no timer)."""

    def __init__(self, owner: Metrics) -> None:
        self._owner = owner

    def describe(self) -> Iterator[Metric]:
        yield from self._families(None)

    def collect(self) -> Iterator[Metric]:
        source = self._owner.gauges
        yield from self._families(source() if source is not None else None)

    def _families(self, snapshot: Gauges | None) -> Iterator[Metric]:
        values = (
            (snapshot.armed_deadlines, snapshot.running_calls, snapshot.retained_results)
            if snapshot is not None
            else (None, None, None)
        )
        for (name, doc), value in zip(_GAUGES, values, strict=True):
            family = GaugeMetricFamily(f"{_NAMESPACE}_{name}", doc)
            if value is not None:
                family.add_metric([], float(value))
            yield family


class Metrics:
    """The daemon's metrics, in a private registry (nothing global is touched).

    Wire it up with ``log.observers.append(metrics.observe)`` and, for the gauges,
    ``metrics.gauges = lambda: view.status()`` (anything with the :class:`Gauges`
    properties). Until ``gauges`` is set the three gauges are exported without samples.
    """

    def __init__(self, *, gauges: Callable[[], Gauges] | None = None) -> None:
        #: Called at scrape time for the gauge values; ``None`` until the daemon is known.
        self.gauges = gauges
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
        self.sql_statements = Counter(
            "sql_statements",
            "SQL statements the daemon sent, by its own count (proofs use the server's).",
            namespace=ns,
            registry=r,
        )
        r.register(_GaugeCollector(self))

    # -- input --------------------------------------------------------------------------

    def observe(self, record: Mapping[str, Any]) -> None:
        """An :class:`~coordinator.log.EventLog` observer. Never raises on odd fields."""
        handler = _HANDLERS.get(str(record.get("event")))
        if handler is not None:
            handler(self, record)

    def count_statement(self, n: int = 1) -> None:
        """The store calls this for every statement it sends (``n`` at once for a batch)."""
        if n > 0:
            self.sql_statements.inc(n)

    # -- output -------------------------------------------------------------------------

    def render(self) -> bytes:
        """Everything, in the Prometheus text format (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    # -- event handlers -----------------------------------------------------------------

    def _wake(self, record: Mapping[str, Any]) -> None:
        if "payload" in record:
            kind = "notification"
        elif "dispatch" in record:
            kind = "dispatch"
        else:
            kind = "lifecycle"
        self.wakes.labels(kind=kind).inc()

    def _refresh(self, record: Mapping[str, Any]) -> None:
        self.refreshes.inc()
        seconds = _seconds(record.get("elapsed_ms"))
        if seconds is not None:
            self.refresh_duration.observe(seconds)

    def _run(self, record: Mapping[str, Any]) -> None:
        self.claims.inc()
        self.runs.labels(
            outcome=_label(record.get("outcome")), cause=_label(record.get("cause"))
        ).inc()
        duration = _seconds(record.get("elapsed_ms"))
        if duration is not None:
            self.run_duration.observe(max(0.0, duration))
        lateness = _seconds(record.get("lateness_ms"))
        if lateness is not None:
            self.lateness.observe(lateness)

    def _rejected(self, record: Mapping[str, Any]) -> None:
        self.claims.inc()
        self.claim_rejections.labels(reason=_label(record.get("reason"))).inc()

    def _sql(self, record: Mapping[str, Any]) -> None:
        count = record.get("statements", 1)
        self.count_statement(count if isinstance(count, int) else 1)


_HANDLERS: Final[dict[str, Callable[[Metrics, Mapping[str, Any]], None]]] = {
    "wake": Metrics._wake,
    "refresh": Metrics._refresh,
    "job.run": Metrics._run,
    "claim.rejected": Metrics._rejected,
    "settle.retained": lambda m, _r: m.retained.inc(),
    "settle.saved": lambda m, _r: m.saved.inc(),
    "settle.spooled": lambda m, _r: m.spooled.inc(),
    "sql": Metrics._sql,
}


def _seconds(milliseconds: object) -> float | None:
    """A logged ``*_ms`` field as seconds; ``None`` when absent or not a finite number."""
    if isinstance(milliseconds, bool) or not isinstance(milliseconds, (int, float)):
        return None
    if not math.isfinite(milliseconds):
        return None
    return float(milliseconds) / 1000.0


def _label(value: object) -> str:
    """A label value: absent fields (the log drops ``None``) become ``none``."""
    return "none" if value is None else str(value)
