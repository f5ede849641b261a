"""Retry and misfire policies, categories and paused state through the command line."""

from __future__ import annotations

import pytest

from .test_cli import cli, one_line_error, sql


def test_define_with_policies_and_show_them(database: str) -> None:
    r = cli(
        "jobs",
        "define",
        "flaky",
        "--every",
        "10m",
        "--retries",
        "3",
        "--retry-backoff",
        "1s",
        "--retry-max-delay",
        "10m",
        "--misfire",
        "skip",
        "--misfire-grace",
        "5m",
        "--",
        "false",
        dsn=database,
    )
    assert r.code == 0, r
    shown = cli("jobs", "show", "flaky", dsn=database).out
    assert "retries:" in shown
    assert "3, the first after 1s, doubling up to 10m" in shown
    # The cap holds for the first delay too: shown as it is (it said "the first after 2h").
    capped = ("--retries", "2", "--retry-backoff", "2h", "--retry-max-delay", "1m")
    assert cli("jobs", "define", "c", "--manual", *capped, "--", "true", dsn=database).code == 0
    assert "2, the first after 1m, doubling up to 1m" in cli("jobs", "show", "c", dsn=database).out
    assert "skip a deadline more than 5m late" in shown
    data = cli("jobs", "show", "flaky", "--json", dsn=database).json
    assert (data["retries"], data["retry_backoff"], data["retry_max_delay"]) == (3, 1.0, 600.0)
    assert (data["misfire"], data["misfire_grace"]) == ("skip", 300.0)
    # Defaults.
    cli("jobs", "define", "plain", "--manual", "--", "true", dsn=database)
    data = cli("jobs", "show", "plain", "--json", dsn=database).json
    assert (data["retries"], data["retry_backoff"], data["retry_max_delay"]) == (0, 30.0, 3600.0)
    assert (data["misfire"], data["misfire_grace"]) == ("run-once", None)


def test_redefining_keeps_the_pause_unless_told(database: str) -> None:
    cli("jobs", "define", "p", "--every", "1h", "--paused", "--", "true", dsn=database)
    r = cli("jobs", "define", "p", "--every", "2h", "--", "true", dsn=database)
    assert r.code == 0, r
    assert "stays paused (--no-paused resumes it)" in r.err
    assert "paused: it runs once resumed" in r.out
    assert cli("jobs", "show", "p", "--json", dsn=database).json["paused"] is True
    r = cli("jobs", "define", "p", "--every", "2h", "--no-paused", "--", "true", dsn=database)
    assert r.code == 0, r
    assert cli("jobs", "show", "p", "--json", dsn=database).json["paused"] is False


def test_runs_list_by_category_and_show_the_chain(database: str) -> None:
    cli("jobs", "define", "a", "--manual", "--retries", "2", "--", "true", dsn=database)
    job = sql(database, "SELECT id FROM coordinator.jobs WHERE name = 'a'")[0]["id"]
    first = sql(
        database,
        "INSERT INTO coordinator.runs (job_id, trigger, status, started_at, finished_at, "
        "error_cause, error_message) VALUES ($1, 'manual', 'timed_out', now(), now(), "
        "'timeout', 'timed out after 5s') RETURNING id",
        job,
    )[0]["id"]
    second = sql(
        database,
        "INSERT INTO coordinator.runs (job_id, trigger, status, started_at, finished_at, "
        "error_cause, error_message, attempt, retry_of, exhausted, category) VALUES "
        "($1, 'retry', 'failed', now(), now(), 'handler', 'no such customer', 2, $2, true, "
        "'invalid-input') RETURNING id",
        job,
        first,
    )[0]["id"]

    timeouts = cli("runs", "list", "--category", "timeout", "--json", dsn=database).json
    assert [r["id"] for r in timeouts] == [first]  # the default category, from the status
    table = cli("runs", "list", "--category", "invalid-input", dsn=database)
    header, row = table.out.splitlines()
    assert header.split()[:5] == ["ID", "JOB", "TRIGGER", "STATUS", "ATTEMPT"]
    assert "failed (exhausted)" in row
    assert "invalid-input: no such customer" in row
    listed = cli("runs", "list", dsn=database).out
    assert f"timed_out (retried: {second})" in listed

    shown = cli("runs", "show", str(second), dsn=database).out
    assert "category:" in shown
    assert f"1: run {first} timed_out (timeout)" in shown
    assert f"2: run {second} (this one) failed (invalid-input), exhausted" in shown
    data = cli("runs", "show", str(first), "--json", dsn=database).json
    assert (data["retried_by"], data["category"]) == (second, "timeout")
    assert [a["id"] for a in data["attempts"]] == [first, second]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("--retries", "101"), "--retries"),
        (("--retries", "-1"), "--retries"),
        (("--retry-backoff", "5"), "--retry-backoff"),
        (("--retry-max-delay", "0s"), "--retry-max-delay"),
        # Policies that did nothing.
        (("--retry-backoff", "5s"), "--retry-backoff: only applies with --retries N"),
        (("--retry-max-delay", "5m"), "--retry-max-delay: only applies with --retries N"),
        (("--misfire", "skip"), "--misfire-grace: required with --misfire skip"),
        (("--misfire-grace", "5m"), "--misfire-grace: only applies with --misfire skip"),
        (("--misfire", "later"), "--misfire"),
        (("--misfire", "skip", "--misfire-grace", "100ms"), "--misfire-grace: must be at least 1s"),
    ],
)
def test_bad_policies_are_one_line_exit_2(database: str, args: tuple[str, ...], field: str) -> None:
    result = cli("jobs", "define", "x", "--every", "5m", *args, "--", "true", dsn=database)
    one_line_error(result, code=2, contains=field)
    assert sql(database, "SELECT count(*) AS n FROM coordinator.jobs")[0]["n"] == 0


def test_runs_list_refuses_an_unknown_category(database: str) -> None:
    one_line_error(
        cli("runs", "list", "--category", "weird", dsn=database), code=2, contains="--category"
    )


def test_trigger_answered_by_a_waiting_retry_says_when_it_runs(database: str) -> None:
    cli("jobs", "define", "w", "--manual", "--retries", "1", "--", "true", dsn=database)
    job = sql(database, "SELECT id FROM coordinator.jobs WHERE name = 'w'")[0]["id"]
    retry = sql(
        database,
        "INSERT INTO coordinator.runs (job_id, trigger, status, attempt, due_at) VALUES "
        "($1, 'retry', 'queued', 2, '2030-01-01T00:00:00Z') RETURNING id",
        job,
    )[0]["id"]
    r = cli("jobs", "trigger", "w", dsn=database)
    assert (r.code, r.out) == (0, f"{retry}\n")
    assert f"already has retry run {retry}, due 2030-01-01 00:00:00Z: it runs then" in r.err
    listing = cli("jobs", "list", dsn=database).out
    assert "retry 2030-01-01 00:00:00Z" in listing
    assert "retry waiting" in listing
