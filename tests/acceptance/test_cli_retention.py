"""The retention and alert surface of the command line, as a user runs it: ``jobs define
--no-alert --keep-last --retention``, ``jobs remove --keep-history``, ``prune --dry-run``
and ``prune``, against a real database."""

from __future__ import annotations

from .test_cli import cli, one_line_error, sql


def test_define_with_alert_and_retention_options(database: str) -> None:
    r = cli(
        "jobs", "define", "b", "--manual", "--no-alert", "--keep-last", "7", "--retention",
        "90d", "--", "true", dsn=database,
    )  # fmt: skip
    assert r.code == 0, r.err
    shown = cli("jobs", "show", "b", "--json", dsn=database).json
    assert (shown["alert"], shown["keep_last"], shown["retention"]) == (False, 7, 90 * 86400)
    text = cli("jobs", "show", "b", dsn=database).out
    assert "no (--no-alert)" in text
    assert "at most the newest 7 runs, none finished more than 90d ago" in text
    # Without its own, the setting's value (it said "retention (setting)").
    cli("jobs", "define", "d", "--manual", "--", "true", dsn=database)
    text = cli("jobs", "show", "d", dsn=database, COORDINATOR_RETENTION="14d").out
    assert "none finished more than 14d (the retention setting, as read here) ago" in text
    one_line_error(
        cli("jobs", "define", "c", "--manual", "--retention", "0s", "--", "true", dsn=database),
        code=2,
        contains="--retention",
    )
    one_line_error(
        cli("jobs", "define", "c", "--manual", "--keep-last", "0", "--", "true", dsn=database),
        code=2,
        contains="--keep-last",
    )


def test_remove_says_what_becomes_of_a_queued_or_paused_run(database: str) -> None:
    """A paused recoverable run was cancelled with no word (its place in the scan lost)."""
    cli("jobs", "define", "scan", "--manual", "--recoverable", "--worker", "scan", dsn=database)
    run_id = int(cli("jobs", "trigger", "scan", dsn=database).out.split()[0])
    sql(database, "UPDATE coordinator.runs SET status = 'paused' WHERE id = $1", run_id)
    r = cli("jobs", "remove", "scan", "--keep-history", dsn=database)
    assert r.code == 0, r.err
    assert r.err_lines == [
        f"coordinator: note: its paused run {run_id} is cancelled, its saved cursor with it: "
        "it will not run"
    ]
    (run,) = cli("runs", "list", "--job", "scan", "--json", dsn=database).json
    assert run["status"] == "cancelled"
    cli("jobs", "define", "once", "--manual", "--", "true", dsn=database)
    queued = int(cli("jobs", "trigger", "once", dsn=database).out.split()[0])
    r = cli("jobs", "remove", "once", dsn=database)
    assert r.err_lines == [
        f"coordinator: note: its queued run {queued} is deleted with the job's history: it "
        "will not run"
    ]
    # Nothing outstanding: nothing said.
    cli("jobs", "define", "idle", "--manual", "--", "true", dsn=database)
    assert cli("jobs", "remove", "idle", dsn=database).err == ""


def test_redefining_a_job_whose_run_is_paused_says_what_a_resume_will_do(database: str) -> None:
    cli("jobs", "define", "scan", "--manual", "--recoverable", "--worker", "scan", dsn=database)
    run_id = int(cli("jobs", "trigger", "scan", dsn=database).out.split()[0])
    sql(database, "UPDATE coordinator.runs SET status = 'paused' WHERE id = $1", run_id)
    moved = cli(
        "jobs", "define", "scan", "--manual", "--recoverable", "--worker", "scan2", dsn=database
    )  # fmt: skip
    assert moved.err_lines == [
        f"coordinator: note: run {run_id} is paused; a resume runs it under the new target "
        "with its saved cursor"
    ]
    plain = cli("jobs", "define", "scan", "--manual", "--worker", "scan2", dsn=database)
    assert plain.err_lines == [
        f"coordinator: note: run {run_id} is paused at a saved cursor; the job is no longer "
        "recoverable, so a resume starts it over from the beginning (--recoverable keeps the "
        "cursor)"
    ]
    same = cli("jobs", "define", "scan", "--manual", "--worker", "scan2", dsn=database)
    assert same.err == ""


def test_remove_keep_history_then_prune(database: str) -> None:
    cli("jobs", "define", "gone", "--manual", "--", "true", dsn=database)
    (job,) = sql(database, "SELECT id FROM coordinator.jobs WHERE name = 'gone'")
    sql(
        database,
        "INSERT INTO coordinator.runs (job_id, trigger, status, created_at, finished_at)"
        " SELECT $1, 'manual', 'succeeded', now() - interval '40 days',"
        " now() - interval '40 days' FROM generate_series(1, 4)",
        job["id"],
    )
    cli("jobs", "define", "busy", "--manual", "--", "true", dsn=database)
    (busy,) = sql(database, "SELECT id FROM coordinator.jobs WHERE name = 'busy'")
    sql(
        database,
        "INSERT INTO coordinator.runs (job_id, trigger, status, created_at, finished_at)"
        " SELECT $1, 'manual', 'failed', now(), now() FROM generate_series(1, 130)",
        busy["id"],
    )
    r = cli("jobs", "remove", "gone", "--keep-history", dsn=database)
    assert r.code == 0, r.err
    assert "kept until retention takes them" in r.out
    assert cli("jobs", "list", "--json", dsn=database).json[0]["name"] == "busy"
    assert len(cli("runs", "list", "--job", "gone", "--json", dsn=database).json) == 4

    dry = cli("prune", "--dry-run", dsn=database)
    assert dry.code == 0, dry.err
    lines = dry.out.splitlines()
    assert lines[0].split() == ["JOB", "RUNS", "WOULD", "DELETE", "KEEPS", "RULE"]
    assert lines[1].split()[:5] == ["default/busy", "130", "30", "100", "at"]
    assert lines[2].split()[:6] == ["default/gone", "(removed)", "4", "4", "0", "younger"]
    assert lines[-1] == "34 run(s) would be deleted (dry run: nothing was)"
    assert sql(database, "SELECT count(*) AS n FROM coordinator.runs")[0]["n"] == 134
    as_json = cli("prune", "--dry-run", "--json", dsn=database).json
    assert {v["name"]: v["prunable"] for v in as_json} == {"busy": 30, "gone": 4}

    done = cli("prune", dsn=database)
    assert done.code == 0, done.err
    assert done.out.startswith("pruned 34 run(s) in ")
    assert "1 removed job(s) gone" in done.out
    assert cli("prune", "--dry-run", dsn=database).out == "nothing to prune\n"
    assert sql(database, "SELECT count(*) AS n FROM coordinator.jobs")[0]["n"] == 1
