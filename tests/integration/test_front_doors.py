"""Names and durations at the database's door (migrations/0005_front_doors.sql), against a
real PostgreSQL: the rules agree with the Python ones character by character, plain SQL is
refused, the SQL API refuses NULL, and rows stored before the rules keep working."""

from __future__ import annotations

import json
import random
from datetime import timedelta
from decimal import Decimal
from typing import Any

import asyncpg
import pytest

from coordinator import client
from coordinator import migrate as migrate_mod
from coordinator.db import aio
from coordinator.errors import InvalidInput
from coordinator.model import ENV_STRING_MAX, Schedule, Target, params_env_size
from coordinator.schedule import MAX_DURATION, parse_duration
from coordinator.text import check_job_name, check_namespace

EXEC = json.dumps({"kind": "exec", "argv": ["true"]})
MAX_US = MAX_DURATION // timedelta(microseconds=1)
#: Python's str.isspace() characters: the grammar's whitespace.
WHITESPACE = [chr(c) for c in range(0x3001) if chr(c).isspace()]


async def refused(conn: asyncpg.Connection, sql: str, *args: Any) -> asyncpg.PostgresError:
    """The error PostgreSQL answers ``sql`` with (the statement must fail)."""
    with pytest.raises(asyncpg.PostgresError) as info:
        await aio(conn.execute)(sql, *args)
    return info.value


def _insert(**columns: Any) -> tuple[Any, ...]:
    """A plain ``INSERT INTO coordinator.jobs`` and its arguments, as an application might
    write one."""
    row = {"schedule_kind": "manual", "target": EXEC, **columns}
    types = {"target": "jsonb", "timeout": "interval", "next_run_at": "timestamptz"}
    names = ", ".join(row)
    values = ", ".join(f"${i}::text::{types.get(k, 'text')}" for i, k in enumerate(row, 1))
    return (f"INSERT INTO coordinator.jobs ({names}) VALUES ({values})", *row.values())


# --------------------------------------------------------------------------- one grammar


def _python_us(text: str) -> int | str | None:
    """parse_duration's answer in microseconds; ``"big"`` past the bound; None if refused."""
    try:
        return parse_duration(text) // timedelta(microseconds=1)
    except InvalidInput as exc:
        return "big" if exc.reason.startswith("at most") else None


def _duration_corpus() -> list[str]:
    rng = random.Random(2026)
    units = ["w", "d", "h", "m", "s", "ms"]
    corpus = [
        "90", "90s", "500ms", "5m", "1h30m", "1h 30m", "1.5h", "2d", "1w", ".5", "5.", "0",
        "0s", "", " ", "5x", "1m1h", "1m1m", "1 5h", "1m s", "5 m", " 7d ", "1W2D3H4M5S6MS",
        "3000000d", "3650d", "3650d0.001ms", "1.0000005ms", "0.0000001s", ".0000001w",
        "0" * 30 + "1s", "0" * 29 + "1s", "1" * 31, "9" * 40 + "d", "-5m", "1e3s", "5 sec",
        "1h\t30m", "1h\n30m", "1\u00a0h", "\u30005m\u3000", "1.2.3h", "..5s", "5..s", "5ms5s",
    ]  # fmt: skip
    alphabet = [*list("0123456789..wdhmsWDHMSxe-"), " ", "\t", "\n", "\xa0", "\u2003"]
    for _ in range(3000):
        corpus.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 10))))
    for _ in range(3000):
        picked = sorted(rng.sample(range(6), rng.randint(1, 3)))
        if rng.random() < 0.1:
            rng.shuffle(picked)
        parts = []
        for index in picked:
            number = rng.choice(
                [str(rng.randint(0, 999)), f"{rng.randint(0, 99)}.{rng.randint(0, 999)}",
                 f".{rng.randint(0, 99)}", f"{rng.randint(1, 9)}.", str(rng.randint(0, 10**9))]
            )  # fmt: skip
            unit = units[index] if rng.random() < 0.7 else units[index].upper()
            gap = rng.choice(["", "", " ", "\t", "\u2009"])
            parts.append(f"{number}{gap}{unit}")
        corpus.append(rng.choice(["", " "]).join(parts))
    return corpus


async def test_sql_reads_the_duration_grammar_of_python(conn: asyncpg.Connection) -> None:
    corpus = _duration_corpus()
    rows = await aio(conn.fetch)(
        "SELECT t, coordinator._duration_us(t) AS us FROM unnest($1::text[]) AS t", corpus
    )
    disagreements = []
    accepted = 0
    for row in rows:
        expected, got = _python_us(row["t"]), row["us"]
        if expected == "big":
            same = got is not None and got > MAX_US
        else:
            same = got == (Decimal(expected) if expected is not None else None)
        accepted += expected is not None
        if not same:
            disagreements.append((row["t"], expected, got))
    assert disagreements == []
    assert accepted > len(corpus) // 4  # the corpus exercises both answers


async def test_sql_interval_problem_agrees_with_the_schedule_rules(
    conn: asyncpg.Connection,
) -> None:
    from coordinator.schedule import invalid_reason

    corpus = [*_duration_corpus()[:60], "500ms", "1s", "0.999s", "3650d", "3650d 1ms"]
    rows = await aio(conn.fetch)(
        "SELECT t, coordinator._interval_problem(t) AS p FROM unnest($1::text[]) AS t", corpus
    )
    for row in rows:
        python = invalid_reason(Schedule(kind="interval", expression=row["t"]))
        assert (row["p"] is None) == (python is None), (row["t"], row["p"], python)


def _name_corpus() -> list[str]:
    rng = random.Random(11)
    controls = [chr(c) for c in (*range(1, 0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029)]
    plain = list("abcXYZ019._-/<>%' é☕")
    corpus = ["default", "a", "a" * 63, "a" * 64, "x" * 200, "x" * 201, "-x", "x-", ".x"]
    corpus += [f"a{c}b" for c in controls] + [f"{w}x" for w in WHITESPACE]
    corpus += [f"x{w}" for w in WHITESPACE] + [f"x{w}y" for w in WHITESPACE]
    for _ in range(2000):
        pool = plain + (controls if rng.random() < 0.3 else []) + WHITESPACE[:3]
        corpus.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 12))))
    corpus.append("".join(chr(rng.randrange(0x21, 0x3000)) for _ in range(3000)))
    return corpus


def _accepts(check: Any, value: str) -> bool:
    try:
        check(value)
    except InvalidInput:
        return False
    return True


async def test_sql_name_rules_agree_with_python(conn: asyncpg.Connection) -> None:
    corpus = _name_corpus()
    rows = await aio(conn.fetch)(
        """SELECT t, coordinator._name_problem(t) AS name, coordinator._namespace_problem(t) AS ns
             FROM unnest($1::text[]) AS t""",
        corpus,
    )
    for row in rows:
        assert (row["name"] is None) == _accepts(check_job_name, row["t"]), (row["t"], row)
        assert (row["ns"] is None) == _accepts(check_namespace, row["t"]), (row["t"], row)
    assert any(r["name"] is None for r in rows)
    assert any(r["name"] for r in rows)


# --------------------------------------------------------------------------- plain SQL refused


REFUSED_ROWS: list[tuple[dict[str, Any], str, str]] = [
    ({"name": "a\nb"}, "name", "U+000A at character 2"),
    ({"name": "a\rb"}, "name", "U+000D at character 2"),
    ({"name": "\x1b[31m"}, "name", "U+001B at character 1"),
    ({"name": "x\x85"}, "name", "U+0085 at character 2"),
    ({"name": " x"}, "name", "must not start or end with whitespace"),
    ({"name": "x" * 201}, "name", "at most 200 characters, not 201"),
    ({"name": "ok", "namespace": "my app"}, "namespace", "use letters, digits"),
    ({"name": "ok", "namespace": "n" * 64}, "namespace", "at most 63 characters"),
    (
        {"name": "ok", "schedule_kind": "interval", "schedule": "3000000d"},
        "every",
        "every: at most 3650d, not 3000000d",
    ),
    (
        {"name": "ok", "schedule_kind": "interval", "schedule": "5 parsecs"},
        "every",
        "is not a duration",
    ),
    (
        {"name": "ok", "schedule_kind": "interval", "schedule": "500ms"},
        "every",
        "at least 1s",
    ),
]


async def test_plain_insert_is_refused_with_the_field(conn: asyncpg.Connection) -> None:
    for columns, field, message in REFUSED_ROWS:
        error = await refused(conn, *_insert(**columns))
        assert error.sqlstate == "23514", columns
        assert error.constraint_name == f"jobs_{field}_check", columns
        assert message in error.message, columns
        assert "\n" not in error.message
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.jobs") == 0


async def test_a_random_3kb_name_gets_a_clear_error_not_a_btree_one(
    conn: asyncpg.Connection,
) -> None:
    rng = random.Random(3)
    name = "".join(chr(rng.randrange(0x21, 0x3000)) for _ in range(3000))
    error = await refused(conn, *_insert(name=name))
    assert error.message == "name: at most 200 characters, not 3000"
    with pytest.raises(InvalidInput, match=r"^name: at most 200 characters, not 3000$"):
        await aio(client.define_job)(
            conn,
            name=name,
            schedule=Schedule(kind="manual"),
            target=Target(kind="exec", argv=["x"]),
        )


async def test_plain_sql_may_define_what_the_rules_allow(conn: asyncpg.Connection) -> None:
    for name in ("<script>alert(1)</script>", "reports/daily", "x" * 200, "100%/sure"):
        await aio(conn.execute)(*_insert(name=name))
    statement = _insert(name="every", schedule_kind="interval", schedule="3650d")
    await aio(conn.execute)(*statement)
    # An interval the rules refuse is storable inert, as sync stores a bad manifest entry.
    statement = _insert(
        name="inert", schedule_kind="interval", schedule="3000000d", invalid_reason="too long"
    )
    await aio(conn.execute)(*statement)


async def test_updates_are_checked_when_they_change_a_checked_column(
    conn: asyncpg.Connection,
) -> None:
    statement = _insert(name="job", schedule_kind="interval", schedule="5m")
    await aio(conn.execute)(*statement)
    for assignment, field in [
        ("schedule = '3000000d'", "every"),
        ("name = E'a\\nb'", "name"),
        ("namespace = 'a b'", "namespace"),
        ("timeout = interval '3651 days'", "timeout"),
        ("next_run_at = 'infinity'", "next_run_at"),
        ("next_run_at = '10000-01-01 00:00:00+00'", "next_run_at"),
        ("next_run_at = '1969-12-31 23:59:59+00'", "next_run_at"),
    ]:
        error = await refused(conn, f"UPDATE coordinator.jobs SET {assignment} WHERE name = 'job'")
        assert error.constraint_name == f"jobs_{field}_check", assignment
    # An inert row keeps its text; making it active again checks it.
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET schedule = 'soon', invalid_reason = 'x' WHERE name = 'job'"
    )
    error = await refused(
        conn, "UPDATE coordinator.jobs SET invalid_reason = NULL WHERE name = 'job'"
    )
    assert "'soon' is not a duration" in error.message


async def test_plain_insert_refuses_a_huge_timeout_and_an_out_of_range_deadline(
    conn: asyncpg.Connection,
) -> None:
    error = await refused(conn, *_insert(name="t", timeout="3000000 days"))
    assert error.constraint_name == "jobs_timeout_check"
    for at in ("infinity", "20000-01-01 00:00:00+00", "1960-01-01 00:00:00+00"):
        statement = _insert(name="o", schedule_kind="once", schedule="x", next_run_at=at)
        assert (await refused(conn, *statement)).constraint_name == "jobs_next_run_at_check"
    # The bounds themselves are fine.
    await aio(conn.execute)(*_insert(name="t", timeout="3650 days"))


# --------------------------------------------------------------------------- the SQL API


async def _define(conn: asyncpg.Connection, **kw: Any) -> Any:
    args = {"name": "job", "schedule_kind": "manual", "target": EXEC, **kw}
    named = ", ".join(f"{k} => ${i}" for i, k in enumerate(args, 1))
    return await aio(conn.fetchval)(f"SELECT coordinator.define_job({named})", *args.values())


OUT_OF_BOUNDS: list[tuple[dict[str, Any], str, str]] = [
    (
        {"schedule_kind": "interval", "schedule": "3000000d"},
        "every",
        "every: at most 3650d, not 3000000d",
    ),
    ({"schedule_kind": "interval", "schedule": "0.5s"}, "every", "at least 1s"),
    ({"timeout": timedelta(days=3651)}, "timeout", "timeout: at most 3650d, not 3651 days"),
    ({"timeout": timedelta(seconds=-1)}, "timeout", "timeout: must be greater than zero"),
    (
        {"schedule_kind": "once", "schedule": "20000-01-01T00:00:00Z"},
        "at",
        "the years 1970 to 9999",
    ),
    (
        {"schedule_kind": "once", "schedule": "1969-07-20T20:17:00Z"},
        "at",
        "the years 1970 to 9999",
    ),
    ({"schedule_kind": "once", "schedule": "infinity"}, "at", "out of range"),
    # (0031: the jobs table's check trigger said these, 23514 with a CONTEXT quoting the
    # whole INSERT ... ON CONFLICT; an empty name read "at most 200 characters, not 0".)
    ({"name": "é" * 201}, "name", "name: at most 200 characters, not 201"),
    ({"name": ""}, "name", "name: must be a non-empty string"),
    ({"name": " x"}, "name", "name: must not start or end with whitespace"),
    ({"name": "a\nb"}, "name", "name: control characters are not allowed (U+000A"),
    # (0026: the table's CHECK constraints said these, naming a constraint, not the argument.)
    (
        {"schedule_kind": "weekly", "schedule": "x"},
        "schedule_kind",
        "schedule_kind: must be cron, interval, once or manual, not 'weekly'",
    ),
    ({"priority": "urgent"}, "priority", "priority: must be interactive or background, not"),
    ({"params": "[1]"}, "params", "params: must be a JSON object, not array"),
    (
        {"schedule": "5m"},
        "schedule",
        "schedule: a manual job has none (it runs when triggered), not '5m'",
    ),
    # Zero, negative, finer than a microsecond, in any spelling: out of bounds, in the
    # CLI's words (stored inert as "not a duration" before 0026).
    *(
        ({"schedule_kind": "interval", "schedule": every}, "every", f"every: {every!r}: {why}")
        for every, why in [
            ("0", "a duration must be greater than zero"),
            ("0S", "a duration must be greater than zero"),
            ("0h0m", "a duration must be greater than zero"),
            ("0m 0s", "a duration must be greater than zero"),
            (" 0.0 h", "a duration must be greater than zero"),
            ("-5", "a duration must be positive"),
            ("-5m", "a duration must be positive"),
            ("0.0000001s", "finer than a microsecond"),
        ]
    ),
]


async def test_define_job_refuses_out_of_bounds(conn: asyncpg.Connection) -> None:
    for kw, column, message in OUT_OF_BOUNDS:
        with pytest.raises(asyncpg.PostgresError) as info:
            await _define(conn, **kw)
        assert info.value.sqlstate == "22023", kw
        assert info.value.column_name == column, kw
        assert message in info.value.message, kw
        assert "INSERT INTO" not in (info.value.context or ""), kw
        # The client reads the field from the error, and says it once.
        with pytest.raises(InvalidInput) as translated, client.translate_errors():
            await _define(conn, **kw)
        assert translated.value.field == column
        assert str(translated.value).count(f"{column}:") == 1, str(translated.value)
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.jobs") == 0


async def test_define_job_asks_for_a_schedule_by_its_name(conn: asyncpg.Connection) -> None:
    for kind in ("cron", "interval", "once"):
        with pytest.raises(asyncpg.PostgresError) as info:
            await _define(conn, schedule_kind=kind)
        assert (info.value.sqlstate, info.value.column_name) == ("22004", "schedule")
        assert info.value.message == f"schedule: required for a {kind} job"
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.jobs") == 0


async def test_define_job_stores_an_unparsable_interval_inert(conn: asyncpg.Connection) -> None:
    await _define(conn, name="junk", schedule_kind="interval", schedule="5 parsecs")
    await _define(conn, name="given", schedule_kind="interval", schedule="3000000d",
                  invalid_reason="every: at most 3650d, not 3000000d")  # fmt: skip
    rows = await aio(conn.fetch)("SELECT name, invalid_reason FROM coordinator.jobs ORDER BY 1")
    assert [(r["name"], r["invalid_reason"]) for r in rows] == [
        ("given", "every: at most 3650d, not 3000000d"),
        ("junk", "every: '5 parsecs' is not a duration (expected e.g. 90s, 5m, 1h30m)"),
    ]


#: Targets, good and bad: SQL's rule must say what Target.from_json says (0022).
TARGETS: list[Any] = [
    {"kind": "exec", "argv": ["true"]},
    {"kind": "exec", "argv": ["/bin/x", "-v"], "env": {"A": "1"}, "cwd": "/tmp"},
    {"kind": "exec", "argv": ["x"], "env": None, "cwd": None},
    # (Python reads a false, empty or zero env as none: `data.get("env") or {}`.)
    {"kind": "exec", "argv": ["x"], "env": []},
    {"kind": "exec", "argv": ["x"], "env": ""},
    {"kind": "exec", "argv": ["x"], "env": 0},
    {"kind": "exec", "argv": ["x"], "env": False},
    {"kind": "exec", "argv": ["x"], "env": {}},
    {"kind": "exec", "argv": ["x"], "env": "A=1"},
    {"kind": "exec", "argv": [""]},
    {"kind": "worker", "type": "t", "extra": 1},
    {"kind": "worker", "type": "billing"},
    {"kind": "shell", "cmd": "true"},
    {"kind": 5},
    {"kind": None},
    {"argv": ["true"]},
    {"kind": "exec"},
    {"kind": "exec", "argv": []},
    {"kind": "exec", "argv": "true"},
    {"kind": "exec", "argv": ["a", 1]},
    {"kind": "exec", "argv": ["a"], "env": {"A": 1}},
    {"kind": "exec", "argv": ["a"], "env": ["A=1"]},
    {"kind": "exec", "argv": ["a"], "cwd": 7},
    {"kind": "worker"},
    {"kind": "worker", "type": ""},
    {"kind": "worker", "type": 3},
]


async def test_sql_target_rule_agrees_with_python(conn: asyncpg.Connection) -> None:
    for target in TARGETS:
        said = await aio(conn.fetchval)(
            "SELECT coordinator._target_problem($1::jsonb)", json.dumps(target)
        )
        try:
            Target.from_json(target)
            expected = None
        except ValueError as exc:
            expected = str(exc)
        assert said == expected, target
    assert await aio(conn.fetchval)("SELECT coordinator._target_problem('[1]')") == (
        "must be a JSON object"
    )


async def test_define_job_refuses_a_target_nothing_could_run(conn: asyncpg.Connection) -> None:
    """A target no executor runs is refused when it is defined, not when it runs; an entry
    stored inert on purpose keeps what it was given."""
    for target, words in [
        ({"kind": "shell", "cmd": "true"}, "target kind must be 'exec' or 'worker', not 'shell'"),
        ({"kind": "exec", "argv": []}, "exec target needs 'argv', a non-empty list of strings"),
    ]:
        with pytest.raises(asyncpg.PostgresError) as info:
            await aio(conn.execute)(
                "SELECT coordinator.define_job('x', 'manual', $1::jsonb)", json.dumps(target)
            )
        assert info.value.sqlstate == "22023"
        assert info.value.column_name == "target"
        assert info.value.message == f"target: {words}"
        with pytest.raises(InvalidInput, match=f"^target: {words}$"), client.translate_errors():
            await aio(conn.execute)(
                "SELECT coordinator.define_job('x', 'manual', $1::jsonb)", json.dumps(target)
            )
    # sync calls define_job: the same refusal, nothing applied.
    with pytest.raises(asyncpg.PostgresError, match="target kind must be"):
        await aio(conn.fetch)(
            "SELECT * FROM coordinator.sync('default', $1::jsonb)",
            json.dumps([{"name": "a", "schedule_kind": "manual", "target": {"kind": "none"}}]),
        )
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.jobs") == 0
    await aio(conn.fetch)(
        "SELECT * FROM coordinator.sync('default', $1::jsonb)",
        json.dumps([{"name": "a", "schedule_kind": "manual", "target": {"kind": "none"},
                     "invalid_reason": "command: give command or worker"}]),
    )  # fmt: skip
    assert await aio(conn.fetchval)("SELECT invalid_reason FROM coordinator.jobs") == (
        "command: give command or worker"
    )


NULLS: list[tuple[str, tuple[Any, ...], str]] = [
    ("SELECT * FROM coordinator.sync(NULL, '[]')", (), "namespace"),
    ("SELECT * FROM coordinator.sync(NULL, $1::jsonb)", ('[{"name": "a"}]',), "namespace"),
    ("SELECT coordinator.define_job(NULL, 'manual', $1::jsonb)", (EXEC,), "name"),
    ("SELECT coordinator.define_job('a', NULL, $1::jsonb)", (EXEC,), "schedule_kind"),
    ("SELECT coordinator.define_job('a', 'manual', NULL)", (), "target"),
    (
        "SELECT coordinator.define_job('a', 'manual', $1::jsonb, namespace => NULL)",
        (EXEC,),
        "namespace",
    ),
    ("SELECT coordinator.trigger(NULL, 'a')", (), "namespace"),
    ("SELECT coordinator.trigger('default', NULL)", (), "name"),
    ("SELECT coordinator.pause(NULL, 'a')", (), "namespace"),
    ("SELECT coordinator.resume('default', NULL)", (), "name"),
    ("SELECT coordinator.remove(NULL, NULL)", (), "namespace"),
    ("SELECT coordinator.resolve(NULL, 'failed')", (), "run_id"),
    ("SELECT coordinator.resolve(1, NULL)", (), "outcome"),
    ("SELECT coordinator.cancel(NULL)", (), "run_id"),
]


async def test_sql_api_refuses_null(conn: asyncpg.Connection) -> None:
    await _define(conn, name="a")
    for sql, args, argument in NULLS:
        error = await refused(conn, sql, *args)
        assert error.sqlstate == "22004", sql
        assert error.message == f"{argument}: must not be NULL", sql
        assert error.column_name == argument, sql
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.jobs") == 1


async def test_trigger_names_its_args_when_it_refuses_them(conn: asyncpg.Connection) -> None:
    """(0029) args that are not an object are refused with the argument in COLUMN, and
    NULL args as every NULL argument is (22004); (0036) in define_job's words for params
    (it said `args must be a JSON object`)."""
    await _define(conn, name="a")
    error = await refused(conn, "SELECT coordinator.trigger('default', 'a', '[1, 2]')")
    assert (error.sqlstate, error.column_name, error.message) == (
        "22023",
        "args",
        "args: must be a JSON object, not array",
    )
    error = await refused(conn, "SELECT coordinator.trigger('default', 'a', '\"x\"')")
    assert error.message == "args: must be a JSON object, not string"
    with pytest.raises(InvalidInput) as translated, client.translate_errors():
        await aio(conn.execute)("SELECT coordinator.trigger('default', 'a', '[1]')")
    assert str(translated.value) == "args: must be a JSON object, not array"
    error = await refused(conn, "SELECT coordinator.trigger('default', 'a', NULL)")
    assert (error.sqlstate, error.column_name, error.message) == (
        "22004",
        "args",
        "args: must not be NULL",
    )
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.runs") == 0


async def test_resolve_names_the_outcome_it_refuses(conn: asyncpg.Connection) -> None:
    """(0036) An unknown outcome is refused as every other argument is: the argument
    first, the value quoted, the argument in COLUMN (it said `outcome must be failed,
    succeeded or retry, not maybe`)."""
    await _define(conn, name="a")
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'a')")
    await aio(conn.execute)(
        "UPDATE coordinator.runs SET status = 'unresolved' WHERE id = $1", run_id
    )
    error = await refused(conn, "SELECT coordinator.resolve($1, 'maybe')", run_id)
    assert (error.sqlstate, error.column_name, error.message) == (
        "22023",
        "outcome",
        "outcome: must be failed, succeeded or retry, not 'maybe'",
    )
    with pytest.raises(InvalidInput) as translated, client.translate_errors():
        await aio(conn.execute)("SELECT coordinator.resolve($1, 'maybe')", run_id)
    assert translated.value.field == "outcome"
    assert str(translated.value).count("outcome:") == 1
    status = await aio(conn.fetchval)("SELECT status FROM coordinator.runs WHERE id = $1", run_id)
    assert status == "unresolved"


async def test_define_job_refuses_a_commands_params_no_environment_variable_holds(
    conn: asyncpg.Connection,
) -> None:
    """(0036) A command gets its params in COORDINATOR_PARAMS, one environment string of
    at most 128 KiB: SQL's define_job (and sync, through it) stored more, and every run
    then failed. Refused now in the client's words, measured as the client measures
    (model.params_env_size: JSON with non-ASCII text as UTF-8)."""
    big = json.dumps({"x": "a" * 200_000})
    error = await refused(
        conn,
        "SELECT coordinator.define_job('big', 'manual', $1::jsonb, params => $2::jsonb)",
        EXEC,
        big,
    )
    assert (error.sqlstate, error.column_name) == ("22023", "params")
    assert error.message.startswith(
        "params: 200,009 bytes as JSON; a command gets its params in one environment "
        "variable (COORDINATOR_PARAMS), which may hold 128 KiB at most"
    ), error.message
    assert "\n" not in error.message
    # The same words as the client's refusal (client._prepare), field said once.
    with pytest.raises(InvalidInput) as from_sql, client.translate_errors():
        await _define(conn, name="big", params=big)
    with pytest.raises(InvalidInput) as from_client:
        await aio(client.define_job)(
            conn,
            name="big",
            schedule=Schedule(kind="manual"),
            target=Target(kind="exec", argv=["true"]),
            params=json.loads(big),
        )
    assert str(from_sql.value) == str(from_client.value)
    # sync defines through define_job: the entry is named.
    error = await refused(
        conn,
        "SELECT * FROM coordinator.sync('default', $1::jsonb)",
        json.dumps([{"name": "big", "schedule_kind": "manual",
                     "target": {"kind": "exec", "argv": ["true"]}, "params": json.loads(big)}]),
    )  # fmt: skip
    assert error.message.startswith("jobs[0].params: 200,009 bytes as JSON"), error.message
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.jobs") == 0

    # The boundary, measured as the command gets it: non-ASCII as UTF-8, escapes as sent.
    for filler in ("a", "é", "日", "\n"):
        fitting = {"k": "", "n": [1, 2.5, None, True]}
        overhead = params_env_size(fitting)
        per_char = params_env_size({"k": filler}) - params_env_size({"k": ""})
        fitting["k"] = filler * ((ENV_STRING_MAX - overhead) // per_char)
        assert (
            params_env_size(fitting)
            <= ENV_STRING_MAX
            < params_env_size({**fitting, "k": fitting["k"] + filler})
        )
        await _define(conn, name="fits", params=json.dumps(fitting))
        error = await refused(
            conn,
            "SELECT coordinator.define_job('over', 'manual', $1::jsonb, params => $2::jsonb)",
            EXEC,
            json.dumps({**fitting, "k": fitting["k"] + filler}),
        )
        size = params_env_size({**fitting, "k": fitting["k"] + filler}) - 20
        assert error.message.startswith(f"params: {size:,} bytes as JSON"), filler
    # A worker's params travel on its socket; an inert entry runs nothing.
    await _define(conn, name="worker", params=big, target='{"kind": "worker", "type": "t"}')
    await _define(conn, name="inert", params=big, invalid_reason="kept as given")
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.jobs") == 3


async def test_resolve_with_null_outcome_leaves_the_run_unresolved(
    conn: asyncpg.Connection,
) -> None:
    await _define(conn, name="a")
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'a')")
    await aio(conn.execute)(
        "UPDATE coordinator.runs SET status = 'unresolved' WHERE id = $1", run_id
    )
    await refused(conn, "SELECT coordinator.resolve($1, NULL)", run_id)
    status = await aio(conn.fetchval)("SELECT status FROM coordinator.runs WHERE id = $1", run_id)
    assert status == "unresolved"


async def test_sync_refuses_a_bad_namespace_and_bad_entries(conn: asyncpg.Connection) -> None:
    error = await refused(conn, "SELECT * FROM coordinator.sync('my app', '[]')")
    assert error.sqlstate == "22023"
    assert error.message.startswith("namespace: use letters, digits")
    error = await refused(conn, "SELECT * FROM coordinator.sync('ns', '[3]')")
    assert error.message == "jobs[0]: must be a JSON object"
    error = await refused(conn, "SELECT * FROM coordinator.sync('ns', '[{\"name\": \"a\"}]')")
    # (0030) define_job's refusal names the entry too, with the argument jobs.
    assert (error.sqlstate, error.column_name, error.message) == (
        "22004",
        "jobs",
        "jobs[0].schedule_kind: must not be NULL",
    )
    error = await refused(conn, "SELECT * FROM coordinator.sync('ns', '{}')")
    assert (error.sqlstate, error.column_name) == ("22023", "jobs")
    error = await refused(conn, "SELECT * FROM coordinator.sync('ns', NULL)")
    assert (error.sqlstate, error.column_name, error.message) == (
        "22004",
        "jobs",
        "jobs: must not be NULL",
    )
    error = await refused(conn, "SELECT * FROM coordinator.sync('ns', '[{\"name\": null}]')")
    assert error.message == "jobs[0].name: required"
    # (0026) A name listed twice is refused, as the client and a manifest refuse it; a
    # value that does not cast is named with its entry.
    ok = {"name": "a", "schedule_kind": "manual", "target": json.loads(EXEC)}
    for entries, message in [
        ([ok, {**ok, "name": "b"}, ok], "jobs[2].name: 'a' is listed twice (also jobs[0])"),
        (
            [ok, {**ok, "name": "b", "retries": "three"}],
            'jobs[1].retries: invalid input syntax for type integer: "three"',
        ),
        (
            [{**ok, "keep_last": 10**10}],
            'jobs[0].keep_last: value "10000000000" is out of range for type integer',
        ),
        (
            [{**ok, "alert": "yes please"}],
            'jobs[0].alert: invalid input syntax for type boolean: "yes please"',
        ),
        (
            [{**ok, "timeout": "forever"}],
            'jobs[0].timeout: invalid input syntax for type interval: "forever"',
        ),
        # (0030) A value that casts but define_job refuses, named with its entry.
        (
            [ok, {**ok, "name": "b", "schedule_kind": "interval", "schedule": "0"}],
            "jobs[1].every: '0': a duration must be greater than zero",
        ),
    ]:
        error = await refused(
            conn, "SELECT * FROM coordinator.sync('ns', $1::text::jsonb)", json.dumps(entries)
        )
        assert (error.sqlstate, error.column_name, error.message) == ("22023", "jobs", message)
        assert (error.detail, error.hint) == (None, None)  # (none made up: not even '')
    # What casts is taken as before (strings for booleans and numbers, a number of seconds
    # for an interval); an unknown key is ignored as before, but said in a WARNING.
    warnings: list[str] = []

    def listen(_conn: Any, message: Any) -> None:
        warnings.append(message.message)

    conn.add_log_listener(listen)
    try:
        synced = await aio(conn.fetchrow)(
            "SELECT * FROM coordinator.sync('ns', $1::text::jsonb)",
            json.dumps(
                [{**ok, "retries": "2", "alert": "false", "timeout": 30, "retires": 3, "x": 1}]
            ),
        )
    finally:
        conn.remove_log_listener(listen)
    assert tuple(synced) == (1, 0, 0)
    row = await aio(conn.fetchrow)("SELECT * FROM coordinator.jobs WHERE name = 'a'")
    assert (row["retries"], row["alert"], row["timeout"]) == (2, False, timedelta(seconds=30))
    assert warnings == [
        "jobs[0]: unknown key 'retires' ignored",
        "jobs[0]: unknown key 'x' ignored",
    ]
    # The client says the same before sending anything.
    with pytest.raises(InvalidInput, match=r"^namespace: 'my app': use letters"):
        await aio(client.sync)(conn, "my app", [])
    with pytest.raises(InvalidInput, match=r"^jobs\[0\]\.name: 'a\\nb': control characters"):
        await aio(client.sync)(conn, "ns", [{"name": "a\nb"}])


# --------------------------------------------------------------------------- the Python client


CLIENT_REFUSALS: list[tuple[dict[str, Any], str]] = [
    ({"name": "a\nb"}, "name: 'a\\nb': control characters are not allowed"),
    ({"name": "x" * 3000}, "name: at most 200 characters, not 3000"),
    ({"name": "ok", "namespace": "my app"}, "namespace: 'my app': use letters"),
    ({"name": "ok", "timeout": timedelta(days=3000000)}, "timeout: at most 3650d, not"),
    (
        {"name": "ok", "schedule": Schedule(kind="interval", expression="3000000d")},
        "every: at most 3650d, not 3000000d",
    ),
]


async def test_client_refuses_in_one_line(conn: asyncpg.Connection) -> None:
    for kw, message in CLIENT_REFUSALS:
        args: dict[str, Any] = {
            "schedule": Schedule(kind="manual"),
            "target": Target(kind="exec", argv=["true"]),
            **kw,
        }
        with pytest.raises(InvalidInput) as info:
            await aio(client.define_job)(conn, **args)
        assert str(info.value).startswith(message)
        assert "\n" not in str(info.value)
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.jobs") == 0


# --------------------------------------------------------------------------- rows from before


async def test_rows_stored_before_the_rules_keep_working(pg_server: Any, aio_loop: Any) -> None:
    """0005 never fails on old rows: unusable durations and deadlines become inert with a
    reason, and rows under refused names stay updatable, reachable and removable."""
    name = pg_server.new_database_name()
    admin = await aio(asyncpg.connect)(pg_server.admin_dsn)
    await aio(admin.execute)(f"CREATE DATABASE {name}")
    conn = await aio(asyncpg.connect)(pg_server.dsn(name))
    try:
        earlier = [m for m in migrate_mod.load_migrations() if m.name < "0005"]
        await migrate_mod.migrate(conn, earlier)
        old_rows = [
            {"namespace": "my app", "name": "legacy"},
            {"name": "two\nlines"},
            {"name": "huge", "schedule_kind": "interval", "schedule": "3000000d"},
            {"name": "slow", "timeout": "3000000 days"},
            {"name": "never", "schedule_kind": "once", "schedule": "x", "next_run_at": "infinity"},
            {"name": "fine", "schedule_kind": "interval", "schedule": "5m"},
        ]
        for row in old_rows:
            await aio(conn.execute)(*_insert(**row))
        applied = await migrate_mod.migrate(conn)
        assert applied[0] == "0005_front_doors.sql"

        rows = await aio(conn.fetch)(
            "SELECT name, invalid_reason, next_run_at FROM coordinator.jobs ORDER BY id"
        )
        reasons = {r["name"]: r["invalid_reason"] for r in rows}
        assert reasons == {
            "legacy": None,
            "two\nlines": None,
            "huge": "every: at most 3650d, not 3000000d",
            "slow": "timeout: at most 3650d, not 3000000 days",
            "never": "at: 'x' is out of range (the years 1970 to 9999, in UTC)",
            "fine": None,
        }
        assert all(r["next_run_at"] is None for r in rows)
        # The daemon's kind of write (one statement for many rows) still succeeds.
        updated = await aio(conn.execute)(
            "UPDATE coordinator.jobs SET next_run_at = now(), updated_at = now()"
        )
        assert updated == "UPDATE 6"
        await aio(conn.execute)("SELECT coordinator.pause('my app', 'legacy')")
        # A rename is a write of the name: it must follow the rules.
        error = await refused(
            conn, "UPDATE coordinator.jobs SET name = E'still\\nbad' WHERE name = 'legacy'"
        )
        assert error.constraint_name == "jobs_name_check"
        await aio(conn.execute)("SELECT coordinator.remove('default', E'two\\nlines')")
        assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.jobs") == 5
    finally:
        await aio(conn.close)()
        await aio(admin.execute)(f"DROP DATABASE {name} WITH (FORCE)")
        await aio(admin.close)()
