"""coordinator.schedule against cronsim, an independent implementation of cron's DST rule.

cronsim (test-only dependency) follows Vixie/Debian cron: jobs at particular times are
moved out of a spring-forward gap and not re-run in a fall-back overlap; jobs whose minute
or hour field starts with ``*`` follow the new wall time as it comes. Our deadlines, chained
the way the daemon chains them (each one computed from the previous), must be exactly
cronsim's firings, converted to UTC, except for the differences named in
``KNOWN_DIFFERENCES`` and justified in docs/schedules.md.

Coverage (see ``windows``; cronsim takes 10-40 µs a firing, and this runs in CI on two
cores): all of 2026 for the ten expressions firing at most twice a day; for the four
firing hourly or so, a day either side of each month's start and two days either side of
each DST transition the zone has in 2026; for the two firing every few minutes, January
1-3 and two days either side of each transition. A one-off run over all of 2026 for every
expression and zone (466,192 firings) found nothing more than ``KNOWN_DIFFERENCES``.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from itertools import takewhile
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim

from coordinator.model import Schedule
from coordinator.schedule import following_deadline, initial_deadline

if TYPE_CHECKING:
    from collections.abc import Iterator

ZONES = [
    "UTC",
    "Asia/Kolkata",  # +05:30, no DST
    "Europe/Berlin",  # 2026-03-29 02:00 -> 03:00, 2026-10-25 03:00 -> 02:00
    "America/New_York",  # 2026-03-08 02:00 -> 03:00, 2026-11-01 02:00 -> 01:00
    "Australia/Lord_Howe",  # 30-minute DST: 2026-04-05 02:00 -> 01:30, 2026-10-04 02:00 -> 02:30
    "America/Santiago",  # at midnight: 2026-04-05 00:00 -> 04-04 23:00, 2026-09-06 00:00 -> 01:00
]

#: expression -> the spans compared (see ``windows``): cronsim takes 10-40 µs a firing, so
#: a full year only for expressions firing a few times a day at most.
EXPRESSIONS = {
    "*/15 * * * *": "dst",
    "*/5 1-3 * * *": "dst",
    "7 * * * *": "months",
    "0 */2 * * *": "months",
    "@hourly": "months",
    "0-59/10 1-2 * * *": "months",  # every 10 minutes, but a fixed-time job (no leading '*')
    "30 2 * * *": "year",
    "15,45 2 * * *": "year",
    "30 1 * * *": "year",
    "0 3 * * *": "year",
    "0 0 * * *": "year",
    "30 23 * * *": "year",
    "@daily": "year",
    "0 9 * * 1-5": "year",
    "0 2 * * 0": "year",
    "0 0 1 * *": "year",
}

#: Differences from cronsim, each justified in docs/schedules.md ("Differences from
#: cronsim"): (expression, zone) -> (UTC firings only we have, UTC firings only cronsim has).
#: The test fails if one of them stops happening, too.
KNOWN_DIFFERENCES = {
    ("0 */2 * * *", "Australia/Lord_Howe"): (
        # 2026-04-05 02:00 +10:30. Lord Howe falls back from 02:00 +11 to 01:30 +10:30, so
        # the clock shows 02:00 once, 30 minutes later. cronsim advances a wildcard hour by
        # 3600 s from 01:00 +11, lands on 02:30 +10:30 and passes over it; Vixie cron, which
        # reads the clock every minute, runs the job at 02:00, and so do we.
        [datetime(2026, 4, 4, 15, 30, tzinfo=UTC)],
        [],
    ),
}

#: cronsim reads no aliases; these are Vixie cron's own expansions of them.
ALIASES = {"@hourly": "0 * * * *", "@daily": "0 0 * * *"}

YEAR_START = datetime(2026, 1, 1, tzinfo=UTC)
YEAR_END = datetime(2027, 1, 1, tzinfo=UTC)
DAY = timedelta(days=1)


@functools.cache
def transitions(zone_name: str) -> tuple[datetime, ...]:
    """The UTC instants of 2026 at which the zone's offset changes (to the minute)."""
    zone = ZoneInfo(zone_name)

    def offset(moment: datetime) -> timedelta | None:
        return moment.astimezone(zone).utcoffset()

    found: list[datetime] = []
    step = timedelta(hours=6)
    moment = YEAR_START
    while moment < YEAR_END:
        if offset(moment) != offset(moment + step):
            low, high = moment, moment + step
            while high - low > timedelta(minutes=1):
                middle = low + timedelta(minutes=(high - low) // timedelta(minutes=2))
                low, high = (middle, high) if offset(middle) == offset(low) else (low, middle)
            found.append(high)
        moment += step
    return tuple(found)


def windows(expression: str, zone_name: str) -> list[tuple[datetime, datetime]]:
    """The UTC spans ``[start, end)`` compared, in order, not overlapping.

    ``year``: all of 2026. ``dst``: January 1-3 and two days either side of each of the
    zone's transitions. ``months``: those, and a day either side of every month's start.
    """
    coverage = EXPRESSIONS[expression]
    if coverage == "year":
        return [(YEAR_START, YEAR_END)]
    spans = [(YEAR_START, YEAR_START + 3 * DAY)]
    spans += [(jump - 2 * DAY, jump + 2 * DAY) for jump in transitions(zone_name)]
    if coverage == "months":
        starts = [datetime(2026, month, 1, tzinfo=UTC) for month in range(2, 13)]
        spans += [(start - DAY, start + DAY) for start in starts]
        spans.append((YEAR_END - DAY, YEAR_END))
    merged: list[tuple[datetime, datetime]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def ours(expression: str, zone_name: str, start: datetime, end: datetime) -> list[datetime]:
    schedule = Schedule(kind="cron", expression=expression, timezone=zone_name)
    out: list[datetime] = []
    moment = initial_deadline(schedule, start)
    while moment is not None and moment < end:
        assert moment.tzinfo is UTC
        out.append(moment)
        following = following_deadline(schedule, moment)
        assert following is not None
        assert following > moment
        moment = following
    return out


def theirs(expression: str, zone_name: str, start: datetime, end: datetime) -> list[datetime]:
    local_start = start.astimezone(ZoneInfo(zone_name))
    firings: Iterator[datetime] = CronSim(ALIASES.get(expression, expression), local_start)
    utc = (firing.astimezone(UTC) for firing in firings)
    return list(takewhile(lambda firing: firing < end, utc))


def test_the_zones_have_the_transitions_the_docs_name() -> None:
    assert transitions("UTC") == transitions("Asia/Kolkata") == ()
    assert transitions("Europe/Berlin") == (
        datetime(2026, 3, 29, 1, tzinfo=UTC),
        datetime(2026, 10, 25, 1, tzinfo=UTC),
    )
    assert transitions("Australia/Lord_Howe") == (
        datetime(2026, 4, 4, 15, tzinfo=UTC),
        datetime(2026, 10, 3, 15, 30, tzinfo=UTC),
    )
    for zone_name in ZONES[2:]:
        assert len(transitions(zone_name)) == 2


@pytest.mark.parametrize("zone_name", ZONES)
@pytest.mark.parametrize("expression", list(EXPRESSIONS))
def test_every_firing_matches_cronsim(expression: str, zone_name: str) -> None:
    only_ours: list[datetime] = []
    only_theirs: list[datetime] = []
    for start, end in windows(expression, zone_name):
        expected = theirs(expression, zone_name, start, end)
        assert expected, "cronsim fired nothing: the comparison would be empty"
        got = ours(expression, zone_name, start, end)
        only_ours += sorted(set(got) - set(expected))
        only_theirs += sorted(set(expected) - set(got))
    assert (only_ours, only_theirs) == KNOWN_DIFFERENCES.get((expression, zone_name), ([], []))
