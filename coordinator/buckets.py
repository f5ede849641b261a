"""Adaptive time buckets for run statistics (``GET /api/jobs/{ns}/{name}/stats``, the
web page's sparklines).

A span of history is cut into 8 to 30 buckets whatever its length, so a sparkline of two
days and one of six months are equally readable. A bucket is a whole number of one
unit — ``hour``, ``day``, ``week`` or ``month`` — aligned in UTC (hours on multiples of
the step from midnight, days and weeks from the Unix epoch's first Monday, weeks starting
on Monday, months on multiples of the step from January). :func:`choose` takes the
finest width whose aligned buckets covering ``[since, until]`` number at most 30; the
widths grow by at most 3.5x (2 days to a week), so the chosen one gives at least 8
buckets for any span of 8 hours or more. A shorter span gets hourly buckets (fewer
than 8): there is no finer unit.

The buckets' edges go to PostgreSQL as one ``timestamptz[]`` for ``width_bucket``, so
calendar months need no arithmetic in SQL (:func:`coordinator.client.run_stats`).

Layering: a value module (pure, no clock: ``until`` is passed in).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final, Literal

import attrs

from .errors import InvalidInput

Unit = Literal["hour", "day", "week", "month"]
UNITS: Final[tuple[Unit, ...]] = ("hour", "day", "week", "month")

#: Fewest and most buckets a span is cut into (fewer only below 8 hours).
MIN_BUCKETS: Final = 8
MAX_BUCKETS: Final = 30

#: Bucket widths tried, finest first: (unit, step).
WIDTHS: Final[tuple[tuple[Unit, int], ...]] = (
    ("hour", 1), ("hour", 2), ("hour", 3), ("hour", 6), ("hour", 12),
    ("day", 1), ("day", 2),
    ("week", 1), ("week", 2),
    ("month", 1), ("month", 2), ("month", 3), ("month", 6), ("month", 12),
)  # fmt: skip

_FIXED: Final = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(weeks=1)}
#: Origin of day and week buckets: a Monday at midnight UTC (1970-01-05).
_ORIGIN: Final = datetime(1970, 1, 5, tzinfo=UTC)
#: Oldest ``since`` accepted (also keeps month arithmetic within datetime's range).
EARLIEST: Final = datetime(1970, 1, 1, tzinfo=UTC)


@attrs.frozen(kw_only=True)
class Buckets:
    """Consecutive buckets covering a span: ``edges[i] <= t < edges[i + 1]`` is bucket i."""

    #: ``hour``, ``day``, ``week`` or ``month``.
    unit: Unit
    #: How many units one bucket spans (1, 2, 3, 6, 12...).
    step: int
    #: The requested span (``since`` is inside the first bucket, ``until`` inside the last).
    since: datetime
    until: datetime
    #: Bucket boundaries, ``count + 1`` of them, ascending, aware UTC.
    edges: tuple[datetime, ...]

    @property
    def count(self) -> int:
        return len(self.edges) - 1

    @property
    def width(self) -> str:
        """The width in words: ``hour``, ``2 hours``, ``week``, ``3 months``."""
        return self.unit if self.step == 1 else f"{self.step} {self.unit}s"

    def spans(self) -> list[tuple[datetime, datetime]]:
        """Each bucket's ``(start, end)``."""
        return list(zip(self.edges, self.edges[1:], strict=False))


def choose(since: datetime, until: datetime) -> Buckets:
    """The finest width that cuts ``[since, until]`` into at most 30 aligned buckets."""
    for value, name in ((since, "since"), (until, "until")):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidInput(name, "must be an aware datetime (with a timezone)")
    since, until = since.astimezone(UTC), until.astimezone(UTC)
    if since < EARLIEST:
        raise InvalidInput("since", f"must be after {EARLIEST.date().isoformat()}")
    if since >= until:
        raise InvalidInput("since", "must be earlier than now (or than until)")
    for unit, step in WIDTHS:
        edges = _edges(unit, step, since, until)
        if edges is not None:
            return Buckets(unit=unit, step=step, since=since, until=until, edges=edges)
    step = 24
    while True:  # decades: yearly steps doubled until 30 buckets hold the span
        edges = _edges("month", step, since, until)
        if edges is not None:
            return Buckets(unit="month", step=step, since=since, until=until, edges=edges)
        step *= 2


def _edges(unit: Unit, step: int, since: datetime, until: datetime) -> tuple[datetime, ...] | None:
    """The aligned edges covering ``[since, until]``, or ``None`` past 30 buckets."""
    edge = align(unit, step, since)
    edges = [edge]
    while edge <= until:
        edge = advance(unit, step, edge)
        edges.append(edge)
        if len(edges) > MAX_BUCKETS + 1:
            return None
    return tuple(edges)


def align(unit: Unit, step: int, moment: datetime) -> datetime:
    """The start of the bucket of ``unit`` x ``step`` holding ``moment`` (UTC)."""
    moment = moment.astimezone(UTC)
    if unit == "month":
        index = moment.year * 12 + moment.month - 1
        index -= index % step
        return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)
    if unit == "hour":
        midnight = moment.replace(hour=0, minute=0, second=0, microsecond=0)
        return midnight + timedelta(hours=moment.hour - moment.hour % step)
    width = _FIXED[unit] * step
    return _ORIGIN + ((moment - _ORIGIN) // width) * width


def advance(unit: Unit, step: int, edge: datetime) -> datetime:
    """The next edge after the aligned ``edge``."""
    if unit == "month":
        index = edge.year * 12 + edge.month - 1 + step
        return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)
    return edge + _FIXED[unit] * step


__all__ = ["EARLIEST", "MAX_BUCKETS", "MIN_BUCKETS", "UNITS", "WIDTHS", "Buckets", "choose"]
