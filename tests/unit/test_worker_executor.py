"""The ``worker`` executor with real Unix sockets, driven by the SDK and by raw workers.

Raw workers (a socket and hand-written lines) play the misbehaving peers: the ones that
send garbage, ignore cancel or claim results for runs they were never given. Every test
runs under a ``trio.fail_after`` guard on trio's real clock (socket I/O and a mock
clock's autojump do not mix).
"""

from __future__ import annotations

import ctypes
import functools
import io
import itertools
import json
import os
import socket
import ssl
import stat
import struct
import tempfile
import time
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio
import trio.testing
import trustme

from coordinator.clock import SystemWallClock
from coordinator.core.admission import Coverage
from coordinator.daemon.dispatch import Turns, _Turn
from coordinator.errors import InvalidInput
from coordinator.events import EventBus
from coordinator.executors.base import ExecutorHooks
from coordinator.executors.outcomes import PAUSE_REASONS
from coordinator.executors.worker import (
    CANCELLED_MESSAGE,
    PROGRESS_LOG_LIMIT,
    TcpKeepalive,
    WorkerExecutor,
    WorkerSocketError,
)
from coordinator.log import EventLog
from coordinator.model import CheckpointWrite, Claim, Cursor, Job, Outcome, Schedule, Target
from coordinator.protocol import MAX_LINE
from coordinator.tokens import hash_token, parse_tokens
from coordinator.worker import Context, Worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

GUARD = 10.0


@pytest.fixture
def sock_path(tmp_path: Path) -> Path:
    """A socket path short enough for AF_UNIX (107 bytes), under tmp_path if possible."""
    path = tmp_path / "w.sock"
    if len(os.fsencode(path)) < 100:
        return path
    return Path(tempfile.mkdtemp(prefix="cw-")) / "w.sock"


def make_claim(
    run_id: int,
    worker_type: str = "echo",
    *,
    timeout: float | None = None,
    args: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
    recoverable: bool = False,
    cursor: Cursor | None = None,
    count: int | None = None,
) -> Claim:
    job = Job(
        id=run_id,
        namespace="billing",
        name=f"job{run_id}",
        schedule=Schedule(kind="manual"),
        target=Target(kind="worker", worker_type=worker_type),
        params=params or {},
        timeout=None if timeout is None else timedelta(seconds=timeout),
        recoverable=recoverable,
    )
    return Claim(
        run_id=run_id,
        job=job,
        trigger="manual",
        scheduled_for=None,
        args=args or {},
        attempt=1,
        claimed_at=datetime.now(UTC),
        cursor=cursor,
        count=count,
    )


@attrs.define(eq=False)
class Harness:
    """An executor serving in a nursery, with its log and change notifications."""

    executor: WorkerExecutor
    nursery: trio.Nursery
    events: list[dict[str, Any]]
    changes: int = 0
    changed: trio.Event = attrs.field(factory=trio.Event)
    raws: list[RawWorker] = attrs.field(factory=list)

    def on_change(self) -> None:
        self.changes += 1
        self.changed.set()
        self.changed = trio.Event()

    async def until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self.changed.wait()

    async def serving(self, worker_type: str) -> None:
        await self.until(lambda: worker_type in sorted(self.executor.capacities()))

    async def connect(self) -> RawWorker:
        """A raw worker connection, closed when the harness exits."""
        path = self.executor.socket_path
        assert path is not None
        raw = RawWorker(await trio.open_unix_socket(str(path)))
        self.raws.append(raw)
        return raw

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]

    async def call(
        self, claim: Claim, abandon: trio.Event | None = None, *, check: bool = True
    ) -> Outcome:
        outcome = await self.executor.call(
            claim, abandon=abandon if abandon is not None else trio.Event()
        )
        if check:
            json.dumps(outcome.extra, allow_nan=False)
            assert outcome.started_at <= outcome.finished_at
        return outcome


@asynccontextmanager
async def harness(sock_path: Path, **kwargs: Any) -> AsyncIterator[Harness]:
    events: list[dict[str, Any]] = []
    log = EventLog(stream=io.StringIO(), level="debug", observers=[events.append])
    async with trio.open_nursery() as nursery:
        h = Harness(executor=None, nursery=nursery, events=events)  # type: ignore[arg-type]
        kwargs.setdefault("socket_path", sock_path)
        hooks: dict[str, Any] = {
            name: kwargs.pop(name)
            for name in ("save_progress", "save_checkpoint", "may_send")
            if kwargs.get(name) is not None
        }
        h.executor = WorkerExecutor(clock=SystemWallClock(), events=EventBus(log=log), **kwargs)
        h.executor.attach(ExecutorHooks(changed=h.on_change, **hooks))
        await nursery.start(h.executor.serve)
        try:
            yield h
        finally:
            for raw in h.raws:
                await raw.aclose()
            nursery.cancel_scope.cancel()


def sdk_worker(worker_id: str = "sdk", capacity: int = 4) -> Worker:
    worker = Worker(worker_id, capacity=capacity)

    @worker.job("echo")
    async def echo(ctx: Context) -> Any:
        return ctx.args.get("reply")

    return worker


@attrs.define(eq=False)
class RawWorker:
    """A hand-driven worker connection."""

    stream: trio.SocketStream
    buf: bytearray = attrs.field(factory=bytearray)

    async def send(self, message: dict[str, Any] | bytes) -> None:
        if isinstance(message, dict):
            message = json.dumps({"v": 1, **message}).encode() + b"\n"
        await self.stream.send_all(message)

    async def hello(
        self, worker: str = "raw", types: list[str] | None = None, **extra: Any
    ) -> None:
        fields = {"worker": worker, "types": types or ["echo"], "capacity": 2, **extra}
        await self.send({"type": "hello", **fields})
        welcome = await self.recv()
        assert welcome == {"v": 1, "type": "welcome", "worker": worker}

    async def recv(self) -> dict[str, Any] | None:
        """The next message, or ``None`` at end of stream."""
        while b"\n" not in self.buf:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.buf += data
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        message: dict[str, Any] = json.loads(line)
        return message

    async def expect_error_and_close(self, fragment: str) -> str:
        message = await self.recv()
        assert message is not None
        assert message["type"] == "error", message
        assert fragment in message["message"]
        assert await self.recv() is None
        return str(message["message"])

    async def aclose(self) -> None:
        await self.stream.aclose()


# -- connecting ----------------------------------------------------------------------------


async def test_a_worker_connecting_changes_the_inventory(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            ex = h.executor
            target = Target(kind="worker", worker_type="echo")
            assert not ex.available(target)
            assert sorted(ex.capacities()) == []
            assert ex.capacities().get("echo", 0) == 0
            assert stat.S_IMODE(os.stat(sock_path).st_mode) == 0o660

            a = await h.connect()
            await a.hello("a", ["echo", "mail"], capacity=3)
            assert h.changes == 1
            assert ex.available(target)
            assert not ex.available(Target(kind="worker", worker_type="other"))
            assert not ex.available(Target(kind="exec", argv=("true",)))
            assert sorted(ex.capacities()) == ["echo", "mail"]
            assert ex.capacities().get("echo", 0) == 3

            b = await h.connect()
            await b.hello("b", ["echo"], capacity=5)
            assert h.changes == 2
            assert ex.capacities().get("echo", 0) == 8
            assert ex.capacities().get("mail", 0) == 3
            workers = ex.connections()
            assert [(w.id, list(w.types), w.capacity, w.busy) for w in workers] == [
                ("a", ["echo", "mail"], 3, 0),
                ("b", ["echo"], 5, 0),
            ]
            assert workers[0].transport == "unix"
            assert workers[0].peer.startswith("pid=")

            await a.aclose()
            await h.until(lambda: "mail" not in sorted(ex.capacities()))
            assert h.changes == 3
            assert ex.capacities().get("echo", 0) == 5
            await b.aclose()
            await h.until(lambda: not sorted(ex.capacities()))
            assert not ex.available(target)
            assert [e["worker"] for e in h.named("worker.connected")] == ["a", "b"]
            assert [e["worker"] for e in h.named("worker.disconnected")] == ["a", "b"]


async def test_sdk_worker_call_returns_count_and_extra(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            worker = Worker("sdk", capacity=2)

            @worker.job("echo")
            async def echo(ctx: Context) -> Any:
                assert ctx.run_id == 41
                assert (ctx.job, ctx.namespace, ctx.type) == ("job41", "billing", "echo")
                assert ctx.params == {"table": "t"}
                assert ctx.args == {"force": True}
                assert ctx.attempt == 1
                assert ctx.trigger == "manual"
                assert ctx.deadline is not None
                assert ctx.cursor is None
                await ctx.progress(50, message="half")
                await ctx.checkpoint({"offset": 10})
                return {"count": 7, "extra": {"files": 2}, "note": "kept"}

            await h.nursery.start(worker.run, sock_path)
            assert sorted(h.executor.capacities()) == ["echo"]
            claim = make_claim(41, timeout=30, args={"force": True}, params={"table": "t"})
            outcome = await h.call(claim)
            assert outcome.status == "succeeded"
            assert outcome.count == 7
            assert outcome.error_cause is None
            assert outcome.extra["files"] == 2
            assert outcome.extra["note"] == "kept"
            assert outcome.extra["progress"]["percent"] == 50
            assert outcome.extra["progress"]["message"] == "half"
            assert outcome.extra["checkpoint"] == {"offset": 10}
            assert len(outcome.extra["log"]) == 1
            assert h.executor.connections()[0].busy == 0


async def test_handler_exception_is_a_handler_failure(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            worker = Worker("sdk")

            @worker.job("echo")
            async def fails(ctx: Context) -> int:
                raise RuntimeError(f"no table {ctx.params['table']}")

            await h.nursery.start(worker.run, sock_path)
            outcome = await h.call(make_claim(1, params={"table": "t"}))
            assert outcome.status == "failed"
            assert outcome.error_cause == "handler"
            assert outcome.error_message == "RuntimeError: no table t"
            assert "Traceback" in outcome.extra["traceback"]
            # The worker is still there and serves the next call.
            assert sorted(h.executor.capacities()) == ["echo"]


async def test_no_worker_serving_the_type_gives_the_run_back(sock_path: Path) -> None:
    """Nothing was sent, so nothing failed: the run is given back (``queued``) with the
    reason, to be claimed again once a worker serves its type."""
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            outcome = await h.call(make_claim(1, "absent"))
            assert outcome.status == "queued"
            assert outcome.error_cause is None
            assert outcome.error_message == "not sent: no worker serving 'absent' is connected"


async def test_a_run_resumed_before_is_not_given_back_but_fails_as_before(
    sock_path: Path,
) -> None:
    """A run that started before (resumed: a job recoverable when it paused, no longer)
    keeps its first start: it cannot go back to ``queued``, so it fails unsent."""
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            claim = attrs.evolve(make_claim(1, "absent"), resumes=1)
            outcome = await h.call(claim)
    assert (outcome.status, outcome.error_cause, outcome.error_message) == (
        "failed",
        "crashed",
        "not sent: no worker serving 'absent' is connected",
    )


async def test_a_recoverable_run_not_sent_is_given_back_unless_it_ran_before(
    sock_path: Path,
) -> None:
    """A recoverable job's run that never started is given back like any other, a retry
    carrying its failed attempt's cursor included (an operator's pause asked meanwhile is
    then settled by the give-back: migrations/0025); one resumed before pauses where it
    was, its cursor and count kept."""
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            fresh = await h.call(make_claim(1, "absent", recoverable=True))
            # A retry: a new run, never started, carrying the failed attempt's cursor.
            retry = await h.call(
                make_claim(3, "absent", recoverable=True, cursor=Cursor(value="c3"), count=3)
            )
            resumed = attrs.evolve(
                make_claim(2, "absent", recoverable=True, cursor=Cursor(value="c2"), count=2),
                resumes=1,
            )
            paused = await h.call(resumed)
    reason = "not sent: no worker serving 'absent' is connected"
    assert (fresh.status, fresh.error_cause, fresh.error_message) == ("queued", None, reason)
    assert (retry.status, retry.error_message) == ("queued", reason)
    assert (paused.status, paused.error_message) == ("paused", f"paused: {reason}")
    assert (paused.cursor, paused.count) == (Cursor(value="c2"), 2)


async def test_workers_confined_to_namespaces_report_coverage_and_take_their_runs_first(
    sock_path: Path,
) -> None:
    """A worker whose token reaches some namespaces only: the executor reports which
    namespaces its types cover (admission keeps the others waiting), and a run it may
    take goes to it before a worker reaching every namespace, which stays free for
    the runs only it may take. A run no connected worker may take is given back."""
    confined, everywhere = "confined-token-" + "c" * 20, "everywhere-token-" + "e" * 20
    tokens = parse_tokens(
        {
            "billing-host": {"hash": hash_token(confined), "namespaces": ["billing"]},
            "any-host": {"hash": hash_token(everywhere), "namespaces": ["*"]},
        },
        "worker_tokens",
        kind="worker",
    )
    with trio.fail_after(GUARD):
        async with harness(sock_path, tokens=tokens) as h:
            wide = await h.connect()
            await wide.hello("wide", capacity=1, token=everywhere)
            assert h.executor.coverage() == {}  # no confined worker: every namespace
            narrow = await h.connect()
            await narrow.hello("narrow", capacity=1, token=confined)
            assert h.executor.coverage() == {"echo": Coverage(1, {"billing": 1})}
            h.nursery.start_soon(h.call, make_claim(1))  # a billing run
            assert (await narrow.recv() or {})["run"] == 1
            await wide.aclose()
            await trio.testing.wait_all_tasks_blocked()
            assert h.executor.coverage() == {"echo": Coverage(0, {"billing": 1})}
            other = attrs.evolve(make_claim(2), job=attrs.evolve(make_claim(2).job, namespace="hr"))
            outcome = await h.call(other)
    assert (outcome.status, outcome.error_message) == (
        "queued",
        "not sent: no worker serving 'echo' may run jobs of namespace 'hr' (their tokens' scope)",
    )


# -- timeout, cancel, abandon ----------------------------------------------------------------


async def test_timeout_sends_cancel_and_records_timed_out(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            seen: dict[str, Any] = {}
            worker = Worker("sdk")

            @worker.job("echo")
            async def slow(ctx: Context) -> None:
                try:
                    await trio.sleep_forever()
                finally:
                    seen["cancelled"] = ctx.cancelled.is_set()
                    seen["reason"] = ctx.cancel_reason

            await h.nursery.start(worker.run, sock_path)
            outcome = await h.call(make_claim(1, timeout=0.2))
            assert outcome.status == "timed_out"
            assert outcome.error_cause == "timeout"
            assert outcome.error_message == "timed out after 0.2s"
            assert seen == {"cancelled": True, "reason": "timeout"}
            # It acknowledged the cancel: still connected, slot free.
            assert h.executor.connections()[0].busy == 0
            assert not h.named("worker.cancel_ignored")


async def test_a_result_waiting_when_the_time_runs_out_is_the_outcome(sock_path: Path) -> None:
    """The process did not run while the deadline passed (a tester stopped the daemon
    with SIGSTOP) and the result was already in the socket: trio then wakes the call's
    task and the reader in either order, and a result sent in time was recorded
    ``timed_out`` (3 times of 3). Here the freeze is a blocking sleep, right after the
    raw worker's result is written; four calls in a row (each order is a coin's toss)."""
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw = await h.connect()
            await raw.hello()
            for run in range(1, 5):
                outcomes: list[Outcome] = []

                async def call(run: int = run, outcomes: list[Outcome] = outcomes) -> None:
                    outcomes.append(await h.call(make_claim(run, timeout=0.2)))

                h.nursery.start_soon(call)
                assert (await raw.recv() or {}).get("run") == run
                # Written and frozen in one step (no checkpoint between: the reader
                # would read it first): the 0.2 s limit passes, the result waits unread.
                line = {"v": 1, "type": "result", "run": run, "ok": True, "count": run}
                os.write(raw.stream.socket.fileno(), json.dumps(line).encode() + b"\n")
                time.sleep(0.4)  # noqa: ASYNC251
                while not outcomes:
                    await trio.sleep(0.01)
                assert (outcomes[0].status, outcomes[0].count) == ("succeeded", run)
            assert not h.named("worker.cancel_ignored")


def test_unread_bytes_are_seen_on_a_descriptor_past_1023() -> None:
    """``select`` refuses a descriptor past 1023 (a busy daemon's): the late look at a
    socket was then silently skipped (a reviewer's)."""
    from coordinator.executors.worker import _unread

    left, right = socket.socketpair()
    high = os.dup2(left.fileno(), 2000)
    try:
        assert not _unread(high)
        right.send(b"x")
        assert _unread(high)
    finally:
        os.close(high)
        left.close()
        right.close()


# -- the batch's order ----------------------------------------------------------------------


async def test_a_line_kept_for_its_turn_goes_out_after_the_ones_before_it(
    sock_path: Path,
) -> None:
    """Trio ran the second call of a batch first: it does not wait, its line is kept and
    sent right after the first one's, by the first call's task."""
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw = await h.connect()
            await raw.hello()
            turns = Turns()
            first, second = _Turn(turns, place=(1, 0, 2)), _Turn(turns, place=(1, 1, 2))
            outcomes: list[Outcome] = []

            async def call(run: int, turn: _Turn) -> None:
                claim = make_claim(run)
                outcomes.append(await h.executor.call(claim, abandon=trio.Event(), turn=turn))

            h.nursery.start_soon(call, 2, second)
            await trio.testing.wait_all_tasks_blocked()
            assert h.executor.connections()[0].busy == 1  # its slot is taken, not sent
            h.nursery.start_soon(call, 1, first)
            assert [(await raw.recv() or {}).get("run") for _ in range(2)] == [1, 2]
            for run in (1, 2):
                await raw.send({"type": "result", "run": run, "ok": True})
            while len(outcomes) < 2:
                await trio.sleep(0.01)
            assert [o.status for o in outcomes] == ["succeeded", "succeeded"]


async def _a_worker_and_a_batch_of_two(h: Harness) -> tuple[Any, _Turn, _Turn]:
    """A connected raw worker, and the two places of one claim batch's turnstile."""
    raw = await h.connect()
    await raw.hello()
    turns = Turns()
    return raw, _Turn(turns, place=(1, 0, 2)), _Turn(turns, place=(1, 1, 2))


async def _first_goes_and_the_kept_line_does_not(h: Harness, raw: Any, first: _Turn) -> None:
    """Run 1 (the first of the batch) is called and answered; then nothing for run 2
    (the second, ended while its line waited for its turn) comes before run 3's call:
    neither its call nor a cancel."""
    done: list[Outcome] = []

    async def call_first() -> None:
        done.append(await h.executor.call(make_claim(1), abandon=trio.Event(), turn=first))

    h.nursery.start_soon(call_first)
    assert (await raw.recv() or {}).get("run") == 1
    await raw.send({"type": "result", "run": 1, "ok": True})
    while not done:
        await trio.sleep(0.01)
    h.nursery.start_soon(h.call, make_claim(3))
    message = await raw.recv()
    assert message is not None
    assert (message["type"], message["run"]) == ("call", 3)


async def test_a_call_cancelled_while_its_line_waits_for_its_turn_is_never_sent(
    sock_path: Path,
) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw, first, second = await _a_worker_and_a_batch_of_two(h)
            scope = trio.CancelScope()

            async def call_second() -> None:
                with scope:
                    await h.executor.call(make_claim(2), abandon=trio.Event(), turn=second)

            h.nursery.start_soon(call_second)
            await trio.testing.wait_all_tasks_blocked()
            assert h.executor.connections()[0].busy == 1
            # Cancelled before the first call of its batch started: its line is never
            # sent, and its slot is free again at once.
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert h.executor.connections()[0].busy == 0
            await _first_goes_and_the_kept_line_does_not(h, raw, first)


@pytest.mark.parametrize("how", ["pause", "abandon"])
async def test_a_call_stopped_while_its_line_waits_for_its_turn_ends_unsent(
    sock_path: Path, how: str
) -> None:
    """The call does not wait for its turn in a task step of its own: asked to stop (or
    abandoned) before the calls ahead of it started, it ends as a call never sent, and
    its kept line is not sent when the turn reaches it."""
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw, first, second = await _a_worker_and_a_batch_of_two(h)
            abandon = trio.Event()
            claim = make_claim(2, recoverable=True, cursor=Cursor(value="c2"), count=2)
            kept: list[Outcome] = []

            async def call_second() -> None:
                kept.append(await h.executor.call(claim, abandon=abandon, turn=second))

            h.nursery.start_soon(call_second)
            await trio.testing.wait_all_tasks_blocked()
            assert h.executor.connections()[0].busy == 1  # its slot is taken, not sent
            if how == "pause":
                assert h.executor.cancel(2, "pause") is True
            else:
                abandon.set()
            while not kept:
                await trio.sleep(0.01)
            assert h.executor.connections()[0].busy == 0
            expected = {
                "pause": "paused by operator before the call started",
                "abandon": PAUSE_REASONS["abandon"],
            }[how]
            assert (kept[0].status, kept[0].error_message) == ("paused", expected)
            assert (kept[0].cursor, kept[0].count) == (Cursor(value="c2"), 2)
            await _first_goes_and_the_kept_line_does_not(h, raw, first)


async def test_a_call_whose_worker_left_while_its_line_waited_for_its_turn_is_given_back(
    sock_path: Path,
) -> None:
    """The second call of a batch took a slot, its line kept for its turn; the worker
    left before the first call started: nothing was sent, so nothing failed -- the run
    is given back (``queued``), not ``crashed`` as a call the worker had."""
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw, _first, second = await _a_worker_and_a_batch_of_two(h)
            outcomes: list[Outcome] = []

            async def call_second() -> None:
                claim = make_claim(2)
                outcomes.append(await h.executor.call(claim, abandon=trio.Event(), turn=second))

            h.nursery.start_soon(call_second)
            await trio.testing.wait_all_tasks_blocked()
            assert h.executor.connections()[0].busy == 1  # its slot is taken, not sent
            await raw.aclose()
            while not outcomes:
                await trio.sleep(0.01)
    [outcome] = outcomes
    assert (outcome.status, outcome.error_cause) == ("queued", None)
    assert outcome.error_message is not None
    assert outcome.error_message.startswith("not sent: worker ")
    assert outcome.error_message.endswith(" disconnected")


async def test_a_call_too_large_for_a_line_is_the_run_s_input_not_a_retry(
    sock_path: Path,
) -> None:
    """Never sent, and a retry would not fit either: it failed as if the handler had."""
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw = await h.connect()
            await raw.hello()
            outcome = await h.call(make_claim(9, args={"pad": "y" * MAX_LINE}))
            assert (outcome.status, outcome.error_cause) == ("failed", "handler")
            assert (outcome.category, outcome.retryable) == ("invalid-input", False)
            assert (outcome.error_message or "").startswith("call message of ")
            assert h.executor.connections()[0].busy == 0  # its slot is free again


async def test_raw_worker_sees_cancel(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path, cancel_grace=5) as h:
            raw = await h.connect()
            await raw.hello()
            result: list[Outcome] = []

            async def call() -> None:
                result.append(await h.call(make_claim(9, timeout=0.1)))

            h.nursery.start_soon(call)
            message = await raw.recv()
            assert message is not None
            assert message["type"] == "call"
            assert message["run"] == 9
            assert message["job_type"] == "echo"
            assert message["deadline"] is not None
            assert await raw.recv() == {"v": 1, "type": "cancel", "run": 9, "reason": "timeout"}
            await raw.send({"type": "result", "run": 9, "ok": False, "error": "stopped"})
            while not result:
                await trio.sleep(0.01)
            assert result[0].status == "timed_out"
            await raw.aclose()


async def test_worker_ignoring_cancel_is_disconnected_after_grace(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path, cancel_grace=0.3) as h:
            raw = await h.connect()
            await raw.hello("stubborn")
            outcomes: dict[int, Outcome] = {}

            async def call(claim: Claim) -> None:
                outcomes[claim.run_id] = await h.call(claim)

            h.nursery.start_soon(call, make_claim(1))  # no timeout: crashes with the worker
            assert (await raw.recv() or {})["run"] == 1
            started = trio.current_time()
            h.nursery.start_soon(call, make_claim(2, timeout=0.1))
            assert (await raw.recv() or {})["run"] == 2
            assert (await raw.recv() or {})["type"] == "cancel"
            text = await raw.expect_error_and_close("ignored cancel")
            assert "run 2" in text
            assert trio.current_time() - started >= 0.1 + 0.3
            while len(outcomes) < 2:
                await trio.sleep(0.01)
            assert outcomes[2].status == "timed_out"
            assert outcomes[2].error_cause == "timeout"
            assert "ignored cancel and was disconnected" in (outcomes[2].error_message or "")
            assert outcomes[1].status == "failed"
            assert outcomes[1].error_cause == "crashed"
            assert outcomes[1].error_message == "worker stubborn disconnected"
            assert h.named("worker.cancel_ignored")[0]["worker"] == "stubborn"
            assert sorted(h.executor.capacities()) == []
            await raw.aclose()


async def test_abandon_cancels_the_call(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            started = trio.Event()
            worker = Worker("sdk")

            @worker.job("echo")
            async def slow(ctx: Context) -> None:
                started.set()
                await trio.sleep_forever()

            await h.nursery.start(worker.run, sock_path)
            abandon = trio.Event()
            outcomes: list[Outcome] = []

            async def call() -> None:
                outcomes.append(await h.call(make_claim(1), abandon))

            h.nursery.start_soon(call)
            await started.wait()
            abandon.set()
            while not outcomes:
                await trio.sleep(0.01)
            assert outcomes[0].status == "cancelled"
            assert outcomes[0].error_message == CANCELLED_MESSAGE
            assert h.executor.connections()[0].busy == 0
            # Already abandoned: nothing is sent.
            again = await h.call(make_claim(2), abandon)
            assert again.status == "cancelled"


async def test_disconnect_mid_call_is_crashed(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw = await h.connect()
            await raw.hello("w7")
            outcomes: list[Outcome] = []

            async def call() -> None:
                outcomes.append(await h.call(make_claim(3)))

            h.nursery.start_soon(call)
            assert (await raw.recv() or {})["type"] == "call"
            await raw.send({"type": "progress", "run": 3, "mode": "determinate", "percent": 30})
            await raw.aclose()
            while not outcomes:
                await trio.sleep(0.01)
            outcome = outcomes[0]
            assert outcome.status == "failed"
            assert outcome.error_cause == "crashed"
            assert outcome.error_message == "worker w7 disconnected"
            assert outcome.extra["progress"]["percent"] == 30
            assert sorted(h.executor.capacities()) == []


async def test_a_call_of_a_worker_cut_off_for_a_bad_line_says_why(sock_path: Path) -> None:
    """The run said "worker w8 disconnected", the reason only in the daemon's log."""
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw = await h.connect()
            await raw.hello("w8")
            outcomes: list[Outcome] = []

            async def call() -> None:
                outcomes.append(await h.call(make_claim(3)))

            h.nursery.start_soon(call)
            assert (await raw.recv() or {})["type"] == "call"
            await raw.send({"type": "result", "run": 3, "ok": True, "count": 1.5})
            await raw.expect_error_and_close("'count' must be an integer")
            while not outcomes:
                await trio.sleep(0.01)
            outcome = outcomes[0]
            assert (outcome.status, outcome.error_cause) == ("failed", "crashed")
            assert outcome.error_message == (
                "worker w8 was disconnected for breaking the protocol: "
                "result: 'count' must be an integer, not 1.5"
            )


async def test_reregistration_replaces_the_old_connection(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            old = await h.connect()
            await old.hello("same")
            outcomes: list[Outcome] = []

            async def call(claim: Claim) -> None:
                outcomes.append(await h.call(claim))

            h.nursery.start_soon(call, make_claim(1))
            assert (await old.recv() or {})["run"] == 1
            changes = h.changes

            new = await h.connect()
            await new.hello("same", capacity=2)
            await old.expect_error_and_close("replaced by a new connection")
            while not outcomes:
                await trio.sleep(0.01)
            assert outcomes[0].error_cause == "crashed"
            assert "replaced" in (outcomes[0].error_message or "")
            assert [w.id for w in h.executor.connections()] == ["same"]
            assert h.changes == changes  # same types, same capacity: no change to report
            # A late result for the crashed run, on the new connection, is ignored.
            await new.send({"type": "result", "run": 1, "ok": True})
            h.nursery.start_soon(call, make_claim(2))
            assert (await new.recv() or {})["run"] == 2
            await new.send({"type": "result", "run": 2, "ok": True, "count": 5})
            while len(outcomes) < 2:
                await trio.sleep(0.01)
            assert outcomes[1].status == "succeeded"
            assert outcomes[1].count == 5
            assert h.named("worker.connected")[-1]["replaced"] is True
            await old.aclose()
            await new.aclose()


# -- protocol violations -------------------------------------------------------------------

HELLO = {"type": "hello", "worker": "bad", "types": ["echo"], "capacity": 1}

VIOLATIONS: list[tuple[str, list[dict[str, Any] | bytes], str]] = [
    ("malformed JSON", [HELLO, b"{this is not json\n"], "malformed JSON"),
    ("unknown type", [HELLO, {"type": "launch", "run": 1}], "unknown message type 'launch'"),
    ("oversized line", [HELLO, b"[" + b" " * (MAX_LINE + 10)], "longer than 65536"),
    (
        "result never given",
        [HELLO, {"type": "result", "run": 999, "ok": True}],
        "result for run 999, which this connection was never given",
    ),
    (
        "progress never given",
        [HELLO, {"type": "progress", "run": 5, "mode": "indeterminate"}],
        "progress for run 5",
    ),
    ("hello twice", [HELLO, HELLO], "hello sent twice"),
    ("before hello", [{"type": "bye"}], "expected hello first, got bye"),
    ("capacity", [{**HELLO, "capacity": 0}], "'capacity' must be an integer from 1 to 1024"),
    ("daemon-side type", [HELLO, {"type": "call", "run": 1}], "sent by the daemon"),
    ("bad version", [{**HELLO, "v": 9}], "unsupported protocol version 9"),
]


@pytest.mark.parametrize(
    ("lines", "expected"), [v[1:] for v in VIOLATIONS], ids=[v[0] for v in VIOLATIONS]
)
async def test_protocol_violation_closes_only_that_connection(
    sock_path: Path, lines: list[dict[str, Any] | bytes], expected: str
) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            good = sdk_worker("good")
            await h.nursery.start(good.run, sock_path)
            # A call in flight on the good worker while the bad one misbehaves.
            gate = trio.Event()
            slow = Worker("good-slow")

            @slow.job("slow")
            async def wait_gate(ctx: Context) -> int:
                await gate.wait()
                return 1

            await h.nursery.start(slow.run, sock_path)
            outcomes: list[Outcome] = []

            async def call_slow() -> None:
                outcomes.append(await h.call(make_claim(100, "slow")))

            h.nursery.start_soon(call_slow)

            bad = await h.connect()
            for line in lines:
                await bad.send(line)
            message = await bad.recv()
            if message is not None and message["type"] == "welcome":
                message = await bad.recv()
            assert message is not None
            assert message["type"] == "error"
            assert expected in message["message"]
            assert await bad.recv() is None
            await bad.aclose()

            rejected = h.named("worker.rejected")
            assert len(rejected) == 1
            assert expected in rejected[0]["error"]
            # The others are unaffected: a new call succeeds, the slow one finishes.
            assert (await h.call(make_claim(1, args={"reply": 3}))).count == 3
            gate.set()
            while not outcomes:
                await trio.sleep(0.01)
            assert outcomes[0].status == "succeeded"
            assert sorted(w.id for w in h.executor.connections()) == ["good", "good-slow"]


async def test_silent_connection_is_closed_after_hello_timeout(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path, hello_timeout=0.2) as h:
            raw = await h.connect()
            await raw.expect_error_and_close("no hello within 0.2s")
            assert h.named("worker.rejected")
            await raw.aclose()


async def test_late_progress_and_duplicate_result_are_ignored(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw = await h.connect()
            await raw.hello("w")
            outcomes: list[Outcome] = []

            async def call() -> None:
                outcomes.append(await h.call(make_claim(4)))

            h.nursery.start_soon(call)
            assert (await raw.recv() or {})["run"] == 4
            await raw.send({"type": "result", "run": 4, "ok": True, "count": 1})
            await raw.send({"type": "progress", "run": 4, "mode": "determinate", "percent": 99})
            await raw.send({"type": "checkpoint", "run": 4, "cursor": 1})
            await raw.send({"type": "result", "run": 4, "ok": False})
            await raw.send({"type": "bye"})
            assert await raw.recv() is None  # closed because of bye, with no error
            assert outcomes[0].status == "succeeded"
            assert "progress" not in outcomes[0].extra
            assert not h.named("worker.rejected")
            await raw.aclose()


# -- progress ------------------------------------------------------------------------------


async def test_progress_writes_are_coalesced_and_flag_regressions(sock_path: Path) -> None:
    interval = 0.3
    saves: list[tuple[float, int, dict[str, Any]]] = []

    async def save(run_id: int, snapshot: dict[str, Any]) -> None:
        saves.append((trio.current_time(), run_id, snapshot))
        await trio.sleep(0.01)

    with trio.fail_after(GUARD):
        async with harness(sock_path, save_progress=save, progress_interval=interval) as h:
            raw = await h.connect()
            await raw.hello("w")
            outcomes: list[Outcome] = []

            async def call() -> None:
                outcomes.append(await h.call(make_claim(6)))

            h.nursery.start_soon(call)
            assert (await raw.recv() or {})["run"] == 6
            await raw.send({"type": "progress", "run": 6, "mode": "determinate", "percent": 10})
            while not saves:
                await trio.sleep(0.01)
            for percent in (20, 30, 25):
                await raw.send(
                    {"type": "progress", "run": 6, "mode": "determinate", "percent": percent}
                )
            await raw.send({"type": "progress", "run": 6, "mode": "step", "label": "upload"})
            while len(saves) < 2:
                await trio.sleep(0.02)
            # First write at once (10), the next one interval later with the latest.
            assert saves[0][1:] == (6, saves[0][2])
            assert saves[0][2]["percent"] == 10
            assert "regressed" not in saves[0][2]
            assert saves[1][2]["mode"] == "step"
            assert saves[1][2]["label"] == "upload"
            assert saves[1][2]["regressed"] is True  # 30 -> 25 happened in between
            assert saves[1][0] - saves[0][0] >= interval - 0.01

            await raw.send({"type": "progress", "run": 6, "mode": "determinate", "percent": 90})
            await raw.send({"type": "result", "run": 6, "ok": True, "count": 1})
            while not outcomes:
                await trio.sleep(0.01)
            count = len(saves)
            await trio.sleep(interval * 2)
            assert len(saves) == count  # nothing written after the result
            extra = outcomes[0].extra
            assert extra["progress"]["percent"] == 90
            assert extra["progress"]["regressed"] is True
            assert [e.get("percent") for e in extra["log"]] == [10, 20, 30, 25, None, 90]
            assert extra["log"][3]["regressed"] is True
            assert extra["log"][3]["previous"] == 30
            for (t1, _, _), (t2, _, _) in itertools.pairwise(saves):
                assert t2 - t1 >= interval - 0.01
            await raw.aclose()


async def test_progress_log_is_bounded(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw = await h.connect()
            await raw.hello("w")
            outcomes: list[Outcome] = []

            async def call() -> None:
                outcomes.append(await h.call(make_claim(8)))

            h.nursery.start_soon(call)
            assert (await raw.recv() or {})["run"] == 8
            lines = b"".join(
                json.dumps(
                    {"v": 1, "type": "progress", "run": 8, "mode": "step", "label": f"s{i}"}
                ).encode()
                + b"\n"
                for i in range(120)
            )
            await raw.send(lines)
            await raw.send({"type": "result", "run": 8, "ok": True})
            while not outcomes:
                await trio.sleep(0.01)
            log = outcomes[0].extra["log"]
            assert len(log) == PROGRESS_LOG_LIMIT
            assert log[-1]["label"] == "s119"
            assert outcomes[0].extra["log_dropped"] == 120 - PROGRESS_LOG_LIMIT
            await raw.aclose()


async def test_failing_progress_write_does_not_disturb_the_call(sock_path: Path) -> None:
    async def save(run_id: int, snapshot: dict[str, Any]) -> None:
        raise OSError("database away")

    with trio.fail_after(GUARD):
        async with harness(sock_path, save_progress=save) as h:
            worker = Worker("sdk")

            @worker.job("echo")
            async def job(ctx: Context) -> int:
                await ctx.progress(10)
                await trio.sleep(0.05)
                return 1

            await h.nursery.start(worker.run, sock_path)
            outcome = await h.call(make_claim(1))
            assert outcome.status == "succeeded"
            assert h.named("progress.save_failed")


# -- capacity ------------------------------------------------------------------------------


async def test_capacity_bounds_concurrent_calls(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            running = 0
            peak = 0
            worker = Worker("two", capacity=2)

            @worker.job("echo")
            async def job(ctx: Context) -> int:
                nonlocal running, peak
                running += 1
                peak = max(peak, running)
                await trio.sleep(0.05)
                running -= 1
                return ctx.run_id

            await h.nursery.start(worker.run, sock_path)
            assert h.executor.capacities().get("echo", 0) == 2
            outcomes: list[Outcome] = []
            busy_seen: list[int] = []

            async def call(run_id: int) -> None:
                outcomes.append(await h.call(make_claim(run_id)))
                busy_seen.append(h.executor.connections()[0].busy)

            async with trio.open_nursery() as calls:
                for run_id in range(1, 6):
                    calls.start_soon(call, run_id)
            assert peak == 2
            assert max(busy_seen) <= 2
            assert sorted(o.count or 0 for o in outcomes) == [1, 2, 3, 4, 5]


async def _one_slot_taken_by_run_1(h: Harness, outcomes: list[Outcome]) -> RawWorker:
    """A raw worker with one slot, run 1's call in it (its outcome goes to ``outcomes``)."""
    raw = await h.connect()
    await raw.hello("one", capacity=1)
    h.nursery.start_soon(_collect, h, make_claim(1), outcomes)
    assert (await raw.recv() or {})["run"] == 1
    return raw


async def _nothing_more_for(raw: RawWorker) -> None:
    """Nothing more is sent to ``raw`` (within 0.2 s)."""
    with trio.move_on_after(0.2) as quiet:
        await raw.recv()
    assert quiet.cancelled_caught


async def test_calls_waiting_for_a_slot_get_one_in_the_order_they_began_to_wait(
    sock_path: Path,
) -> None:
    # (Each freed slot wakes the first waiting call. Waking them all, as before, let
    # whichever trio ran first take it: trio runs a round's woken tasks in reverse order
    # half the time.)
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            outcomes: list[Outcome] = []
            raw = await _one_slot_taken_by_run_1(h, outcomes)
            for run in range(2, 8):
                h.nursery.start_soon(_collect, h, make_claim(run), outcomes)
                await trio.testing.wait_all_tasks_blocked()  # run waits, after the one before
            order = [1]
            while len(order) < 7:
                await raw.send({"type": "result", "run": order[-1], "ok": True})
                message = await raw.recv()
                assert message is not None
                order.append(message["run"])
            await raw.send({"type": "result", "run": order[-1], "ok": True})
            while len(outcomes) < 7:
                await trio.sleep(0.01)
    assert order == [1, 2, 3, 4, 5, 6, 7]
    assert {o.status for o in outcomes} == {"succeeded"}


async def test_a_call_waiting_for_a_slot_that_is_asked_to_stop_ends_at_once(
    sock_path: Path,
) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            first: list[Outcome] = []
            raw = await _one_slot_taken_by_run_1(h, first)
            second: list[Outcome] = []
            h.nursery.start_soon(_collect, h, make_claim(2), second)
            await trio.testing.wait_all_tasks_blocked()  # waiting for the one slot
            assert h.executor.cancel(2, "stopping") is True
            while not second:  # (run 1 still holds the slot)
                await trio.sleep(0.01)
            assert not first
            await raw.send({"type": "result", "run": 1, "ok": True})
            while not first:
                await trio.sleep(0.01)
            await _nothing_more_for(raw)  # no call for run 2
    assert second[0].status == "cancelled"
    assert first[0].status == "succeeded"


async def test_a_call_that_waited_is_not_sent_once_the_daemon_lost_its_lead(
    sock_path: Path,
) -> None:
    # Claimed while the daemon led, it waited for a slot; meanwhile the lead was lost
    # (another daemon may have swept the run already): it is not sent when a slot frees,
    # and is given back (the settlement leaves it be if it was swept meanwhile).
    leading = [True]
    with trio.fail_after(GUARD):
        async with harness(sock_path, may_send=lambda _since: leading[0]) as h:
            first: list[Outcome] = []
            raw = await _one_slot_taken_by_run_1(h, first)
            second: list[Outcome] = []
            h.nursery.start_soon(_collect, h, make_claim(2), second)
            await trio.testing.wait_all_tasks_blocked()  # waiting for the one slot
            leading[0] = False
            await raw.send({"type": "result", "run": 1, "ok": True})
            while not second:
                await trio.sleep(0.01)
            await _nothing_more_for(raw)  # no call for run 2
    assert (second[0].status, second[0].error_cause, second[0].error_message) == (
        "queued",
        None,
        "not sent: this daemon lost its leadership",
    )


@pytest.mark.parametrize("how", ["asked to stop", "cancelled"])
async def test_a_woken_call_that_leaves_before_it_runs_wakes_the_next_in_its_place(
    sock_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # Run 1's result frees the one slot and wakes run 2, in the tick in which run 2 is
    # asked to stop (or its task is cancelled) before its task runs again. Run 2 leaves
    # without the slot: run 3 must be woken for it, not left waiting beside a free slot.
    second = trio.CancelScope()  # run 2's
    fired = False
    freed = WorkerExecutor._slot_freed

    def slot_freed(executor: WorkerExecutor, conn: Any) -> None:
        nonlocal fired
        if fired:
            freed(executor, conn)
            return
        fired = True
        if how == "cancelled":
            second.cancel()  # (its wait is aborted; it is still first in the queue)
        freed(executor, conn)  # (wakes run 2)
        if how == "asked to stop":
            assert executor.cancel(2, "stopping") is True

    monkeypatch.setattr(WorkerExecutor, "_slot_freed", slot_freed)
    expected = {1: "succeeded", 3: "succeeded"}
    if how == "asked to stop":
        expected[2] = "cancelled"  # (a cancelled task has no outcome)
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw = await h.connect()
            await raw.hello("one", capacity=1)
            outcomes: dict[int, Outcome] = {}

            async def call(run: int, scope: trio.CancelScope) -> None:
                with scope:
                    outcomes[run] = await h.call(make_claim(run))

            h.nursery.start_soon(call, 1, trio.CancelScope())
            assert (await raw.recv() or {})["run"] == 1
            h.nursery.start_soon(call, 2, second)
            await trio.testing.wait_all_tasks_blocked()
            h.nursery.start_soon(call, 3, trio.CancelScope())
            await trio.testing.wait_all_tasks_blocked()
            await raw.send({"type": "result", "run": 1, "ok": True})
            assert (await raw.recv() or {})["run"] == 3
            await raw.send({"type": "result", "run": 3, "ok": True})
            while len(outcomes) < len(expected):
                await trio.sleep(0.01)
    assert {run: o.status for run, o in outcomes.items()} == expected


async def test_calls_go_to_the_least_busy_worker(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            a = await h.connect()
            await a.hello("a", capacity=4)
            b = await h.connect()
            await b.hello("b", capacity=4)
            outcomes: list[Outcome] = []

            async def call(run_id: int) -> None:
                outcomes.append(await h.call(make_claim(run_id)))

            for run_id in (1, 2, 3, 4):
                h.nursery.start_soon(call, run_id)
            while sum(w.busy for w in h.executor.connections()) < 4:
                await trio.sleep(0.01)
            assert [w.busy for w in h.executor.connections()] == [2, 2]
            for raw in (a, b):
                for _ in range(2):
                    message = await raw.recv()
                    assert message is not None
                    await raw.send({"type": "result", "run": message["run"], "ok": True})
            while len(outcomes) < 4:
                await trio.sleep(0.01)
            assert {o.status for o in outcomes} == {"succeeded"}
            await a.aclose()
            await b.aclose()


# -- bye, detach, sockets --------------------------------------------------------------------


async def test_bye_stops_new_calls_and_lets_running_ones_finish(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw = await h.connect()
            await raw.hello("leaving")
            outcomes: list[Outcome] = []

            async def call() -> None:
                outcomes.append(await h.call(make_claim(1)))

            h.nursery.start_soon(call)
            assert (await raw.recv() or {})["run"] == 1
            await raw.send({"type": "bye"})
            await h.until(lambda: not sorted(h.executor.capacities()))
            assert h.executor.connections()[0].draining is True
            await raw.send({"type": "result", "run": 1, "ok": True, "count": 2})
            assert await raw.recv() is None  # closed once the last result is in
            while not outcomes:
                await trio.sleep(0.01)
            assert outcomes[0].count == 2
            assert h.executor.connections() == []
            await raw.aclose()


async def test_a_worker_that_said_bye_goes_once_its_unsent_call_is_stopped(
    sock_path: Path,
) -> None:
    """The only call of a worker that said bye waited for its turn and was stopped
    before it: the worker has nothing left to run and is let go, as after a result."""
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw = await h.connect()
            await raw.hello("leaving")
            turns = Turns()
            second = _Turn(turns, place=(1, 1, 2))
            outcomes: list[Outcome] = []

            async def call() -> None:
                claim = make_claim(2)
                outcomes.append(await h.executor.call(claim, abandon=trio.Event(), turn=second))

            h.nursery.start_soon(call)
            await trio.testing.wait_all_tasks_blocked()
            assert h.executor.connections()[0].busy == 1  # reserved, its line kept
            await raw.send({"type": "bye"})
            await h.until(lambda: h.executor.connections()[0].draining)
            assert h.executor.cancel(2, "pause") is True
            assert await raw.recv() is None  # closed: no call, no cancel was sent
            while not outcomes:
                await trio.sleep(0.01)
            assert outcomes[0].status == "cancelled"
            assert h.executor.connections() == []
            await raw.aclose()


async def test_detach_stops_accepting_but_claimed_calls_go_on(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw = await h.connect()
            await raw.hello("w")
            outcomes: list[Outcome] = []

            async def call() -> None:
                outcomes.append(await h.call(make_claim(1)))

            h.nursery.start_soon(call)
            assert (await raw.recv() or {})["run"] == 1
            changes = h.changes
            await h.executor.detach()
            assert h.changes == changes + 1
            assert sorted(h.executor.capacities()) == []
            assert not await trio.Path(sock_path).exists()
            with pytest.raises(FileNotFoundError):
                await trio.open_unix_socket(str(sock_path))
            # A run claimed before the stop (claimed ahead, or its claim in flight) is
            # admitted work: the executor still serves its type (though it reports no
            # capacity: nothing new is claimed), and it waits for the busy worker's slot
            # and is sent, not failed. A recoverable one pauses unsent instead, as the
            # recoverable calls under way are asked to at a stop.
            assert h.executor.available(make_claim(2).job.target)
            paused = await h.call(make_claim(3, recoverable=True))
            assert (paused.status, paused.error_message) == (
                "paused",
                "paused: the daemon is stopping",
            )
            h.nursery.start_soon(functools.partial(h.call, make_claim(2)))
            await trio.testing.wait_all_tasks_blocked()  # it waits for the slot
            await raw.send({"type": "result", "run": 1, "ok": True, "count": 9})
            assert (await raw.recv() or {})["run"] == 2
            while not outcomes:
                await trio.sleep(0.01)
            assert outcomes[0].count == 9
            await raw.aclose()


async def test_a_claimed_call_still_unsent_at_the_stop_timeout_is_given_back(
    sock_path: Path,
) -> None:
    # A stopping daemon sends the runs it claimed as slots free; one still waiting when
    # the stop timeout passes (abandon) never started: it is given back (``queued``; the
    # next daemon sends it), not ``cancelled`` (which no retry policy retries).
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw = await h.connect()
            await raw.hello("one", capacity=1)
            abandon = trio.Event()  # (the daemon's one abandon event, for every call)
            first: list[Outcome] = []
            h.nursery.start_soon(
                functools.partial(_collect, h, make_claim(1), first, abandon=abandon)
            )
            assert (await raw.recv() or {})["run"] == 1
            await h.executor.detach()
            second: list[Outcome] = []
            h.nursery.start_soon(
                functools.partial(_collect, h, make_claim(2), second, abandon=abandon)
            )
            await trio.testing.wait_all_tasks_blocked()  # waiting for the one slot
            abandon.set()
            while not second:
                await trio.sleep(0.01)
            cancel = await raw.recv() or {}
            assert (cancel["type"], cancel["run"], cancel["reason"]) == ("cancel", 1, "stopping")
            await raw.send({"type": "result", "run": 1, "ok": False, "error": "cancelled"})
            while not first:
                await trio.sleep(0.01)
            await _nothing_more_for(raw)  # no call for run 2
    assert (second[0].status, second[0].error_cause, second[0].error_message) == (
        "queued",
        None,
        "not sent: the stop timeout passed before a worker slot freed",
    )


async def test_stale_socket_is_replaced_but_a_file_is_not(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        stale = trio.socket.socket(trio.socket.AF_UNIX)
        await stale.bind(str(sock_path))
        stale.close()
        assert await trio.Path(sock_path).exists()
        async with harness(sock_path) as h:
            await h.nursery.start(sdk_worker().run, sock_path)
            assert (await h.call(make_claim(1, args={"reply": 1}))).count == 1
        assert not await trio.Path(sock_path).exists()  # removed at exit

        await trio.Path(sock_path).write_text("not a socket")
        executor = WorkerExecutor(
            clock=SystemWallClock(), events=EventBus(log=EventLog()), socket_path=sock_path
        )
        with pytest.raises(WorkerSocketError, match="not a socket"):
            await executor.serve()
        assert await trio.Path(sock_path).read_text() == "not a socket"


async def test_a_socket_another_daemon_listens_on_is_not_taken(sock_path: Path) -> None:
    """A second daemon (of another database) given the same path replaced the first's
    socket and deleted it at its stop: the first's workers could not reconnect."""
    with trio.fail_after(GUARD):
        async with harness(sock_path) as first:
            said: list[dict[str, Any]] = []
            second = WorkerExecutor(
                clock=SystemWallClock(),
                events=EventBus(log=EventLog(stream=io.StringIO(), observers=[said.append])),
                socket_path=sock_path,
                socket_busy_grace=0.3,
            )
            with pytest.raises(WorkerSocketError, match="is in use: another process listens"):
                await second.serve()
            assert [e["event"] for e in said] == ["worker.socket_busy"]
            # The first's socket is untouched: a worker still reaches it.
            await first.nursery.start(sdk_worker().run, sock_path)
            assert (await first.call(make_claim(1, args={"reply": 1}))).count == 1


async def test_a_socket_whose_listener_goes_meanwhile_is_taken(sock_path: Path) -> None:
    # (A leader of this database stepping down closes its listener as its stop begins.)
    with trio.fail_after(GUARD):
        async with harness(sock_path) as old:

            async def step_down() -> None:
                await trio.sleep(0.2)
                await old.executor.detach()

            old.nursery.start_soon(step_down)
            async with harness(sock_path, socket_busy_grace=GUARD) as new:
                await new.nursery.start(sdk_worker().run, sock_path)
                assert (await new.call(make_claim(1, args={"reply": 2}))).count == 2
                assert [e["event"] for e in new.events][:1] == ["worker.socket_busy"]


async def test_tcp_on_loopback_requires_the_token(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path, socket_path=None, tcp=("127.0.0.1", 0), token="s3") as h:
            assert h.executor.bound_tcp is not None
            host, port = h.executor.bound_tcp
            stream = await trio.open_tcp_stream(host, port)
            raw = RawWorker(stream)
            await raw.send({**HELLO, "token": "wrong"})
            await raw.expect_error_and_close("missing or wrong token")
            await raw.aclose()

            worker = sdk_worker("tcp")
            await h.nursery.start(functools.partial(worker.run, (host, port), token="s3"))
            assert h.executor.connections()[0].transport == "tcp"
            assert (await h.call(make_claim(1, args={"reply": 4}))).count == 4


def daemon_end(h: Harness) -> trio.SocketStream:
    """The daemon's end of its one TCP worker connection (under TLS, if any)."""
    (conn,) = h.executor._conns.values()
    stream = conn.stream
    raw = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    assert isinstance(raw, trio.SocketStream)
    return raw


def go_silent(stream: trio.SocketStream) -> None:
    """Make this end of a loopback connection drop every packet it is sent, unanswered,
    as a host that lost its power or its network does (no FIN, no RST): a classic BPF
    socket filter that accepts nothing, which needs no privilege."""
    drop_all = ctypes.create_string_buffer(struct.pack("HBBI", 0x06, 0, 0, 0))  # ret #0
    program = struct.pack("HP", 1, ctypes.addressof(drop_all))
    try:
        stream.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_ATTACH_FILTER", 26), program)
    except OSError as exc:  # not Linux
        pytest.skip(f"cannot attach a socket filter here: {exc}")


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
async def test_accepted_tcp_workers_get_tcp_keepalive(sock_path: Path, tls: bool) -> None:
    """The daemon sends nothing to a quiet worker, so a worker's host that vanished
    (no FIN, no RST) left its connection open, and its run running, indefinitely: the
    kernel's keepalive (and TCP_USER_TIMEOUT, for a call sent to a dead host) is what
    notices, about a minute on."""
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    with trio.fail_after(GUARD):
        async with harness(
            sock_path,
            socket_path=None,
            tcp=("127.0.0.1", 0),
            token="s3",
            tls=server if tls else None,
        ) as h:
            assert h.executor.bound_tcp is not None
            worker = sdk_worker("tcp")
            run = functools.partial(worker.run, h.executor.bound_tcp, token="s3")
            await h.nursery.start(functools.partial(run, tls=client) if tls else run)
            end = daemon_end(h)
            assert end.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0
            expected = {"TCP_KEEPIDLE": 30, "TCP_KEEPINTVL": 10, "TCP_KEEPCNT": 3}
            expected["TCP_USER_TIMEOUT"] = 60_000  # milliseconds
            for name, value in expected.items():
                if hasattr(socket, name):
                    assert end.getsockopt(socket.IPPROTO_TCP, getattr(socket, name)) == value


async def _silent_worker(h: Harness, *, before_the_call: bool) -> Outcome:
    """A TCP worker that goes silent before or after its call reaches it: the call's
    outcome (the connection's loss, noticed by the kernel)."""
    assert h.executor.bound_tcp is not None
    raw = RawWorker(await trio.open_tcp_stream(*h.executor.bound_tcp))
    h.raws.append(raw)
    await raw.hello("gone", token="s3")
    if before_the_call:
        go_silent(raw.stream)
    outcomes: list[Outcome] = []
    done = trio.Event()

    async def call() -> None:
        outcomes.append(await h.call(make_claim(5)))
        done.set()

    h.nursery.start_soon(call)
    if not before_the_call:
        assert (await raw.recv() or {})["type"] == "call"
        go_silent(raw.stream)
    await done.wait()
    return outcomes[0]


@pytest.mark.parametrize("before_the_call", [False, True], ids=["quiet", "unacknowledged"])
async def test_a_tcp_worker_whose_host_vanished_is_let_go_and_its_call_crashes(
    sock_path: Path, before_the_call: bool
) -> None:
    """A TCP worker that goes silent mid-call (keepalive probes go unanswered) or before
    its call (the call is never acknowledged: TCP_USER_TIMEOUT) is let go within the
    keepalive's limit (2 s here), its call ``crashed`` as for any lost worker. Before,
    both stayed connected, and the run ``running``, until the tester closed the relay."""
    keepalive = TcpKeepalive(idle=1, interval=1, count=1)
    with trio.fail_after(GUARD):
        async with harness(
            sock_path, socket_path=None, tcp=("127.0.0.1", 0), token="s3", keepalive=keepalive
        ) as h:
            outcome = await _silent_worker(h, before_the_call=before_the_call)
            assert (outcome.status, outcome.error_cause) == ("failed", "crashed")
            assert outcome.error_message == "worker gone disconnected"
            assert h.executor.connections() == []
            [gone] = h.named("worker.disconnected")
            assert (gone["worker"], gone["reason"], gone["crashed"]) == (
                "gone",
                "connection lost",
                1,
            )


async def test_a_token_on_the_unix_socket_is_checked_as_over_tcp(sock_path: Path) -> None:
    """The socket's permissions admit a worker without a token (unscoped); a token given
    there is checked as over TCP: a worker's own scopes it, the shared one leaves it
    unscoped, and one that matches nothing is refused and logged. It used to be ignored:
    the worker was welcomed reaching every namespace."""
    mine = "billing-host-token-" + "b" * 20
    tokens = parse_tokens(
        {"billing-host": {"hash": hash_token(mine), "namespaces": ["billing"]}},
        "worker_tokens",
        kind="worker",
    )
    with trio.fail_after(GUARD):
        async with harness(sock_path, tokens=tokens, token="shared-secret") as h:
            wrong = await h.connect()
            await wrong.send({**HELLO, "token": "wrongtoken"})
            await wrong.expect_error_and_close("missing or wrong token")
            assert [e["error"] for e in h.named("worker.rejected")] == ["missing or wrong token"]
            assert h.named("worker.connected") == []

            await (await h.connect()).hello("scoped", token=mine)
            await (await h.connect()).hello("shared", token="shared-secret")
            await (await h.connect()).hello("plain")
            assert {w.id: w.namespaces for w in h.executor.connections()} == {
                "plain": None,
                "scoped": ("billing",),
                "shared": None,
            }


def test_configuration_is_checked() -> None:
    clock, log = SystemWallClock(), EventBus(log=EventLog())
    with pytest.raises(InvalidInput, match="socket path"):
        WorkerExecutor(clock=clock, events=log)
    with pytest.raises(InvalidInput, match="loopback"):
        WorkerExecutor(clock=clock, events=log, tcp=("0.0.0.0", 9000), token="t")
    with pytest.raises(InvalidInput, match="token"):
        WorkerExecutor(clock=clock, events=log, tcp=("127.0.0.1", 9000))
    WorkerExecutor(clock=clock, events=log, tcp=("::1", 9000), token="t")
    WorkerExecutor(clock=clock, events=log, tcp=("localhost", 9000), token="t")


# -- recoverable calls: cursors, counters, findings, pausing ----------------------------------


@attrs.define(eq=False)
class Checkpoints:
    """A ``save_checkpoint`` hook that records what it was given (and can fail or wait)."""

    writes: list[tuple[int, CheckpointWrite]] = attrs.field(factory=list)
    fail_next: int = 0
    gate: trio.Event | None = None
    running: bool = True

    async def save(self, run_id: int, write: CheckpointWrite) -> bool:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("database away")
        self.writes.append((run_id, write))
        return self.running

    def cursors(self) -> list[Any]:
        return [w.cursor.value for _, w in self.writes if w.cursor is not None]

    def findings(self) -> list[str]:
        return [f.resource_id for _, w in self.writes for f in w.findings]


def finding(resource_id: str, severity: str = "warning") -> dict[str, Any]:
    return {"kind": "k", "resource_id": resource_id, "severity": severity}


async def test_a_recoverable_call_carries_the_cursor_and_writes_checkpoints_coalesced(
    sock_path: Path,
) -> None:
    saved = Checkpoints()
    with trio.fail_after(GUARD):
        async with harness(sock_path, save_checkpoint=saved.save, checkpoint_interval=0.3) as h:
            raw = await h.connect()
            await raw.hello(types=["scan"])
            outcomes: list[Outcome] = []
            claim = make_claim(
                1, "scan", recoverable=True, cursor=Cursor(value={"after": 5}), count=5
            )

            async def call() -> None:
                outcomes.append(await h.call(claim))

            h.nursery.start_soon(call)
            message = await raw.recv()
            assert message is not None
            assert (message["checkpoint"], message["recoverable"], message["count"]) == (
                {"after": 5},
                True,
                5,
            )
            for i in range(6, 26):
                if i % 5 == 0:
                    await raw.send({"type": "finding", "run": 1, "findings": [finding(f"r{i}")]})
                await raw.send({"type": "checkpoint", "run": 1, "cursor": {"after": i}, "count": 1})
            await trio.sleep(0.5)  # one interval: the second write
            await raw.send({"type": "finding", "run": 1, "findings": [finding("late", "error")]})
            await raw.send({"type": "result", "run": 1, "ok": True, "count": 4})
            while not outcomes:
                await trio.sleep(0.01)
    [outcome] = outcomes
    assert outcome.status == "succeeded"
    # Coalesced: the first write at once, then at most one per interval (20 checkpoints,
    # about 0.5 s). Each write carries the latest cursor with the counter's total for it,
    # and every finding reported before that cursor (in it, or in an earlier write).
    assert 1 <= len(saved.writes) <= 3
    written_before: set[str] = set()
    for _, write in saved.writes:
        written_before |= {f.resource_id for f in write.findings}
        if write.cursor is not None:
            after = write.cursor.value["after"]
            assert write.count == after
            assert {f"r{i}" for i in range(10, after + 1, 5)} <= written_before
    assert saved.cursors()[-1] == {"after": 25}
    # What was not written goes with the outcome; the result's count is a last delta.
    assert outcome.cursor == Cursor(value={"after": 25})
    assert outcome.count == 29
    assert written_before | {f.resource_id for f in outcome.findings} == {
        "r10", "r15", "r20", "r25", "late"
    }  # fmt: skip
    assert "late" not in written_before
    assert "checkpoint" not in outcome.extra


async def test_a_pause_request_sends_cancel_pause_and_the_run_pauses(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw = await h.connect()
            await raw.hello(types=["scan"])
            outcomes: list[Outcome] = []
            claim = make_claim(2, "scan", recoverable=True, count=3)
            h.nursery.start_soon(lambda: _collect(h, claim, outcomes))
            assert (await raw.recv() or {})["type"] == "call"
            await raw.send({"type": "checkpoint", "run": 2, "cursor": "c1", "count": 1})
            while h.executor._calls[2].cursor != "c1":  # (read: the call keeps it)
                await trio.sleep(0.01)
            assert h.executor.cancel(2, "pause") is True
            assert h.executor.cancel(3, "pause") is False  # not a call of ours
            assert await raw.recv() == {"v": 1, "type": "cancel", "run": 2, "reason": "pause"}
            await raw.send({"type": "result", "run": 2, "ok": True, "paused": True})
            while not outcomes:
                await trio.sleep(0.01)
    [outcome] = outcomes
    assert (outcome.status, outcome.error_message) == ("paused", "paused by operator")
    assert (outcome.cursor, outcome.count, outcome.error_cause) == (Cursor(value="c1"), 4, None)


async def _collect(h: Harness, claim: Claim, outcomes: list[Outcome], **kw: Any) -> None:
    outcomes.append(await h.call(claim, **kw))


@pytest.mark.parametrize(
    ("answer", "status", "message"),
    [
        ({"ok": False, "error": "cancelled"}, "paused", "paused: the daemon is stopping; the "
         "worker said: cancelled"),
        ({"ok": True, "count": 1}, "succeeded", None),
        (None, "paused", "paused: the daemon is stopping; worker raw ignored the cancel for "
         "0.2s and was disconnected"),
    ],
)  # fmt: skip
async def test_a_stopped_recoverable_call_pauses_whatever_the_worker_answers(
    sock_path: Path, answer: dict[str, Any] | None, status: str, message: str | None
) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path, cancel_grace=0.2) as h:
            raw = await h.connect()
            await raw.hello(types=["scan"])
            outcomes: list[Outcome] = []
            claim = make_claim(4, "scan", recoverable=True, cursor=Cursor(value=None))
            h.nursery.start_soon(lambda: _collect(h, claim, outcomes))
            assert (await raw.recv() or {})["type"] == "call"
            assert h.executor.cancel(4, "stopping")
            assert (await raw.recv() or {})["reason"] == "stopping"
            if answer is not None:
                await raw.send({"type": "result", "run": 4, **answer})
            while not outcomes:
                await trio.sleep(0.01)
    [outcome] = outcomes
    assert (outcome.status, outcome.error_message) == (status, message)
    assert outcome.cursor == Cursor(value=None)  # JSON null, handed on as it came


async def test_a_failure_the_worker_reports_by_itself_fails_a_recoverable_run(
    sock_path: Path,
) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw = await h.connect()
            await raw.hello(types=["scan"])
            outcomes: list[Outcome] = []
            h.nursery.start_soon(
                lambda: _collect(h, make_claim(5, "scan", recoverable=True), outcomes)
            )
            assert (await raw.recv() or {})["type"] == "call"
            await raw.send({"type": "checkpoint", "run": 5, "cursor": 17})
            await raw.send({"type": "result", "run": 5, "ok": False, "error": "disk full"})
            while not outcomes:
                await trio.sleep(0.01)
    [outcome] = outcomes
    assert (outcome.status, outcome.error_cause, outcome.error_message) == (
        "failed",
        "handler",
        "disk full",
    )
    assert outcome.cursor == Cursor(value=17)


async def test_a_lost_worker_and_a_timeout_pause_a_recoverable_run(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path, cancel_grace=0.2) as h:
            raw = await h.connect()
            await raw.hello(types=["scan"])
            lost: list[Outcome] = []
            h.nursery.start_soon(lambda: _collect(h, make_claim(6, "scan", recoverable=True), lost))
            assert (await raw.recv() or {})["type"] == "call"
            await raw.send({"type": "checkpoint", "run": 6, "cursor": [1], "count": 1})
            await trio.sleep(0.05)
            await raw.aclose()
            h.raws.remove(raw)
            while not lost:
                await trio.sleep(0.01)

            raw = await h.connect()
            await raw.hello(worker="raw2", types=["scan"])
            timed: list[Outcome] = []
            claim = make_claim(7, "scan", recoverable=True, timeout=0.2)
            h.nursery.start_soon(lambda: _collect(h, claim, timed))
            assert (await raw.recv() or {})["type"] == "call"
            await raw.send({"type": "checkpoint", "run": 7, "cursor": "t", "count": 2})
            assert await raw.recv() == {"v": 1, "type": "cancel", "run": 7, "reason": "timeout"}
            await raw.send({"type": "result", "run": 7, "ok": True, "paused": True})
            while not timed:
                await trio.sleep(0.01)
    assert (lost[0].status, lost[0].error_message) == ("paused", "paused: worker raw disconnected")
    assert (lost[0].cursor, lost[0].count) == (Cursor(value=[1]), 1)
    assert (timed[0].status, timed[0].error_message) == ("paused", "paused: timed out after 0.2s")
    assert (timed[0].cursor, timed[0].count) == (Cursor(value="t"), 2)


async def test_a_pause_before_the_call_is_sent_pauses_without_calling(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw = await h.connect()
            await raw.send({"type": "hello", "worker": "one", "types": ["scan"], "capacity": 1})
            assert (await raw.recv() or {})["type"] == "welcome"
            first: list[Outcome] = []
            h.nursery.start_soon(lambda: _collect(h, make_claim(8, "scan"), first))
            assert (await raw.recv() or {})["run"] == 8
            second: list[Outcome] = []
            claim = make_claim(9, "scan", recoverable=True, cursor=Cursor(value="c9"), count=9)
            h.nursery.start_soon(lambda: _collect(h, claim, second))
            await trio.sleep(0.05)  # waiting for the one slot
            assert h.executor.cancel(9, "pause") is True
            await raw.send({"type": "result", "run": 8, "ok": True})
            while not second:
                await trio.sleep(0.01)
            with trio.move_on_after(0.2):
                assert await raw.recv() is None  # no call for run 9
    assert (second[0].status, second[0].error_message) == (
        "paused",
        "paused by operator before the call started",
    )
    assert (second[0].cursor, second[0].count) == (Cursor(value="c9"), 9)


async def test_a_paused_result_for_a_plain_job_is_a_failure(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw = await h.connect()
            await raw.hello(types=["echo"])
            outcomes: list[Outcome] = []
            h.nursery.start_soon(lambda: _collect(h, make_claim(10), outcomes))
            assert (await raw.recv() or {})["type"] == "call"
            await raw.send({"type": "checkpoint", "run": 10, "cursor": "p", "count": 5})
            await raw.send({"type": "result", "run": 10, "ok": True, "paused": True})
            while not outcomes:
                await trio.sleep(0.01)
    [outcome] = outcomes
    assert (outcome.status, outcome.error_cause) == ("failed", "handler")
    assert outcome.error_message == (
        "worker raw paused the call, but the job is not recoverable "
        "(define it recoverable to resume from a cursor)"
    )  # (it said "raw's job", as if the job were the worker's)
    assert outcome.cursor is None  # a plain job's cursor stays in extra, as before
    assert outcome.extra["checkpoint"] == "p"


async def test_a_failed_checkpoint_write_keeps_its_findings_for_the_next(sock_path: Path) -> None:
    saved = Checkpoints(fail_next=1)
    with trio.fail_after(GUARD):
        async with harness(sock_path, save_checkpoint=saved.save, checkpoint_interval=0.1) as h:
            raw = await h.connect()
            await raw.hello(types=["scan"])
            outcomes: list[Outcome] = []
            h.nursery.start_soon(
                lambda: _collect(h, make_claim(11, "scan", recoverable=True), outcomes)
            )
            assert (await raw.recv() or {})["type"] == "call"
            await raw.send({"type": "finding", "run": 11, "findings": [finding("a"), finding("b")]})
            await raw.send({"type": "checkpoint", "run": 11, "cursor": 2, "count": 2})
            while not saved.writes:
                await trio.sleep(0.01)
            await raw.send({"type": "result", "run": 11, "ok": True})
            while not outcomes:
                await trio.sleep(0.01)
    assert sorted(saved.findings()) == ["a", "b"]
    assert saved.cursors() == [2]
    assert h.named("checkpoint.save_failed")
    assert outcomes[0].findings == ()


async def test_too_many_unwritten_findings_stop_reading_until_written(
    sock_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from coordinator.executors import worker as worker_module

    monkeypatch.setattr(worker_module, "FINDINGS_BACKLOG", 5)
    saved = Checkpoints(gate=trio.Event())
    with trio.fail_after(GUARD):
        async with harness(sock_path, save_checkpoint=saved.save, checkpoint_interval=0.05) as h:
            raw = await h.connect()
            await raw.hello(types=["scan"])
            outcomes: list[Outcome] = []
            h.nursery.start_soon(
                lambda: _collect(h, make_claim(12, "scan", recoverable=True), outcomes)
            )
            assert (await raw.recv() or {})["type"] == "call"
            batch = [finding(f"f{i}") for i in range(8)]
            await raw.send({"type": "finding", "run": 12, "findings": batch})
            await raw.send({"type": "checkpoint", "run": 12, "cursor": 8, "count": 8})
            await trio.sleep(0.3)
            # The checkpoint behind the backlog was not read yet.
            assert h.executor._calls[12].cursor is None
            assert saved.gate is not None
            saved.gate.set()
            await raw.send({"type": "result", "run": 12, "ok": True})
            while not outcomes:
                await trio.sleep(0.01)
    assert sorted(saved.findings() + [f.resource_id for f in outcomes[0].findings]) == sorted(
        f"f{i}" for i in range(8)
    )
    assert outcomes[0].cursor == Cursor(value=8)


async def test_an_oversized_cursor_is_a_protocol_error_and_the_run_pauses(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with harness(sock_path) as h:
            raw = await h.connect()
            await raw.hello(types=["scan"])
            outcomes: list[Outcome] = []
            h.nursery.start_soon(
                lambda: _collect(h, make_claim(13, "scan", recoverable=True), outcomes)
            )
            assert (await raw.recv() or {})["type"] == "call"
            await raw.send({"type": "checkpoint", "run": 13, "cursor": "ok", "count": 1})
            await raw.send({"type": "checkpoint", "run": 13, "cursor": "x" * 17000})
            await raw.expect_error_and_close("checkpoint: 'cursor' is 17002 bytes as JSON")
            while not outcomes:
                await trio.sleep(0.01)
    assert (outcomes[0].status, outcomes[0].cursor) == ("paused", Cursor(value="ok"))


async def test_full_batches_of_findings_are_written_without_waiting(sock_path: Path) -> None:
    """The interval coalesces cursors; it does not throttle findings: a full batch
    (FINDINGS_PER_WRITE) is written at once, one statement each."""
    from coordinator.executors.worker import FINDINGS_PER_WRITE

    saved = Checkpoints()
    with trio.fail_after(GUARD):
        async with harness(sock_path, save_checkpoint=saved.save, checkpoint_interval=30) as h:
            raw = await h.connect()
            await raw.hello(types=["scan"])
            outcomes: list[Outcome] = []
            h.nursery.start_soon(
                lambda: _collect(h, make_claim(14, "scan", recoverable=True), outcomes)
            )
            assert (await raw.recv() or {})["type"] == "call"
            for start in range(0, 3 * FINDINGS_PER_WRITE, FINDINGS_PER_WRITE):
                batch = [finding(f"f{i}") for i in range(start, start + FINDINGS_PER_WRITE)]
                await raw.send({"type": "finding", "run": 14, "findings": batch})
            with trio.fail_after(5):  # far less than the 30 s interval
                while len(saved.findings()) < 2 * FINDINGS_PER_WRITE:
                    await trio.sleep(0.01)
            await raw.send({"type": "result", "run": 14, "ok": True})
            while not outcomes:
                await trio.sleep(0.01)
    assert all(len(w.findings) <= FINDINGS_PER_WRITE for _, w in saved.writes)
    written = saved.findings() + [f.resource_id for f in outcomes[0].findings]
    assert sorted(written) == sorted(f"f{i}" for i in range(3 * FINDINGS_PER_WRITE))
