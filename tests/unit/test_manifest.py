"""Parsing ``sync`` manifests: pure, no database."""

from __future__ import annotations

import json
import textwrap
from typing import TYPE_CHECKING, Any

import pytest

from coordinator.errors import InvalidInput
from coordinator.manifest import Manifest, ManifestRejected, Problem, load, parse

if TYPE_CHECKING:
    from pathlib import Path


def _parse(text: str) -> Manifest:
    return parse(textwrap.dedent(text), source="jobs.toml")


def _one(job: str) -> tuple[dict[str, Any], list[Problem]]:
    """Parse one ``[[jobs]]`` body; return its entry and problems."""
    manifest = _parse('namespace = "svc"\n[[jobs]]\n' + textwrap.dedent(job))
    (entry,) = manifest.entries
    return entry, list(manifest.problems)


def _fields(problems: list[Problem]) -> list[str]:
    return [p.field for p in problems]


def test_full_entry_in_sql_shape() -> None:
    manifest = _parse(
        """
        namespace = "billing"

        [[jobs]]
        name = "invoice"
        cron = "0  3 * * *"
        timezone = "Europe/Berlin"
        timeout = "15m"
        priority = "interactive"
        idempotent = true
        paused = true
        retries = 3
        retry_backoff = "10s"
        retry_max_delay = "10m"
        misfire = "skip"
        misfire_grace = "5m"
        alert = false
        keep_last = 7
        retention = "90d"
        params = { region = "eu", batch = 500, since = 2026-01-01 }
        command = ["/usr/local/bin/invoice", "--all"]
        env = { LANG = "C.UTF-8" }
        cwd = "/srv/billing"

        [[jobs]]
        name = "reindex"
        every = "6h"
        worker = "search"
        recoverable = true
        """
    )
    assert manifest.namespace == "billing"
    assert manifest.problems == ()
    assert manifest.entries[0] == {
        "name": "invoice",
        "schedule_kind": "cron",
        "schedule": "0 3 * * *",
        "timezone": "Europe/Berlin",
        "target": {
            "kind": "exec",
            "argv": ["/usr/local/bin/invoice", "--all"],
            "env": {"LANG": "C.UTF-8"},
            "cwd": "/srv/billing",
        },
        "params": {"region": "eu", "batch": 500, "since": "2026-01-01"},
        "timeout": "900000000 microseconds",
        "priority": "interactive",
        "idempotent": True,
        "paused": True,
        "invalid_reason": None,
        "retries": 3,
        "retry_backoff": "10000000 microseconds",
        "retry_max_delay": "600000000 microseconds",
        "misfire": "skip",
        "misfire_grace": "300000000 microseconds",
        "recoverable": False,
        "alert": False,
        "keep_last": 7,
        "retention": "7776000000000 microseconds",
    }
    # Without `paused` the key is left out: the job keeps its paused state.
    assert manifest.entries[1] == {
        "name": "reindex",
        "schedule_kind": "interval",
        "schedule": "6h",
        "timezone": "UTC",
        "target": {"kind": "worker", "type": "search"},
        "params": {},
        "timeout": None,
        "priority": "background",
        "idempotent": False,
        "invalid_reason": None,
        "retries": 0,
        "retry_backoff": "30000000 microseconds",
        "retry_max_delay": "3600000000 microseconds",
        "misfire": "run-once",
        "misfire_grace": None,
        "recoverable": True,
        "alert": True,
        "keep_last": None,
        "retention": None,
    }
    json.dumps(manifest.entries)  # what coordinator.sync receives


def test_recoverable_needs_a_worker_and_a_boolean() -> None:
    manifest = _parse(
        """
        namespace = "ops"

        [[jobs]]
        name = "scan"
        manual = true
        recoverable = true
        command = ["scan.sh"]

        [[jobs]]
        name = "check"
        manual = true
        recoverable = "yes"
        worker = "check"
        """
    )
    assert [(p.job, p.field) for p in manifest.problems] == [
        ("scan", "recoverable"),
        ("check", "recoverable"),
    ]
    assert "only a worker job can be recoverable" in manifest.problems[0].reason
    assert manifest.problems[0].line == 7
    assert all(entry["invalid_reason"] for entry in manifest.entries)


@pytest.mark.parametrize(
    ("body", "kind", "schedule"),
    [
        ('every = "90s"', "interval", "1m30s"),
        ('every = "300s"', "interval", "5m"),
        ('at = "2030-01-01T10:00:00+02:00"', "once", "2030-01-01T08:00:00+00:00"),
        ("at = 2030-01-01T10:00:00Z", "once", "2030-01-01T10:00:00+00:00"),
        ("manual = true", "manual", None),
        ('cron = "@DAILY"', "cron", "@daily"),
    ],
)
def test_schedule_kinds(body: str, kind: str, schedule: str | None) -> None:
    entry, problems = _one(f'name = "j"\n{body}\nworker = "w"\n')
    assert problems == []
    assert (entry["schedule_kind"], entry["schedule"]) == (kind, schedule)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("manual = true\ntimeout = 90", "timeout"),
        ('manual = true\ntimeout = "90"', "timeout"),
        ("every = 6", "every"),
        ('every = "6"', "every"),
    ],
)
def test_a_duration_needs_its_unit(body: str, field: str) -> None:
    """`every = 6`: six seconds or six hours? Refused, with the two readings as a hint."""
    entry, problems = _one(f'name = "j"\n{body}\nworker = "w"\n')
    assert [(p.field, "a unit is required" in p.reason) for p in problems] == [(field, True)]
    assert entry["invalid_reason"] is not None


def test_problems_carry_their_line() -> None:
    manifest = _parse(
        """\
        namespace = "svc"

        [[jobs]]
        name = "ok"
        every = "5m"
        worker = "w"

        [[jobs]]
        name = "typo"
        cron = "0 0 3 * * *"
        worker = "w"

        [[jobs]]
        name = "hours"
        every = "6 hours"
        worker = "w"

        [[jobs]]
        name = "nothing"
        worker = "w"
        """
    )
    located = [p.located("jobs.toml") for p in manifest.problems]
    assert [line.split(": ")[0:3] for line in located] == [
        ["jobs.toml:10", "typo", "cron"],
        ["jobs.toml:15", "hours", "every"],
        ["jobs.toml:18", "nothing", "schedule"],  # not written: the entry's [[jobs]] line
    ]


def test_an_entrys_problems_come_in_the_order_of_its_lines() -> None:
    manifest = _parse(
        """\
        namespace = "svc"

        [[jobs]]
        name = "many"
        timeout = "soon"
        retries = -1
        cron = "not cron"
        worker = "w"
        """
    )
    lines = [p.line for p in manifest.problems]
    assert len(lines) >= 3
    assert lines == sorted(lines), manifest.problems


def test_inline_entries_point_at_the_jobs_line() -> None:
    manifest = parse('namespace = "svc"\n\njobs = [{ name = "a", worker = "w" }]\n')
    assert [p.line for p in manifest.problems] == [3]


@pytest.mark.parametrize("text", ['namespace = "svc"\n', 'namespace = "svc"\njobs = []\n'])
def test_empty_manifest(text: str) -> None:
    manifest = parse(text)
    assert (manifest.namespace, manifest.entries, manifest.problems) == ("svc", (), ())


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ('cron = "0 25 * * *"\nworker = "w"', "cron", "hour field '25'"),
        ('cron = "* * *"\nworker = "w"', "cron", "expected 5 fields"),
        ('cron = "@daily"\ntimezone = "Mars/Base"\nworker = "w"', "timezone", "unknown timezone"),
        ('every = "5m"\ntimezone = "UTC"\nworker = "w"', "timezone", "only applies to cron"),
        ('every = "5 parsecs"\nworker = "w"', "every", "unknown unit"),
        ('at = "2030-01-01T00:00:00"\nworker = "w"', "at", "no UTC offset"),
        ("at = 2030-01-01\nworker = 'w'", "at", "no UTC offset"),
        ('worker = "w"', "schedule", "exactly one of"),
        ('cron = "@daily"\nevery = "5m"\nworker = "w"', "schedule", "not cron and every"),
        ('manual = false\nworker = "w"', "manual", "must be true"),
        ("cron = 5\nworker = 'w'", "cron", "must be a string"),
        ('manual = true\ntimeout = "soon"\nworker = "w"', "timeout", "'soon'"),
        ('manual = true\ntimeout = "0s"\nworker = "w"', "timeout", "greater than zero"),
        ('manual = true\ntimeout = "3000000d"\nworker = "w"', "timeout", "at most 3650d"),
        ("manual = true\ntimeout = 400000000\nworker = 'w'", "timeout", "a unit is required"),
        ('every = "3000000d"\nworker = "w"', "every", "at most 3650d, not 3000000d"),
        ("every = 1e300\nworker = 'w'", "every", "a unit is required"),
        ('at = "1969-07-20T20:17:00Z"\nworker = "w"', "at", "the years 1970 to 9999"),
        ("at = 1960-01-01T00:00:00Z\nworker = 'w'", "at", "the years 1970 to 9999"),
        ('manual = true\npriority = "urgent"\nworker = "w"', "priority", "interactive"),
        ('manual = true\nidempotent = "yes"\nworker = "w"', "idempotent", "true or false"),
        ('manual = true\npaused = 1\nworker = "w"', "paused", "true or false"),
        ('manual = true\nparams = "x"\nworker = "w"', "params", "a table"),
        ('manual = true\nworker = "w"\ncommand = ["x"]', "command", "not both"),
        ("manual = true", "command", "give command"),
        ('manual = true\ncommand = "ls -l"', "command", "array of strings"),
        ("manual = true\ncommand = []", "command", "array of strings"),
        ('manual = true\nworker = ""', "worker", "non-empty"),
        ('manual = true\nworker = "w"\nenv = { A = "1" }', "env", "only applies to command"),
        ('manual = true\ncommand = ["x"]\nenv = { A = 1 }', "env", "strings"),
        ('manual = true\nworker = "w"\ntimout = "5m"', "timout", "did you mean 'timeout'?"),
        ('manual = true\nworker = "w"\nretries = 101', "retries", "0 to 100"),
        ('manual = true\nworker = "w"\nretries = "3"', "retries", "an integer"),
        ('manual = true\nworker = "w"\nretry_backoff = 5', "retry_backoff", "a unit"),
        ('manual = true\nworker = "w"\nretry_backoff = "0s"', "retry_backoff", "greater than"),
        ('manual = true\nworker = "w"\nretry_max_delay = "x"', "retry_max_delay", "'x'"),
        ('manual = true\nworker = "w"\nmisfire = "later"', "misfire", "run-once, skip"),
        ('manual = true\nworker = "w"\nmisfire = "skip"', "misfire_grace", "required"),
        ('manual = true\nworker = "w"\nmisfire_grace = "5m"', "misfire_grace", "only applies"),
        (
            'manual = true\nworker = "w"\nmisfire = "skip"\nmisfire_grace = "500ms"',
            "misfire_grace",
            "at least 1s",
        ),
        ('manual = true\nworker = "w"\nretrys = 3', "retrys", "did you mean 'retries'?"),
    ],
)
def test_invalid_entry_is_kept_inert(body: str, field: str, reason: str) -> None:
    entry, problems = _one(f'name = "j"\n{body}\n')
    assert field in _fields(problems), problems
    problem = next(p for p in problems if p.field == field)
    assert problem.job == "j"
    assert reason in problem.reason
    assert entry["name"] == "j"
    assert f"{field}: " in entry["invalid_reason"]
    assert entry["schedule_kind"] in ("cron", "interval", "once", "manual")
    assert (entry["schedule_kind"] == "manual") == (entry["schedule"] is None)
    assert isinstance(entry["target"], dict)
    json.dumps(entry)


def test_several_problems_in_one_entry() -> None:
    entry, problems = _one('name = "j"\ncron = "bad"\npriority = "x"\ncolour = "red"\n')
    # (In the order of the lines: the missing command points at the entry's first line.)
    assert _fields(problems) == ["command", "cron", "priority", "colour"]
    assert entry["invalid_reason"].count(": ") >= 4
    assert entry["priority"] == "background"  # the stored row must still pass the CHECKs


def test_nameless_entries_are_dropped() -> None:
    manifest = _parse(
        """
        namespace = "svc"
        [[jobs]]
        every = "5m"
        worker = "w"
        [[jobs]]
        name = ""
        manual = true
        worker = "w"
        [[jobs]]
        name = "ok"
        manual = true
        worker = "w"
        """
    )
    assert [e["name"] for e in manifest.entries] == ["ok"]
    assert [(p.job, p.field) for p in manifest.problems] == [
        ("jobs[0]", "name"),
        ("jobs[1]", "name"),
    ]
    assert manifest.entries[0]["invalid_reason"] is None


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ('"two\\nlines"', "'two\\nlines': control characters are not allowed (U+000A"),
        ('"esc\\u001b[31m"', "(U+001B at character 4)"),
        ('"cr\\r"', "(U+000D at character 3)"),
        ('" padded"', "must not start or end with whitespace"),
        ('"' + "x" * 3000 + '"', "at most 200 characters, not 3000"),
    ],
)
def test_entries_with_refused_names_are_dropped_with_a_problem(name: str, reason: str) -> None:
    manifest = _parse(
        f"""
        namespace = "svc"
        [[jobs]]
        name = {name}
        manual = true
        worker = "w"
        [[jobs]]
        name = "<script>alert(1)</script>/ok"
        manual = true
        worker = "w"
        """
    )
    assert [e["name"] for e in manifest.entries] == ["<script>alert(1)</script>/ok"]
    (problem,) = manifest.problems
    assert (problem.job, problem.field) == ("jobs[0]", "name")
    assert reason in problem.reason
    assert problem.reason.endswith("; the entry was skipped")
    assert "\n" not in str(problem)
    assert "\x1b" not in str(problem)


def test_non_table_entry() -> None:
    manifest = parse('namespace = "svc"\njobs = [1]\n')
    assert manifest.entries == ()
    assert manifest.problems == (
        Problem("jobs[0]", "jobs", "each entry must be a table, not a number", 2),
    )


def test_duplicate_names_keep_first_entry_inert() -> None:
    manifest = _parse(
        """
        namespace = "svc"
        [[jobs]]
        name = "a"
        every = "5m"
        worker = "first"
        [[jobs]]
        name = "a"
        every = "1h"
        worker = "second"
        """
    )
    (entry,) = manifest.entries
    assert entry["target"] == {"kind": "worker", "type": "first"}
    assert "defined more than once" in entry["invalid_reason"]
    assert manifest.problems == (
        Problem("a", "name", "defined more than once (again as jobs[1])", 8),
    )
    assert manifest.invalid == ("a",)


def test_problem_prints_as_name_field_reason() -> None:
    assert str(Problem("a", "cron", "bad")) == "a: cron: bad"


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ('namespace = "svc"\n[[jobs]\n', "jobs.toml:2:", "TOML syntax error"),
        ('namespace = "svc"\nname = \n', "jobs.toml:2:", "TOML syntax error"),
        ("[[jobs]]\nname = 'a'\n", "jobs.toml: namespace", "required"),
        ('namespace = ""\n', "jobs.toml: namespace", "non-empty"),
        ("namespace = 3\n", "jobs.toml: namespace", "non-empty"),
        ('namespace = "my app"\n', "jobs.toml: namespace", "use letters, digits"),
        ('namespace = "a\\nb"\n', "jobs.toml: namespace", "'a\\nb': use letters"),
        (f'namespace = "{"n" * 64}"\n', "jobs.toml: namespace", "at most 63 characters"),
        ('namespace = "svc"\n[[job]]\nname = "a"\n', "jobs.toml: job", "did you mean 'jobs'?"),
        ('namespace = "svc"\njobs = "a"\n', "jobs.toml: jobs", "array of tables"),
    ],
)
def test_file_level_errors_raise(text: str, field: str, reason: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse(text, source="jobs.toml")
    assert caught.value.field.startswith(field)
    assert reason in caught.value.reason
    assert "\n" not in str(caught.value)


def test_load_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text('namespace = "svc"\n[[jobs]]\nname = "a"\nmanual = true\nworker = "w"\n')
    manifest = load(path)
    assert manifest.source == str(path)
    assert [e["name"] for e in manifest.entries] == ["a"]


def test_load_missing_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="no such file"):
        load(tmp_path / "absent.toml")
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"namespace = '\xff'\n")
    with pytest.raises(InvalidInput, match="not UTF-8"):
        load(binary)


def test_manifest_rejected_message() -> None:
    manifest = _parse('namespace = "svc"\n[[jobs]]\nname = "a"\nmanual = true\n')
    error = ManifestRejected(manifest)
    assert str(error) == (
        "jobs.toml: 1 problem in the manifest; nothing applied "
        "(fix them, or store those entries inert with --allow-invalid)"
    )
    assert error.exit_code == 2
    assert error.manifest is manifest


def test_params_that_json_cannot_hold_are_problems() -> None:
    """TOML has nan and inf (and 1e400 reads as inf); they were stored as the strings
    "nan" and "inf" without a word, where the client and the protocol refuse them."""
    entry, problems = _one(
        'name = "g"\nmanual = true\nworker = "w"\n'
        "params = { big = 1e400, fine = 1.5, deep = { n = nan, list = [1, -inf] } }\n"
    )
    assert [(p.field, p.reason) for p in problems] == [
        ("params.big", "inf is not a JSON number (JSON has no NaN or infinity)"),
        ("params.deep.n", "nan is not a JSON number (JSON has no NaN or infinity)"),
        ("params.deep.list[1]", "-inf is not a JSON number (JSON has no NaN or infinity)"),
    ]
    assert entry["invalid_reason"] is not None
