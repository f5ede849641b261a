"""coordinator.schedule: durations, validation, normalisation and deadlines (pure, no DB)."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from coordinator.errors import InvalidInput, InvalidSchedule
from coordinator.model import Schedule
from coordinator.schedule import (
    MAX_DURATION,
    check_duration,
    firings_between,
    following_deadline,
    format_duration,
    initial_deadline,
    invalid_reason,
    normalize,
    parse_duration,
    validate,
    validate_timezone,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

PROPERTY = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def cron(expression: str, timezone: str = "UTC") -> Schedule:
    return Schedule(kind="cron", expression=expression, timezone=timezone)


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def series(schedule: Schedule, start: datetime, count: int) -> list[datetime]:
    out: list[datetime] = []
    moment = start
    for _ in range(count):
        following = following_deadline(schedule, moment)
        assert following is not None
        out.append(following)
        moment = following
    return out


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90", timedelta(seconds=90)),
        ("90s", timedelta(seconds=90)),
        ("500ms", timedelta(milliseconds=500)),
        ("5m", timedelta(minutes=5)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("2d", timedelta(days=2)),
        ("1h 30m", timedelta(hours=1, minutes=30)),
        ("1.5h", timedelta(hours=1, minutes=30)),
        ("1W", timedelta(weeks=1)),
        ("1H30M", timedelta(hours=1, minutes=30)),
        ("  5 m ", timedelta(minutes=5)),
        ("1m30s250ms", timedelta(seconds=90, milliseconds=250)),
        ("0.5s", timedelta(milliseconds=500)),
        (".25h", timedelta(minutes=15)),
        ("1.5ms", timedelta(microseconds=1500)),
        ("1d2h3m4s5ms", timedelta(days=1, hours=2, minutes=3, seconds=4, milliseconds=5)),
    ],
)
def test_parse_duration_accepts(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("5x", "'5x': unknown unit 'x' (use ms, s, m, h, d, w)"),
        ("", "empty duration"),
        ("   ", "empty duration"),
        ("-5m", "must be positive"),
        ("0", "greater than zero"),
        ("0s", "greater than zero"),
        ("0h0m", "greater than zero"),
        ("1h 30", "'30' has no unit"),
        ("30m1h", "largest to smallest"),
        ("1m1m", "largest to smallest"),
        ("abc", "unexpected 'a'"),
        ("5m!", "unexpected '!'"),
        ("1e3s", "unknown unit 'e'"),
        ("5 sec", "unknown unit 'sec'"),
        ("0.0000001s", "finer than a microsecond"),
        ("9" * 40 + "d", "too large"),
        ("999999999w", "at most 3650d, not 999999999w"),
        ("3651d", "at most 3650d, not 3651d"),
        ("3000000d", "at most 3650d, not 3000000d"),
        ("3650d 0.001ms", "at most 3650d, not 3650d 0.001ms"),
        ("3000000d\n1h", "at most 3650d, not 3000000d 1h"),  # shown on one line
        ("521w4d", "at most 3650d, not 521w4d"),
    ],
)
def test_parse_duration_rejects(text: str, reason: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_duration(text, field="timeout")
    assert info.value.field == "timeout"
    assert reason in info.value.reason
    assert not isinstance(info.value, InvalidSchedule)


def test_parse_duration_accepts_the_bound() -> None:
    assert timedelta(days=3650) == MAX_DURATION
    assert parse_duration("3650d") == MAX_DURATION
    assert parse_duration("521w3d") == MAX_DURATION
    assert parse_duration("3649d23h59m59s999.999ms") == MAX_DURATION - timedelta(microseconds=1)


def test_check_duration() -> None:
    assert check_duration(MAX_DURATION, "timeout") == MAX_DURATION
    with pytest.raises(InvalidInput) as info:
        check_duration(timedelta(days=3000000), "timeout")
    assert str(info.value) == "timeout: at most 3650d, not 3000000d"
    with pytest.raises(InvalidInput, match=r"^timeout: at most 3650d, not 3650d0\.001ms$"):
        check_duration(MAX_DURATION + timedelta(microseconds=1), "timeout")


def test_parse_duration_unit_required() -> None:
    """What a person types must say its unit; the SQL API still reads a bare number."""
    with pytest.raises(InvalidInput, match=r"--every: '5': a unit is required: 5s or 5m\?"):
        parse_duration("5", field="--every", unit_required=True)
    assert parse_duration("5m", unit_required=True) == timedelta(minutes=5)
    assert parse_duration("5") == timedelta(seconds=5)


def test_parse_duration_default_field() -> None:
    with pytest.raises(InvalidInput, match=r"^duration: '5x': unknown unit 'x'"):
        parse_duration("5x")


@pytest.mark.parametrize(
    ("duration", "text"),
    [
        (timedelta(hours=1, minutes=30), "1h30m"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(milliseconds=500), "500ms"),
        (timedelta(days=9, seconds=1), "9d1s"),
        (timedelta(microseconds=1500), "1.5ms"),
        (timedelta(microseconds=1), "0.001ms"),
        (timedelta(0), "0s"),
    ],
)
def test_format_duration(duration: timedelta, text: str) -> None:
    assert format_duration(duration) == text


def test_format_duration_rejects_negative() -> None:
    with pytest.raises(ValueError, match="negative"):
        format_duration(timedelta(seconds=-1))


@PROPERTY
@given(st.timedeltas(min_value=timedelta(microseconds=1), max_value=MAX_DURATION))
def test_format_duration_round_trips(duration: timedelta) -> None:
    text = format_duration(duration)
    assert parse_duration(text) == duration
    assert format_duration(parse_duration(text)) == text


# --------------------------------------------------------------------------- timezones


def test_validate_timezone() -> None:
    assert validate_timezone("Europe/Berlin") == ZoneInfo("Europe/Berlin")
    for bad in ["Mars/Base", "", "America", "../etc/passwd", "/etc/localtime", "localtime"]:
        with pytest.raises(InvalidSchedule) as info:
            validate_timezone(bad, field="--tz")
        assert info.value.field == "--tz"
        assert "IANA" in info.value.reason


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("schedule", "field", "reason"),
    [
        (cron("60 * * * *"), "cron", "minute field '60': out of range"),
        (cron("* 24 * * *"), "cron", "hour field '24': out of range"),
        (cron("* * 32 * *"), "cron", "day-of-month field '32'"),
        (cron("* * * 13 *"), "cron", "month field '13'"),
        (cron("* * * * 8"), "cron", "day-of-week field '8'"),
        (cron("*/0 * * * *"), "cron", "step '0'"),
        (cron("x * * * *"), "cron", "minute field 'x'"),
        (cron("0 0 30 2 *"), "cron", "'0 0 30 2 *': day 30 never occurs in February"),
        (cron("0 0 31 4,6 *"), "cron", "day 31 never occurs in April or June"),
        (cron("0 0 30,31 2 *"), "cron", "days 30, 31 never occur in February"),
        (cron("* * * * * *"), "cron", "expected 5 fields"),
        (cron("0 0 1 1 * 2030"), "cron", "expected 5 fields"),
        (cron("* * * *"), "cron", "got 4"),
        (cron("@reboot"), "cron", "'@reboot' is not supported"),
        (cron("@fortnightly"), "cron", "unknown alias"),
        (cron("H * * * *"), "cron", "H, R"),
        (cron("0 R * * *"), "cron", "H, R"),
        (cron(""), "cron", "needs an expression"),
        (Schedule(kind="cron"), "cron", "needs an expression"),
        (cron("0 0 * * *", "Mars/Base"), "timezone", "unknown timezone 'Mars/Base'"),
        (Schedule(kind="interval", expression="5x"), "every", "unknown unit 'x'"),
        (Schedule(kind="interval", expression="500ms"), "every", "at least 1s"),
        (Schedule(kind="interval", expression="3000000d"), "every", "at most 3650d, not 3000000d"),
        (Schedule(kind="interval"), "every", "needs an expression"),
        (Schedule(kind="interval", expression="5m", timezone="Nowhere"), "timezone", "unknown"),
        (Schedule(kind="once", expression="2026-12-01T10:00:00"), "at", "no UTC offset"),
        (Schedule(kind="once", expression="2026-12-01"), "at", "no UTC offset"),
        (Schedule(kind="once", expression="next tuesday"), "at", "not an ISO 8601"),
        (Schedule(kind="once", expression="1969-12-31T23:59:59Z"), "at", "the years 1970 to 9999"),
        (Schedule(kind="once", expression="0001-01-01T00:00:00Z"), "at", "the years 1970 to 9999"),
        (Schedule(kind="once", expression="9999-12-31T23:00:00-05:00"), "at", "out of range"),
        (Schedule(kind="once"), "at", "needs an expression"),
        (Schedule(kind="manual", expression="5m"), "manual", "no expression"),
        (Schedule(kind="manual", timezone="Nowhere"), "timezone", "unknown"),
    ],
)
def test_validate_names_the_field(schedule: Schedule, field: str, reason: str) -> None:
    with pytest.raises(InvalidSchedule) as info:
        validate(schedule)
    assert info.value.field == field
    assert reason in info.value.reason
    assert invalid_reason(schedule) == info.value.reason
    with pytest.raises(InvalidSchedule) as prefixed:
        validate(schedule, field_prefix="jobs[3].")
    assert prefixed.value.field == f"jobs[3].{field}"
    assert prefixed.value.reason == info.value.reason
    with pytest.raises(InvalidSchedule) as normalized:
        normalize(schedule)
    assert normalized.value.field == field


def test_once_naive_rejected_with_advice() -> None:
    reason = invalid_reason(Schedule(kind="once", expression="2026-12-01T10:00:00"))
    assert reason is not None
    assert "add one" in reason
    assert "2026-12-01T10:00:00Z" in reason


@pytest.mark.parametrize(
    "schedule",
    [
        cron("*/5 * * * *"),
        cron("0 9 * * mon-fri", "Europe/Berlin"),
        cron("0 0 L * *"),
        cron("0 0 15W * *"),
        cron("0 0 * * 5#3"),
        cron("0 0 29 2 *"),
        cron("0 0 31 2 mon"),  # Vixie OR: Mondays in February
        cron("59/1 * * * *"),
        Schedule(kind="interval", expression="1s"),
        Schedule(kind="interval", expression="3650d"),
        Schedule(kind="once", expression="1999-12-31T23:59:59Z"),
        Schedule(kind="once", expression="1970-01-01T00:00:00Z"),
        Schedule(kind="once", expression="9999-12-31T23:59:59Z"),
        Schedule(kind="manual"),
    ],
)
def test_valid_schedules(schedule: Schedule) -> None:
    validate(schedule)
    assert invalid_reason(schedule) is None


@pytest.mark.parametrize(
    ("alias", "first_after_epoch"),
    [
        ("@hourly", utc(2026, 1, 1, 1)),
        ("@daily", utc(2026, 1, 2)),
        ("@midnight", utc(2026, 1, 2)),
        ("@weekly", utc(2026, 1, 4)),  # a Sunday
        ("@monthly", utc(2026, 2, 1)),
        ("@yearly", utc(2027, 1, 1)),
        ("@annually", utc(2027, 1, 1)),
        ("@Daily", utc(2026, 1, 2)),
    ],
)
def test_cron_aliases(alias: str, first_after_epoch: datetime) -> None:
    validate(cron(alias))
    assert following_deadline(cron(alias), utc(2026, 1, 1)) == first_after_epoch
    assert normalize(cron(alias)).expression == alias.lower()


@pytest.mark.parametrize(
    ("schedule", "expression"),
    [
        (cron("  0   9\t* *  mon-fri "), "0 9 * * mon-fri"),
        (Schedule(kind="interval", expression="90s"), "1m30s"),
        (Schedule(kind="interval", expression="1h 30m"), "1h30m"),
        (Schedule(kind="interval", expression="1.5h"), "1h30m"),
        (
            Schedule(kind="once", expression="2026-12-01T11:00:00+01:00"),
            "2026-12-01T10:00:00+00:00",
        ),
        (Schedule(kind="once", expression="2026-12-01T10:00Z"), "2026-12-01T10:00:00+00:00"),
        (Schedule(kind="manual"), None),
    ],
)
def test_normalize(schedule: Schedule, expression: str | None) -> None:
    normalized = normalize(schedule)
    assert normalized.expression == expression
    assert normalized.kind == schedule.kind
    assert normalized.timezone == schedule.timezone
    assert normalize(normalized) == normalized


# --------------------------------------------------------------------------- deadlines


def test_interval_deadlines_are_utc_elapsed_time() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    now = datetime(2025, 3, 30, 1, 30, tzinfo=berlin)  # 30 min before the jump
    schedule = Schedule(kind="interval", expression="1h", timezone="Europe/Berlin")
    first = initial_deadline(schedule, now)
    assert first == utc(2025, 3, 30, 1, 30)
    assert first is not None
    assert first.tzinfo is UTC
    assert following_deadline(schedule, first) == utc(2025, 3, 30, 2, 30)


def test_once_deadline_is_owed_even_if_past() -> None:
    schedule = Schedule(kind="once", expression="2020-01-01T12:00:00+02:00")
    deadline = initial_deadline(schedule, utc(2026, 1, 1))
    assert deadline == utc(2020, 1, 1, 10)
    assert deadline is not None
    assert deadline.tzinfo is UTC
    assert following_deadline(schedule, utc(2026, 1, 1)) is None


def test_manual_has_no_deadline() -> None:
    schedule = Schedule(kind="manual")
    assert initial_deadline(schedule, utc(2026, 1, 1)) is None
    assert following_deadline(schedule, utc(2026, 1, 1)) is None


def test_cron_deadline_strictly_after() -> None:
    schedule = cron("0 * * * *")
    assert initial_deadline(schedule, utc(2026, 1, 1, 10)) == utc(2026, 1, 1, 11)
    assert following_deadline(schedule, utc(2026, 1, 1, 10)) == utc(2026, 1, 1, 11)
    assert following_deadline(schedule, utc(2026, 1, 1, 9, 59, 59, 999999)) == utc(2026, 1, 1, 10)


def test_cron_input_timezone_does_not_matter() -> None:
    schedule = cron("30 8 * * *", "Asia/Kolkata")
    expected = utc(2026, 6, 1, 3)  # 08:30 IST
    for zone in ["UTC", "America/New_York", "Australia/Lord_Howe"]:
        now = utc(2026, 6, 1).astimezone(ZoneInfo(zone))
        assert initial_deadline(schedule, now) == expected


@pytest.mark.parametrize(
    "schedule",
    [
        cron("* * * * *"),
        Schedule(kind="interval", expression="5m"),
        Schedule(kind="once", expression="2026-01-01T00:00:00Z"),
        Schedule(kind="manual"),
    ],
)
def test_naive_instants_rejected(schedule: Schedule) -> None:
    naive = datetime(2026, 1, 1)
    with pytest.raises(ValueError, match="timezone-aware"):
        initial_deadline(schedule, naive)
    with pytest.raises(ValueError, match="timezone-aware"):
        following_deadline(schedule, naive)


def test_invalid_schedule_has_no_deadline() -> None:
    with pytest.raises(InvalidSchedule) as info:
        initial_deadline(cron("61 * * * *"), utc(2026, 1, 1))
    assert info.value.field == "cron"
    with pytest.raises(InvalidSchedule):
        following_deadline(Schedule(kind="interval", expression="soon"), utc(2026, 1, 1))


# --------------------------------------------------------------------------- DST, explicit
# 2026: Berlin springs forward 03-29 01:00 UTC (02:00 CET -> 03:00 CEST) and falls back
# 10-25 01:00 UTC (03:00 CEST -> 02:00 CET); New York springs forward 03-08 07:00 UTC
# (02:00 EST -> 03:00 EDT) and falls back 11-01 06:00 UTC (02:00 EDT -> 01:00 EST); Lord
# Howe falls back 04-04 15:00 UTC (02:00 +11 -> 01:30 +10:30) and springs forward 10-03
# 15:30 UTC (02:00 +10:30 -> 02:30 +11). Deadlines are shown as local ISO times.


def local_series(expression: str, timezone: str, start: datetime, count: int) -> list[str]:
    zone = ZoneInfo(timezone)
    deadlines = series(cron(expression, timezone), start, count)
    return [d.astimezone(zone).isoformat(timespec="minutes") for d in deadlines]


@pytest.mark.parametrize(
    ("expression", "timezone", "start", "expected"),
    [
        (
            "30 2 * * *",
            "Europe/Berlin",
            utc(2026, 3, 28),
            ["2026-03-28T02:30+01:00", "2026-03-29T03:00+02:00", "2026-03-30T02:30+02:00"],
        ),
        (
            "30 2 * * *",
            "America/New_York",
            utc(2026, 3, 7),
            ["2026-03-07T02:30-05:00", "2026-03-08T03:00-04:00", "2026-03-09T02:30-04:00"],
        ),
        (
            "@daily",  # Santiago springs forward at midnight: 00:00 -04 -> 01:00 -03
            "America/Santiago",
            utc(2026, 9, 5),
            ["2026-09-05T00:00-04:00", "2026-09-06T01:00-03:00", "2026-09-07T00:00-03:00"],
        ),
        (
            "15 2 * * *",  # a 30-minute gap: 02:00 +10:30 -> 02:30 +11
            "Australia/Lord_Howe",
            utc(2026, 10, 2, 12),
            ["2026-10-03T02:15+10:30", "2026-10-04T02:30+11:00", "2026-10-05T02:15+11:00"],
        ),
        (
            # Two skipped matches fire once, at the jump (a deadline is an instant).
            "15,45 2 * * *",
            "Europe/Berlin",
            utc(2026, 3, 28),
            [
                "2026-03-28T02:15+01:00",
                "2026-03-28T02:45+01:00",
                "2026-03-29T03:00+02:00",
                "2026-03-30T02:15+02:00",
            ],
        ),
        (
            # The jump coincides with a real match at 03:00: one firing.
            "0-59/30 2-3 * * *",
            "Europe/Berlin",
            utc(2026, 3, 29),
            ["2026-03-29T03:00+02:00", "2026-03-29T03:30+02:00", "2026-03-30T02:00+02:00"],
        ),
    ],
)
def test_spring_forward_fixed_time_fires_at_the_jump(
    expression: str, timezone: str, start: datetime, expected: list[str]
) -> None:
    assert local_series(expression, timezone, start, len(expected)) == expected


@pytest.mark.parametrize(
    ("expression", "timezone", "start", "expected"),
    [
        (
            "*/15 * * * *",
            "Europe/Berlin",
            utc(2026, 3, 29, 0, 30),
            ["2026-03-29T01:45+01:00", "2026-03-29T03:00+02:00", "2026-03-29T03:15+02:00"],
        ),
        (
            "7 * * * *",
            "Europe/Berlin",
            utc(2026, 3, 28, 23, 30),
            ["2026-03-29T01:07+01:00", "2026-03-29T03:07+02:00"],
        ),
        (
            "0 */2 * * *",
            "Europe/Berlin",
            utc(2026, 3, 28, 22),
            ["2026-03-29T00:00+01:00", "2026-03-29T04:00+02:00"],
        ),
        (
            "*/15 2 * * *",  # no 02:xx on 03-29 at all
            "Europe/Berlin",
            utc(2026, 3, 28, 2),
            ["2026-03-30T02:00+02:00"],
        ),
        (
            "*/15 * * * *",
            "America/New_York",
            utc(2026, 3, 8, 6, 30),
            ["2026-03-08T01:45-05:00", "2026-03-08T03:00-04:00"],
        ),
        (
            "*/15 * * * *",
            "Australia/Lord_Howe",
            utc(2026, 10, 3, 15),
            ["2026-10-04T01:45+10:30", "2026-10-04T02:30+11:00", "2026-10-04T02:45+11:00"],
        ),
        (
            "@hourly",  # Santiago: 23:00 -04 is followed by 01:00 -03
            "America/Santiago",
            utc(2026, 9, 6, 2, 30),
            ["2026-09-05T23:00-04:00", "2026-09-06T01:00-03:00"],
        ),
    ],
)
def test_spring_forward_wildcard_makes_nothing_up(
    expression: str, timezone: str, start: datetime, expected: list[str]
) -> None:
    assert local_series(expression, timezone, start, len(expected)) == expected


@pytest.mark.parametrize(
    ("expression", "timezone", "start", "expected"),
    [
        # Berlin repeats 02:00-03:00: 02:30 fires at its first (CEST) pass only.
        (
            "30 2 * * *",
            "Europe/Berlin",
            utc(2026, 10, 24),
            ["2026-10-24T02:30+02:00", "2026-10-25T02:30+02:00", "2026-10-26T02:30+01:00"],
        ),
        # New York repeats 01:00-02:00, so 02:30 is not affected.
        (
            "30 2 * * *",
            "America/New_York",
            utc(2026, 10, 31),
            ["2026-10-31T02:30-04:00", "2026-11-01T02:30-05:00", "2026-11-02T02:30-05:00"],
        ),
        (
            "30 1 * * *",
            "America/New_York",
            utc(2026, 10, 31),
            ["2026-10-31T01:30-04:00", "2026-11-01T01:30-04:00", "2026-11-02T01:30-05:00"],
        ),
        (
            # A step without a leading '*' is a fixed-time job: no second pass.
            "0-59/20 1 * * *",
            "America/New_York",
            utc(2026, 11, 1, 4),
            [
                "2026-11-01T01:00-04:00",
                "2026-11-01T01:20-04:00",
                "2026-11-01T01:40-04:00",
                "2026-11-02T01:00-05:00",
            ],
        ),
        (
            # Santiago repeats 23:00-24:00 on 04-04.
            "30 23 * * *",
            "America/Santiago",
            utc(2026, 4, 3, 12),
            ["2026-04-03T23:30-03:00", "2026-04-04T23:30-03:00", "2026-04-05T23:30-04:00"],
        ),
        (
            "30 1 * * *",  # Lord Howe repeats 01:30-02:00
            "Australia/Lord_Howe",
            utc(2026, 4, 3, 12),
            ["2026-04-04T01:30+11:00", "2026-04-05T01:30+11:00", "2026-04-06T01:30+10:30"],
        ),
    ],
)
def test_fall_back_fixed_time_fires_once(
    expression: str, timezone: str, start: datetime, expected: list[str]
) -> None:
    assert local_series(expression, timezone, start, len(expected)) == expected


def test_fall_back_fixed_time_started_in_second_pass_waits_for_the_next_day() -> None:
    schedule = cron("30 1 * * *", "America/New_York")
    # 01:10 EST, the second pass: 01:30 has fired (EDT) and is not fired again.
    assert following_deadline(schedule, utc(2026, 11, 1, 6, 10)) == utc(2026, 11, 2, 6, 30)


@pytest.mark.parametrize(
    ("expression", "timezone", "start", "expected"),
    [
        (
            "*/15 * * * *",
            "Europe/Berlin",
            utc(2026, 10, 24, 23, 50),  # 01:50 CEST
            [
                "2026-10-25T02:00+02:00",
                "2026-10-25T02:15+02:00",
                "2026-10-25T02:30+02:00",
                "2026-10-25T02:45+02:00",
                "2026-10-25T02:00+01:00",
                "2026-10-25T02:15+01:00",
                "2026-10-25T02:30+01:00",
                "2026-10-25T02:45+01:00",
                "2026-10-25T03:00+01:00",
            ],
        ),
        (
            "7 * * * *",
            "Europe/Berlin",
            utc(2026, 10, 24, 23),
            [
                "2026-10-25T01:07+02:00",
                "2026-10-25T02:07+02:00",
                "2026-10-25T02:07+01:00",
                "2026-10-25T03:07+01:00",
            ],
        ),
        (
            "*/30 1 * * *",
            "America/New_York",
            utc(2026, 11, 1, 4),
            [
                "2026-11-01T01:00-04:00",
                "2026-11-01T01:30-04:00",
                "2026-11-01T01:00-05:00",
                "2026-11-01T01:30-05:00",
                "2026-11-02T01:00-05:00",
            ],
        ),
        (
            "*/15 * * * *",  # Lord Howe repeats half an hour
            "Australia/Lord_Howe",
            utc(2026, 4, 4, 14, 20),  # 01:20 +11
            [
                "2026-04-05T01:30+11:00",
                "2026-04-05T01:45+11:00",
                "2026-04-05T01:30+10:30",
                "2026-04-05T01:45+10:30",
                "2026-04-05T02:00+10:30",
            ],
        ),
        (
            # The wall clock shows 02:00 once, half an hour after 02:00 +11 became 01:30
            # +10:30 (cronsim misses it: docs/schedules.md).
            "0 */2 * * *",
            "Australia/Lord_Howe",
            utc(2026, 4, 4, 12),
            ["2026-04-05T00:00+11:00", "2026-04-05T02:00+10:30", "2026-04-05T04:00+10:30"],
        ),
    ],
)
def test_fall_back_wildcard_fires_in_both_passes(
    expression: str, timezone: str, start: datetime, expected: list[str]
) -> None:
    assert local_series(expression, timezone, start, len(expected)) == expected


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (utc(2026, 11, 1, 6, 10), utc(2026, 11, 1, 6, 15)),  # 01:10 EST -> 01:15 EST
        (utc(2026, 11, 1, 5, 50), utc(2026, 11, 1, 6, 0)),  # 01:50 EDT -> 01:00 EST
        (utc(2026, 11, 1, 5, 44), utc(2026, 11, 1, 5, 45)),  # 01:44 EDT -> 01:45 EDT
        (utc(2026, 11, 1, 6, 45), utc(2026, 11, 1, 7, 0)),  # 01:45 EST -> 02:00 EST
    ],
)
def test_fall_back_wildcard_from_either_pass(after: datetime, expected: datetime) -> None:
    assert following_deadline(cron("*/15 * * * *", "America/New_York"), after) == expected


@pytest.mark.parametrize(
    ("expression", "wildcard"),
    [
        ("* 2 * * *", True),
        ("*/15 2 * * *", True),
        ("0 */1 * * *", True),
        ("*/20,45 1-3 * * *", True),  # a list starting with '*'
        ("@hourly", True),
        ("0 2 * * *", False),
        ("0-59/15 2 * * *", False),
        ("0,15,30,45 2 * * *", False),
        ("0 0-23 * * *", False),  # every hour, yet a fixed-time job, as in Vixie cron
        ("0 2-2/1 * * 0", False),
    ],
)
def test_wildcard_or_fixed_time_is_decided_by_the_text(expression: str, wildcard: bool) -> None:
    """Vixie cron's split (minute or hour field starting with '*', or @hourly), seen in
    behaviour: only a wildcard job fires 02:00 again in Berlin's repeated hour."""
    schedule = cron(expression, "Europe/Berlin")
    first_pass, second_pass = utc(2026, 10, 25, 0), utc(2026, 10, 25, 1)  # 02:00 CEST, CET
    assert following_deadline(schedule, first_pass - timedelta(microseconds=1)) == first_pass
    repeat = following_deadline(schedule, second_pass - timedelta(microseconds=1))
    assert (repeat == second_pass) is wildcard


@pytest.mark.parametrize(
    ("expression", "start", "expected"),
    [
        # croniter path (#, L), fixed-time: 2025-03-30 and 2025-10-26 are Berlin's DST days
        ("30 2 * 3 sun#5", utc(2025, 3, 1), [utc(2025, 3, 30, 1), utc(2026, 3, 29, 1)]),
        ("30 2 * 10 sun#4", utc(2025, 10, 1), [utc(2025, 10, 26, 0, 30), utc(2026, 10, 25, 0, 30)]),
        ("30 2 L 10 *", utc(2025, 10, 30), [utc(2025, 10, 31, 1, 30), utc(2026, 10, 31, 1, 30)]),
        # croniter path, wildcard: both passes, nothing in the gap
        (
            "*/30 2 * 10 sun#4",
            utc(2025, 10, 1),
            [utc(2025, 10, 26, 0), utc(2025, 10, 26, 0, 30), utc(2025, 10, 26, 1)],
        ),
    ],
)
def test_croniter_fallback_path_follows_the_same_policy(
    expression: str, start: datetime, expected: list[datetime]
) -> None:
    assert series(cron(expression, "Europe/Berlin"), start, len(expected)) == expected


def test_wildcard_job_matching_only_gap_times_is_refused() -> None:
    # The fifth Sunday of March is Berlin's last, which has no 02:xx, and a wildcard job
    # makes nothing up; the fixed-time job fires at the jump.
    expression, fixed = "*/30 2 * 3 sun#5", "0,30 2 * 3 sun#5"
    reason = invalid_reason(cron(expression, "Europe/Berlin"))
    assert reason is not None
    assert "never fires in Europe/Berlin" in reason
    assert "daylight-saving gap" in reason
    assert invalid_reason(cron(expression, "UTC")) is None
    assert invalid_reason(cron(fixed, "Europe/Berlin")) is None


# --------------------------------------------------------------------------- DST, properties

ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "America/Santiago",
    "Asia/Kolkata",
]
#: expression -> whether it is a wildcard job (the brute-force oracle is told, not asked).
EXPRESSIONS = {
    "30 2 * * *": False,
    "*/15 * * * *": True,
    "30 1 * * *": False,
    "15 2 * * *": False,
    "0 * * * *": True,
    "@hourly": True,
    "0 */2 * * *": True,
    "45 1-3 * * *": False,
    "*/7 2 * * *": True,
    "0-59/20 1-2 * * *": False,
    "0 0 * * *": False,
    "59 23 * * *": False,
    "0 12 * * 1-5": False,
    "10,40 0-4 * * 0": False,
    "* 0,1 * * *": True,
}
HORIZON = timedelta(days=8)


@functools.cache
def transitions(zone_name: str) -> tuple[datetime, ...]:
    """UTC instants (to the minute) where the zone's offset changes, 2020-2030."""
    zone = ZoneInfo(zone_name)
    found: list[datetime] = []
    moment = utc(2020, 1, 1)
    step = timedelta(hours=6)
    while moment < utc(2031, 1, 1):
        if moment.astimezone(zone).utcoffset() != (moment + step).astimezone(zone).utcoffset():
            low, high = moment, moment + step
            while high - low > timedelta(minutes=1):
                middle = low + (high - low) / 2
                middle = middle.replace(second=0, microsecond=0)
                if middle.astimezone(zone).utcoffset() == low.astimezone(zone).utcoffset():
                    low = middle
                else:
                    high = middle
            found.append(high)
        moment += step
    return tuple(found)


@functools.cache
def field_sets(expression: str) -> tuple[frozenset[int] | None, ...]:
    expanded, nth = croniter.expand(expression)
    assert not nth
    return tuple(None if values == ["*"] else frozenset(values) for values in expanded)


def wall_matches(expression: str, wall: datetime) -> bool:
    minute, hour, day, month, weekday = field_sets(expression)
    cron_weekday = (wall.weekday() + 1) % 7
    if day is not None and weekday is not None:
        day_ok = wall.day in day or cron_weekday in weekday
    else:
        day_ok = (day is None or wall.day in day) and (weekday is None or cron_weekday in weekday)
    return (
        day_ok
        and (minute is None or wall.minute in minute)
        and (hour is None or wall.hour in hour)
        and (month is None or wall.month in month)
    )


def firings(expression: str, zone: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """Brute force, minute by minute in UTC: the instants the rule says fire.

    A wildcard job fires whenever the wall clock shows a matching time; a fixed-time job
    only in a repeated time's first pass, and at a jump over a matching skipped time.
    """
    wildcard = EXPRESSIONS[expression]
    moment = after.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
    minute = timedelta(minutes=1)
    previous_offset = (moment - minute).astimezone(zone).utcoffset()
    assert previous_offset is not None
    while True:
        local = moment.astimezone(zone)
        offset = local.utcoffset()
        assert offset is not None
        wall = local.replace(tzinfo=None)
        fires = wall_matches(expression, wall) and (wildcard or local.fold == 0)
        if offset > previous_offset and not wildcard:  # a jump: skipped times fire now
            skipped = wall - (offset - previous_offset)
            while skipped < wall and not fires:
                fires = wall_matches(expression, skipped)
                skipped += minute
        if fires:
            yield moment
            after = moment
        assert moment - after < HORIZON, "no firing within the horizon"
        previous_offset = offset
        moment += minute


def oracle_next(expression: str, zone: ZoneInfo, after: datetime) -> datetime:
    return next(firings(expression, zone, after))


def _near_transition(draw: st.DrawFn, zone_name: str) -> datetime:
    candidates = transitions(zone_name)
    if not candidates:
        return draw(
            st.datetimes(datetime(2020, 1, 1), datetime(2030, 12, 31), timezones=st.just(UTC))
        )
    base = draw(st.sampled_from(candidates))
    # Half the time within three hours, so that repeated and skipped hours come up often.
    reach = draw(st.sampled_from([2 * 86_400_000_000, 3 * 3_600_000_000]))
    shift = draw(st.integers(-reach, reach))
    return base + timedelta(microseconds=shift)


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, str, datetime]:
    zone_name = draw(st.sampled_from(ZONES))
    expression = draw(st.sampled_from(list(EXPRESSIONS)))
    if draw(st.booleans()):
        moment = _near_transition(draw, zone_name)
    else:
        moment = draw(
            st.datetimes(datetime(2000, 1, 1), datetime(2037, 12, 31), timezones=st.just(UTC))
        )
    # Hand it over in some zone or other: only the instant may matter.
    moment = moment.astimezone(ZoneInfo(draw(st.sampled_from(ZONES))))
    return zone_name, expression, moment


@PROPERTY
@given(cases())
def test_following_cron_deadline_obeys_the_rule(case: tuple[str, str, datetime]) -> None:
    zone_name, expression, after = case
    schedule = cron(expression, zone_name)
    result = following_deadline(schedule, after)
    assert result is not None
    assert result.tzinfo is UTC
    assert result > after
    # Equals the first instant the brute-force oracle fires at: so it matches the fields in
    # local time (in a pass the rule allows) or is a fixed-time job's jump over a matching
    # gap time, and no firing between ``after`` and it was skipped.
    assert result == oracle_next(expression, ZoneInfo(zone_name), after)
    assert initial_deadline(schedule, after) == result


@PROPERTY
@given(cases(), st.integers(0, 3 * 86_400_000_000))
def test_following_cron_deadline_is_monotonic(
    case: tuple[str, str, datetime], later_by: int
) -> None:
    zone_name, expression, earlier = case
    # Add in UTC: aware arithmetic in a ZoneInfo zone is wall-time arithmetic (and drops fold).
    later = (earlier.astimezone(UTC) + timedelta(microseconds=later_by)).astimezone(earlier.tzinfo)
    assert later.astimezone(UTC) >= earlier.astimezone(UTC)
    schedule = cron(expression, zone_name)
    first, second = following_deadline(schedule, earlier), following_deadline(schedule, later)
    assert first is not None
    assert second is not None
    assert first <= second
    if later < first:
        assert second == first


@settings(max_examples=40, deadline=None, database=None)
@given(cases())
def test_following_cron_deadlines_chain_without_skipping(case: tuple[str, str, datetime]) -> None:
    zone_name, expression, start = case
    schedule = cron(expression, zone_name)
    oracle = firings(expression, ZoneInfo(zone_name), start)
    moment = start
    for _ in range(12):
        following = following_deadline(schedule, moment)
        assert following == next(oracle)
        moment = following


# --------------------------------------------------------------------------- vs croniter (UTC)

_PLAIN_FIELDS = [
    (0, 59),
    (0, 23),
    (1, 31),
    (1, 12),
    (0, 7),
]


@st.composite
def cron_field(draw: st.DrawFn, index: int) -> str:
    low, high = _PLAIN_FIELDS[index]
    kind = draw(st.sampled_from(["*", "value", "range", "step", "list", "range-step"]))
    value = st.integers(low, high)
    if kind == "*":
        return "*"
    if kind == "value":
        return str(draw(value))
    if kind == "step":
        return f"*/{draw(st.integers(1, high - low + 1))}"
    if kind == "list":
        return ",".join(str(v) for v in draw(st.lists(value, min_size=2, max_size=4)))
    start = draw(value)
    end = draw(st.integers(start, high))
    if kind == "range":
        return f"{start}-{end}"
    return f"{start}-{end}/{draw(st.integers(1, 5))}"


@st.composite
def cron_expressions(draw: st.DrawFn) -> str:
    fields = [draw(cron_field(index)) for index in range(5)]
    if draw(st.integers(0, 9)) == 0:
        fields[2] = draw(st.sampled_from(["L", "15W", "1,L"]))
    elif draw(st.integers(0, 9)) == 0:
        fields[4] = draw(st.sampled_from(["5#3", "mon#1", "L5", "mon-fri", "sat,sun"]))
    return " ".join(fields)


@settings(max_examples=200, deadline=None, database=None)
@given(
    cron_expressions(),
    st.datetimes(datetime(2000, 1, 1), datetime(2037, 12, 31), timezones=st.just(UTC)),
)
def test_utc_deadlines_agree_with_croniter(expression: str, after: datetime) -> None:
    schedule = cron(expression)
    assume(invalid_reason(schedule) is None)
    expected = croniter(expression, after).get_next(datetime)
    assert following_deadline(schedule, after) == expected


# -- ticks skipped by a run ----------------------------------------------------------------


def test_firings_between_counts_the_ticks_a_run_overlapped() -> None:
    every_5 = Schedule(kind="cron", expression="*/5 * * * *")
    start = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    # (after, until]: the tick at the start was the run's own; the one at the end counts.
    assert firings_between(every_5, start, start + timedelta(minutes=12)) == (
        2,
        start + timedelta(minutes=5),
        start + timedelta(minutes=10),
    )
    assert firings_between(every_5, start, start + timedelta(minutes=10)) == (
        2,
        start + timedelta(minutes=5),
        start + timedelta(minutes=10),
    )
    assert firings_between(every_5, start, start + timedelta(minutes=4)) == (0, None, None)
    # Counting stops at the limit; the last is then the limit-th.
    assert firings_between(every_5, start, start + timedelta(days=1), limit=3) == (
        3,
        start + timedelta(minutes=5),
        start + timedelta(minutes=15),
    )


def test_firings_between_follows_the_dst_policy() -> None:
    """Berlin's fall-back hour is passed twice by a wildcard job (Vixie cron)."""
    every_15 = Schedule(kind="cron", expression="*/15 * * * *", timezone="Europe/Berlin")
    before = datetime(2026, 10, 24, 23, 59, tzinfo=UTC)  # 01:59 CEST
    after = before + timedelta(hours=3)  # 03:59 CET: three hours of real time
    count, first, _last = firings_between(every_15, before, after)
    assert count == 12
    assert first == datetime(2026, 10, 25, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "schedule",
    [
        Schedule(kind="interval", expression="1m"),
        Schedule(kind="once", expression="2026-03-01T10:00:00+00:00"),
        Schedule(kind="manual"),
    ],
)
def test_only_cron_has_firings_of_its_own(schedule: Schedule) -> None:
    start = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    assert firings_between(schedule, start, start + timedelta(hours=1)) == (0, None, None)


def test_firings_between_refuses_naive_times() -> None:
    hourly = Schedule(kind="cron", expression="0 * * * *")
    with pytest.raises(ValueError, match="timezone-aware"):
        firings_between(hourly, datetime(2026, 3, 1), datetime(2026, 3, 2, tzinfo=UTC))
