"""Usage errors: said by the command typed, in one line, naming the option that was not
understood and the one perhaps meant (no database: the command line is refused first)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from coordinator.cli import main

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # A misspelt option makes argparse miss a required one: the misspelling is named.
        (
            ["jobs", "define", "x", "--evry", "5m", "--", "true"],
            "coordinator jobs define: unknown option --evry (did you mean --every?) "
            "(see 'coordinator jobs define --help')",
        ),
        (
            ["jobs", "define", "x", "--every", "5m", "--timout", "5m", "--", "true"],
            "coordinator jobs define: unrecognized arguments: --timout 5m (did you mean "
            "--timeout?) (see 'coordinator jobs define --help')",
        ),
        # The command without its `--`.
        (
            ["jobs", "define", "x", "--every", "5m", "true"],
            "coordinator jobs define: unrecognized arguments: true (the command goes after "
            "--: ... -- PROGRAM ARGS) (see 'coordinator jobs define --help')",
        ),
        # A cron expression left unquoted: the shell made five words of it.
        (
            ["jobs", "define", "x", "--cron", "30", "2", "*", "*", "*", "--", "true"],
            "coordinator jobs define: unrecognized arguments: 2 * * * (quote the cron "
            "expression: --cron '30 2 * * *') (see 'coordinator jobs define --help')",
        ),
        (
            ["runs", "list", "--statuss", "failed"],
            "coordinator runs list: unrecognized arguments: --statuss failed (did you mean "
            "--status?) (see 'coordinator runs list --help')",
        ),
        # An id beyond PostgreSQL's bigint: refused here, not by the driver's words.
        (
            ["runs", "show", "99999999999999999999"],
            "coordinator runs show: argument ID: must be at most 9223372036854775807, not "
            "99999999999999999999 (see 'coordinator runs show --help')",
        ),
        # Nothing close: no guess.
        (
            ["runs", "list", "--zzz"],
            "coordinator runs list: unrecognized arguments: --zzz "
            "(see 'coordinator runs list --help')",
        ),
    ],
)
def test_a_usage_error_is_said_by_the_command_typed(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--dsn", "postgresql://nobody@127.0.0.1:1/none", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [expected]


def test_a_cron_expression_whose_stars_the_shell_expanded_is_not_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a directory with files, `--cron 30 2 * * *` unquoted reaches us as file names:
    the hint offered `--cron '30 2 Makefile'`."""
    (tmp_path / "Makefile").write_text("")
    monkeypatch.chdir(tmp_path)
    argv = ["jobs", "define", "x", "--cron", "30", "2", "Makefile", "--", "true"]
    assert main(["--dsn", "postgresql://nobody@127.0.0.1:1/none", *argv]) == 2
    err = capsys.readouterr().err
    assert "(quote the cron expression: the shell split it in words, and makes file " in err
    assert "Makefile'" not in err


def test_an_abbreviation_argparse_takes_is_not_called_unknown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """(``--every`` is missing here; ``--timeo`` is a fine abbreviation of --timeout.)"""
    assert main(["jobs", "define", "x", "--timeo", "5m", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert "one of the arguments --cron --every --at --manual is required" in err
    assert "unknown option" not in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["jobs", "trigger", "a", "--arg", "k={bad"],
            "coordinator: --arg: 'k={bad': not JSON (Expecting property name enclosed in "
            "double quotes at character 2); a string that starts with { needs JSON quotes",
        ),
        (
            ["jobs", "define", "a", "--manual", "--param", "ids=[1,", "--", "true"],
            "coordinator: --param: 'ids=[1,': not JSON (Expecting value at character 4); a "
            "string that starts with [ needs JSON quotes",
        ),
    ],
)
def test_a_value_meant_as_json_that_is_not_is_refused(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Text that opens an object or an array was meant as JSON: refused, not stored as a
    string (plain words still are: ``--param region=eu``). Refused before connecting."""
    assert main(["--dsn", "postgresql://nobody@127.0.0.1:1/none", *argv]) == 2
    assert capsys.readouterr().err.splitlines() == [expected]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # An option's value that looks like an option is its value, not a misspelling.
        (
            ["jobs", "define", "x", "--cwd", "--weird", "--", "true"],
            "coordinator jobs define: argument --cwd: expected one argument "
            "(see 'coordinator jobs define --help')",
        ),
        (
            ["jobs", "define", "x", "--param", "--a b", "--", "true"],
            "coordinator jobs define: one of the arguments --cron --every --at --manual is "
            "required (see 'coordinator jobs define --help')",
        ),
        # A known option where it is not read: no "did you mean" itself.
        (
            ["jobs", "trigger", "x", "--", "--force"],
            "coordinator jobs trigger: unrecognized arguments: --force "
            "(see 'coordinator jobs trigger --help')",
        ),
    ],
)
def test_no_guess_where_argparse_knows_better(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--dsn", "postgresql://nobody@127.0.0.1:1/none", *argv]) == 2
    assert capsys.readouterr().err.splitlines() == [expected]


def test_config_and_state_dir_are_read_before_the_command_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`coordinator --config F config` (as `--dsn` before the command) used to answer
    "invalid choice: 'F'"; now it reads F, and a flag after the command still wins."""
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    monkeypatch.setenv("COORDINATOR_CONFIG", str(empty))
    for name in ("COORDINATOR_STATE_DIR", "COORDINATOR_DSN"):
        monkeypatch.delenv(name, raising=False)
    bad = tmp_path / "bad.toml"
    bad.write_text("bogus = 1\n")
    assert main(["--config", str(bad), "config"]) == 2
    assert capsys.readouterr().err == f"coordinator: config file {bad}: unknown setting 'bogus'\n"
    assert main(["--state-dir", str(tmp_path / "a"), "config", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["state_dir"]["value"] == str(tmp_path / "a")
    assert main(["--state-dir", str(tmp_path / "a"), "config", "--state-dir", str(tmp_path / "b"),
                 "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["state_dir"]["value"] == str(tmp_path / "b")


def test_worker_options_before_worker_are_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`coordinator worker` is its own program: options before it used to crash."""
    assert main(["--config", str(tmp_path / "c.toml"), "worker", "m:o"]) == 2
    assert capsys.readouterr().err == (
        "coordinator worker: its options go after `worker`: coordinator worker "
        "MODULE:OBJECT [--socket PATH | --tcp HOST:PORT] ...\n"
    )


def test_a_define_with_worker_is_not_the_worker_program(capsys: pytest.CaptureFixture[str]) -> None:
    """(`jobs define --worker TYPE` sets args.worker: the check above must not take it
    for `coordinator worker`.) It gets as far as connecting."""
    code = main(["--dsn", "postgresql://nobody@127.0.0.1:1/none", "jobs", "define", "x",
                 "--manual", "--worker", "scan"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err
    assert "cannot connect to PostgreSQL" in err


def test_config_says_what_run_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    monkeypatch.setenv("COORDINATOR_CONFIG", str(empty))
    monkeypatch.setenv("COORDINATOR_ADMIN_LISTEN", "8787")
    assert main(["config"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "coordinator: note: `coordinator run` with these settings would refuse: "
        "admin_listen: expected HOST:PORT, not '8787'",
        "coordinator: note: `coordinator run` with these settings would refuse: "
        "admin_listen is set, but none of admin_token, admin_token_file and admin_tokens "
        "is: the admin API needs a token",
    ]


def test_config_lists_every_refusal_of_run_and_run_refuses_before_the_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`coordinator config` says each thing `coordinator run` refuses (not only the
    first, nor only some), and `run` refuses the first of them, in the same words."""
    (tmp_path / "spool.jsonl").mkdir()
    settings = tmp_path / "coordinator.toml"
    settings.write_text(
        "\n".join(
            [
                'dsn = "postgresql://nobody@127.0.0.1:1/none"',
                f'state_dir = "{tmp_path}"',
                'admin_listen = "127.0.0.1:8787"',
                'admin_token = "short"',
                'worker_listen = "0.0.0.0:9000"',
                'alert_email_to = ["ops@example.com"]',
            ]
        )
        + "\n"
    )
    monkeypatch.setenv("COORDINATOR_CONFIG", str(settings))
    assert main(["config"]) == 0
    notes = capsys.readouterr().err.splitlines()
    prefix = "coordinator: note: `coordinator run` with these settings would refuse: "
    assert all(line.startswith(prefix) for line in notes), notes
    said = [line.removeprefix(prefix) for line in notes]
    assert said[0] == f"spool: {tmp_path / 'spool.jsonl'} is a directory, not a file"
    assert said[1] == "alert_email_to is set but alert_smtp_host is not"
    assert said[2].startswith("worker_listen: 0.0.0.0 is not a loopback address"), said
    assert said[3].startswith("admin token"), said
    assert len(said) == 4, said

    assert main(["run"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"coordinator: {said[0]}"]


def test_an_empty_timezone_is_refused_not_taken_for_utc(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["jobs", "define", "a", "--cron", "* * * * *", "--timezone", "", "--", "true"]
    assert main(["--dsn", "postgresql://nobody@127.0.0.1:1/none", *argv]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "coordinator: --timezone: unknown timezone '' (use an IANA name such as "
        "'Europe/Berlin' or 'UTC')"
    ]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["jobs", "define", "x", "--every", "-5m", "--", "true"],
            "coordinator: --every: '-5m': a duration must be positive",
        ),
        (
            ["jobs", "define", "x", "--every", "5m", "--timeout", "-.5s", "--", "true"],
            "coordinator: --timeout: '-.5s': a duration must be positive",
        ),
        (
            ["runs", "list", "--limit", "-5"],
            "coordinator runs list: argument --limit: must be at least 1, not -5 "
            "(see 'coordinator runs list --help')",
        ),
    ],
)
def test_a_negative_value_is_read_as_the_options_value(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse took ``-5m`` for an option and said "expected one argument" of
    ``--every``; a word of a minus and a digit is a value (no option looks like one), so
    the value's own check speaks. Refused before connecting."""
    assert main(["--dsn", "postgresql://nobody@127.0.0.1:1/none", *argv]) == 2
    assert capsys.readouterr().err.splitlines() == [expected]


def test_status_of_a_standby_says_it_stands_by_and_who_leads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The differences were worded for a leader ("the daemon has loaded 0: it loads only
    jobs that can fall due (407 manual not loaded)"), where the reason is that this
    daemon stands by and another leads."""
    import argparse
    from datetime import UTC, datetime

    from coordinator import cli, client, probe
    from coordinator.config import Config

    answer = probe.ApiAnswer(
        status={"state": "standby", "instance": "b", "jobs": 0, "uptime_s": 3},
        label="the daemon's admin API at http://127.0.0.1:18673/api/status",
    )
    database = {
        "jobs": 409, "loadable": 2, "manual": 407, "paused": 0, "invalid": 0, "done": 0,
        "next_deadline": datetime(2026, 12, 3, tzinfo=UTC), "next_job": "default/a",
    }  # fmt: skip
    leader = client.Leader(pid=4242, application="coordinator", since=None)
    args = argparse.Namespace(json=False)
    assert cli._status_of_daemon(args, Config(), answer, database, None, leader) == 0
    differences = [
        line.split(":", 1)[1].strip()
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("difference:")
    ]
    assert differences == [
        "this daemon stands by: it loads and arms nothing until it takes the lock; "
        "PostgreSQL session 4242 (coordinator) leads"
    ]
