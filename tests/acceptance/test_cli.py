"""The ``coordinator`` command line as a user runs it: a subprocess against a real database."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import asyncpg
import attrs
import pytest

RUN_MAIN = "from coordinator.cli import main; import sys; sys.exit(main())"
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/x"


@attrs.frozen
class Result:
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)

    @property
    def err_lines(self) -> list[str]:
        return self.err.splitlines()


NO_BINARIES = "/nonexistent/postgresql/bin"
#: An empty configuration file: the CLI never reads the machine's /etc/coordinator.
EMPTY_CONFIG = Path(tempfile.mkdtemp(prefix="coordinator-cli-")) / "coordinator.toml"
EMPTY_CONFIG.write_text("")


def _env(env_dsn: str | None, **extra: str) -> dict[str, str]:
    """The CLI's environment: no DSN unless given, an empty configuration file, and
    (unless a test says otherwise) no server binaries, so a command without a DSN never
    creates an embedded cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR_")}
    env["COORDINATOR_PG_BIN"] = NO_BINARIES
    env["COORDINATOR_CONFIG"] = str(EMPTY_CONFIG)
    if env_dsn is not None:
        env["COORDINATOR_DSN"] = env_dsn
    env.update(extra)
    return env


def cli(*args: str, dsn: str | None = None, env_dsn: str | None = None, **env: str) -> Result:
    """Run ``coordinator [--dsn DSN] ARGS...`` and collect its exit status and output."""
    argv = [sys.executable, "-c", RUN_MAIN]
    if dsn is not None:
        argv += ["--dsn", dsn]
    proc = subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=120, env=_env(env_dsn, **env)
    )
    result = Result(proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in result.err, result.err
    return result


def sql(dsn: str, query: str, *args: Any) -> Any:
    """One statement on the test database, from outside the CLI."""

    async def run() -> Any:
        conn = await asyncpg.connect(dsn, server_settings={"application_name": "tests-app"})
        try:
            return await conn.fetch(query, *args)
        finally:
            await conn.close()

    return asyncio.run(run())


#: What a command says when no daemon leads on its database (these tests run none).
NO_DAEMON = "coordinator: note: no daemon is running on this database"


def one_line_error(result: Result, *, code: int, contains: str) -> None:
    assert result.code == code, result
    assert len(result.err_lines) == 1, result.err
    assert result.err_lines[0].startswith("coordinator"), result.err
    assert contains in result.err_lines[0], result.err


JOB_KEYS = {
    "name",
    "namespace",
    "key",
    "state",
    "schedule_kind",
    "schedule",
    "timezone",
    "paused",
    "invalid_reason",
    "next_run_at",
    "last_status",
}
RUN_KEYS = {
    "id",
    "job",
    "namespace",
    "status",
    "trigger",
    "scheduled_for",
    "started_at",
    "finished_at",
    "count",
    "extra",
    "error_cause",
    "error_message",
}


# --------------------------------------------------------------------------- migrate


def test_migrate_fresh_then_up_to_date(pg_server: Any) -> None:
    name = pg_server.new_database_name()
    sql(pg_server.admin_dsn, f"CREATE DATABASE {name}")
    try:
        dsn = pg_server.dsn(name)
        first = cli("migrate", dsn=dsn)
        assert first.code == 0, first
        assert first.out.startswith("applied 0001_")
        again = cli("migrate", env_dsn=dsn)
        assert (again.code, again.out) == (0, "schema is up to date\n")
    finally:
        sql(pg_server.admin_dsn, f"DROP DATABASE {name} WITH (FORCE)")


def test_commands_on_unmigrated_database_say_migrate(pg_server: Any) -> None:
    result = cli("jobs", "list", dsn=pg_server.admin_dsn)
    one_line_error(result, code=1, contains="coordinator migrate")


# --------------------------------------------------------------------------- jobs


def test_params_and_args_stored_redacted_are_named_and_references_kept(database: str) -> None:
    """What a front door stores as [redacted] is said (the job gets that); a key naming
    where a secret is (``password_file``) is kept, since secrets are to be passed so."""
    r = cli(
        "jobs", "define", "envdump", "--manual",
        "--param", "api_token=s3cr3t",
        "--param", "password_file=/run/secrets/db",
        "--param", "page=1",
        "--", "true",
        dsn=database,
    )  # fmt: skip
    assert r.code == 0, r
    assert r.err_lines == [
        "coordinator: note: --param api_token stored as [redacted] (it looks secret), and the "
        "job gets that: give a job secrets by reference (a file, an environment variable, a "
        "systemd credential)"
    ]
    shown = cli("jobs", "show", "envdump", "--json", dsn=database).json
    assert shown["params"] == {
        "api_token": "[redacted]",
        "password_file": "/run/secrets/db",
        "page": 1,
    }
    r = cli(
        "jobs", "trigger", "envdump",
        "--arg", "token_count=10", "--arg", "dsn=postgresql://app:pw@db/app",
        dsn=database,
    )  # fmt: skip
    assert r.code == 0, r
    assert "--arg dsn stored as [redacted]" in r.err
    assert "token_count" not in r.err
    run = cli("runs", "show", r.out.split()[0], "--json", dsn=database).json
    assert run["args"] == {"token_count": 10, "dsn": "postgresql://app:[redacted]@db/app"}


def test_define_list_show(database: str) -> None:
    r = cli(
        "jobs",
        "define",
        "backup",
        "--cron",
        "0  3 * * *",
        "--timezone",
        "Europe/Berlin",
        "--timeout",
        "90s",
        "--priority",
        "interactive",
        "--idempotent",
        "--param",
        "region=eu",
        "--param",
        "n=3",
        "--",
        "/usr/bin/backup",
        "--full",
        "--",
        "x",
        dsn=database,
    )
    assert r.code == 0, r
    assert r.out.startswith("defined default/backup (job ")
    r = cli(
        "jobs",
        "define",
        "reindex",
        "-n",
        "search",
        "--every",
        "1h30m",
        "--worker",
        "idx",
        dsn=database,
    )
    assert r.code == 0, r

    listing = cli("jobs", "list", dsn=database)
    assert listing.code == 0
    header, *rows = listing.out.splitlines()
    assert header.split() == [
        "NAMESPACE",
        "NAME",
        "SCHEDULE",
        "TARGET",
        "NEXT",
        "RUN",
        "LAST",
        "STATE",
    ]
    assert len(rows) == 2
    assert rows[0].split()[:2] == ["default", "backup"]
    assert "cron 0 3 * * * (Europe/Berlin)" in rows[0]
    assert "/usr/bin/backup --full -- x" in rows[0]
    # Columns are aligned: every row starts its NAME column at the same offset.
    assert {row.index(name) for row, name in zip(rows, ["backup", "reindex"], strict=True)} == {
        header.index(" NAME ") + 1
    }

    data = cli("jobs", "list", "--json", dsn=database).json
    assert [j["name"] for j in data] == ["backup", "reindex"]
    assert all(set(j) >= JOB_KEYS for j in data)
    backup, reindex = data
    assert backup["schedule"] == "0 3 * * *"
    assert backup["timeout"] == 90.0
    assert backup["params"] == {"region": "eu", "n": 3}
    assert backup["target"] == {"kind": "exec", "argv": ["/usr/bin/backup", "--full", "--", "x"]}
    assert backup["last_status"] is None
    assert reindex["schedule_kind"] == "interval"
    assert reindex["target"] == {"kind": "worker", "type": "idx"}

    assert [
        j["name"] for j in cli("jobs", "list", "-n", "search", "--json", dsn=database).json
    ] == ["reindex"]

    show = cli("jobs", "show", "backup", dsn=database)
    assert show.code == 0
    assert "job:" in show.out
    assert "default/backup" in show.out
    assert "timeout:" in show.out
    assert "1m30s" in show.out
    shown = cli("jobs", "show", "reindex", "--namespace", "search", "--json", dsn=database).json
    assert shown["name"] == "reindex"
    assert shown["schedule"] == "1h30m"


def test_define_at_and_manual_and_env(database: str) -> None:
    r = cli(
        "jobs", "define", "once", "--at", "2030-01-01T10:00:00+02:00", "--", "true", dsn=database
    )
    assert r.code == 0, r
    r = cli(
        "jobs",
        "define",
        "m",
        "--manual",
        "--paused",
        "--env",
        "A=1",
        "--cwd",
        "/tmp",
        "--",
        "env",
        dsn=database,
    )
    assert r.code == 0, r
    once = cli("jobs", "show", "once", "--json", dsn=database).json
    assert once["schedule"] == "2030-01-01T08:00:00+00:00"
    assert once["next_run_at"] == "2030-01-01T08:00:00+00:00"
    manual = cli("jobs", "show", "m", "--json", dsn=database).json
    assert manual["paused"] is True
    assert manual["target"] == {"kind": "exec", "argv": ["env"], "env": {"A": "1"}, "cwd": "/tmp"}


def test_trigger_prints_run_id_and_is_idempotent(database: str) -> None:
    cli("jobs", "define", "m", "--manual", "--", "true", dsn=database)
    first = cli("jobs", "trigger", "m", "--force", "--arg", 'day="2026-01-01"', dsn=database)
    assert first.code == 0, first
    run_id = int(first.out)
    assert len(first.err_lines) == 1
    assert first.err_lines[0].startswith(NO_DAEMON)
    assert "`coordinator run`, or `systemctl start coordinator`" in first.err
    second = cli("jobs", "trigger", "m", dsn=database)
    assert int(second.out) == run_id
    assert "already has run" in second.err
    run = cli("runs", "show", str(run_id), "--json", dsn=database).json
    assert run["args"] == {"force": True, "day": "2026-01-01"}
    assert run["status"] == "queued"
    assert run["trigger"] == "manual"
    assert cli("jobs", "show", "m", "--json", dsn=database).json["last_status"] == "queued"


def test_runs_show_prints_a_running_calls_progress(database: str) -> None:
    """README: "Progress is kept on the run (`runs show`)", but only `--json` had it."""
    cli("jobs", "define", "p", "--manual", "--worker", "t", dsn=database)
    run_id = int(cli("jobs", "trigger", "p", dsn=database).out)
    sql(
        database,
        "UPDATE coordinator.runs SET status = 'running', started_at = now(), "
        "claimed_at = now(), progress = $2::jsonb WHERE id = $1",
        run_id,
        json.dumps(
            {"at": "2026-12-02T09:00:03+00:00", "mode": "step", "label": "sales",
             "percent": 36.6, "message": "row 11"}
        ),
    )  # fmt: skip
    shown = cli("runs", "show", str(run_id), dsn=database).out
    assert "progress:      37% sales: row 11 (at 2026-12-02 09:00:03Z)" in shown.splitlines()


def test_trigger_of_a_paused_run_says_whether_its_cursor_is_handed_back(database: str) -> None:
    """A job redefined without --recoverable since its run paused starts that run over
    (the note said it resumed from its saved cursor)."""
    cli("jobs", "define", "s", "--manual", "--recoverable", "--worker", "t", dsn=database)
    run_id = sql(
        database,
        "INSERT INTO coordinator.runs (job_id, trigger, status, cursor, count, paused_at, "
        "error_message) SELECT id, 'manual', 'paused', '{\"after\": 180}', 180, now(), "
        "'paused by operator' FROM coordinator.jobs WHERE name = 's' RETURNING id",
    )[0]["id"]
    r = cli("jobs", "trigger", "s", "--arg", "x=2", dsn=database)
    assert f"resuming paused run {run_id} of default/s from its saved cursor" in r.err
    # Queued again, it is not shown with the pause's words as its error.
    [row] = cli("runs", "list", dsn=database).out.splitlines()[1:]
    assert "queued" in row
    assert "paused by operator" not in row
    assert "error:         -" in cli("runs", "show", str(run_id), dsn=database).out.splitlines()
    # (Its args stand: trigger() answers with the outstanding run as it is.)
    assert f"--arg x not applied: run {run_id} keeps the args it was triggered with" in r.err
    sql(database, "UPDATE coordinator.runs SET status = 'paused' WHERE id = $1", run_id)
    cli("jobs", "define", "s", "--manual", "--worker", "t", dsn=database)
    r = cli("jobs", "trigger", "s", dsn=database)
    assert (
        f"resuming paused run {run_id} of default/s from the start: the job is no longer "
        "recoverable, so its saved cursor is not handed back"
    ) in r.err


def test_trigger_json(database: str) -> None:
    cli("jobs", "define", "m", "--manual", "--", "true", dsn=database)
    run = cli("jobs", "trigger", "m", "--json", dsn=database).json
    assert set(run) >= RUN_KEYS
    assert run["job"] == "m"
    assert run["status"] == "queued"


def test_trigger_paused_job_notes_queued(database: str) -> None:
    cli("jobs", "define", "p", "--manual", "--paused", "--worker", "w", dsn=database)
    r = cli("jobs", "trigger", "p", dsn=database)
    assert r.code == 0
    assert "paused" in r.err
    assert "stays queued" in r.err


def test_trigger_wait_on_a_paused_job_says_it_would_wait_forever(database: str) -> None:
    """Nothing starts the run until a resume: --wait with no --wait-timeout waited
    forever (a tester killed it after 10 min). A bounded wait still waits."""
    cli("jobs", "define", "p", "--manual", "--paused", "--", "true", dsn=database)
    r = cli("jobs", "trigger", "p", "--wait", dsn=database)
    assert r.code == 1, r
    run_id = int(r.out.split()[0])
    assert r.err.splitlines()[-1] == (
        f"coordinator: not waiting for run {run_id}: default/p is paused, so the run cannot "
        "start (the note above says what lets it); --wait-timeout DURATION waits anyway"
    )
    assert "coordinator jobs resume p" in r.err
    bounded = cli("jobs", "trigger", "p", "--wait-timeout", "1s", dsn=database)
    assert bounded.code == 1
    assert f"run {run_id} is still queued after 1s" in bounded.err


def _wait_then_settle(
    database: str,
    status: str,
    *extra: str,
    define: tuple[str, ...] = (),
    also: str = "",
    cut: bool = False,
) -> tuple[Result, int]:
    """``jobs trigger w --wait`` while the run is settled by hand (no daemon): its status
    set, and ``also`` (more of the statement's CTEs, after ``s``: the run's id and job_id)
    in the same transaction. ``cut``: the command's connection is ended first, once it
    waits (its last statement the run's read), as a server restart ends it."""
    cli("jobs", "define", "w", "--manual", *define, "--", "true", dsn=database)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            RUN_MAIN,
            "--dsn",
            database,
            "jobs",
            "trigger",
            "w",
            "--wait",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(None),
    )
    assert proc.stdout is not None
    run_id = int(proc.stdout.readline())
    if cut:
        waiting = (
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'coordinator-cli' "
            "AND query LIKE '%WHERE r.id = $1%'"
        )
        for _ in range(200):
            found = sql(database, waiting)
            if found:
                break
            time.sleep(0.05)
        assert found, "the command never waited"
        sql(database, "SELECT pg_terminate_backend($1)", found[0]["pid"])
    sql(
        database,
        "WITH s AS (UPDATE coordinator.runs SET status = $2, started_at = now(), "
        "finished_at = now(), error_cause = CASE WHEN $2 = 'failed' THEN 'handler' END, "
        "error_message = CASE WHEN $2 = 'failed' THEN 'boom' END WHERE id = $1 "
        f"RETURNING id, job_id){also} SELECT id FROM s",
        run_id,
        status,
    )
    out, err = proc.communicate(timeout=30)
    assert "Traceback" not in err
    return Result(proc.returncode, out, err), run_id


def test_trigger_wait_succeeded(database: str) -> None:
    result, _ = _wait_then_settle(database, "succeeded")
    assert (result.code, result.out) == (0, "succeeded\n")
    assert [line.split(":")[:2] for line in result.err.splitlines()] == [["coordinator", " note"]]


def test_trigger_wait_connects_again_when_its_connection_is_lost(database: str) -> None:
    """PostgreSQL restarted while --wait polled: the command exited 1, "connection lost",
    for a run that succeeded (the daemon rides a restart out)."""
    result, run_id = _wait_then_settle(database, "succeeded", "--wait-timeout", "60s", cut=True)
    assert (result.code, result.out) == (0, "succeeded\n"), result
    assert f"lost the connection while waiting for run {run_id}" in result.err


def test_trigger_wait_failed_exits_1(database: str) -> None:
    result, run_id = _wait_then_settle(database, "failed", "--wait-timeout", "30s")
    assert (result.code, result.out) == (1, "failed\n")
    assert result.err.splitlines()[-1] == f"coordinator: run {run_id} failed (handler): boom"


def test_trigger_wait_failed_says_a_retry_follows(database: str) -> None:
    """The run it waited for failed, but the job's policy queued the next attempt with the
    result: the last line says so, instead of sounding final."""
    result, run_id = _wait_then_settle(
        database,
        "failed",
        define=("--retries", "1"),
        also=", r AS (INSERT INTO coordinator.runs (job_id, trigger, status, attempt, due_at, "
        "retry_of) SELECT job_id, 'retry', 'queued', 2, '2030-01-01T00:00:00Z', id FROM s "
        "RETURNING id)",
    )
    retry = sql(database, "SELECT id FROM coordinator.runs WHERE retry_of = $1", run_id)[0]["id"]
    assert (result.code, result.out) == (1, "failed\n")
    assert result.err.splitlines()[-1] == (
        f"coordinator: run {run_id} failed (handler): boom; retry run {retry} (attempt 2) "
        "follows, due 2030-01-01 00:00:00Z"
    )


def test_ctrl_c_is_one_line_and_exit_130(database: str) -> None:
    """Ctrl-C while a command waits came out of trio's nurseries wrapped in an exception
    group (a 76-line traceback instead of the CLI's word for it), or, right after the
    run's id, left the command waiting forever."""
    cli("jobs", "define", "w", "--manual", "--", "true", dsn=database)
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN_MAIN, "--dsn", database, "jobs", "trigger", "w", "--wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(None),
        # (A shell's background job ignores SIGINT, and a Python started so keeps it.)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    int(proc.stdout.readline())  # the run's id: it waits now (no daemon)
    # At once: right after the id it probes the database and the daemon, where a Ctrl-C
    # left to trio could land in trio-asyncio's loop and leave the command waiting.
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert err.splitlines()[-1] == "coordinator: interrupted"
    assert "Traceback" not in err


def test_trigger_wait_timeout_says_the_daemon_is_not_running(database: str) -> None:
    cli("jobs", "define", "w", "--manual", "--", "true", dsn=database)
    r = cli("jobs", "trigger", "w", "--wait-timeout", "300ms", dsn=database)
    assert r.code == 1
    run_id = int(r.out)
    assert r.err_lines[0].startswith(NO_DAEMON)
    assert r.err_lines[1] == (
        f"coordinator: run {run_id} is still queued after 300ms: the daemon is not running "
        "(no session holds its lock): start it (`coordinator run`, or "
        "`systemctl start coordinator`)"
    )


def test_trigger_json_wait_timeout_prints_the_run_as_it_stands(database: str) -> None:
    """With ``--json`` a script gets the run even when the wait gives up (before, stdout
    was empty): its last state, then the reason on stderr, exit 1 as documented."""
    cli("jobs", "define", "w", "--manual", "--", "true", dsn=database)
    r = cli("jobs", "trigger", "w", "--json", "--wait-timeout", "300ms", dsn=database)
    assert r.code == 1
    assert (r.json["status"], r.json["job"]) == ("queued", "w")
    assert r.err_lines[-1] == (
        f"coordinator: run {r.json['id']} is still queued after 300ms: the daemon is not "
        "running (no session holds its lock): start it (`coordinator run`, or "
        "`systemctl start coordinator`)"
    )


def test_pause_resume_remove(database: str) -> None:
    cli("jobs", "define", "c", "--every", "5m", "--", "true", dsn=database)
    r = cli("jobs", "pause", "c", dsn=database)
    assert (r.code, r.out) == (0, "paused default/c\n")
    assert cli("jobs", "show", "c", "--json", dsn=database).json["paused"] is True
    assert "paused" in cli("jobs", "list", dsn=database).out
    again = cli("jobs", "pause", "c", dsn=database)  # (it said "paused" as if it had)
    assert (again.code, again.out) == (0, "paused default/c (it was already)\n")
    r = cli("jobs", "resume", "c", dsn=database)
    assert (r.code, r.out) == (0, "resumed default/c\n")
    assert cli("jobs", "show", "c", "--json", dsn=database).json["paused"] is False
    again = cli("jobs", "resume", "c", dsn=database)
    assert (again.code, again.out) == (0, "resumed default/c (it was not paused)\n")
    r = cli("jobs", "remove", "c", dsn=database)
    assert (r.code, r.out) == (0, "removed default/c\n")
    assert cli("jobs", "list", "--json", dsn=database).json == []
    assert cli("jobs", "list", dsn=database).out == "no jobs\n"


# --------------------------------------------------------------------------- runs


def test_runs_list_show_resolve(database: str) -> None:
    cli("jobs", "define", "a", "--manual", "--", "true", dsn=database)
    cli("jobs", "define", "b", "-n", "other", "--manual", "--worker", "t", dsn=database)
    job_a = sql(database, "SELECT id FROM coordinator.jobs WHERE name = 'a'")[0]["id"]
    done = sql(
        database,
        "INSERT INTO coordinator.runs (job_id, trigger, status, started_at, finished_at, count, "
        "extra) VALUES ($1, 'schedule', 'succeeded', now(), now(), 7, '{\"files\": 2}') "
        "RETURNING id",
        job_a,
    )[0]["id"]
    lost = sql(
        database,
        "INSERT INTO coordinator.runs (job_id, trigger, status, error_cause) "
        "VALUES ($1, 'schedule', 'unresolved', 'lost') RETURNING id",
        job_a,
    )[0]["id"]
    other = int(cli("jobs", "trigger", "b", "-n", "other", dsn=database).out)

    runs = cli("runs", "list", "--json", dsn=database).json
    assert [r["id"] for r in runs] == [other, lost, done]
    assert all(set(r) >= RUN_KEYS for r in runs)
    assert runs[2]["count"] == 7
    assert runs[2]["extra"] == {"files": 2}
    assert [r["id"] for r in cli("runs", "list", "--job", "a", "--json", dsn=database).json] == [
        lost,
        done,
    ]
    by_status = cli("runs", "list", "--status", "unresolved", "--json", dsn=database).json
    assert [r["id"] for r in by_status] == [lost]
    assert [r["id"] for r in cli("runs", "list", "-n", "other", "--json", dsn=database).json] == [
        other
    ]
    assert len(cli("runs", "list", "--limit", "1", "--json", dsn=database).json) == 1

    table = cli("runs", "list", dsn=database)
    header, *rows = table.out.splitlines()
    assert header.split()[:4] == ["ID", "JOB", "TRIGGER", "STATUS"]
    assert len(rows) == 3
    assert "other/b" in rows[0]

    shown = cli("runs", "show", str(lost), dsn=database)
    assert "status:" in shown.out
    assert "unresolved" in shown.out

    job = cli("jobs", "show", "a", "--json", dsn=database).json
    assert (job["last_status"], job["blocked_by"]) == ("unresolved", lost)
    assert f"blocked by run {lost}" in cli("jobs", "list", dsn=database).out

    r = cli("runs", "resolve", str(lost), "--as", "retry", dsn=database)
    assert r.code == 0, r
    retry_id = int(r.out.rsplit(" ", 1)[1])
    retry = cli("runs", "show", str(retry_id), "--json", dsn=database).json
    assert (retry["trigger"], retry["status"], retry["attempt"]) == ("retry", "queued", 2)

    again = cli("runs", "resolve", str(lost), "--as", "failed", dsn=database)
    one_line_error(again, code=2, contains="only unresolved runs can be resolved")


def test_runs_empty(database: str) -> None:
    assert cli("runs", "list", dsn=database).out == "no runs\n"
    assert cli("runs", "list", "--json", dsn=database).json == []


# --------------------------------------------------------------------------- sync


def _manifest(tmp_path: Path, text: str) -> str:
    path = tmp_path / "jobs.toml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_sync_applies_and_reports(database: str, tmp_path: Path) -> None:
    cli("jobs", "define", "old", "-n", "svc", "--manual", "--", "true", dsn=database)
    path = _manifest(
        tmp_path,
        """
        namespace = "svc"

        [[jobs]]
        name = "nightly"
        cron = "0 2 * * *"
        command = ["nightly.sh"]

        [[jobs]]
        name = "broken"
        cron = "0 25 * * *"
        worker = "w"
        """,
    )
    r = cli("sync", path, "--allow-invalid", dsn=database)
    assert r.code == 0, r
    lines = r.out.splitlines()
    assert lines[0] == "synced namespace svc: 2 created, 0 updated, 1 paused"
    assert lines[1].startswith("1 problem")
    assert lines[2].startswith(f"  {path}:11: broken: cron: ")
    jobs = {j["name"]: j for j in cli("jobs", "list", "-n", "svc", "--json", dsn=database).json}
    assert jobs["old"]["paused"] is True
    assert jobs["nightly"]["invalid_reason"] is None
    assert jobs["broken"]["invalid_reason"].startswith("cron: ")

    again = cli("sync", path, "--json", "--allow-invalid", dsn=database).json
    assert again["created"] == 0
    assert again["updated"] == 2
    assert again["paused"] == 0
    assert again["applied"] is True
    assert again["invalid"] == ["broken"]
    assert again["problems"][0]["job"] == "broken"
    assert again["problems"][0]["field"] == "cron"
    assert again["problems"][0]["line"] == 11


def test_sync_dry_run_says_what_would_change_and_applies_nothing(
    database: str, tmp_path: Path
) -> None:
    """`sync --dry-run`: which jobs a sync would create, change or pause, every check of
    the real one made, nothing written (a transaction rolled back)."""
    base = """
        namespace = "svc"

        [[jobs]]
        name = "nightly"
        cron = "0 2 * * *"
        command = ["nightly.sh"]

        [[jobs]]
        name = "reindex"
        every = "6h"
        worker = "search"
        """
    assert cli("sync", _manifest(tmp_path, base), dsn=database).code == 0
    cli("jobs", "define", "by-hand", "-n", "svc", "--manual", "--", "true", dsn=database)
    before = cli("jobs", "list", "-n", "svc", "--json", dsn=database).json
    changed = (
        base.replace('every = "6h"', 'every = "30m"')
        + """
        [[jobs]]
        name = "fresh"
        manual = true
        command = ["true"]
        """
    )
    path = _manifest(tmp_path, changed)
    r = cli("sync", path, "--dry-run", dsn=database)
    assert r.code == 0, r
    assert r.out.splitlines() == [
        "would sync namespace svc: 1 created, 1 changed, 1 unchanged, 1 paused "
        "(dry run: nothing applied)",
        "  create  fresh",
        "  change  reindex",
        "  pause   by-hand",
    ]
    assert cli("jobs", "list", "-n", "svc", "--json", dsn=database).json == before
    plan = cli("sync", path, "--dry-run", "--json", dsn=database).json
    assert (plan["create"], plan["change"], plan["unchanged"], plan["pause"]) == (
        ["fresh"],
        ["reindex"],
        ["nightly"],
        ["by-hand"],
    )
    assert (plan["applied"], plan["dry_run"]) == (False, True)
    # A manifest with a problem is refused by a dry run as by a sync (exit 2).
    bad = _manifest(
        tmp_path,
        base.replace('cron = "0 2 * * *"', 'cron = "0 2 * * *"\n        misfire_grace = "5m"'),
    )
    refused = cli("sync", bad, "--dry-run", dsn=database)
    assert refused.code == 2, refused
    assert "misfire_grace" in refused.err
    assert cli("jobs", "list", "-n", "svc", "--json", dsn=database).json == before


@pytest.mark.parametrize("flags", [(), ("--strict",)])
def test_sync_refuses_a_manifest_with_problems(
    database: str, tmp_path: Path, flags: tuple[str, ...]
) -> None:
    """The default (and the old --strict, still accepted): every problem with its line,
    nothing applied, exit 2."""
    cli("jobs", "define", "old", "-n", "svc", "--manual", "--", "true", dsn=database)
    path = _manifest(
        tmp_path,
        """
        namespace = "svc"
        [[jobs]]
        name = "good"
        every = "5m"
        worker = "w"
        [[jobs]]
        name = "bad"
        every = "5m"
        worker = "w"
        command = ["x"]
        """,
    )
    r = cli("sync", path, *flags, dsn=database)
    assert r.code == 2
    assert r.err_lines[0].startswith(f"{path}:11: bad: command: ")
    assert r.err_lines[-1] == (
        f"coordinator: {path}: 1 problem in the manifest; nothing applied "
        "(fix them, or store those entries inert with --allow-invalid)"
    )
    assert [j["name"] for j in cli("jobs", "list", "--json", dsn=database).json] == ["old"]
    assert cli("jobs", "show", "old", "-n", "svc", "--json", dsn=database).json["paused"] is False


def test_sync_empty_manifest_pauses_all(database: str, tmp_path: Path) -> None:
    cli("jobs", "define", "a", "-n", "svc", "--manual", "--", "true", dsn=database)
    cli("jobs", "define", "b", "-n", "svc", "--manual", "--", "true", dsn=database)
    r = cli("sync", _manifest(tmp_path, 'namespace = "svc"\njobs = []\n'), dsn=database)
    assert r.out == "synced namespace svc: 0 created, 0 updated, 2 paused\n"
    assert all(j["paused"] for j in cli("jobs", "list", "--json", dsn=database).json)


def test_sync_toml_syntax_error_names_file_and_line(database: str, tmp_path: Path) -> None:
    path = _manifest(tmp_path, 'namespace = "svc"\n[[jobs]\nname = "x"\n')
    one_line_error(cli("sync", path, dsn=database), code=2, contains=f"{path}:2:")


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("jobs", "show", "nope"), "unknown job default/nope"),
        (("jobs", "trigger", "nope"), "unknown job default/nope"),
        (("jobs", "pause", "nope", "-n", "svc"), "unknown job svc/nope"),
        (("jobs", "resume", "nope"), "unknown job default/nope"),
        (("jobs", "remove", "nope"), "unknown job default/nope"),
        (("runs", "list", "--job", "nope"), "unknown job default/nope"),
        (("runs", "show", "999"), "unknown run 999"),
        (("runs", "resolve", "999", "--as", "failed"), "unknown run 999"),
        (("jobs", "define", "x", "--cron", "0 25 * * *", "--", "true"), "--cron: hour"),
        (("jobs", "define", "x", "--cron", "* * *", "--", "true"), "--cron:"),
        (("jobs", "define", "x", "--every", "5 parsecs", "--", "true"), "--every:"),
        (
            ("jobs", "define", "x", "--manual", "--param", "k=1", "--param", "k=2", "--", "true"),
            "--param: 'k' is given twice; give each key once",
        ),
        (("jobs", "define", "x", "--manual", "--timeout", "-3s", "--", "true"), "--timeout:"),
        (("jobs", "trigger", "x", "--wait-timeout", "soon"), "--wait-timeout:"),
        (
            ("jobs", "define", "x", "--cron", "@daily", "--timezone", "Mars/Base", "--", "true"),
            "--timezone:",
        ),
        (
            ("jobs", "define", "x", "--every", "5m", "--timezone", "UTC", "--", "true"),
            "--timezone:",
        ),
        (("jobs", "define", "x", "--at", "2030-01-01T00:00:00", "--", "true"), "--at:"),
        (("jobs", "define", "x", "--manual"), "command:"),
        (("jobs", "define", "x", "--manual", "--worker", "w", "--", "true"), "--worker:"),
        (("jobs", "define", "x", "--manual", "--param", "novalue", "--", "true"), "--param:"),
        (("jobs", "define", "x", "--", "true"), "--cron --every --at --manual"),
        (("jobs", "define", "x", "--manual", "--priority", "urgent", "--", "true"), "--priority"),
        (("runs", "show", "abc"), "ID"),
        (("runs", "list", "--status", "weird"), "--status"),
        (("runs", "list", "--limit", "0"), "--limit"),
        (("runs", "resolve", "1"), "--as"),
        (("jobs",), "ACTION"),
        (("frobnicate",), "COMMAND"),
    ],
)
def test_bad_input_is_one_line_exit_2(database: str, args: tuple[str, ...], field: str) -> None:
    one_line_error(cli(*args, dsn=database), code=2, contains=field)


def test_no_dsn_and_no_server_binaries_says_how_to_fix_it(tmp_path: Path) -> None:
    result = cli("jobs", "list", COORDINATOR_STATE_DIR=str(tmp_path))
    one_line_error(result, code=2, contains="--dsn")
    assert "apt-get install -y postgresql" in result.err


def test_no_dsn_uses_the_embedded_database_and_stops_it(cluster_home: Path) -> None:
    from coordinator.embedded import NoServerBinaries, find_bin_dir

    try:
        bin_dir = str(find_bin_dir())
    except NoServerBinaries:
        pytest.skip("needs PostgreSQL server binaries")
    env = {"COORDINATOR_STATE_DIR": str(cluster_home / "state"), "COORDINATOR_PG_BIN": bin_dir}
    migrated = cli("migrate", **env)
    assert migrated.code == 0, migrated.err
    # Made by this command: it says so, and why (another state directory may be meant).
    assert (
        f"started the embedded PostgreSQL in {cluster_home / 'state' / 'postgres'} (new: no DSN "
        f"is configured and there was none in {cluster_home / 'state'})"
    ) in migrated.err
    assert (cluster_home / "state" / "postgres" / "data" / "PG_VERSION").exists()
    # The cluster is stopped when the command ends; the next command reuses it.
    assert not (cluster_home / "state" / "postgres" / "data" / "postmaster.pid").exists()
    defined = cli("jobs", "define", "e", "--manual", "--", "true", **env)
    assert defined.code == 0, defined.err
    assert "started the embedded PostgreSQL" in defined.err
    assert "(new:" not in defined.err
    listed = cli("jobs", "list", "--json", **env)
    assert [j["name"] for j in json.loads(listed.out)] == ["e"]


def test_dsn_from_environment_and_after_the_command(database: str) -> None:
    assert cli("jobs", "list", env_dsn=database).code == 0
    assert cli("jobs", "list", "--dsn", database).code == 0


def test_unreachable_database_exits_1() -> None:
    result = cli("jobs", "list", dsn=UNREACHABLE)
    # It says which server it tried (never the password), and the socket's path for a
    # socket DSN (before: "[Errno 2] No such file or directory" alone).
    one_line_error(result, code=1, contains="cannot connect to PostgreSQL at 127.0.0.1:1: ")
    assert result.out == ""
    socket_dsn = "postgresql://app:hunter2@/x?host=/nonexistent"
    result = cli("jobs", "list", dsn=socket_dsn)
    one_line_error(
        result, code=1, contains="cannot connect to PostgreSQL at /nonexistent/.s.PGSQL.5432: "
    )
    assert "hunter2" not in result.err


@pytest.mark.parametrize(
    "dsn", ["nonsense://", "postgresql://a@127.0.0.1:99999/x", "postgresql://a@h/x?sslmode=no"]
)
def test_malformed_dsn_exits_2(dsn: str) -> None:
    one_line_error(cli("jobs", "list", dsn=dsn), code=2, contains="--dsn: ")


def test_a_malformed_dsn_is_named_where_it_was_set_and_run_refuses_it(tmp_path: Path) -> None:
    """A DSN from the file was refused as "--dsn", and `coordinator run` retried it
    forever as if the database were unreachable; then refused it without saying where."""
    config = tmp_path / "coordinator.toml"
    config.write_text('dsn = "not a dsn"\n')
    listed = cli("jobs", "list", COORDINATOR_CONFIG=str(config))
    one_line_error(listed, code=2, contains=f"coordinator: dsn (file {config}): invalid DSN")
    env = cli("jobs", "list", COORDINATOR_DSN="nonsense://")
    one_line_error(env, code=2, contains="coordinator: COORDINATOR_DSN: invalid DSN")
    ran = subprocess.run(
        [sys.executable, "-c", RUN_MAIN, "run", "--state-dir", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        env=_env(None, COORDINATOR_CONFIG=str(config)),
        timeout=60,
    )
    assert ran.returncode == 2, ran.stderr
    # (It said "dsn: invalid DSN", not where: `run` names the file as the commands do.)
    assert f"dsn (file {config}): invalid DSN" in ran.stderr.splitlines()[-1]


def test_an_unknown_job_names_the_namespace_that_has_one(database: str) -> None:
    """A demo's jobs are in namespace demo: `jobs trigger hello` said only "unknown job
    default/hello"."""
    cli("jobs", "define", "hello", "-n", "demo", "--manual", "--", "true", dsn=database)
    for args in (("jobs", "trigger", "hello"), ("jobs", "show", "hello")):
        one_line_error(
            cli(*args, dsn=database),
            code=2,
            contains="unknown job default/hello (there is demo/hello: add --namespace demo)",
        )
    one_line_error(cli("jobs", "show", "nope", dsn=database), code=2, contains="default/nope")
    assert "there is" not in cli("jobs", "show", "nope", dsn=database).err


def test_runs_show_prints_a_commands_output_as_lines(database: str) -> None:
    """It was only inside extra's JSON, newlines escaped."""
    cli("jobs", "define", "talk", "--manual", "--", "true", dsn=database)
    run_id = sql(
        database,
        "INSERT INTO coordinator.runs (job_id, trigger, status, started_at, finished_at, extra) "
        "SELECT id, 'manual', 'succeeded', now(), now(), "
        """'{"exit_code": 0, "stdout_tail": "line one\\nline two\\n", "stderr_tail": ""}' """
        "FROM coordinator.jobs RETURNING id",
    )[0]["id"]
    out = cli("runs", "show", str(run_id), dsn=database).out
    assert "stdout (its end):\n  | line one\n  | line two\n" in out
    assert "stderr (its end)" not in out  # (empty)
    assert '{"exit_code": 0, "stderr_tail": ""}' in out
    shown = cli("runs", "show", str(run_id), "--json", dsn=database).json
    assert shown["extra"]["stdout_tail"] == "line one\nline two\n"


def _a_running_run(database: str, name: str) -> int:
    """A manual job ``name`` whose run is ``running`` (as a daemon's claim leaves it)."""
    cli("jobs", "define", name, "--manual", "--", "true", dsn=database)
    run_id: int = sql(
        database,
        "INSERT INTO coordinator.runs (job_id, trigger, status, claimed_at, started_at) "
        "SELECT id, 'manual', 'running', now(), now() FROM coordinator.jobs WHERE name = $1 "
        "RETURNING id",
        name,
    )[0]["id"]
    return run_id


def test_cancelling_a_running_run_says_what_can_be_done(database: str) -> None:
    """The refusal offered no way out."""
    run_id = _a_running_run(database, "long")
    one_line_error(
        cli("runs", "cancel", str(run_id), dsn=database),
        code=2,
        contains=f"run {run_id} is running, only queued or paused runs can be cancelled; a "
        "running run ends with its call (or its job's timeout, if it has one); a run of a "
        f"recoverable job can be paused instead: coordinator runs pause {run_id}",
    )


def test_removing_a_job_whose_run_is_running_says_its_result_is_lost(database: str) -> None:
    run_id = _a_running_run(database, "busy")
    removed = cli("jobs", "remove", "busy", dsn=database)
    assert removed.code == 0, removed.err
    assert removed.out.strip() == "removed default/busy"
    assert (
        f"note: run {run_id} was running: its command or call goes on to its end, and its "
        "result is not saved (the job is gone)" in removed.err
    )


def test_status_names_the_unresolved_run_blocking_the_earliest_deadline(database: str) -> None:
    cli("jobs", "define", "c", "--every", "1h", "--", "true", dsn=database)
    sql(database, "UPDATE coordinator.jobs SET next_run_at = now() - interval '4 minutes'")
    lost = sql(
        database,
        "INSERT INTO coordinator.runs (job_id, trigger, status, error_cause) "
        "SELECT id, 'schedule', 'unresolved', 'lost' FROM coordinator.jobs RETURNING id",
    )[0]["id"]
    facts = cli("status", "--json", dsn=database).json
    assert (facts["next_job"], facts["next_blocked_by"]) == ("default/c", lost)


def test_help_exits_0() -> None:
    result = cli("--help")
    assert result.code == 0
    for command in ("migrate", "jobs", "runs", "sync"):
        assert command in result.out
    assert cli("jobs", "define", "--help").code == 0


def test_console_script_runs() -> None:
    script = Path(sys.executable).parent / "coordinator"
    if not script.exists():
        pytest.skip("the console script is not installed (pip install -e .)")
    proc = subprocess.run(
        [str(script), "jobs", "list"], capture_output=True, text=True, env=_env(None), timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("coordinator: no PostgreSQL server binaries found")


def test_define_again_says_the_saved_deadline_stands_and_a_spent_one_shot_is_done(
    database: str,
) -> None:
    """Defined again unchanged, an interval job printed a fresh estimate from now though
    its saved deadline stood; a one-shot job whose instant was served printed a run to
    come. (No daemon here: the deadlines are saved as a daemon would save them.)"""
    assert cli("jobs", "define", "tick", "--every", "5m", "--", "true", dsn=database).code == 0
    sql(database, "UPDATE coordinator.jobs SET next_run_at = '2030-01-01 08:00+00' "
                  "WHERE name = 'tick'")  # fmt: skip
    again = cli("jobs", "define", "tick", "--every", "5m", "--", "true", dsn=database)
    # (With a daemon: "... (unchanged: its saved deadline stands)"; tests/unit/test_why.py.)
    assert "next run 2030-01-01 08:00:00Z, once a daemon runs" in again.out
    changed = cli("jobs", "define", "tick", "--every", "7m", "--", "true", dsn=database)
    assert "next run about" in changed.out
    assert "unchanged" not in changed.out

    at = "2020-01-01T00:00:00Z"
    assert cli("jobs", "define", "once", "--at", at, "--", "true", dsn=database).code == 0
    sql(database, "UPDATE coordinator.jobs SET next_run_at = NULL WHERE name = 'once'")
    done = cli("jobs", "define", "once", "--at", at, "--", "true", dsn=database)
    assert "done: its instant 2020-01-01 00:00:00Z was served" in done.out
    listed = cli("jobs", "list", dsn=database)
    [row] = [line for line in listed.out.splitlines() if " once " in f" {line} "]
    assert " done " in row


def test_runs_of_a_removed_job_are_told_from_a_new_job_of_its_name(database: str) -> None:
    """A job removed with its history kept, and a new job given its name: `runs list
    --job NAME` lists both jobs' runs; the removed one's say so (only --json's job_id
    told them apart)."""
    cli("jobs", "define", "gone", "--manual", "--", "true", dsn=database)
    old = cli("jobs", "trigger", "gone", dsn=database).out.strip()
    assert cli("jobs", "remove", "gone", "--keep-history", dsn=database).code == 0
    cli("jobs", "define", "gone", "--manual", "--", "true", dsn=database)
    new = cli("jobs", "trigger", "gone", dsn=database).out.strip()
    rows = {
        line.split()[0]: line
        for line in cli("runs", "list", "--job", "gone", dsn=database).out.splitlines()[1:]
    }
    assert " default/gone (removed) " in rows[old]
    assert "(removed)" not in rows[new]
    listed = {str(r["id"]): r["job_removed"] for r in cli(
        "runs", "list", "--job", "gone", "--json", dsn=database).json}  # fmt: skip
    assert listed == {old: True, new: False}
