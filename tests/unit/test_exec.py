"""The ``exec`` executor, with real subprocesses on trio's real clock (docs/design.md, "Executors").

Process deaths are awaited through pidfds (which also work for processes that are not
our children, and count an unreaped zombie as gone), never by polling.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
import trio

from coordinator.clock import SystemWallClock
from coordinator.executors import ExecExecutor, Executor, ExecutorHooks
from coordinator.executors.exec import (
    CANCELLED_MESSAGE,
    DRAIN_AFTER_KILL,
    PIPE_GRACE,
    TRUNCATED,
)
from coordinator.model import Claim, Job, Outcome, Schedule, Target

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="pidfds and sh: Linux only")

PY = sys.executable
#: Generous bound on process start-up and teardown, for slow CI machines.
SLACK = 2.0


def make_claim(
    argv: list[str] | tuple[str, ...],
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    timeout: timedelta | None = None,
    args: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
) -> Claim:
    job = Job(
        id=11,
        namespace="billing",
        name="sweep",
        schedule=Schedule(kind="manual"),
        target=Target(kind="exec", argv=tuple(argv), env=env or {}, cwd=cwd),
        params=params or {},
        timeout=timeout,
    )
    return Claim(
        run_id=42,
        job=job,
        trigger="schedule",
        scheduled_for=datetime(2024, 3, 1, 12, 0, tzinfo=UTC),
        args=args or {},
        attempt=2,
        claimed_at=datetime(2024, 3, 1, 12, 0, 1, tzinfo=UTC),
    )


def executor(**kwargs: Any) -> ExecExecutor:
    return ExecExecutor(clock=SystemWallClock(), **kwargs)


async def run(claim: Claim, ex: ExecExecutor | None = None, *, bound: float = 10) -> Outcome:
    with trio.fail_after(bound):
        outcome = await (ex or executor()).call(claim, abandon=trio.Event())
    json.dumps(outcome.extra, allow_nan=False)  # always JSON-serialisable
    assert outcome.started_at <= outcome.finished_at
    return outcome


def py(source: str) -> list[str]:
    return [PY, "-c", textwrap.dedent(source)]


def read_pid(path: Path) -> int:
    return int(path.read_text().strip())


async def wait_gone(pid: int, bound: float = SLACK) -> None:
    """Return once ``pid`` has exited (a zombie counts); fail after ``bound`` seconds."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        with trio.fail_after(bound):
            await trio.lowlevel.wait_readable(fd)
    finally:
        trio.lowlevel.notify_closing(fd)
        os.close(fd)


# -- the protocol -----------------------------------------------------------------------


def test_available_for_exec_targets_only() -> None:
    ex: Executor = executor()
    assert ex.available(Target(kind="exec", argv=("true",)))
    assert not ex.available(Target(kind="worker", worker_type="billing"))


# -- success and the reported line -------------------------------------------------------


async def test_success_takes_count_and_extra_from_last_stdout_line() -> None:
    claim = make_claim(
        py("""
            print("working")
            print('{"count": 7, "extra": {"a": 1}, "b": "x"}')
            print("   ")
        """)
    )
    outcome = await run(claim)
    assert outcome.status == "succeeded"
    assert outcome.count == 7
    assert outcome.error_cause is None
    assert outcome.error_message is None
    assert outcome.extra["a"] == 1
    assert outcome.extra["b"] == "x"
    assert outcome.extra["exit_code"] == 0
    assert outcome.extra["stdout_tail"].startswith("working\n")
    assert outcome.extra["stderr_tail"] == ""
    assert "count" not in outcome.extra
    assert "count_error" not in outcome.extra


async def test_reserved_extra_keys_are_ours() -> None:
    claim = make_claim(py('print(\'{"count": 1, "exit_code": 99, "stdout_tail": "lie"}\')'))
    outcome = await run(claim)
    assert outcome.extra["exit_code"] == 0
    assert outcome.extra["stdout_tail"] != "lie"


@pytest.mark.parametrize("line", ["plain text", "[1, 2]", '{"count": 3', '{"count": NaN}'])
async def test_last_line_not_a_json_object_reports_nothing(line: str) -> None:
    outcome = await run(make_claim(["echo", line]))
    assert outcome.status == "succeeded"
    assert outcome.count is None
    assert set(outcome.extra) == {"exit_code", "stdout_tail", "stderr_tail"}


@pytest.mark.parametrize("count", ['"many"', "1.5", "true", "[1]", str(2**70)])
async def test_bad_count_is_ignored_with_a_note(count: str) -> None:
    outcome = await run(make_claim(["echo", f'{{"count": {count}, "k": 1}}']))
    assert outcome.status == "succeeded"
    assert outcome.count is None
    assert "count_error" in outcome.extra
    assert outcome.extra["k"] == 1


async def test_output_is_kept_storable() -> None:
    outcome = await run(make_claim(["printf", 'a\\000b\\n{"count": 2, "s": "x\\\\u0000y"}\\n']))
    assert outcome.count == 2
    assert "\x00" not in outcome.extra["stdout_tail"]
    assert outcome.extra["stdout_tail"].startswith("a\ufffdb\n")
    assert outcome.extra["s"] == "x\ufffdy"


# -- what the command receives -----------------------------------------------------------


async def test_env_params_and_stdin_args_arrive(tmp_path: Path) -> None:
    claim = make_claim(
        py("""
            import json, os, sys
            env = {k: v for k, v in os.environ.items() if k != "LC_CTYPE"}
            print(json.dumps({"count": 1, "env": env, "stdin": sys.stdin.read(),
                              "cwd": os.getcwd()}))
        """),
        env={"FROM_TARGET": "t", "SHARED": "target wins"},
        cwd=str(tmp_path),
        args={"force": True, "day": "2024-03-01"},
        params={"bucket": "b1", "depth": 3, "city": "Zürich"},
    )
    ex = executor(base_env={"FROM_BASE": "b", "SHARED": "base"})
    outcome = await run(claim, ex)
    assert outcome.status == "succeeded", outcome
    env = outcome.extra["env"]
    assert env == {
        "FROM_BASE": "b",
        "FROM_TARGET": "t",
        "SHARED": "target wins",
        "COORDINATOR_RUN_ID": "42",
        "COORDINATOR_JOB": "sweep",
        "COORDINATOR_NAMESPACE": "billing",
        "COORDINATOR_FORCE": "1",
        "COORDINATOR_ATTEMPT": "2",
        "COORDINATOR_TRIGGER": "schedule",
        "COORDINATOR_SCHEDULED_FOR": "2024-03-01T12:00:00+00:00",
        "COORDINATOR_PARAMS": env["COORDINATOR_PARAMS"],
    }
    assert json.loads(env["COORDINATOR_PARAMS"]) == {"bucket": "b1", "depth": 3, "city": "Zürich"}
    assert "Zürich" in env["COORDINATOR_PARAMS"]  # (UTF-8, not \\u00fc: it counts against 128 KiB)
    assert json.loads(outcome.extra["stdin"]) == {"force": True, "day": "2024-03-01"}
    assert await trio.Path(outcome.extra["cwd"]).samefile(tmp_path)


async def test_default_env_is_the_daemons(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COORD_TEST_INHERITED", "yes")
    claim = make_claim(
        ["sh", "-c", 'echo "$COORD_TEST_INHERITED $COORDINATOR_FORCE"'], args={"force": 0}
    )
    outcome = await run(claim)
    assert outcome.extra["stdout_tail"] == "yes 0\n"


async def test_stdin_not_read_is_fine() -> None:
    big = {"blob": "z" * 1_000_000}
    assert (await run(make_claim(["true"], args=big))).status == "succeeded"
    # Still running when the feed blocks on a full pipe; the feed is dropped at exit.
    assert (await run(make_claim(["sleep", "0.2"], args=big))).status == "succeeded"


# -- failures -----------------------------------------------------------------------------


async def test_nonzero_exit_fails_with_last_stderr_line() -> None:
    claim = make_claim(["sh", "-c", 'echo out; echo first >&2; echo "boom here" >&2; exit 3'])
    outcome = await run(claim)
    assert outcome.status == "failed"
    assert outcome.error_cause == "handler"
    assert outcome.error_message == "exit status 3: boom here"
    assert outcome.count is None
    assert outcome.extra["exit_code"] == 3
    assert outcome.extra["stdout_tail"] == "out\n"
    assert outcome.extra["stderr_tail"] == "first\nboom here\n"


async def test_nonzero_exit_without_stderr() -> None:
    outcome = await run(make_claim(["sh", "-c", "echo '{\"count\": 5}'; exit 1"]))
    assert outcome.error_message == "exit status 1"
    assert outcome.count is None  # a report only counts on success


async def test_signal_death() -> None:
    outcome = await run(make_claim(["sh", "-c", "kill -SEGV $$"]))
    assert outcome.status == "failed"
    assert outcome.error_cause == "handler"
    assert outcome.error_message == "killed by signal SIGSEGV"
    assert outcome.extra["exit_code"] is None
    assert outcome.extra["signal"] == "SIGSEGV"
    assert (outcome.category, outcome.retryable) == ("provider-failure", None)


async def test_exit_status_75_means_temporary_retry() -> None:
    """sysexits' EX_TEMPFAIL: retry while attempts remain; other statuses say nothing
    (the job's policy decides, the category is the default)."""
    outcome = await run(make_claim(["sh", "-c", "echo 'no route to db' >&2; exit 75"]))
    assert (outcome.status, outcome.error_message) == ("failed", "exit status 75: no route to db")
    assert (outcome.category, outcome.retryable) == ("external-dependency", True)
    plain = await run(make_claim(["sh", "-c", "exit 74"]))
    assert (plain.category, plain.retryable) == (None, None)
    success = await run(make_claim(["true"]))
    assert (success.category, success.retryable) == (None, None)


async def test_missing_binary_cannot_start() -> None:
    outcome = await run(make_claim(["nope"]))
    assert outcome.status == "failed"
    assert outcome.error_cause == "handler"
    assert outcome.error_message == "cannot start: [Errno 2] No such file or directory: 'nope'"
    assert outcome.extra == {"exit_code": None, "stdout_tail": "", "stderr_tail": ""}


async def test_bad_cwd_cannot_start(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    outcome = await run(make_claim(["true"], cwd=str(missing)))
    assert outcome.status == "failed"
    assert outcome.error_cause == "handler"
    assert outcome.error_message is not None
    assert outcome.error_message.startswith("cannot start: [Errno 2]")
    assert str(missing) in outcome.error_message


async def test_permission_denied_cannot_start(tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    outcome = await run(make_claim([str(script)]))
    assert outcome.status == "failed"
    assert outcome.error_message == f"cannot start: [Errno 13] Permission denied: '{script}'"


async def test_params_beyond_the_kernel_s_limit_are_the_run_s_input_not_a_retry() -> None:
    """A single environment string over 128 KiB (MAX_ARG_STRLEN): E2BIG, for every attempt
    alike; it was category unknown and retried."""
    outcome = await run(make_claim(["true"], params={"p": "z" * 200_000}))
    assert (outcome.status, outcome.error_cause) == ("failed", "handler")
    # The kernel's words named `true` (4 bytes); these name what was too long.
    assert outcome.error_message == (
        "cannot start: the job's params are 200,009 bytes as JSON in COORDINATOR_PARAMS, over the "
        "128 KiB one environment variable may hold: pass large input as a run's args (its "
        "stdin), or a reference to it"
    )
    assert (outcome.category, outcome.retryable) == ("invalid-input", False)
    missing = await run(make_claim(["nope"]))  # (another cannot-start: the policy decides)
    assert (missing.category, missing.retryable) == (None, None)


async def test_empty_argv_cannot_start() -> None:
    outcome = await run(make_claim([]))
    assert outcome.status == "failed"
    assert outcome.error_message == "cannot start: empty argv"


# -- timeout, abandon, cancellation --------------------------------------------------------


async def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    main, child = tmp_path / "main.pid", tmp_path / "child.pid"
    claim = make_claim(
        ["sh", "-c", f"echo $$ > {main}; sleep 60 & echo $! > {child}; sleep 60"],
        timeout=timedelta(seconds=0.5),
    )
    ex = executor(kill_grace=2.0)
    start = trio.current_time()
    outcome = await run(claim, ex)
    elapsed = trio.current_time() - start
    assert outcome.status == "timed_out"
    assert outcome.error_cause == "timeout"
    assert outcome.error_message == "timed out after 0.5s"
    assert outcome.extra["signal"] == "SIGTERM"
    assert 0.5 <= elapsed < 0.5 + ex.kill_grace
    await wait_gone(read_pid(main))
    await wait_gone(read_pid(child))


async def test_timeout_escalates_to_sigkill(tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    # Ignored signals stay ignored across exec: the sleeps ignore SIGTERM too.
    claim = make_claim(
        ["sh", "-c", f"trap '' TERM; sleep 60 & echo $! > {child}; sleep 60"],
        timeout=timedelta(seconds=0.3),
    )
    ex = executor(kill_grace=0.5)
    start = trio.current_time()
    outcome = await run(claim, ex)
    elapsed = trio.current_time() - start
    assert outcome.status == "timed_out"
    assert outcome.error_message == "timed out after 0.3s"
    assert outcome.extra["signal"] == "SIGKILL"
    assert 0.8 <= elapsed < 0.8 + SLACK
    await wait_gone(read_pid(child))


async def test_abandon_cancels_the_call(tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    claim = make_claim(["sh", "-c", f"sleep 60 & echo $! > {child}; sleep 60"])
    abandon = trio.Event()
    outcome: Outcome | None = None

    async def call() -> None:
        nonlocal outcome
        outcome = await executor().call(claim, abandon=abandon)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await trio.sleep(0.3)
            abandon.set()
    assert outcome is not None
    assert outcome.status == "cancelled"
    assert outcome.error_cause is None
    assert outcome.error_message == CANCELLED_MESSAGE == "cancelled: daemon stopping"
    await wait_gone(read_pid(child))


async def test_abandon_already_set_starts_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    abandon = trio.Event()
    abandon.set()
    with trio.fail_after(5):
        outcome = await executor().call(make_claim(["touch", str(marker)]), abandon=abandon)
    assert outcome.status == "cancelled"
    assert outcome.error_message == CANCELLED_MESSAGE
    assert outcome.extra["exit_code"] is None
    assert not marker.exists()


async def test_a_lead_lost_since_the_claim_spawns_nothing(tmp_path: Path) -> None:
    # Another daemon may have swept the run meanwhile and be running it: the command is
    # not started here, and the run is given back (nothing of it ran).
    marker = tmp_path / "ran"
    asked: list[float] = []

    def may_send(since: float) -> bool:
        asked.append(since)
        return False

    ex = executor()
    ex.attach(ExecutorHooks(may_send=may_send))
    with trio.fail_after(5):
        outcome = await ex.call(make_claim(["touch", str(marker)]), abandon=trio.Event())
    assert outcome.status == "queued"
    assert outcome.error_message == "not sent: this daemon lost its leadership"
    assert len(asked) == 1
    assert asked[0] <= trio.current_time()
    assert not marker.exists()


async def test_a_lead_kept_spawns_as_before(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    ex = executor()
    ex.attach(ExecutorHooks(may_send=lambda _since: True))
    outcome = await run(make_claim(["touch", str(marker)]), ex)
    assert outcome.status == "succeeded"
    assert marker.exists()


async def test_task_cancellation_kills_the_group_and_propagates(tmp_path: Path) -> None:
    main, child = tmp_path / "main.pid", tmp_path / "child.pid"
    claim = make_claim(["sh", "-c", f"echo $$ > {main}; sleep 60 & echo $! > {child}; wait"])
    with trio.fail_after(5):
        with trio.move_on_after(0.3) as scope:
            await executor(kill_grace=1.0).call(claim, abandon=trio.Event())
            pytest.fail("the call returned instead of raising Cancelled")
    assert scope.cancelled_caught
    await wait_gone(read_pid(main))
    await wait_gone(read_pid(child))


# -- output bounds --------------------------------------------------------------------------


async def test_huge_output_stays_bounded() -> None:
    claim = make_claim(
        py("""
            import sys
            sys.stdout.write("x" * 5_000_000 + "OUT-END")
            sys.stderr.write("y" * 5_000_000 + "ERR-END")
        """)
    )
    limit = 1024
    outcome = await run(claim, executor(output_limit=limit))
    assert outcome.status == "succeeded"
    for key, end in (("stdout_tail", "OUT-END"), ("stderr_tail", "ERR-END")):
        tail = outcome.extra[key]
        assert len(tail.encode()) <= limit + len(TRUNCATED.encode())
        assert tail.startswith(TRUNCATED)
        assert tail.endswith(end)


async def test_huge_failure_output_stays_bounded() -> None:
    claim = make_claim(py("import sys; sys.stderr.write('e' * 3_000_000 + '\\n'); sys.exit(2)"))
    outcome = await run(claim, executor(output_limit=100))
    assert len(outcome.extra["stderr_tail"].encode()) <= 100 + len(TRUNCATED.encode())
    assert outcome.error_message is not None
    assert outcome.error_message.startswith("exit status 2: " + TRUNCATED)


async def test_tail_cut_inside_a_character_drops_the_fragment() -> None:
    outcome = await run(make_claim(py("print('é' * 1000, end='')")), executor(output_limit=101))
    tail = outcome.extra["stdout_tail"]
    assert tail == TRUNCATED + "é" * 50
    assert "\ufffd" not in tail


# -- leftovers in the group -----------------------------------------------------------------


async def test_grandchild_holding_stdout_does_not_hang_the_call(tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    claim = make_claim(["sh", "-c", f"sleep 60 & echo $! > {child}; echo done"])
    start = trio.current_time()
    outcome = await run(claim)
    elapsed = trio.current_time() - start
    assert outcome.status == "succeeded"
    assert outcome.extra["stdout_tail"] == "done\n"
    # Waited for the pipes (PIPE_GRACE), then killed the group.
    assert PIPE_GRACE <= elapsed < PIPE_GRACE + DRAIN_AFTER_KILL + SLACK
    await wait_gone(read_pid(child))


async def test_grandchild_output_within_the_grace_is_kept() -> None:
    claim = make_claim(["sh", "-c", "(sleep 0.2; echo late) & echo early"])
    outcome = await run(claim)
    assert outcome.extra["stdout_tail"] == "early\nlate\n"


async def test_background_child_without_pipes_dies_with_the_run(tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    claim = make_claim(
        ["sh", "-c", f"sleep 60 </dev/null >/dev/null 2>&1 & echo $! > {child}; echo done"]
    )
    start = trio.current_time()
    outcome = await run(claim)
    assert trio.current_time() - start < PIPE_GRACE  # nothing held the pipes
    assert outcome.status == "succeeded"
    await wait_gone(read_pid(child))


async def test_escaped_process_holding_stdout_does_not_hang_the_call(tmp_path: Path) -> None:
    escapee = tmp_path / "escapee.pid"
    claim = make_claim(
        py(f"""
            import subprocess
            proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
            open({str(escapee)!r}, "w").write(str(proc.pid))
            print("left")
        """)
    )
    start = trio.current_time()
    try:
        outcome = await run(claim)
        elapsed = trio.current_time() - start
        assert outcome.status == "succeeded"
        assert outcome.extra["stdout_tail"] == "left\n"
        assert elapsed < PIPE_GRACE + DRAIN_AFTER_KILL + SLACK
    finally:
        if escapee.exists():
            os.kill(read_pid(escapee), signal.SIGKILL)
            await wait_gone(read_pid(escapee))


async def test_commands_going_unrecorded_are_said_once(tmp_path: Path) -> None:
    """The ledger's directory cannot be written (here: under a regular file; on a full
    disk the entry used to be left an empty file without a word): the commands still
    run, and a warning says, once until one is recorded again, what that costs."""
    import io

    from coordinator.events import EventBus
    from coordinator.executors.ledger import CommandLedger
    from coordinator.log import EventLog

    blocker = tmp_path / "state"
    blocker.write_text("not a directory")
    events: list[dict[str, Any]] = []
    log = EventLog(stream=io.StringIO(), observers=[events.append])
    ledger = CommandLedger(blocker / "commands")
    ex = executor(ledger=ledger, events=EventBus(log=log))
    for _ in range(2):
        assert (await run(make_claim(["sleep", "0.2"]), ex)).status == "succeeded"
    said = [e for e in events if e["event"] == "commands.unrecorded"]
    assert len(said) == 1, events
    assert "Not a directory" in said[0]["error"]
    assert said[0]["run"] == 42
    # Recorded again once it can be: said again only after a new failure.
    blocker.unlink()
    blocker.mkdir()
    assert (await run(make_claim(["sleep", "0.2"]), ex)).status == "succeeded"
    blocker.joinpath("commands").rmdir()
    blocker.rmdir()
    blocker.write_text("again")
    assert (await run(make_claim(["sleep", "0.2"]), ex)).status == "succeeded"
    assert len([e for e in events if e["event"] == "commands.unrecorded"]) == 2


async def test_a_command_is_stopped_when_the_daemon_stops_it(tmp_path: Path) -> None:
    """A leader that stepped down stops the commands the new leader runs again
    (``cancel(run, "stopping")``): its group gets SIGTERM and the run ends cancelled. A
    pause is not for commands, nor is a run that is not running here."""
    ex = executor()
    outcome: list[Outcome] = []

    async def call() -> None:
        outcome.append(await run(make_claim(["sleep", "30"]), ex))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        with trio.fail_after(SLACK):
            while 42 not in ex._stops:
                await trio.sleep(0.01)
        assert not ex.cancel(42, "pause")
        assert not ex.cancel(43, "stopping")
        assert ex.cancel(42, "stopping")
    assert outcome[0].status == "cancelled"
    assert outcome[0].extra.get("signal") == "SIGTERM"
    assert 42 not in ex._stops
