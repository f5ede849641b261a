"""Adaptive stats buckets (coordinator.buckets): the width chosen at its boundaries, and
8 to 30 aligned buckets for any span of 8 hours or more."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator import buckets
from coordinator.errors import InvalidInput

MIDNIGHT = datetime(2026, 3, 2, tzinfo=UTC)  # a Monday
H = timedelta(hours=1)


def choose(span: timedelta, until: datetime = MIDNIGHT + timedelta(days=400)) -> buckets.Buckets:
    return buckets.choose(until - span, until)


@pytest.mark.parametrize(
    ("span", "unit", "step"),
    [
        (8 * H, "hour", 1),
        (29 * H, "hour", 1),
        (30 * H, "hour", 2),  # aligned on the hour, 30 h touch 31 hourly buckets
        (2 * 24 * H, "hour", 2),
        (7 * 24 * H, "hour", 6),
        (14 * 24 * H, "hour", 12),
        (29 * 24 * H, "day", 1),
        (30 * 24 * H, "day", 2),
        (57 * 24 * H, "day", 2),
        (61 * 24 * H, "week", 1),
        (183 * 24 * H, "week", 1),
        (365 * 24 * H, "week", 2),
        (2 * 365 * 24 * H, "month", 1),
        (10 * 365 * 24 * H, "month", 6),
        (25 * 365 * 24 * H, "month", 12),
        (50 * 365 * 24 * H, "month", 24),
    ],
)
def test_the_width_at_its_boundaries(span: timedelta, unit: str, step: int) -> None:
    chosen = choose(span)
    assert (chosen.unit, chosen.step) == (unit, step)
    assert chosen.count <= buckets.MAX_BUCKETS


def test_exactly_thirty_aligned_hours_stay_hourly_and_one_more_does_not() -> None:
    until = MIDNIGHT + timedelta(hours=29, minutes=59)
    assert buckets.choose(MIDNIGHT, until).count == 30
    assert buckets.choose(MIDNIGHT, until).unit == "hour"
    past = buckets.choose(MIDNIGHT, MIDNIGHT + timedelta(hours=30))
    assert (past.unit, past.step, past.count) == ("hour", 2, 16)


def test_buckets_are_aligned_and_cover_the_span() -> None:
    since = datetime(2026, 1, 15, 13, 37, tzinfo=UTC)
    until = datetime(2026, 7, 1, 8, 0, tzinfo=UTC)
    chosen = buckets.choose(since, until)
    assert chosen.unit == "week"
    assert chosen.edges[0].weekday() == 0  # weeks start on Monday, at midnight UTC
    assert chosen.edges[0].time().hour == 0
    assert chosen.edges[0] <= since < chosen.edges[1]
    assert chosen.edges[-2] <= until < chosen.edges[-1]


def test_months_are_calendar_months() -> None:
    chosen = buckets.choose(datetime(2024, 1, 31, tzinfo=UTC), datetime(2026, 2, 10, tzinfo=UTC))
    assert chosen.unit == "month"
    assert all(edge.day == 1 for edge in chosen.edges)
    assert chosen.edges[0] == datetime(2024, 1, 1, tzinfo=UTC)
    assert chosen.width in ("month", "2 months")


@settings(max_examples=400, deadline=None)
@given(
    start=st.datetimes(
        min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    ),
    seconds=st.integers(min_value=8 * 3600, max_value=300 * 365 * 86400),
)
def test_any_span_of_eight_hours_or_more_gets_eight_to_thirty_buckets(
    start: datetime, seconds: int
) -> None:
    until = start + timedelta(seconds=seconds)
    chosen = buckets.choose(start, until)
    assert buckets.MIN_BUCKETS <= chosen.count <= buckets.MAX_BUCKETS
    assert chosen.edges[0] <= start
    assert chosen.edges[-1] > until
    assert list(chosen.edges) == sorted(chosen.edges)


def test_a_short_span_is_hourly() -> None:
    chosen = buckets.choose(MIDNIGHT, MIDNIGHT + timedelta(minutes=90))
    assert (chosen.unit, chosen.step, chosen.count) == ("hour", 1, 2)


@pytest.mark.parametrize(
    ("since", "until", "field"),
    [
        (MIDNIGHT, MIDNIGHT, "since"),
        (MIDNIGHT + H, MIDNIGHT, "since"),
        (datetime(2026, 1, 1), MIDNIGHT, "since"),
        (MIDNIGHT, datetime(2026, 5, 1), "until"),
        (datetime(1960, 1, 1, tzinfo=UTC), MIDNIGHT, "since"),
    ],
)
def test_bad_spans_are_refused_naming_the_field(
    since: datetime, until: datetime, field: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        buckets.choose(since, until)
    assert caught.value.field == field
