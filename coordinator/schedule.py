"""Schedule arithmetic: parsing, validation, normalisation and deadlines.

Pure: no I/O beyond loading timezone data, no wall-clock reads. Every instant is passed in
as an aware :class:`~datetime.datetime` (a naive one raises :class:`ValueError`) and every
instant returned is an aware UTC datetime.

Schedule kinds
--------------
``cron``
    A standard 5-field expression (minute hour day-of-month month day-of-week), read in
    the schedule's IANA timezone, or one of the aliases ``@hourly``, ``@daily``
    (``@midnight``), ``@weekly``, ``@monthly``, ``@yearly`` (``@annually``). Six- and
    seven-field forms (seconds, years), ``@reboot`` and croniter's hashed/random ``H`` and
    ``R`` values are refused. Day-of-month and day-of-week combine as in Vixie cron
    (either matches when both are restricted). croniter's ``L``, ``W`` and ``#`` work.
``interval``
    A duration (:func:`parse_duration`) of at least one second and at most
    :data:`MAX_DURATION`, counted from when the previous run settled.
``once``
    An ISO 8601 instant with an explicit offset or ``Z``, in the years 1970 to 9999 (UTC);
    stored in UTC.
``manual``
    No expression; never due on its own.

Daylight saving time (cron only)
--------------------------------
Cron expressions match *local wall time* in the schedule's timezone. Around transitions
this module follows Vixie cron (``cron(8)``: "jobs specified with wildcards run based on
the new time immediately"), and cronsim, which the tests use as the oracle (see
docs/schedules.md). Jobs come in two kinds, decided by the text alone:

* A **wildcard job** has a minute or hour field starting with ``*`` (``*``, ``*/15``,
  ``*/5 1-3 * * *``, ``0 */2 * * *``, ``7 * * * *``), or is ``@hourly``. It fires at every
  real instant whose wall time matches: both passes of a repeated hour, and nothing for a
  wall time skipped by a spring-forward gap (Berlin, ``*/15 * * * *`` on 2026-10-25 fires
  at 02:00, 02:15, 02:30, 02:45 CEST and again at 02:00 ... 02:45 CET; on 2026-03-29 01:45
  CET is followed by 03:00 CEST).
* Every other job is a **fixed-time job**: ranges, lists and steps that do not start with
  ``*`` (``30 2 * * *``, ``15,45 2 * * *``, ``0-59/5 1 * * *``, ``0 0-23 * * *``) and
  ``@daily``/``@midnight``/``@weekly``/``@monthly``/``@yearly``/``@annually``. A wall
  time skipped by a spring-forward gap fires right at the jump, the first instant after
  the gap (Berlin, ``30 2 * * *`` on 2026-03-29 fires at 03:00 CEST = 01:00 UTC); several
  matches inside one gap (``15,45 2``) collapse into that one firing, which may coincide
  with a match at the end of the gap. A wall time repeated by a fall-back overlap fires
  once, at its first pass (New York, ``30 1 * * *`` on 2026-11-01 fires at 01:30 EDT, not
  again at 01:30 EST).

Either way the deadlines of a schedule are a fixed set of instants, and each call returns
the first one strictly after the given instant: so they are strictly increasing and
monotonic in the input.

croniter 7 with zoneinfo-aware start times follows neither kind (it fires both passes of
every repeated wall time and makes up skipped ones). So croniter is only asked about naive
wall time (pure calendar arithmetic); the conversion to instants, with the policy above,
is done here (:func:`_next_fixed`, :func:`_next_wildcard`). croniter is touched in one
function, :func:`_croniter_next_wall`, which parses with ``croniter.expand`` and, for the
common expressions (numbers, ranges, steps, lists, names), iterates over the expanded
fields itself: croniter's own ``get_next`` costs ~60 µs a call, too slow for the daemon's
startup pass over 100,000 jobs. Expressions using ``L``, ``W`` or ``#`` go through
``croniter.get_next`` on naive wall time.

Parsed cron expressions, zones, intervals and instants are cached (``functools.lru_cache``)
so the per-call cost of :func:`initial_deadline` and :func:`following_deadline` is a few
microseconds.
"""

from __future__ import annotations

import calendar
import functools
import re
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from fractions import Fraction
from typing import Final, NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from .errors import InvalidInput, InvalidSchedule
from .model import Schedule, ScheduleKind

__all__ = [
    "MAX_DURATION",
    "check_duration",
    "firings_between",
    "following_deadline",
    "format_duration",
    "initial_deadline",
    "invalid_reason",
    "normalize",
    "parse_duration",
    "parse_prune_at",
    "validate",
    "validate_timezone",
]

# --------------------------------------------------------------------------- durations

_US_PER: Final[dict[str, int]] = {
    "w": 7 * 86_400_000_000,
    "d": 86_400_000_000,
    "h": 3_600_000_000,
    "m": 60_000_000,
    "s": 1_000_000,
    "ms": 1_000,
}
_UNIT_RANK: Final[dict[str, int]] = {unit: rank for rank, unit in enumerate(_US_PER)}
_UNITS_HINT: Final = "use ms, s, m, h, d, w"
_DURATION_EXAMPLE: Final = "expected e.g. 90s, 5m, 1h30m"
_DURATION_TOKEN: Final = re.compile(
    r"\s*(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?P<unit>[^\W\d_]*)"
)
_MAX_NUMBER_LEN: Final = 30

#: The longest duration anything accepts (an interval, a timeout, a setting): ten years.
#: Far beyond any real schedule, and far inside what datetime arithmetic can add to today
#: (an unbounded one crashed the daemon with OverflowError). PostgreSQL holds the same
#: bound (migrations/0005_front_doors.sql).
MAX_DURATION: Final = timedelta(days=3650)


def _too_long(field: str, shown: str) -> InvalidInput:
    return InvalidInput(field, f"at most {format_duration(MAX_DURATION)}, not {shown}")


def check_duration(value: timedelta, field: str) -> timedelta:
    """``value`` if it is at most :data:`MAX_DURATION`, else :class:`InvalidInput`."""
    if value > MAX_DURATION:
        raise _too_long(field, format_duration(value))
    return value


def parse_duration(text: str, *, field: str = "duration", unit_required: bool = False) -> timedelta:
    """Read a positive duration: ``90``/``90s``, ``500ms``, ``5m``, ``1h30m``, ``1h 30m``,
    ``1.5h``, ``2d``, ``1w``; at most :data:`MAX_DURATION`.

    Units (case-insensitive) are ``ms``, ``s``, ``m`` (minutes), ``h``, ``d`` and ``w``;
    a bare number means seconds and must stand alone, unless ``unit_required`` (what a
    person types: the CLI, manifests, settings), where ``5`` is refused with a hint
    because it is as likely to mean minutes. Components go from the largest unit to the
    smallest, each at most once. Raises :class:`InvalidInput` ``(field, reason)``.
    PostgreSQL reads the same grammar (``coordinator._duration_us``).
    """
    stripped = text.strip()

    def bad(why: str) -> InvalidInput:
        return InvalidInput(field, f"{stripped!r}: {why}")

    if not stripped:
        raise InvalidInput(field, f"empty duration ({_DURATION_EXAMPLE})")
    if stripped[0] == "-":
        raise bad("a duration must be positive")
    total = Fraction(0)
    last_rank = -1
    pos = 0
    while pos < len(stripped):
        match = _DURATION_TOKEN.match(stripped, pos)
        if match is None:
            raise bad(f"unexpected {stripped[pos]!r} ({_DURATION_EXAMPLE})")
        number, unit_text = match["number"], match["unit"]
        unit = unit_text.lower()
        if not unit:
            if pos != 0 or match.end() != len(stripped):
                raise bad(f"{number!r} has no unit ({_UNITS_HINT})")
            if unit_required:
                raise bad(f"a unit is required: {number}s or {number}m? ({_UNITS_HINT})")
            unit = "s"
        elif unit not in _US_PER:
            raise bad(f"unknown unit {unit_text!r} ({_UNITS_HINT})")
        rank = _UNIT_RANK[unit]
        if rank <= last_rank:
            raise bad("units must go from largest to smallest, each at most once (e.g. 1h30m)")
        if len(number) > _MAX_NUMBER_LEN:
            raise bad("too large")
        last_rank = rank
        total += Fraction(number) * _US_PER[unit]
        pos = match.end()
    if total.denominator != 1:
        raise bad("finer than a microsecond")
    if total == 0:
        raise bad("a duration must be greater than zero")
    if total > MAX_DURATION // timedelta(microseconds=1):
        raise _too_long(field, " ".join(stripped.split()))
    return timedelta(microseconds=int(total))


def format_duration(duration: timedelta) -> str:
    """The compact canonical form: ``1h30m``, ``1m30s``, ``500ms``, ``2d4h``, ``1.5ms``.

    Days are the largest unit. ``parse_duration(format_duration(d)) == d`` for every
    positive ``d``; zero gives ``0s``; a negative duration raises :class:`ValueError`.
    """
    if duration < timedelta(0):
        raise ValueError(f"cannot format a negative duration: {duration!r}")
    rest = (duration.days * 86_400 + duration.seconds) * 1_000_000 + duration.microseconds
    if rest == 0:
        return "0s"
    parts: list[str] = []
    for unit in ("d", "h", "m", "s"):
        count, rest = divmod(rest, _US_PER[unit])
        if count:
            parts.append(f"{count}{unit}")
    if rest:
        millis, micros = divmod(rest, 1_000)
        if micros:
            parts.append(f"{millis}.{micros:03d}".rstrip("0") + "ms")
        else:
            parts.append(f"{millis}ms")
    return "".join(parts)


# --------------------------------------------------------------------------- timezones


@functools.lru_cache(maxsize=1024)
def _zone(name: str) -> ZoneInfo:
    """The zone called ``name``; raises :class:`InvalidSchedule` on field ``timezone``."""
    hint = "use an IANA name such as 'Europe/Berlin' or 'UTC'"
    if name == "localtime":
        raise InvalidSchedule("timezone", f"'localtime' depends on the host; {hint}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidSchedule("timezone", f"unknown timezone {name!r} ({hint})") from None


def validate_timezone(name: str, *, field: str = "timezone") -> ZoneInfo:
    """The IANA zone called ``name``; raises :class:`InvalidSchedule` ``(field, reason)``."""
    try:
        return _zone(name)
    except InvalidSchedule as exc:
        raise InvalidSchedule(field, exc.reason) from None


# --------------------------------------------------------------------------- cron text

#: (name, allowed values) of the five fields, for messages.
_CRON_FIELDS: Final = (
    ("minute", "0-59"),
    ("hour", "0-23"),
    ("day-of-month", "1-31"),
    ("month", "1-12 or jan-dec"),
    ("day-of-week", "0-7 or sun-sat"),
)
_CRON_ALIASES: Final = frozenset(
    {"@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually"}
)
_HASHED: Final = re.compile(r"[hr](?:\(|/|$)", re.IGNORECASE)


def _cron_text(expression: str) -> str:
    """The whitespace-collapsed expression, after the checks croniter does not make."""
    fields = expression.split()
    if not fields:
        raise InvalidSchedule("cron", "empty cron expression")
    if len(fields) == 1 and fields[0].startswith("@"):
        alias = fields[0].lower()
        if alias == "@reboot":
            raise InvalidSchedule(
                "cron", "'@reboot' is not supported: jobs run on a schedule, not at daemon start"
            )
        if alias not in _CRON_ALIASES:
            raise InvalidSchedule(
                "cron",
                f"unknown alias {fields[0]!r} (use @hourly, @daily, @weekly, @monthly, @yearly)",
            )
        return alias
    if len(fields) != len(_CRON_FIELDS):
        extra = " (seconds and years are not supported)" if len(fields) in (6, 7) else ""
        raise InvalidSchedule(
            "cron",
            f"{' '.join(fields)!r}: expected 5 fields (minute hour day-of-month month "
            f"day-of-week), got {len(fields)}{extra}",
        )
    for (name, _allowed), value in zip(_CRON_FIELDS, fields, strict=True):
        if any(_HASHED.match(part) for part in value.split(",")):
            raise InvalidSchedule(
                "cron", f"{name} field {value!r}: hashed/random values (H, R) are not supported"
            )
    return " ".join(fields)


# --------------------------------------------------------------------------- croniter

#: ``next_wall(wall)``: the first matching naive wall time strictly after ``wall``.
_NextWall = Callable[[datetime], datetime]

_MAX_YEARS_BETWEEN_MATCHES: Final = 50
_MINUTE: Final = timedelta(minutes=1)
#: Where a new expression is tried once, to refuse one that never fires.
_PROBE_WALL: Final = datetime(2000, 1, 1)
_MONTH_DAYS: Final = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


class _CronSyntaxError(Exception):
    """croniter refused an expression; ``args[0]`` is its message."""


class _NeverFires(Exception):
    """No matching wall time within the search horizon."""


@functools.lru_cache(maxsize=32768)
def _croniter_next_wall(expression: str) -> _NextWall:
    """Parse a checked expression (see :func:`_cron_text`); the only code touching croniter.

    Returns ``next_wall``, working on naive wall time only: the timezone is applied by the
    caller. Raises :class:`_CronSyntaxError` (also for an expression that never fires);
    ``next_wall`` raises :class:`_NeverFires`.
    """
    try:
        expanded, nth_weekday = croniter.expand(expression)
    except CroniterError as exc:
        raise _CronSyntaxError(str(exc)) from None
    day_of_month_text = "" if expression.startswith("@") else expression.split()[2]
    plain = (
        not nth_weekday
        and "w" not in day_of_month_text.lower()
        and all(isinstance(value, int) or value == "*" for value in expanded[2])
    )
    if plain:
        next_wall = _FieldMatcher.build(expanded).next_wall
    else:

        def next_wall(wall: datetime) -> datetime:
            try:
                result: datetime = croniter(expression, wall).get_next(datetime)
            except CroniterBadDateError:
                raise _NeverFires from None
            return result

    try:
        next_wall(_PROBE_WALL)
    except _NeverFires:
        try:  # strict mode names impossible day/month pairs ("0 0 30 2 *")
            croniter.expand(expression, strict=True)
        except CroniterError as exc:
            raise _CronSyntaxError(_impossible_date(str(exc))) from None
        raise _CronSyntaxError("never fires") from None
    return next_wall


_IMPOSSIBLE: Final = re.compile(
    r"Day\(s\) \[(?P<days>[\d, ]+)\] can never occur in month\(s\) \[(?P<months>[\d, ]+)\]"
)


def _impossible_date(message: str) -> str:
    """croniter's "Day(s) [31] can never occur in month(s) [2]" in our words: "day 31
    never occurs in February" (any other message as it is)."""
    found = _IMPOSSIBLE.search(message)
    if found is None:
        return message
    days = [int(d) for d in found["days"].split(",")]
    months = [calendar.month_name[int(m)] for m in found["months"].split(",")]
    day_words = f"day {days[0]}" if len(days) == 1 else f"days {', '.join(map(str, days))}"
    month_words = months[0] if len(months) == 1 else f"{', '.join(months[:-1])} or {months[-1]}"
    verb = "occurs" if len(days) == 1 else "occur"
    return f"{day_words} never {verb} in {month_words}"


# --------------------------------------------------------------------------- iteration


@functools.lru_cache(maxsize=4096)
def _next_table(allowed: tuple[int, ...], low: int, high: int) -> tuple[int, ...]:
    """``table[i - low]``: the smallest allowed value ``>= i``, or -1."""
    table: list[int] = []
    following = -1
    for value in range(high, low - 1, -1):
        if value in allowed:
            following = value
        table.append(following)
    return tuple(reversed(table))


def _values(field: list[int | str], low: int, high: int) -> tuple[int, ...]:
    if field == ["*"]:
        return tuple(range(low, high + 1))
    return tuple(sorted({value for value in field if isinstance(value, int)}))


class _FieldMatcher(NamedTuple):
    """A 5-field expression of plain values, iterated without croniter."""

    minutes: tuple[int, ...]  # next-table over 0..59
    hours: tuple[int, ...]  # next-table over 0..23
    months: tuple[int, ...]  # next-table over 1..12
    days: frozenset[int] | None  # day-of-month values, None for '*'
    weekdays: frozenset[int] | None  # cron weekdays (0 = Sunday), None for '*'

    @classmethod
    def build(cls, expanded: list[list[int | str]]) -> _FieldMatcher:
        minute, hour, day, month, weekday = expanded
        return cls(
            minutes=_next_table(_values(minute, 0, 59), 0, 59),
            hours=_next_table(_values(hour, 0, 23), 0, 23),
            months=_next_table(_values(month, 1, 12), 1, 12),
            days=None if day == ["*"] else frozenset(_values(day, 1, 31)),
            weekdays=None if weekday == ["*"] else frozenset(_values(weekday, 0, 6)),
        )

    def next_wall(self, wall: datetime) -> datetime:
        start = wall + _MINUTE
        year, month, day = start.year, start.month, start.day
        hour, minute = start.hour, start.minute
        last_year = min(year + _MAX_YEARS_BETWEEN_MATCHES, 9999)
        minutes, hours, months = self.minutes, self.hours, self.months
        days, weekdays = self.days, self.weekdays
        while year <= last_year:
            next_month = months[month - 1]
            if next_month < 0:
                year, month, day, hour, minute = year + 1, 1, 1, 0, 0
                continue
            if next_month != month:
                month, day, hour, minute = next_month, 1, 0, 0
            month_days = _MONTH_DAYS[month] + (month == 2 and calendar.isleap(year))
            weekday = (date(year, month, day).weekday() + 1) % 7  # cron numbering: 0 = Sunday
            while day <= month_days:
                if weekdays is None:
                    day_matches = days is None or day in days
                elif days is None:
                    day_matches = weekday in weekdays
                else:  # both restricted: either matches (Vixie cron)
                    day_matches = day in days or weekday in weekdays
                if day_matches:
                    while hour < 24:
                        next_hour = hours[hour]
                        if next_hour < 0:
                            break
                        if next_hour != hour:
                            hour, minute = next_hour, 0
                        next_minute = minutes[minute]
                        if next_minute >= 0:
                            return datetime(year, month, day, hour, next_minute)
                        hour, minute = hour + 1, 0
                day, hour, minute = day + 1, 0, 0
                weekday = (weekday + 1) % 7
            month, day, hour, minute = month + 1, 1, 0, 0
            if month > 12:
                year, month = year + 1, 1
        raise _NeverFires


# --------------------------------------------------------------------------- wall → instant


def _offset(moment: datetime) -> timedelta:
    offset = moment.utcoffset()
    assert offset is not None
    return offset


def _utc(naive_utc: datetime) -> datetime:
    return naive_utc.replace(tzinfo=UTC)


def _passes(wall: datetime, zone: ZoneInfo) -> tuple[timedelta, timedelta]:
    """The offsets of the first and second pass of ``wall``: equal when it occurs once,
    first > second when fall-back repeats it, first < second when spring-forward skips it.
    """
    local = wall.replace(tzinfo=zone)
    return _offset(local), _offset(local.replace(fold=1))


def _transition(zone: ZoneInfo, low: datetime, high: datetime, before: timedelta) -> datetime:
    """The first UTC instant in ``(low, high]`` (naive UTC) whose offset is not ``before``.

    Transitions fall on whole seconds (TZif), so bisecting to one second is exact.
    """
    second = timedelta(seconds=1)
    while high - low > second:
        middle = low + ((high - low) // second // 2) * second
        if _offset(middle.replace(tzinfo=UTC).astimezone(zone)) == before:
            low = middle
        else:
            high = middle
    return _utc(high)


def _next_fixed(next_wall: _NextWall, zone: ZoneInfo, after: datetime) -> datetime:
    """A fixed-time job's first firing strictly after ``after`` (aware UTC).

    Walks matching wall times from ``after``'s own: a repeated one fires at its first pass
    only, a skipped one at the jump (the instant the gap ends).
    """
    wall = after.astimezone(zone).replace(tzinfo=None)
    while True:  # more than once only when ``after`` is in a repeated hour's second pass
        wall = next_wall(wall)
        first, second = _passes(wall, zone)
        if first >= second:
            instant = _utc(wall - first)
        else:  # skipped: the jump lies in (wall - second, wall - first]
            instant = _transition(zone, wall - second, wall - first, first)
        if instant > after:
            return instant


def _next_wildcard(next_wall: _NextWall, zone: ZoneInfo, after: datetime) -> datetime:
    """A wildcard job's first firing strictly after ``after`` (aware UTC).

    Every real instant whose wall time matches fires, both passes of a repeated one;
    skipped wall times fire never. Matching walls are walked in order; the first-pass
    instant grows with the wall, so the search ends at the first wall whose first pass is
    after ``after`` (an earlier wall's second pass may still come before it).
    """
    local = after.astimezone(zone)
    # In a repeated hour's first pass, the second passes of the wall times already gone
    # are still ahead: start from the wall ``after`` would have in the second pass.
    slowest = min(_offset(local), _offset(local.replace(fold=1)))
    wall = after.replace(tzinfo=None) + slowest
    last_year = wall.year + _MAX_YEARS_BETWEEN_MATCHES
    best: datetime | None = None
    while True:
        wall = next_wall(wall)
        if wall.year > last_year:  # e.g. every match falls in a spring-forward gap
            raise _NeverFires
        first, second = _passes(wall, zone)
        if first < second:  # skipped by spring-forward: nothing made up
            continue
        early = _utc(wall - first)
        if early > after:
            return early if best is None else min(best, early)
        if best is None:
            late = _utc(wall - second)  # the second pass; == early when not repeated
            if late > after:
                best = late


class _CronPlan(NamedTuple):
    next_wall: _NextWall
    zone: ZoneInfo
    #: True for a wildcard job (see the module docstring), False for a fixed-time job.
    wildcard: bool


def _explain(expression: str, message: str) -> str:
    """croniter's ``message`` about ``expression``, made readable and pinned on a field."""
    if not expression.startswith("@"):
        fields = expression.split()
        for index, ((name, allowed), value) in enumerate(zip(_CRON_FIELDS, fields, strict=True)):
            probe = " ".join(value if other == index else "*" for other in range(len(fields)))
            try:
                _croniter_next_wall(probe)
            except _CronSyntaxError as exc:
                return f"{name} field {value!r}: {_clean(str(exc), probe)} (values: {allowed})"
    return f"{expression!r}: {_clean(message, expression)}"


def _clean(message: str, expression: str) -> str:
    if "Traceback" in message:
        return "not a valid value"
    message = message.split("Cron:")[0]
    message = re.sub(r"\[?" + re.escape(expression) + r"\]?", "", message, flags=re.IGNORECASE)
    message = re.sub(r"\s*\bin field \d+", "", message)
    message = re.sub(r"\s+", " ", message).replace("is out of bands", "out of range")
    message = message.strip(" ,.:").removeprefix("is not acceptable").strip(" ,.:")
    message = message.removeprefix("day-of-week field ").replace("not acceptable", "not allowed")
    return message or "not a valid value"


@functools.lru_cache(maxsize=32768)
def _cron_plan(expression: str, timezone: str) -> _CronPlan:
    """The parsed expression and zone; raises :class:`InvalidSchedule` (unprefixed)."""
    text = _cron_text(expression)
    try:
        next_wall = _croniter_next_wall(text)
    except _CronSyntaxError as exc:
        raise InvalidSchedule("cron", _explain(text, str(exc.args[0]))) from None
    plan = _CronPlan(next_wall, _zone(timezone), _is_wildcard(text))
    if plan.wildcard:
        try:  # a wildcard job skips gap times: one that matches nothing else never fires
            _next_wildcard(next_wall, plan.zone, _utc(_PROBE_WALL))
        except _NeverFires:
            raise InvalidSchedule(
                "cron",
                f"{text!r} never fires in {timezone}: every matching time falls in a "
                "daylight-saving gap (a job with '*' in its minute or hour field skips them)",
            ) from None
    return plan


def _is_wildcard(text: str) -> bool:
    """Vixie cron's split: a job is a *wildcard* job when its minute or hour field starts
    with ``*`` (``*``, ``*/15``) or it is ``@hourly``; otherwise it runs at particular
    times. Ranges, lists and steps without a leading ``*`` (``0-59/5``, ``1-3``, ``0,30``)
    are particular times even where they cover every hour, exactly as in Vixie cron's
    ``MIN_STAR``/``HR_STAR`` flags (and cronsim).
    """
    if text.startswith("@"):
        return text == "@hourly"
    minute, hour = text.split()[:2]
    return minute.startswith("*") or hour.startswith("*")


def _next_cron(plan: _CronPlan, after: datetime) -> datetime:
    """The first firing instant strictly after ``after`` (aware), in UTC."""
    after = after.astimezone(UTC)
    step = _next_wildcard if plan.wildcard else _next_fixed
    try:
        return step(plan.next_wall, plan.zone, after)
    except _NeverFires:
        raise InvalidSchedule("cron", f"no firing time after {after.isoformat()}") from None


# --------------------------------------------------------------------------- interval, once

_MIN_INTERVAL: Final = timedelta(seconds=1)


@functools.lru_cache(maxsize=4096)
def _interval(expression: str) -> timedelta:
    try:
        interval = parse_duration(expression, field="every")
    except InvalidInput as exc:
        raise InvalidSchedule("every", exc.reason) from None
    if interval < _MIN_INTERVAL:
        raise InvalidSchedule("every", f"{expression.strip()!r}: an interval must be at least 1s")
    return interval


#: The instants a one-shot job may be due at: Python's datetime (and so the daemon's
#: deadline arithmetic) ends with the year 9999, and nothing is owed from before 1970.
_FIRST_INSTANT: Final = datetime(1970, 1, 1, tzinfo=UTC)
_LAST_YEAR: Final = 9999


@functools.lru_cache(maxsize=4096)
def _instant(expression: str) -> datetime:
    text = expression.strip()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidSchedule(
            "at", f"{text!r}: not an ISO 8601 timestamp (expected e.g. 2026-12-01T10:00:00Z)"
        ) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        example = text if ("T" in text or " " in text) else f"{text}T00:00:00"
        raise InvalidSchedule(
            "at", f"{text!r} has no UTC offset; add one, e.g. '{example}Z' or '{example}+01:00'"
        )
    out_of_range = InvalidSchedule(
        "at", f"{text!r} is out of range (the years 1970 to {_LAST_YEAR}, in UTC)"
    )
    try:
        instant = moment.astimezone(UTC)
    except OverflowError:
        raise out_of_range from None
    if instant < _FIRST_INSTANT:
        raise out_of_range
    return instant


# --------------------------------------------------------------------------- schedules

_FIELD: Final[dict[ScheduleKind, str]] = {
    "cron": "cron",
    "interval": "every",
    "once": "at",
    "manual": "manual",
}


def _expression(schedule: Schedule) -> str:
    expression = schedule.expression
    if expression is None or not expression.strip():
        raise InvalidSchedule(
            _FIELD[schedule.kind], f"a {schedule.kind} schedule needs an expression"
        )
    return expression


def _normalized(schedule: Schedule) -> Schedule:
    """The canonical form; raises :class:`InvalidSchedule` with an unprefixed field."""
    kind = schedule.kind
    if kind == "manual":
        if schedule.expression is not None:
            raise InvalidSchedule(
                "manual", f"a manual schedule has no expression, got {schedule.expression!r}"
            )
        _zone(schedule.timezone)
        return schedule
    expression = _expression(schedule)
    if kind == "cron":
        _cron_plan(expression, schedule.timezone)
        canonical = _cron_text(expression)
    elif kind == "interval":
        canonical = format_duration(_interval(expression))
    else:
        canonical = _instant(expression).isoformat()
    _zone(schedule.timezone)
    return Schedule(kind=kind, expression=canonical, timezone=schedule.timezone)


def validate(schedule: Schedule, *, field_prefix: str = "") -> None:
    """Raise :class:`InvalidSchedule` ``(field, reason)`` if ``schedule`` cannot be used.

    ``field`` is ``cron``, ``every``, ``at``, ``manual`` or ``timezone``, with
    ``field_prefix`` prepended as is (pass e.g. ``"--"`` or ``"jobs[3]."``).
    """
    try:
        _normalized(schedule)
    except InvalidSchedule as exc:
        if field_prefix:
            raise InvalidSchedule(field_prefix + exc.field, exc.reason) from None
        raise


def invalid_reason(schedule: Schedule) -> str | None:
    """The reason :func:`validate` would give, or ``None`` if the schedule is usable."""
    try:
        _normalized(schedule)
    except InvalidSchedule as exc:
        return exc.reason
    return None


def normalize(schedule: Schedule) -> Schedule:
    """The canonical stored form; raises like :func:`validate` (fields unprefixed).

    cron: whitespace collapsed (aliases lower-cased); interval: :func:`format_duration`;
    once: UTC ISO 8601 (``2026-12-01T10:00:00+00:00``); manual: unchanged.
    """
    return _normalized(schedule)


def parse_prune_at(text: str) -> str | None:
    """``prune_at`` as a cron expression: ``HH:MM`` (every day at that local time), a
    5-field cron expression, or ``off`` (``None``: never). Raises ``ValueError`` with
    the reason."""
    value = " ".join(text.split())
    if value.lower() in ("off", "never", "none"):
        return None
    hour, sep, minute = value.partition(":")
    if sep:
        if not (hour.isdigit() and minute.isdigit() and len(minute) == 2):
            raise ValueError(f"expected HH:MM (e.g. 03:17), a cron expression or off, not {text!r}")
        h, m = int(hour), int(minute)
        if h > 23 or m > 59:
            raise ValueError(f"{text!r} is not a time of day (00:00 to 23:59)")
        return f"{m} {h} * * *"
    reason = invalid_reason(Schedule(kind="cron", expression=value))
    if reason is not None:
        raise ValueError(reason)
    return value


def _aware(moment: datetime, name: str) -> None:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, got {moment!r}")


def initial_deadline(schedule: Schedule, now: datetime) -> datetime | None:
    """The first deadline of a job that has none saved (UTC), or ``None`` for manual jobs.

    cron: the first firing strictly after ``now``; interval: ``now`` + interval; once:
    the instant itself, even if past (it is owed). Raises :class:`InvalidSchedule` for an
    unusable schedule and :class:`ValueError` for a naive ``now``.
    """
    _aware(now, "now")
    kind = schedule.kind
    if kind == "cron":
        return _next_cron(_cron_plan(_expression(schedule), schedule.timezone), now)
    if kind == "interval":
        return now.astimezone(UTC) + _interval(_expression(schedule))
    if kind == "once":
        return _instant(_expression(schedule))
    return None


def following_deadline(schedule: Schedule, completed_at: datetime) -> datetime | None:
    """The deadline after a run settles (UTC), or ``None`` when there is none.

    cron: the first firing strictly after ``completed_at``; interval: ``completed_at`` +
    interval; once and manual: ``None``. Raises like :func:`initial_deadline`.
    """
    _aware(completed_at, "completed_at")
    kind = schedule.kind
    if kind == "cron":
        return _next_cron(_cron_plan(_expression(schedule), schedule.timezone), completed_at)
    if kind == "interval":
        return completed_at.astimezone(UTC) + _interval(_expression(schedule))
    return None


#: Most firings :func:`firings_between` counts (a minutely job stuck for a week has 10,080).
MAX_COUNTED_FIRINGS: Final = 10_000


def firings_between(
    schedule: Schedule, after: datetime, until: datetime, *, limit: int = MAX_COUNTED_FIRINGS
) -> tuple[int, datetime | None, datetime | None]:
    """How many times a cron schedule fires in ``(after, until]``, the first and the last
    (UTC): the ticks a run that lasted from ``after`` to ``until`` made the job skip. The
    count stops at ``limit`` (then the last is the ``limit``-th). Interval, one-shot and
    manual schedules have no firings of their own (an interval counts from a completion):
    ``(0, None, None)``. Raises like :func:`following_deadline`.
    """
    _aware(after, "after")
    _aware(until, "until")
    if schedule.kind != "cron":
        return 0, None, None
    plan = _cron_plan(_expression(schedule), schedule.timezone)
    count, first, last = 0, None, None
    moment = after
    while count < limit:
        moment = _next_cron(plan, moment)
        if moment > until:
            break
        count += 1
        first = first or moment
        last = moment
    return count, first, last
