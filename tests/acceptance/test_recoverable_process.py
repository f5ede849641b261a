"""Recoverable runs as an operator meets them: ``coordinator run`` killed with SIGKILL in
the middle of a scan served by a ``coordinator worker`` process, restarted, the run
paused (not guessed), resumed by a trigger from its last saved checkpoint, its findings
recorded once; and the CLI's pause, findings and refusals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .test_daemon_process import COORDINATOR, EMPTY_CONFIG, DaemonProcess, cli, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Items the scan walks (one checkpoint each, every 20 ms), and every fifth is a finding.
LIMIT = 400
#: How often the daemon writes a running call's checkpoint (the worker executor's default).
CHECKPOINT_INTERVAL = 2.0

WORKER_MODULE = """
import json, os, time
from pathlib import Path

import trio

from coordinator.worker import Paused, Worker

LOG = Path(os.environ["SCAN_LOG"])
LIMIT = int(os.environ["SCAN_LIMIT"])
worker = Worker(worker_id="scanner", capacity=1)


def note(**fields):
    with LOG.open("a") as f:
        f.write(json.dumps({**fields, "t": time.monotonic()}) + "\\n")


@worker.job("scan")
async def scan(ctx):
    start = ctx.cursor or 0
    note(event="start", run=ctx.run_id, cursor=ctx.cursor, count=ctx.count)
    # Look at the last few items before the cursor again: their findings, reported a
    # second time, must not be recorded twice.
    for item in range(max(0, start - 10), start):
        if item % 5 == 0:
            await ctx.finding("fifth", f"item-{item}", severity="warning", detail={"item": item})
    position = start
    while position < LIMIT:
        if ctx.cancelled.is_set():
            raise Paused()
        if position % 5 == 0:
            await ctx.finding("fifth", f"item-{position}", severity="warning",
                              detail={"item": position})
        position += 1
        await ctx.checkpoint(position, count=1)
        note(event="checkpoint", cursor=position)
        await trio.sleep(0.02)
"""


def notes(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def start_daemon(database: str, socket: Path, state: Path, log_path: Path) -> DaemonProcess:
    env = {**os.environ, "COORDINATOR_DSN": database, "COORDINATOR_CONFIG": str(EMPTY_CONFIG)}
    env["COORDINATOR_WORKER_SOCKET"] = str(socket)
    env.pop("COORDINATOR_TEST_DSN", None)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*COORDINATOR, "run", "--log-format", "json", "--state-dir", str(state)],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
        )
    return DaemonProcess(proc=proc, log_path=log_path)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_daemon_killed_mid_scan_pauses_the_run_and_a_trigger_resumes_it(
    database: str, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    socket = Path(tempfile.mkdtemp(prefix="cw-")) / "w.sock"
    (tmp_path / "scanworker.py").write_text(WORKER_MODULE)
    log = tmp_path / "scan.log"
    defined = cli(
        database, "jobs", "define", "scan", "--manual", "--recoverable", "--worker", "scan"
    )
    assert defined.returncode == 0, defined.stderr
    shown = json.loads(cli(database, "jobs", "show", "scan", "--json").stdout)
    assert shown["recoverable"] is True

    first = start_daemon(database, socket, tmp_path / "state", tmp_path / "d1.log")
    processes.append(first.proc)
    first.wait_event("ready")
    worker = subprocess.Popen(
        [sys.executable, "-m", "coordinator.worker", "scanworker:worker", "--socket", str(socket)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path), "SCAN_LOG": str(log),
             "SCAN_LIMIT": str(LIMIT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    processes.append(worker)
    first.wait_event("worker.connected", worker="scanner")
    run_id = int(cli(database, "jobs", "trigger", "scan").stdout.strip())
    wait_until(lambda: sum(n["event"] == "checkpoint" for n in notes(log)) >= 150, timeout=30)
    first.proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    first.proc.wait(10)
    sent = [n for n in notes(log) if n["event"] == "checkpoint" and n["t"] <= killed_at]
    last_sent = sent[-1]["cursor"]

    # The next start pauses the run (it does not guess, it does not resume it).
    second = start_daemon(database, socket, tmp_path / "state", tmp_path / "d2.log")
    processes.append(second.proc)
    lost = second.wait_event("startup.lost_run")
    assert (lost["run"], lost["action"]) == (run_id, "paused")
    second.wait_event("ready")
    run = json.loads(cli(database, "runs", "show", str(run_id), "--json").stdout)
    assert run["status"] == "paused"
    assert run["error_message"].startswith("daemon restart mid-run")
    saved = run["cursor"]
    assert 0 < saved <= last_sent
    assert run["count"] == saved
    findings_before = run["finding_counts"].get("warning", 0)
    assert findings_before >= saved // 5  # those up to the saved cursor at least
    second.wait_event("worker.connected", worker="scanner", timeout=40)
    time.sleep(1.0)
    assert [n["event"] for n in notes(log)].count("start") == 1  # not resumed by itself
    assert (
        json.loads(cli(database, "runs", "show", str(run_id), "--json").stdout)["status"]
        == "paused"
    )
    shown_text = cli(database, "runs", "show", str(run_id)).stdout
    assert "paused:" in shown_text
    assert "cursor:" in shown_text

    # A trigger resumes that run from the last saved checkpoint.
    resumed = cli(database, "jobs", "trigger", "scan")
    assert resumed.stdout.strip() == str(run_id)
    assert "resuming paused run" in resumed.stderr
    done = second.wait_event("job.run", run=run_id, timeout=60)
    assert (done["outcome"], done["completed"], done["resumes"]) == ("succeeded", True, 1)
    starts = [n for n in notes(log) if n["event"] == "start"]
    assert [(s["run"], s["cursor"], s["count"]) for s in starts] == [
        (run_id, None, None),
        (run_id, saved, saved),
    ]
    replayed = last_sent - saved
    print(
        f"\nreplay after SIGKILL: saved cursor {saved}, last checkpoint sent {last_sent}: "
        f"{replayed} item(s) replayed (checkpoint every 20 ms, writes every "
        f"{CHECKPOINT_INTERVAL:g} s)"
    )

    final = json.loads(cli(database, "runs", "show", str(run_id), "--json").stdout)
    assert (final["status"], final["cursor"], final["count"], final["resumes"]) == (
        "succeeded",
        LIMIT,
        LIMIT,
        1,
    )
    assert final["finding_counts"] == {"warning": LIMIT // 5}
    page = json.loads(
        cli(database, "runs", "findings", str(run_id), "--json", "--limit", "1000").stdout
    )
    ids = [f["resource_id"] for f in page["findings"]]
    assert sorted(ids) == sorted(f"item-{i}" for i in range(0, LIMIT, 5))  # each once
    assert page["next"] is None
    table = cli(database, "runs", "findings", str(run_id), "--limit", "3")
    assert table.returncode == 0
    assert table.stdout.splitlines()[0].split() == ["ID", "SEVERITY", "KIND", "RESOURCE", "DETAIL"]
    assert "--after" in table.stderr  # how to get the next page
    # ... of the same query: its filters kept (the hint dropped them).
    hint = table.stderr.split("more: coordinator ", 1)[1].split()
    assert hint[-2:] == ["--limit", "3"], table.stderr
    filtered = cli(
        database, "runs", "findings", str(run_id), "--severity", "warning", "--limit", "2"
    )
    assert filtered.stderr.rstrip().endswith("--severity warning --limit 2"), filtered.stderr
    worker.send_signal(signal.SIGTERM)
    worker.wait(20)
    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(30) == 0


def test_the_cli_pauses_cancels_and_refuses_clearly(database: str) -> None:
    refused = cli(database, "jobs", "define", "cmd", "--manual", "--recoverable", "--", "true")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "coordinator: --recoverable: only a worker job can be recoverable (a command cannot "
        "hand back a cursor): use --worker TYPE"
    )
    assert json.loads(cli(database, "jobs", "list", "--json").stdout) == []

    assert cli(database, "jobs", "define", "scan", "--manual", "--recoverable", "--worker", "scan",
               "--paused").returncode == 0  # fmt: skip
    assert cli(database, "jobs", "define", "plain", "--manual", "--worker", "plain",
               "--paused").returncode == 0  # fmt: skip
    assert "recoverable:      yes" in cli(database, "jobs", "show", "scan").stdout
    run_id = cli(database, "jobs", "trigger", "scan").stdout.strip()
    paused = cli(database, "runs", "pause", run_id)
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.strip() == f"run {run_id} is paused (a trigger of its job resumes it)"
    listed = cli(database, "runs", "list", "--status", "paused")
    assert run_id in listed.stdout
    outstanding = json.loads(cli(database, "jobs", "show", "scan", "--json").stdout)
    assert (outstanding["outstanding_run"], outstanding["outstanding_status"]) == (
        int(run_id),
        "paused",
    )

    plain_run = cli(database, "jobs", "trigger", "plain").stdout.strip()
    not_recoverable = cli(database, "runs", "pause", plain_run)
    assert not_recoverable.returncode == 2
    assert not_recoverable.stderr.strip() == (
        f"coordinator: run {plain_run} of default/plain cannot be paused: the job is not "
        "recoverable: define it with --recoverable (coordinator jobs define) to make its "
        "runs pausable"
    )
    unknown = cli(database, "runs", "pause", "987654")
    assert (unknown.returncode, unknown.stderr.count("\n")) == (2, 1)
    assert "987654" in unknown.stderr

    cancelled = cli(database, "runs", "cancel", run_id)
    assert (cancelled.returncode, cancelled.stdout.strip()) == (0, f"run {run_id} cancelled")
    finished = cli(database, "runs", "pause", run_id)
    assert finished.returncode == 2
    assert f"run {run_id} is cancelled: only a running or queued run can be paused" in (
        finished.stderr
    )
    assert cli(database, "runs", "findings", run_id).stdout.strip() == "no findings"
    bad = cli(database, "runs", "findings", run_id, "--severity", "fatal")
    assert bad.returncode == 2
