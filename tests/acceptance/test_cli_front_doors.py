"""The command line's front door (bounded durations, allowed names) and its output (control
characters escaped), as a user runs it: a subprocess against a real database."""

from __future__ import annotations

import asyncio
import json
import random
import re
from typing import TYPE_CHECKING

import asyncpg

from .test_cli import cli, one_line_error, sql

if TYPE_CHECKING:
    from pathlib import Path

#: What may never reach a terminal raw (C0 but newline, DEL, C1, U+2028/U+2029).
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
NASTY = "two\nlines\r\x1b[31mred\x1b[0m\x07\x7f\x85\u2028end"


def _script(dsn: str, script: str) -> None:
    """Several statements in one transaction, from outside the CLI."""

    async def run() -> None:
        conn = await asyncpg.connect(dsn, server_settings={"application_name": "tests-app"})
        try:
            async with conn.transaction():
                await conn.execute(script)
        finally:
            await conn.close()

    asyncio.run(run())


def test_huge_durations_are_refused_in_one_line(database: str) -> None:
    cases = [
        (("jobs", "define", "huge", "--every", "3000000d", "--", "true"), "--every"),
        (("jobs", "define", "t", "--manual", "--timeout", "3000000d", "--", "true"), "--timeout"),
        (("jobs", "trigger", "t", "--wait-timeout", "3000000d"), "--wait-timeout"),
    ]
    for args, flag in cases:
        result = cli(*args, dsn=database)
        assert (result.code, result.err) == (
            2,
            f"coordinator: {flag}: at most 3650d, not 3000000d\n",
        )
    old = cli("jobs", "define", "old", "--at", "1969-07-20T20:17:00Z", "--", "true", dsn=database)
    one_line_error(old, code=2, contains="--at: '1969-07-20T20:17:00Z' is out of range")
    assert sql(database, "SELECT count(*) AS n FROM coordinator.jobs")[0]["n"] == 0
    ok = cli("jobs", "define", "decade", "--every", "3650d", "--timeout", "3650d", "--", "true",
             dsn=database)  # fmt: skip
    assert ok.code == 0, ok


def test_refused_names_are_one_line_without_raw_control_characters(database: str) -> None:
    rng = random.Random(7)
    random_name = "".join(chr(rng.randrange(0x21, 0x3000)) for _ in range(3000))
    cases = [
        (("jobs", "define", "a\nb", "--manual", "--", "true"), "name: 'a\\nb': control"),
        (("jobs", "define", "a\rb", "--manual", "--", "true"), "(U+000D at character 2)"),
        (("jobs", "define", "\x1b[2Jx", "--manual", "--", "true"), "(U+001B at character 1)"),
        (("jobs", "define", "x\x85", "--manual", "--", "true"), "(U+0085 at character 2)"),
        (("jobs", "define", " x", "--manual", "--", "true"), "start or end with whitespace"),
        (("jobs", "define", random_name, "--manual", "--", "true"), "name: at most 200"),
        (("jobs", "define", "x", "-n", "my app", "--manual", "--", "true"), "--namespace:"),
    ]
    for args, contains in cases:
        result = cli(*args, dsn=database)
        one_line_error(result, code=2, contains=contains)
        assert RAW.search(result.err) is None, result.err
    assert sql(database, "SELECT count(*) AS n FROM coordinator.jobs")[0]["n"] == 0
    xss = cli("jobs", "define", "<script>alert(1)</script>", "--manual", "--", "true",
              dsn=database)  # fmt: skip
    assert xss.code == 0, xss
    assert cli("jobs", "show", "<script>alert(1)</script>", "--json", dsn=database).json[
        "name"
    ] == ("<script>alert(1)</script>")


def test_control_characters_in_stored_text_are_escaped_on_output(database: str) -> None:
    """Rows from before the naming rules, error messages and outputs: one line per row,
    nothing a terminal would act on."""
    cli("jobs", "define", "plain", "--manual", "--", "printf", "\x1b[31m", dsn=database)
    _script(
        database,
        """
        ALTER TABLE coordinator.jobs DISABLE TRIGGER jobs_check_insert;
        INSERT INTO coordinator.jobs (name, schedule_kind, target)
             VALUES (E'legacy\\n\\u001b[2Jname', 'manual', '{"kind": "exec", "argv": ["true"]}');
        ALTER TABLE coordinator.jobs ENABLE TRIGGER jobs_check_insert;
        """,
    )
    job_id = sql(database, "SELECT id FROM coordinator.jobs WHERE name LIKE 'legacy%'")[0]["id"]
    run_id = sql(
        database,
        "INSERT INTO coordinator.runs (job_id, trigger, status, started_at, finished_at, "
        "error_cause, error_message, extra) VALUES ($1, 'schedule', 'failed', now(), now(), "
        "'handler', $2, $3::jsonb) RETURNING id",
        job_id,
        NASTY,
        json.dumps({"output_tail": NASTY}),
    )[0]["id"]

    jobs = cli("jobs", "list", dsn=database)
    assert jobs.code == 0, jobs
    assert RAW.search(jobs.out) is None, jobs.out
    _header, *rows = jobs.out.splitlines()
    assert len(rows) == 2
    assert "legacy\\n\\x1b[2Jname" in jobs.out

    runs = cli("runs", "list", dsn=database)
    assert RAW.search(runs.out) is None, runs.out
    assert len(runs.out.splitlines()) == 2
    shown = cli("runs", "show", str(run_id), dsn=database)
    assert RAW.search(shown.out) is None, shown.out
    assert "two\\nlines\\r\\x1b[31mred" in shown.out
    assert "\\x85\\u2028end" in shown.out
    one = cli("runs", "show", str(run_id), "--json", dsn=database)
    listed = cli("runs", "list", "--json", dsn=database)
    for machine in (one, listed):  # JSON escapes, and reads back exactly
        assert RAW.search(machine.out) is None, machine.out
    assert one.json["error_message"] == NASTY
    assert listed.json[0]["extra"] == {"output_tail": NASTY}

    # A job stored under such a name stays reachable by it; what is printed is escaped.
    legacy = "legacy\n\x1b[2Jname"
    show = cli("jobs", "show", legacy, dsn=database)
    assert show.code == 0, show
    assert RAW.search(show.out) is None, show.out
    target = cli("jobs", "show", "plain", dsn=database)
    assert "printf \\x1b[31m" in target.out
    missing = cli("jobs", "pause", "gone\x1b[2J", dsn=database)
    one_line_error(missing, code=2, contains="unknown job default/gone\\x1b[2J")
    removed = cli("jobs", "remove", legacy, dsn=database)
    assert (removed.code, removed.out) == (0, "removed default/legacy\\n\\x1b[2Jname\n")


def test_manifest_bounds_and_names(database: str, tmp_path: Path) -> None:
    manifest = tmp_path / "jobs.toml"
    manifest.write_text(
        'namespace = "svc"\n'
        '[[jobs]]\nname = "huge"\nevery = "3000000d"\ncommand = ["true"]\n'
        '[[jobs]]\nname = "slow"\nmanual = true\ntimeout = "3000000d"\ncommand = ["true"]\n'
        '[[jobs]]\nname = "bad\\u001b[2J\\nname"\nmanual = true\ncommand = ["true"]\n'
        '[[jobs]]\nname = "fine/one"\nevery = "1h"\ncommand = ["true"]\n'
    )
    strict = cli("sync", str(manifest), "--strict", dsn=database)
    assert strict.code == 2, strict
    assert RAW.search(strict.err) is None, strict.err
    assert "huge: every: at most 3650d, not 3000000d" in strict.err
    assert sql(database, "SELECT count(*) AS n FROM coordinator.jobs")[0]["n"] == 0

    refused = cli("sync", str(manifest), dsn=database)  # refusing is the default now
    assert refused.code == 2, refused
    assert RAW.search(refused.err) is None, refused.err
    applied = cli("sync", str(manifest), "--allow-invalid", dsn=database)
    assert applied.code == 0, applied
    assert RAW.search(applied.out) is None, applied.out
    assert "synced namespace svc: 3 created" in applied.out
    assert "slow: timeout: at most 3650d, not 3000000d" in applied.out
    assert "jobs[2]: name: 'bad\\x1b[2J\\nname': control characters" in applied.out
    rows = sql(database, "SELECT name, invalid_reason FROM coordinator.jobs ORDER BY name")
    assert [(r["name"], r["invalid_reason"] is None) for r in rows] == [
        ("fine/one", True),
        ("huge", False),
        ("slow", False),
    ]

    bad_namespace = tmp_path / "ns.toml"
    bad_namespace.write_text('namespace = "my app"\n')
    one_line_error(
        cli("sync", str(bad_namespace), dsn=database), code=2, contains="namespace: 'my app'"
    )
