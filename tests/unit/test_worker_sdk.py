"""The Python worker SDK against a hand-driven fake daemon (real Unix sockets), and the
``coordinator worker`` command as a process against the real executor.

Every test runs under a ``trio.fail_after`` guard on trio's real clock.
"""

from __future__ import annotations

import io
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio

from coordinator.clock import SystemWallClock
from coordinator.events import EventBus
from coordinator.executors.base import ExecutorHooks
from coordinator.executors.worker import WorkerExecutor
from coordinator.log import EventLog
from coordinator.model import Claim, Job, Schedule, Target
from coordinator.protocol import MAX_LINE
from coordinator.worker import (
    FINDINGS_SPACING,
    PROGRESS_SPACING,
    Context,
    JobError,
    Worker,
    backoff,
    load,
    main,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

GUARD = 10.0


@pytest.fixture
def sock_path(tmp_path: Path) -> Path:
    """A socket path short enough for AF_UNIX (107 bytes), under tmp_path if possible."""
    path = tmp_path / "d.sock"
    if len(os.fsencode(path)) < 100:
        return path
    return Path(tempfile.mkdtemp(prefix="cw-")) / "d.sock"


@attrs.define(eq=False)
class Peer:
    """The daemon's end of one worker connection, driven by hand."""

    stream: trio.SocketStream
    buf: bytearray = attrs.field(factory=bytearray)

    async def send(self, message: dict[str, Any]) -> None:
        await self.stream.send_all(json.dumps({"v": 1, **message}).encode() + b"\n")

    async def recv(self) -> dict[str, Any] | None:
        while b"\n" not in self.buf:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.buf += data
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        message: dict[str, Any] = json.loads(line)
        assert message.pop("v") == 1
        return message

    async def recv_type(self, kind: str) -> dict[str, Any]:
        """The next message of type ``kind``, skipping progress and checkpoints."""
        while True:
            message = await self.recv()
            assert message is not None, f"closed while waiting for {kind}"
            if message["type"] == kind:
                return message
            assert message["type"] in ("progress", "checkpoint"), message

    async def welcome(self) -> dict[str, Any]:
        hello = await self.recv()
        assert hello is not None
        assert hello["type"] == "hello"
        await self.send({"type": "welcome", "worker": hello["worker"]})
        return hello

    async def call(self, run: int, job_type: str = "echo", **fields: Any) -> None:
        body = {
            "type": "call",
            "run": run,
            "job": f"job{run}",
            "namespace": "ns",
            "job_type": job_type,
            "args": {},
            "params": {},
            "deadline": None,
            "attempt": 1,
            "checkpoint": None,
        }
        body.update(fields)
        await self.send(body)


@attrs.define(eq=False)
class FakeDaemon:
    listener: trio.SocketListener
    peers: list[Peer] = attrs.field(factory=list)

    async def accept(self) -> Peer:
        peer = Peer(await self.listener.accept())
        self.peers.append(peer)
        return peer


@asynccontextmanager
async def fake_daemon(path: Path) -> AsyncIterator[FakeDaemon]:
    sock = trio.socket.socket(trio.socket.AF_UNIX)
    await sock.bind(str(path))
    sock.listen(8)
    daemon = FakeDaemon(trio.SocketListener(sock))
    try:
        yield daemon
    finally:
        for peer in daemon.peers:
            await peer.stream.aclose()
        await daemon.listener.aclose()
        await trio.Path(path).unlink(missing_ok=True)


def echo_worker(**kwargs: Any) -> Worker:
    worker = Worker("w", **kwargs)

    @worker.job("echo")
    async def echo(ctx: Context) -> Any:
        return ctx.args.get("reply")

    return worker


# -- results ---------------------------------------------------------------------------------


class Odd:
    def __str__(self) -> str:
        return "odd"


RETURNS: list[tuple[Any, dict[str, Any]]] = [
    (None, {"ok": True}),
    (5, {"ok": True, "count": 5}),
    ({"count": 2, "extra": {"a": 1}, "b": 2}, {"ok": True, "count": 2, "extra": {"a": 1, "b": 2}}),
    ({"files": 3}, {"ok": True, "extra": {"files": 3}}),
    ((4, {"when": datetime(2024, 1, 1, tzinfo=UTC)}), {"ok": True, "count": 4, "extra": {}}),
    ((None, {"o": Odd()}), {"ok": True, "extra": {"o": "odd"}}),
    ({"count": 1, "extra": [1, 2]}, {"ok": True, "count": 1, "extra": {"extra": [1, 2]}}),
    ({"city": "Zürich", 3: None}, {"ok": True, "extra": {"city": "Zürich", "3": None}}),
    ((6, {}), {"ok": True, "count": 6}),
    # NaN and infinities, which JSON cannot say either (they failed the run).
    (
        (1, {"ratio": float("nan"), "deep": [{"top": float("-inf")}], "ok": 0.5}),
        {"ok": True, "count": 1, "extra": {"ratio": "nan", "deep": [{"top": "-inf"}], "ok": 0.5}},
    ),
]


@pytest.mark.parametrize(("value", "expected"), RETURNS)
async def test_return_values_become_results(
    sock_path: Path, value: Any, expected: dict[str, Any]
) -> None:
    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> Any:
        return value

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(1)
            result = await peer.recv_type("result")
            assert result.pop("type") == "result"
            assert result.pop("run") == 1
            if isinstance(value, tuple) and "when" in value[1]:
                assert result["extra"] == {"when": "2024-01-01 00:00:00+00:00"}
                result["extra"] = {}
            assert result == expected
            nursery.cancel_scope.cancel()


BAD_RETURNS: list[tuple[Any, str]] = [
    (True, "not a bool"),
    ("done", "not str"),
    ((1, 2), "extra must be a dict"),
    ({"count": "many"}, "'count' must be a 64-bit integer"),
    ({(1, 2): "tuple key"}, "bad return value"),
    ({"x": "\ud800"}, "bad return value"),
    ({"big": "x" * MAX_LINE}, f"exceeds the {MAX_LINE}-byte limit"),
]


@pytest.mark.parametrize(("value", "expected"), BAD_RETURNS)
async def test_bad_return_values_are_failures(sock_path: Path, value: Any, expected: str) -> None:
    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> Any:
        return value

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(1)
            result = await peer.recv_type("result")
            assert result["ok"] is False
            assert expected in result["error"]
            # The handler's work is done; a retry would do it again to end the same.
            assert (result["retryable"], result["category"]) == (False, "invalid-input")
            nursery.cancel_scope.cancel()


async def test_exception_is_reported_with_traceback(sock_path: Path) -> None:
    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> int:
        raise KeyError("table")

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(1)
            result = await peer.recv_type("result")
            assert result["ok"] is False
            assert result["error"] == "KeyError: 'table'"
            assert "raise KeyError" in result["extra"]["traceback"]
            nursery.cancel_scope.cancel()


async def test_job_error_says_whether_to_retry_and_why(sock_path: Path) -> None:
    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> int:
        if ctx.attempt == 1:
            raise JobError("row 3: no such customer", retryable=False, category="invalid-input")
        raise JobError("")

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(1)
            result = await peer.recv_type("result")
            assert (result["ok"], result["error"]) == (False, "row 3: no such customer")
            assert (result["retryable"], result["category"]) == (False, "invalid-input")
            assert "extra" not in result  # the handler said what failed: no traceback
            await peer.call(2, attempt=2)
            result = await peer.recv_type("result")
            assert result["error"] == "the handler reported a failure"
            assert "retryable" not in result
            assert "category" not in result
            nursery.cancel_scope.cancel()


async def test_what_a_nursery_wraps_is_read_as_the_handler_raised_it(sock_path: Path) -> None:
    """A nursery (trio's, asyncio's TaskGroup, trio_asyncio.open_loop as in README's
    example) wraps its task's exception in a group: a JobError or a Paused alone in it is
    the handler's own. Before, the run said "ExceptionGroup: Exceptions from Trio nursery
    (1 sub-exception)", a JobError lost its category and was retried, and a pause was
    told as a failure's text."""
    from coordinator.worker import Paused

    worker = Worker("w")

    async def raise_(exc: Exception) -> None:
        raise exc

    @worker.job("echo")
    async def handler(ctx: Context) -> None:
        async with trio.open_nursery() as nursery:
            if ctx.run_id == 1:
                nursery.start_soon(
                    raise_, JobError("no such customer", retryable=False, category="invalid-input")
                )
            elif ctx.run_id == 2:
                nursery.start_soon(raise_, Paused({"at": 7}))
            else:
                nursery.start_soon(raise_, ValueError("a"))
                nursery.start_soon(raise_, KeyError("b"))

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(1)
            result = await peer.recv_type("result")
            assert (result["error"], result["retryable"], result["category"]) == (
                "no such customer",
                False,
                "invalid-input",
            )
            await peer.call(2, recoverable=True)
            result = await peer.recv_type("result")
            assert result == {"type": "result", "run": 2, "ok": True, "paused": True,
                              "cursor": {"at": 7}}  # fmt: skip
            await peer.call(3)
            result = await peer.recv_type("result")
            assert result["ok"] is False
            assert result["error"] in (
                "2 errors: ValueError: a; KeyError: 'b'",
                "2 errors: KeyError: 'b'; ValueError: a",
            )
            assert "ExceptionGroup" in result["extra"]["traceback"]
            nursery.cancel_scope.cancel()


async def test_a_handler_s_sys_exit_fails_its_call_only(sock_path: Path) -> None:
    """``sys.exit(4)`` in a handler ended the whole worker process (a ``SystemExit: 4``
    traceback), and a call running beside it failed ``worker W disconnected``. It is one
    call's failure, as any exception is; the worker serves on, on the same connection."""
    gate = trio.Event()
    worker = Worker("w")

    async def exit_() -> None:
        sys.exit()

    @worker.job("echo")
    async def handler(ctx: Context) -> int:
        if ctx.run_id == 1:
            sys.exit(4)
        if ctx.run_id == 3:  # in a nursery: a group of one SystemExit
            async with trio.open_nursery() as nursery:
                nursery.start_soon(exit_)
        await gate.wait()
        return 7

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(2)  # the unrelated call beside it
            await peer.call(1)
            result = await peer.recv_type("result")
            assert (result["run"], result["ok"], result["error"]) == (1, False, "SystemExit: 4")
            assert "sys.exit(4)" in result["extra"]["traceback"]
            await peer.call(3)
            result = await peer.recv_type("result")
            assert (result["run"], result["error"]) == (3, "SystemExit")
            gate.set()
            assert await peer.recv_type("result") == {"type": "result", "run": 2, "ok": True,
                                                      "count": 7}  # fmt: skip
            nursery.cancel_scope.cancel()
    assert len(daemon.peers) == 1


@pytest.mark.parametrize("kind", [KeyboardInterrupt, GeneratorExit])
async def test_other_base_exceptions_of_a_handler_are_not_its_failure(
    sock_path: Path, kind: type[BaseException]
) -> None:
    """Only SystemExit of the base exceptions becomes a failure: Ctrl-C still stops the
    worker, and GeneratorExit is not swallowed."""
    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> int:
        raise kind

    async def serve_one_call() -> None:
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(1)
            assert await peer.recv() is None  # no result: the worker went
            await trio.sleep_forever()  # until its exception ends this

    with trio.fail_after(GUARD), pytest.raises(BaseExceptionGroup) as raised:
        await serve_one_call()
    assert raised.group_contains(kind)


async def test_under_the_worker_command_a_handlers_keyboard_interrupt_fails_its_call(
    sock_path: Path,
) -> None:
    """``coordinator worker`` receives SIGINT as a signal: a KeyboardInterrupt a handler
    raises is its own, and fails that call only (it ended the worker, and the calls
    beside it failed ``crashed``)."""
    worker = Worker("w")
    worker._sigint_received = True  # (as _watch_signals sets it)

    @worker.job("echo")
    async def handler(ctx: Context) -> int:
        raise KeyboardInterrupt

    async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
        nursery.start_soon(worker.run, sock_path)
        peer = await daemon.accept()
        await peer.welcome()
        await peer.call(1)
        with trio.fail_after(GUARD):
            result = await peer.recv()
        assert result is not None
        assert (result["type"], result["ok"], result["error"]) == (
            "result",
            False,
            "KeyboardInterrupt",
        )
        await peer.call(2)  # and it serves on
        with trio.fail_after(GUARD):
            assert (await peer.recv() or {}).get("run") == 2
        nursery.cancel_scope.cancel()


def test_job_error_refuses_an_unknown_category() -> None:
    with pytest.raises(ValueError, match="category must be one of"):
        JobError("x", category="later")  # type: ignore[arg-type]


async def test_context_carries_the_call(sock_path: Path) -> None:
    seen: dict[str, Any] = {}
    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> None:
        seen.update(
            run_id=ctx.run_id,
            job=ctx.job,
            namespace=ctx.namespace,
            type=ctx.type,
            args=ctx.args,
            params=ctx.params,
            attempt=ctx.attempt,
            deadline=ctx.deadline,
            trigger=ctx.trigger,
            cursor=ctx.cursor,
        )
        await ctx.checkpoint({"page": 4})
        seen["after"] = ctx.cursor

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            hello = await peer.welcome()
            assert hello == {"type": "hello", "worker": "w", "types": ["echo"], "capacity": 4}
            await peer.call(
                12,
                args={"force": True},
                params={"p": 1},
                attempt=2,
                deadline="2024-03-01T12:00:00+00:00",
                checkpoint={"page": 3},
                trigger="retry",
            )
            assert await peer.recv() == {"type": "checkpoint", "run": 12, "cursor": {"page": 4}}
            assert (await peer.recv_type("result"))["ok"] is True
            assert seen == {
                "run_id": 12,
                "job": "job12",
                "namespace": "ns",
                "type": "echo",
                "args": {"force": True},
                "params": {"p": 1},
                "attempt": 2,
                "deadline": datetime(2024, 3, 1, 12, 0, tzinfo=UTC),
                "trigger": "retry",
                "cursor": {"page": 3},
                "after": {"page": 4},
            }
            nursery.cancel_scope.cancel()


async def test_progress_is_spaced_and_the_last_one_sent(sock_path: Path) -> None:
    errors: list[str] = []
    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> int:
        for step in ("a", "b", "c"):
            await ctx.progress(step=step)
        for i in range(1, 1001):
            await ctx.progress(i / 10, message="m" * 600)
        await ctx.progress()
        for bad in (101, -1):
            try:
                await ctx.progress(bad)
            except ValueError as exc:
                errors.append(str(exc))
        try:
            await ctx.checkpoint("x" * 20000)
        except ValueError as exc:
            errors.append(str(exc))
        return 1

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(1)
            messages = []
            while (message := await peer.recv()) is not None and message["type"] != "result":
                messages.append(message)
            assert [m.get("label") for m in messages[:3]] == ["a", "b", "c"]
            determinate = [m for m in messages if m["mode"] == "determinate"]
            assert 1 <= len(determinate) < 20
            assert len(determinate[0]["message"]) == 500
            assert messages[-1] == {"type": "progress", "run": 1, "mode": "indeterminate"}
            assert len(errors) == 3
            assert "0 to 100" in errors[0]
            assert "16384" in errors[2]
            nursery.cancel_scope.cancel()


async def test_pending_progress_is_flushed_before_the_result(sock_path: Path) -> None:
    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> int:
        await ctx.progress(10)
        await ctx.progress(20)  # within the spacing: held back
        await trio.sleep(0.3)  # ... and sent by the flusher meanwhile
        await ctx.progress(30)
        await ctx.progress(40)  # held back, flushed before the result
        return 1

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(1)
            percents = []
            while (message := await peer.recv()) is not None and message["type"] == "progress":
                percents.append(message["percent"])
            assert message is not None
            assert message["type"] == "result"
            assert percents == [10, 20, 30, 40]
            nursery.cancel_scope.cancel()


async def test_a_calls_delayed_sends_end_with_it(sock_path: Path) -> None:
    """Held-back progress and batched findings start delayed sends in the connection's
    nursery; the flush before the result sends what they held, and none of them sends
    anything after the result, however long the connection lives on."""
    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> int:
        await ctx.progress(10)
        await ctx.progress(20)  # within the spacing: held back, a delayed send starts
        await ctx.finding("k", 1)  # batched: another delayed send
        return 1

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(1)
            kinds = []
            while (message := await peer.recv()) is not None and message["type"] != "result":
                kinds.append((message["type"], message.get("percent")))
            assert message is not None
            assert kinds == [("progress", 10), ("progress", 20), ("finding", None)]
            with trio.move_on_after(FINDINGS_SPACING + PROGRESS_SPACING + 0.2) as quiet:
                late = await peer.recv()
            assert quiet.cancelled_caught, late
            await peer.call(2)  # the connection still serves calls
            while (message := await peer.recv()) is not None and message["type"] != "result":
                pass
            assert message == {"type": "result", "run": 2, "ok": True, "count": 1}
            nursery.cancel_scope.cancel()


async def test_a_long_call_keeps_no_finished_delayed_sends(sock_path: Path) -> None:
    """Each held-back progress starts a delayed send; one that has sent is forgotten, so a
    call that reports for hours does not pile them up."""
    kept: list[int] = []
    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> int:
        for i in range(5):
            await ctx.progress(10 * i)
            await ctx.progress(10 * i + 5)  # held back: a delayed send starts
            # ... and sends it meanwhile, then is forgotten. (Waited for, not slept for a
            # fixed 2.5 spacings: on a loaded CI machine the send came later, once.)
            with trio.move_on_after(GUARD / 2):
                while ctx._later:
                    await trio.sleep(PROGRESS_SPACING)
            kept.append(len(ctx._later))
        return 1

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(1)
            percents = []
            while (message := await peer.recv()) is not None and message["type"] == "progress":
                percents.append(message["percent"])
            assert message is not None
            assert message["type"] == "result"
            assert percents == [p for i in range(5) for p in (10 * i, 10 * i + 5)]
            assert kept == [0, 0, 0, 0, 0]
            nursery.cancel_scope.cancel()


# -- cancel, capacity, unknown types ---------------------------------------------------------


async def test_cancel_sets_the_event_and_cancels_the_handler(sock_path: Path) -> None:
    seen: list[bool] = []
    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> int:
        try:
            await trio.sleep_forever()
        finally:
            seen.append(ctx.cancelled.is_set())
        return 1  # pragma: no cover

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(1)
            await peer.send({"type": "cancel", "run": 1, "reason": "timeout"})
            result = await peer.recv_type("result")
            assert result == {
                "type": "result",
                "run": 1,
                "ok": False,
                "error": "cancelled (timeout)",
                "category": "cancellation",  # (the daemon keeps its own word after its cancel)
            }
            assert seen == [True]
            await peer.send({"type": "cancel", "run": 99, "reason": "timeout"})  # unknown: ignored
            await peer.call(2, args={"reply": 1})
            nursery.cancel_scope.cancel()


async def test_cancel_delay_lets_a_handler_finish_cooperatively(sock_path: Path) -> None:
    worker = Worker("w", cancel_delay=5.0)

    @worker.job("echo")
    async def handler(ctx: Context) -> dict[str, Any]:
        await ctx.cancelled.wait()
        await ctx.checkpoint({"at": 7})
        return {"count": 7, "stopped": ctx.cancel_reason}

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(1)
            await peer.send({"type": "cancel", "run": 1, "reason": "stopping"})
            assert await peer.recv() == {"type": "checkpoint", "run": 1, "cursor": {"at": 7}}
            result = await peer.recv_type("result")
            assert result["count"] == 7
            assert result["extra"] == {"stopped": "stopping"}
            nursery.cancel_scope.cancel()


async def test_unknown_type_and_over_capacity_are_refused(sock_path: Path) -> None:
    gate = trio.Event()
    worker = Worker("w", capacity=1)

    @worker.job("echo")
    async def handler(ctx: Context) -> int:
        await gate.wait()
        return 1

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(1, "other")
            result = await peer.recv_type("result")
            assert result["ok"] is False
            assert "does not serve 'other'" in result["error"]
            await peer.call(2)
            await peer.call(3)
            result = await peer.recv_type("result")
            assert result["run"] == 3
            assert "at capacity (1)" in result["error"]
            gate.set()
            result = await peer.recv_type("result")
            assert result == {"type": "result", "run": 2, "ok": True, "count": 1}
            nursery.cancel_scope.cancel()


# -- connection lifecycle ------------------------------------------------------------------


def test_backoff_is_capped_exponential() -> None:
    assert [backoff(n) for n in range(1, 10)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]


async def test_reconnects_with_backoff_and_cancels_orphaned_handlers(sock_path: Path) -> None:
    cancelled: list[int] = []
    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> int:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.append(ctx.run_id)
        return 1  # pragma: no cover

    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)  # no daemon yet: retries
            await trio.sleep(0.8)  # attempts at 0, 0.5 (then 1.5, ...)
            async with fake_daemon(sock_path) as daemon:
                started = trio.current_time()
                peer = await daemon.accept()
                assert trio.current_time() - started < 1.5
                await peer.welcome()
                await peer.call(1)
                while True:
                    await trio.sleep(0.01)
                    if cancelled or peer.buf:
                        break
                    if trio.current_time() - started > 0.3:
                        break
                await peer.stream.aclose()  # the daemon goes away mid-call
                with trio.move_on_after(2):
                    while not cancelled:
                        await trio.sleep(0.01)
                assert cancelled == [1]
                # Up for a moment only: no proof of a good connection, so the backoff goes
                # on (the third delay, 2 s; a proven one starts over: the test below).
                started = trio.current_time()
                peer = await daemon.accept()
                assert 1.5 < trio.current_time() - started < 2.5
                await peer.welcome()
                await peer.call(2)
                await peer.send({"type": "cancel", "run": 2, "reason": "timeout"})
                assert (await peer.recv_type("result"))["run"] == 2
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("over_tls", [False, True], ids=["tcp", "tls"])
async def test_a_tcp_connection_has_keepalive(over_tls: bool) -> None:
    """A daemon host that vanishes without closing is noticed in about a minute: the
    kernel probes an idle connection (30 s idle, every 10 s, 3 probes on Linux)."""
    import ssl

    import trustme

    from coordinator.worker import _connect, tls_context

    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_tls)
    client_tls = tls_context()
    ca.configure_trust(client_tls)
    with trio.fail_after(GUARD):
        (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listener.socket.getsockname()[1]
        async with listener, trio.open_nursery() as nursery:

            async def handshake() -> None:
                tcp = await listener.accept()
                async with trio.SSLStream(tcp, server_tls, server_side=True) as peer:
                    await peer.do_handshake()
                    await trio.sleep_forever()

            if over_tls:
                nursery.start_soon(handshake)
            stream = await _connect(("127.0.0.1", port), client_tls if over_tls else None)
            async with stream:
                if over_tls:
                    assert isinstance(stream, trio.SSLStream)
                    tcp = stream.transport_stream
                else:
                    tcp = stream
                assert isinstance(tcp, trio.SocketStream)
                sock = tcp.socket
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0
                if sys.platform == "linux":
                    options = (
                        socket.TCP_KEEPIDLE,
                        socket.TCP_KEEPINTVL,
                        socket.TCP_KEEPCNT,
                        socket.TCP_USER_TIMEOUT,
                    )
                    got = [sock.getsockopt(socket.IPPROTO_TCP, o) for o in options]
                    assert got == [30, 10, 3, 60_000]
            nursery.cancel_scope.cancel()


REFUSALS = [
    'permission denied for namespace "reports": token t reaches namespace billing',
    "replaced by a new connection with the same worker id",
]


async def test_refusals_back_off_and_a_proven_connection_starts_over(
    sock_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The daemon welcomes a worker and then refuses its declaration, or another process
    with the same id replaces it: the backoff started over on each welcome, and such a
    worker reconnected every 0.5 s for good. It backs off; a connection that stayed up
    (then lost to a daemon restart, say) is back after the first delay."""
    # (The guard goes inside: binding and removing the socket take a thread, and while
    # one runs the mock clock jumps to the next deadline.)
    async with fake_daemon(sock_path) as daemon:
        with trio.fail_after(120):  # (trio's clock: the mock one here)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(echo_worker().run, sock_path)
                accepted = []
                for i in range(6):
                    peer = await daemon.accept()
                    accepted.append(trio.current_time())
                    await peer.welcome()
                    await peer.send({"type": "error", "message": REFUSALS[i % 2]})
                    assert await peer.recv() is None  # the worker hung up
                gaps = [later - first for first, later in itertools.pairwise(accepted)]
                assert gaps == pytest.approx([0.5, 1, 2, 4, 8], abs=0.01)
                peer = await daemon.accept()
                await peer.welcome()
                await trio.sleep(60)  # (a minute up proves it: PROVEN_AFTER is less)
                await peer.stream.aclose()  # the daemon restarts
                closed = trio.current_time()
                peer = await daemon.accept()
                assert trio.current_time() - closed == pytest.approx(0.5, abs=0.01)
                nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("said", "logged"),
    [
        (
            "replaced by a new connection with the same worker id",
            "another connection with worker id w replaced this one: is a second worker "
            "running with the same id?",
        ),
        (
            "run 5 ignored cancel for 10s; disconnecting",
            "the daemon disconnected this worker: a call went on after its cancel",
        ),
        ("missing or wrong token", "the daemon refused this worker: missing or wrong token"),
    ],
    ids=["replaced", "cancel-ignored", "refused"],
)
async def test_the_log_says_why_the_daemon_ended_the_connection(
    sock_path: Path, caplog: pytest.LogCaptureFixture, said: str, logged: str
) -> None:
    """A replacement by another process with the same id and a disconnect for ignoring
    a cancel were both logged "the daemon refused this worker"."""
    caplog.set_level(logging.INFO, logger="coordinator.worker")
    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(echo_worker().run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.send({"type": "error", "message": said})
            assert await peer.recv() is None
            nursery.cancel_scope.cancel()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert errors[0].startswith(logged)
    assert errors[0].endswith(said)


async def test_the_same_refusal_is_an_error_once(
    sock_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A refusal no retry fixes (a wrong token) was an ERROR line at every retry, every
    30 s, for good. Once, then info; a welcome resets it."""
    caplog.set_level(logging.INFO, logger="coordinator.worker")
    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(echo_worker().run, sock_path)
            for _ in range(2):
                peer = await daemon.accept()
                assert (await peer.recv() or {})["type"] == "hello"
                await peer.send({"type": "error", "message": "missing or wrong token"})
            peer = await daemon.accept()
            await peer.welcome()
            await peer.send({"type": "error", "message": "missing or wrong token"})
            assert await peer.recv() is None
            nursery.cancel_scope.cancel()
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "refused" in r.getMessage()]
    assert said == [
        ("ERROR", "the daemon refused this worker: missing or wrong token"),
        ("INFO", "the daemon refused this worker again: missing or wrong token"),
        ("ERROR", "the daemon refused this worker: missing or wrong token"),  # after a welcome
    ]


async def test_a_refused_declaration_is_an_error_once_and_no_connection(
    sock_path: Path, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    """The daemon welcomes a declaring worker, then refuses its declaration: the welcome
    forgot the refusal just before it came again, so every retry said "connected as"
    and the refusal at ERROR, each time promising info level from then on. Once at
    ERROR, then info, and "connected as" only once the declaration is answered."""
    caplog.set_level(logging.INFO, logger="coordinator.worker")
    worker = Worker("w", namespace="reports")

    @worker.job("reports.daily", every="1h")
    async def daily(ctx: Context) -> None:
        return None

    refusal = REFUSALS[0]
    async with fake_daemon(sock_path) as daemon:
        with trio.fail_after(120):  # (trio's clock: the mock one here)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(worker.run, sock_path)
                for _ in range(3):
                    peer = await daemon.accept()
                    await peer.welcome()
                    assert (await peer.recv() or {})["type"] == "declare"
                    await peer.send({"type": "error", "message": refusal})
                    assert await peer.recv() is None
                peer = await daemon.accept()  # the daemon's configuration allows it now
                await peer.welcome()
                assert (await peer.recv() or {})["type"] == "declare"
                answer = {"created": 1, "updated": 0, "paused": 0, "unchanged": False}
                await peer.send({"type": "declared", "namespace": "reports", "ok": True, **answer})
                await trio.sleep(1)
                await peer.send({"type": "error", "message": refusal})  # refused anew
                assert await peer.recv() is None
                nursery.cancel_scope.cancel()
    said = [
        (r.levelname, r.getMessage().split(":")[0])
        for r in caplog.records
        if "refused" in r.getMessage() or "connected as" in r.getMessage()
    ]
    assert said == [
        ("ERROR", "the daemon refused this worker"),
        ("INFO", "the daemon refused this worker again"),
        ("INFO", "the daemon refused this worker again"),
        ("INFO", "connected as w"),
        ("ERROR", "the daemon refused this worker"),  # after it was accepted
    ]
    promises = [r for r in caplog.records if "from now on" in r.getMessage()]
    assert len(promises) == 2


async def test_error_from_the_daemon_means_reconnect(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(echo_worker().run, sock_path)
            peer = await daemon.accept()
            assert (await peer.recv() or {})["type"] == "hello"
            await peer.send({"type": "error", "message": "missing or wrong token"})
            peer = await daemon.accept()
            await peer.welcome()
            nursery.cancel_scope.cancel()


async def test_bad_daemon_message_means_reconnect(sock_path: Path) -> None:
    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(echo_worker().run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.stream.send_all(b"garbage\n")
            assert await peer.recv() is None  # the worker hung up
            peer = await daemon.accept()
            await peer.welcome()
            nursery.cancel_scope.cancel()


async def test_stop_says_bye_and_finishes_running_calls(sock_path: Path) -> None:
    release = trio.Event()
    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> int:
        await release.wait()
        return 3

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            done = trio.Event()

            async def run() -> None:
                await worker.run(sock_path)
                done.set()

            nursery.start_soon(run)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(1)
            await trio.sleep(0.05)
            worker.stop()
            assert await peer.recv() == {"type": "bye"}
            release.set()
            assert (await peer.recv_type("result"))["count"] == 3
            assert not done.is_set()
            await peer.stream.aclose()  # the daemon closes once the results are in
            await done.wait()


async def test_stop_asks_recoverable_calls_to_pause_even_one_sent_before_the_bye(
    sock_path: Path,
) -> None:
    """A recoverable call is asked to pause by the worker's stop, as by the daemon's; one
    the daemon sent before it read the bye too. Other calls are left to finish."""
    from coordinator.worker import Paused

    worker = Worker("w", pause_grace=60)
    reasons: dict[int, str | None] = {}

    @worker.job("echo")
    async def handler(ctx: Context) -> Any:
        if not ctx.recoverable:
            return 5
        await ctx.cancelled.wait()
        reasons[ctx.run_id] = ctx.cancel_reason
        return Paused()

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(1, recoverable=True)
            await trio.sleep(0.05)
            worker.stop()
            assert await peer.recv() == {"type": "bye"}
            assert await peer.recv() == {"type": "result", "run": 1, "ok": True, "paused": True}
            await peer.call(2, recoverable=True)  # (crossed the bye)
            assert await peer.recv() == {"type": "result", "run": 2, "ok": True, "paused": True}
            await peer.call(3)
            assert await peer.recv() == {"type": "result", "run": 3, "ok": True, "count": 5}
            assert reasons == {1: "stopping", 2: "stopping"}
            await peer.stream.aclose()


async def test_stop_before_welcome_returns(sock_path: Path) -> None:
    worker = echo_worker()
    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            done = trio.Event()

            async def run() -> None:
                await worker.run(sock_path)
                done.set()

            nursery.start_soon(run)
            peer = await daemon.accept()
            assert (await peer.recv() or {})["type"] == "hello"
            worker.stop()
            await done.wait()
            assert await peer.recv() is None


async def test_a_stop_before_the_run_makes_it_return_at_once(sock_path: Path) -> None:
    """A program that handled a shutdown during its start-up, calling stop() before
    run(), got a worker that served for good: the stop was lost."""
    worker = echo_worker()
    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon:
            worker.stop()
            await worker.run(sock_path)  # returns, without connecting
            with trio.move_on_after(0.2):
                await daemon.accept()
                pytest.fail("run() connected after stop()")
            # A run after that serves again, until its own stop.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(worker.run, sock_path)
                peer = await daemon.accept()
                await peer.welcome()
                worker.stop()
                assert await peer.recv() == {"type": "bye"}
                await peer.stream.aclose()
            # A stop between two runs is the next run's, as before the first.
            worker.stop()
            await worker.run(sock_path)


async def test_started_after_the_first_welcome(sock_path: Path) -> None:
    events = io.StringIO()
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            executor = WorkerExecutor(
                clock=SystemWallClock(),
                events=EventBus(log=EventLog(stream=events)),
                socket_path=sock_path,
            )
            await nursery.start(executor.serve)
            await nursery.start(echo_worker(capacity=3).run, sock_path)
            assert executor.capacities().get("echo", 0) == 3
            nursery.cancel_scope.cancel()


# -- construction and the command ------------------------------------------------------------


async def test_worker_validation() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Worker(capacity=0)
    with pytest.raises(ValueError, match="capacity"):
        Worker(capacity=1025)
    worker = Worker()
    assert worker.worker_id.endswith(f"-{os.getpid()}")
    with pytest.raises(ValueError, match="no job types"):
        await worker.run("/nonexistent")
    with pytest.raises(ValueError, match="non-empty"):
        worker.job("")

    def sync(ctx: Context) -> None:
        return None

    with pytest.raises(TypeError, match="async function"):
        worker.job("t")(sync)  # type: ignore[arg-type]

    async def handler(ctx: Context) -> None:
        return None

    assert worker.job("t")(handler) is handler
    with pytest.raises(ValueError, match="already has a handler"):
        worker.job("t")(handler)
    assert worker.types == ["t"]


WORKER_MODULE = """
from coordinator.worker import Worker

worker = Worker("cli-worker", capacity=2)
not_a_worker = 42


@worker.job("echo")
async def echo(ctx):
    return {"count": ctx.args["n"], "extra": {"pid": __import__("os").getpid()}}
"""


def test_load_and_main_report_bad_targets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cw_app_bad.py").write_text(textwrap.dedent(WORKER_MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert isinstance(load("cw_app_bad:worker"), Worker)
    with pytest.raises(ValueError, match="MODULE:OBJECT"):
        load("cw_app_bad")
    with pytest.raises(ValueError, match="cannot import"):
        load("no_such_module_here:worker")
    with pytest.raises(ValueError, match="has no attribute"):
        load("cw_app_bad:missing")
    with pytest.raises(ValueError, match=r"is a int, not a coordinator\.worker\.Worker"):
        load("cw_app_bad:not_a_worker")
    assert main(["cw_app_bad:missing", "--socket", "/nonexistent"]) == 2
    assert "has no attribute" in capsys.readouterr().err
    assert main(["cw_app_bad:worker", "--tcp", "127.0.0.1:1"]) == 2
    assert "needs --token" in capsys.readouterr().err
    # --state-dir: only a demo's directory holds a worker socket.
    assert main(["cw_app_bad:worker", "--state-dir", str(tmp_path)]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            f"--state-dir: {tmp_path} is not a coordinator demo's directory (no demo.json); a "
            "service's worker socket is its worker_socket: pass --socket"
        )
    )
    sys.modules.pop("cw_app_bad", None)


SCHEDULED_MODULE = """
from coordinator.worker import Worker

worker = Worker("cli-worker")


@worker.job("reports.daily", cron="0 6 * * *")
async def daily(ctx):
    return None
"""


def test_the_command_says_in_one_line_why_the_worker_cannot_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Schedules without a namespace ended the command with an ExceptionGroup traceback
    (from inside its trio run), the reason buried in it: it is one line and status 2,
    as the command's other startup errors are."""
    (tmp_path / "cw_app_scheduled.py").write_text(textwrap.dedent(SCHEDULED_MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["cw_app_scheduled:worker", "--socket", "/nonexistent"]) == 2
    assert capsys.readouterr().err == (
        "coordinator worker: handlers declare schedules (reports.daily): give the worker "
        "its namespace, Worker(namespace=...) or --namespace\n"
    )
    argv = ["cw_app_scheduled:worker", "--socket", "/nonexistent", "--namespace", "a b"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("coordinator worker: --namespace: 'a b': use letters")
    assert err.count("\n") == 1
    sys.modules.pop("cw_app_scheduled", None)


LONG_TYPE_MODULE = """
from coordinator.worker import Worker

worker = Worker("cli-worker")


@worker.job("reports." + "x" * 193)
async def long_type(ctx):
    return None
"""


def test_a_worker_id_or_job_type_the_hello_would_refuse_is_one_line_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An id or a type over 200 characters passed the start-up checks, and the first
    connect ended the command with a 38-line exception-group traceback, exit 1 (a bad
    capacity: one line, exit 2). Refused before anything connects, as a capacity is."""
    (tmp_path / "cw_app_ids.py").write_text(textwrap.dedent(WORKER_MODULE))
    (tmp_path / "cw_app_long_type.py").write_text(textwrap.dedent(LONG_TYPE_MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["cw_app_ids:worker", "--socket", "/nonexistent", "--id", "x" * 201]) == 2
    assert capsys.readouterr().err == (
        "coordinator worker: the worker id is 201 characters long; the limit is 200\n"
    )
    assert main(["cw_app_long_type:worker", "--socket", "/nonexistent"]) == 2
    assert capsys.readouterr().err == (
        "coordinator worker: job type 'reports.xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... is 201 "
        "characters long; the limit is 200\n"
    )
    embedded = Worker(" ")
    embedded.job("t")(echo_handler)
    with pytest.raises(ValueError, match=r"^the worker id must not be empty$"):
        embedded._check()
    embedded.worker_id = "x" * 200  # (the limit itself is fine)
    embedded._check()
    for module in ("cw_app_ids", "cw_app_long_type"):
        sys.modules.pop(module, None)


async def echo_handler(ctx: Context) -> None:
    return None


def test_a_demo_s_directory_names_its_worker_socket(tmp_path: Path) -> None:
    from coordinator.worker import _address, build_parser

    (tmp_path / "demo.json").write_text("{}")
    args = build_parser().parse_args(["m:w", "--state-dir", str(tmp_path)])
    assert _address(args) == tmp_path / "worker.sock"
    with pytest.raises(SystemExit):  # one place to connect to, not two
        build_parser().parse_args(["m:w", "--state-dir", str(tmp_path), "--socket", "/x"])


def test_config_names_the_file_whose_worker_socket_to_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every other command takes --config; `coordinator worker` refused it."""
    from coordinator.worker import _address, build_parser

    monkeypatch.delenv("COORDINATOR_WORKER_SOCKET", raising=False)
    monkeypatch.setenv("COORDINATOR_CONFIG", str(tmp_path / "not-this.toml"))
    config = tmp_path / "coordinator.toml"
    config.write_text(f'worker_socket = "{tmp_path / "w.sock"}"\n')
    args = build_parser().parse_args(["m:w", "--config", str(config)])
    assert _address(args) == tmp_path / "w.sock"
    missing = build_parser().parse_args(["m:w", "--config", str(tmp_path / "gone.toml")])
    with pytest.raises(ValueError, match=r"--config: .*gone\.toml: no such file"):
        _address(missing)


async def _reap(proc: trio.Process) -> bytes:
    """End ``proc`` if it still runs, and return all it wrote on stderr."""
    if proc.returncode is None:
        proc.kill()
        await proc.wait()
    assert proc.stderr is not None
    stderr = b""
    while chunk := await proc.stderr.receive_some(65536):
        stderr += chunk
    await proc.stderr.aclose()
    return stderr


@pytest.mark.skipif(sys.platform != "linux", reason="signals and sockets: Linux")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
async def test_command_serves_and_stops_cleanly_on_sigterm(
    sock_path: Path, tmp_path: Path, signum: signal.Signals
) -> None:
    (tmp_path / "cw_app.py").write_text(textwrap.dedent(WORKER_MODULE))
    served = trio.Event()
    events: list[dict[str, Any]] = []
    log = EventLog(stream=io.StringIO(), observers=[events.append])
    executor = WorkerExecutor(
        clock=SystemWallClock(), events=EventBus(log=log), socket_path=sock_path
    )
    executor.attach(ExecutorHooks(changed=served.set))
    job = Job(
        id=1,
        namespace="ns",
        name="j",
        schedule=Schedule(kind="manual"),
        target=Target(kind="worker", worker_type="echo"),
    )
    claim = Claim(
        run_id=5,
        job=job,
        trigger="manual",
        scheduled_for=None,
        args={"n": 6},
        claimed_at=datetime.now(UTC),
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(executor.serve)
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "coordinator.worker", "cw_app:worker"],
                cwd=tmp_path,
                env={**os.environ, "COORDINATOR_WORKER_SOCKET": str(sock_path)},
                stderr=subprocess.PIPE,
            )
            try:
                await served.wait()
                assert executor.connections()[0].id == "cli-worker"
                outcome = await executor.call(claim, abandon=trio.Event())
                assert outcome.status == "succeeded"
                assert outcome.count == 6
                assert outcome.extra["pid"] == proc.pid
                proc.send_signal(signum)  # (SIGHUP's default action: no goodbye)
                assert await proc.wait() == 0
            finally:
                stderr = await _reap(proc)
            assert f"{signum.name}: leaving cleanly".encode() in stderr
            assert [e["reason"] for e in events if e["event"] == "worker.disconnected"] == ["bye"]
            nursery.cancel_scope.cancel()


STOPPING_MODULE = """
import trio
from coordinator.worker import Paused, Worker

worker = Worker("cli-worker", capacity=2, pause_grace=60)


@worker.job("scan")
async def scan(ctx):
    await ctx.checkpoint({"at": 1}, count=1)
    open("scan-started", "w").close()
    await ctx.cancelled.wait()  # an hours-long scan, until asked to pause
    open("asked", "w").write(ctx.cancel_reason)
    raise Paused()


@worker.job("long")
async def long(ctx):
    open("long-started", "w").close()
    await trio.sleep_forever()
"""


@pytest.mark.skipif(sys.platform != "linux", reason="signals and sockets: Linux")
async def test_the_command_s_first_signal_pauses_recoverable_calls_the_second_cancels(
    sock_path: Path, tmp_path: Path
) -> None:
    """The first SIGTERM said bye and waited for every call: a recoverable one was never
    asked to pause, so a scan of hours kept the worker up for hours. It is asked, as the
    daemon's own stop asks it. The second dropped the connection, and the calls still
    running were recorded crashed, "worker W disconnected" (provider-failure): each now
    sends its result, saying the worker's stop cancelled it."""
    (tmp_path / "cw_app_stopping.py").write_text(textwrap.dedent(STOPPING_MODULE))
    served = trio.Event()
    executor = WorkerExecutor(
        clock=SystemWallClock(), events=EventBus(log=EventLog(stream=io.StringIO())),
        socket_path=sock_path,
    )  # fmt: skip
    executor.attach(ExecutorHooks(changed=served.set))

    def claim(run_id: int, job_type: str, *, recoverable: bool) -> Claim:
        job = Job(
            id=run_id, namespace="ns", name=job_type, schedule=Schedule(kind="manual"),
            target=Target(kind="worker", worker_type=job_type), recoverable=recoverable,
        )  # fmt: skip
        return Claim(
            run_id=run_id, job=job, trigger="manual", scheduled_for=None,
            claimed_at=datetime.now(UTC),
        )  # fmt: skip

    outcomes: dict[str, Any] = {}

    async def call(run_id: int, name: str, recoverable: bool, done: trio.Event) -> None:
        outcomes[name] = await executor.call(
            claim(run_id, name, recoverable=recoverable), abandon=trio.Event()
        )
        done.set()

    async def appears(path: Path) -> None:
        while not await trio.Path(path).exists():
            await trio.sleep(0.01)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(executor.serve)
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "coordinator.worker", "cw_app_stopping:worker"],
                cwd=tmp_path,
                env={**os.environ, "COORDINATOR_WORKER_SOCKET": str(sock_path)},
                stderr=subprocess.PIPE,
            )
            try:
                await served.wait()
                paused, cancelled = trio.Event(), trio.Event()
                nursery.start_soon(call, 10, "scan", True, paused)
                nursery.start_soon(call, 11, "long", False, cancelled)
                await appears(tmp_path / "long-started")
                await appears(tmp_path / "scan-started")
                proc.send_signal(signal.SIGTERM)
                await paused.wait()
                assert (tmp_path / "asked").read_text() == "stopping"
                scan = outcomes["scan"]
                assert (scan.status, scan.error_message, scan.count) == (
                    "paused",
                    "paused by the worker",
                    1,
                )
                assert proc.returncode is None  # "long" runs on
                assert not cancelled.is_set()
                proc.send_signal(signal.SIGTERM)
                await cancelled.wait()
                assert await proc.wait() == 0
            finally:
                stderr = await _reap(proc)
            long = outcomes["long"]
            assert (long.status, long.error_cause, long.category, long.error_message) == (
                "failed",
                "handler",
                "cancellation",
                "cancelled: worker cli-worker was stopped by a second signal (SIGTERM)",
            )
            assert b"Traceback" not in stderr
            nursery.cancel_scope.cancel()
    sys.modules.pop("cw_app_stopping", None)


async def test_the_command_line_sets_the_orphan_limit_a_program_may_leave_unset(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from coordinator.worker import ORPHAN_LIMIT, _Prepared, _serve_until_signalled

    seen: list[float | None] = []

    async def run(self: Worker, *_args: Any, **_kwargs: Any) -> None:
        seen.append(self.orphan_limit)

    monkeypatch.setattr(Worker, "run", run)
    for given, expected in ((None, ORPHAN_LIMIT), (2.5, 2.5)):
        worker = Worker("w", orphan_limit=given)
        prepared = _Prepared(
            worker=worker, address=tmp_path / "w.sock", token=None, tls=None,
            server_hostname=None,
        )  # fmt: skip
        await _serve_until_signalled(prepared)
        assert seen[-1] == expected
    assert Worker("embedded").orphan_limit is None  # embedded: logged, not enforced
    assert ORPHAN_LIMIT == 10.0
    with pytest.raises(ValueError, match="orphan_limit"):
        Worker("w", orphan_limit=0)


ORPHAN_MODULE = """
import trio
from coordinator.worker import Worker

worker = Worker("orphan-worker", capacity=2, orphan_limit=1.0)


@worker.job("stubborn")
async def stubborn(ctx):
    open("started", "w").close()
    # Ignores its cancel (a shielded stretch of work, as a blocking batch would) for
    # the seconds it is given.
    with trio.CancelScope(shield=True):
        await trio.sleep(ctx.args.get("seconds", 60))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="signals and sockets: Linux")
@pytest.mark.parametrize(
    ("seconds", "exits"), [(60, True), (0.3, False)], ids=["runs-on", "ends-in-time"]
)
async def test_a_call_running_on_after_its_connection_closed_ends_the_worker(
    sock_path: Path, tmp_path: Path, seconds: float, exits: bool
) -> None:
    """It ran on beside the retry or resume the daemon may start elsewhere (a paused
    recoverable run was worked on by two processes at once; helper-63)."""
    (tmp_path / "cw_orphan.py").write_text(textwrap.dedent(ORPHAN_MODULE))
    served = trio.Event()
    executor = WorkerExecutor(
        clock=SystemWallClock(), events=EventBus(log=EventLog(stream=io.StringIO())),
        socket_path=sock_path,
    )  # fmt: skip
    executor.attach(ExecutorHooks(changed=served.set))
    job = Job(
        id=1, namespace="ns", name="j", schedule=Schedule(kind="manual"),
        target=Target(kind="worker", worker_type="stubborn"),
    )  # fmt: skip
    claim = Claim(
        run_id=7, job=job, trigger="manual", scheduled_for=None, args={"seconds": seconds},
        claimed_at=datetime.now(UTC),
    )  # fmt: skip
    with trio.fail_after(60):
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "coordinator.worker", "cw_orphan:worker"],
            cwd=tmp_path,
            env={**os.environ, "COORDINATOR_WORKER_SOCKET": str(sock_path)},
            stderr=subprocess.PIPE,
        )
        try:
            async with trio.open_nursery() as daemon:
                await daemon.start(executor.serve)
                await served.wait()
                daemon.start_soon(partial(executor.call, claim, abandon=trio.Event()))
                while not (tmp_path / "started").exists():  # (the handler started)
                    await trio.sleep(0.01)
                daemon.cancel_scope.cancel()  # the connection closes, the call is cancelled
            if exits:
                assert await proc.wait() == 70
            else:
                # Its call ended within the limit: the watch is disarmed, the worker lives
                # on (reconnecting) until told to stop.
                await trio.sleep(2.5)
                assert proc.returncode is None
                proc.send_signal(signal.SIGTERM)
                assert await proc.wait() == 0
        finally:
            stderr = await _reap(proc)
    said = stderr.decode()
    assert "connection closed with 1 call(s) running; cancelling them" in said
    assert (
        "run(s) 7 still running 1s after their connection closed and their cancel: "
        "exiting (status 70)" in said
    ) is exits


def test_the_orphan_watch_names_only_the_calls_still_running(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The line named every call running when the connection closed, one that had ended
    10 s before among them: an operator would look for a runaway handler that was not
    there. (The thread's timer, shortened; no limit: the embedded worker's log line.)"""
    from coordinator import worker as worker_mod

    monkeypatch.setattr(worker_mod, "ORPHAN_LIMIT", 0.05)
    running: dict[int, object] = {308: object(), 309: object()}
    watch = worker_mod._Orphans(None)
    with caplog.at_level(logging.ERROR, logger="coordinator.worker"):
        watch.arm(running)
        del running[308]  # its handler honoured the cancel
        assert watch._timer is not None
        watch._timer.join(5)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("run(s) 309 still running 0.05s after their connection closed")


def thread_worker(
    capacity: int, gate: trio.Event | None = None
) -> tuple[Worker, threading.Event, list[int], trio.Event]:
    """A worker whose ``slow`` calls block in a thread (which trio cannot cancel) until
    released, and whose ``echo`` calls wait to be cancelled (``wait``) or for ``gate``
    (``gate``)."""
    worker = Worker("w", capacity=capacity)
    release = threading.Event()
    gated = trio.Event() if gate is None else gate
    ended: list[int] = []
    in_thread = trio.Event()

    @worker.job("slow")
    async def slow(ctx: Context) -> int:
        in_thread.set()
        try:
            await trio.to_thread.run_sync(release.wait, 30)
            await ctx.progress(50)  # (its connection closed: dropped)
        finally:
            ended.append(ctx.run_id)
        return 1

    @worker.job("echo")
    async def echo(ctx: Context) -> int:
        if ctx.args.get("wait"):
            try:
                await trio.sleep_forever()
            finally:
                ended.append(ctx.run_id)
        if ctx.args.get("gate"):
            await gated.wait()
        return 2

    return worker, release, ended, in_thread


async def test_a_call_running_on_after_its_connection_closed_leaves_its_slot_taken(
    sock_path: Path,
) -> None:
    """Embedded (no orphan limit), the worker waited for a call that ran on in a thread
    before it connected again: every type it serves went unserved meanwhile. It connects
    at once, its capacity less the call's slot, and what the call returns is sent on no
    connection (the daemon ended its run when the old one closed). Once it ended, the
    connection, when idle, makes way for one with the full capacity."""
    gate = trio.Event()
    worker, release, ended, in_thread = thread_worker(capacity=2, gate=gate)
    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            try:
                peer = await daemon.accept()
                assert (await peer.welcome())["capacity"] == 2
                await peer.call(1, "slow")
                await peer.call(2, args={"wait": True})  # ends at its cancel
                await in_thread.wait()
                await peer.stream.aclose()  # the daemon goes away
                peer = await daemon.accept()
                assert (await peer.welcome())["capacity"] == 1  # run 1 holds a slot
                assert ended == [2]
                await peer.call(3)
                assert await peer.recv_type("result") == {
                    "type": "result", "run": 3, "ok": True, "count": 2,
                }  # fmt: skip
                await peer.call(4, args={"gate": True})
            finally:
                release.set()
            while len(ended) < 2:
                await trio.sleep(0.01)
            gate.set()
            # Not run 1's result (nor its progress): run 4's is the next line, and only
            # then, the connection idle, its bye.
            assert await peer.recv() == {"type": "result", "run": 4, "ok": True, "count": 2}
            assert await peer.recv() == {"type": "bye"}
            await peer.stream.aclose()  # (the daemon closes a connection that said bye)
            peer = await daemon.accept()
            assert (await peer.welcome())["capacity"] == 2
            await peer.call(5)
            await peer.call(6)
            assert {(await peer.recv_type("result"))["run"] for _ in range(2)} == {5, 6}
            nursery.cancel_scope.cancel()


async def test_with_every_slot_held_by_such_a_call_the_worker_connects_once_it_ends(
    sock_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="coordinator.worker")
    worker, release, ended, in_thread = thread_worker(capacity=1)
    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            try:
                peer = await daemon.accept()
                await peer.welcome()
                await peer.call(1, "slow")
                await in_thread.wait()
                await peer.stream.aclose()
                while not any("slot(s) are held" in r.getMessage() for r in caplog.records):
                    await trio.sleep(0.01)
                assert ended == []
            finally:
                release.set()
            peer = await daemon.accept()  # once the thread returned
            assert ended == [1]
            assert (await peer.welcome())["capacity"] == 1
            await peer.call(2)
            assert await peer.recv() == {"type": "result", "run": 2, "ok": True, "count": 2}
            nursery.cancel_scope.cancel()
    said = [r.getMessage() for r in caplog.records]
    assert (
        "all 1 slot(s) are held by calls still running after their connection closed; "
        "connecting again once one of them ends"
    ) in said


# -- recoverable jobs: cursor, counter, findings, pausing -------------------------------------


async def test_a_recoverable_call_resumes_from_its_cursor_and_counter(sock_path: Path) -> None:
    seen: list[Any] = []
    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> None:
        seen.append((ctx.recoverable, ctx.cursor, ctx.count))
        await ctx.checkpoint({"after": 12}, count=2)
        seen.append((ctx.cursor, ctx.count))

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(3, checkpoint={"after": 10}, recoverable=True, count=10)
            assert await peer.recv() == {
                "type": "checkpoint",
                "run": 3,
                "cursor": {"after": 12},
                "count": 2,
            }
            assert await peer.recv() == {"type": "result", "run": 3, "ok": True}
            assert seen == [(True, {"after": 10}, 10), ({"after": 12}, 12)]
            nursery.cancel_scope.cancel()


async def test_findings_are_batched_and_sent_before_the_checkpoint_after_them(
    sock_path: Path,
) -> None:
    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> None:
        for i in range(450):
            await ctx.finding("dup", i, severity="warning", detail={"i": i})
        await ctx.checkpoint(450, count=450)
        await ctx.finding("tail", "last", severity="data_loss")
        await trio.sleep(0.8)  # longer than the batching: the flusher sends it
        await ctx.finding("end", "x")  # sent with the result

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(4, recoverable=True)
            messages = []
            while (message := await peer.recv()) is not None:
                messages.append(message)
                if message["type"] == "result":
                    break
            kinds = [m["type"] for m in messages]
            assert kinds == ["finding", "finding", "finding", "checkpoint", "finding", "finding",
                             "result"]  # fmt: skip
            first = [f for m in messages[:3] for f in m["findings"]]
            assert [f["resource_id"] for f in first] == [str(i) for i in range(450)]
            assert first[7] == {
                "kind": "dup", "resource_id": "7", "severity": "warning", "detail": {"i": 7}
            }  # fmt: skip
            assert all(len(m["findings"]) <= 200 for m in messages[:3])
            assert messages[4]["findings"] == [
                {"kind": "tail", "resource_id": "last", "severity": "data_loss"}
            ]
            assert messages[5]["findings"] == [
                {"kind": "end", "resource_id": "x", "severity": "info"}
            ]
            nursery.cancel_scope.cancel()


async def test_bad_findings_and_checkpoints_raise_value_errors(sock_path: Path) -> None:
    errors: list[str] = []
    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> int:
        for bad in (
            lambda: ctx.finding("k", "r", severity="fatal"),
            lambda: ctx.finding("k" * 201, "r"),
            lambda: ctx.finding("k", "r" * 1001),
            lambda: ctx.finding("k", "r", detail={"x": "y" * 17000}),
            lambda: ctx.finding("k", "r", detail=[1]),  # type: ignore[arg-type]
            lambda: ctx.checkpoint({"big": "z" * 16384}),
            lambda: ctx.checkpoint(1, count=2**63),
            # Recorded as resource "None" (rows whose id a typo lost became one finding),
            # and the counter that "only grows" went down.
            lambda: ctx.finding("k", None),  # type: ignore[arg-type]
            lambda: ctx.finding("k", 1.5),  # type: ignore[arg-type]
            lambda: ctx.finding("k", True),
            lambda: ctx.checkpoint(1, count=-25),
        ):
            try:
                await bad()
            except ValueError as exc:
                errors.append(str(exc))
        await ctx.finding("k", 7)  # an int is fine: sent as a string
        await ctx.checkpoint(1, count=0)
        return len(errors)

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(5, recoverable=True)
            assert (await peer.recv() or {})["findings"] == [
                {"kind": "k", "resource_id": "7", "severity": "info"}
            ]
            assert await peer.recv() == {"type": "checkpoint", "run": 5, "cursor": 1, "count": 0}
            assert await peer.recv() == {"type": "result", "run": 5, "ok": True, "count": 11}
            assert errors == [
                "finding: 'severity' must be one of info, warning, error, data_loss, not 'fatal'",
                "finding: 'kind' is longer than 200 characters",
                "finding: 'resource_id' is longer than 1000 characters",
                "finding: 'detail' is 17008 bytes as JSON; the limit is 16384",
                "finding: 'detail' must be a JSON object, not [1]",
                "checkpoint: 'cursor' is 16394 bytes as JSON; the limit is 16384",
                "checkpoint: 'count' must be a 64-bit integer, not 9223372036854775808",
                "finding: 'resource_id' must be a string or an integer, not None",
                "finding: 'resource_id' must be a string or an integer, not 1.5",
                "finding: 'resource_id' must be a string or an integer, not True",
                "checkpoint: 'count' is -25: it says how much the run's counter grew, and the "
                "counter only grows (0 or more)",
            ]
            nursery.cancel_scope.cancel()


async def test_a_recoverable_runs_last_delta_may_not_be_negative(sock_path: Path) -> None:
    """A recoverable job's returned count and a Paused count are last deltas of its
    counter, which only grows; a plain job's count is its own number, negative or not."""
    from coordinator.worker import Paused

    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> Any:
        if ctx.run_id == 2:
            raise Paused(count=-2)
        return -3

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(1, recoverable=True)
            returned = await peer.recv_type("result")
            assert (returned["ok"], returned["error"]) == (
                False,
                "bad return value: result: 'count' is -3: it says how much the run's counter "
                "grew, and the counter only grows (0 or more); not retried",
            )
            await peer.call(2, recoverable=True)
            paused = await peer.recv_type("result")
            assert (paused["ok"], paused["error"]) == (
                False,
                "bad pause: pause: 'count' is -2: it says how much the run's counter grew, "
                "and the counter only grows (0 or more)",
            )
            await peer.call(3)
            assert await peer.recv_type("result") == {
                "type": "result", "run": 3, "ok": True, "count": -3,
            }  # fmt: skip
            nursery.cancel_scope.cancel()


async def test_a_handler_pauses_by_raising_or_returning_paused(sock_path: Path) -> None:
    from coordinator.worker import Paused

    worker = Worker("w")

    @worker.job("echo")
    async def handler(ctx: Context) -> Any:
        await ctx.checkpoint("c1", count=1)
        await ctx.cancelled.wait()
        assert ctx.cancel_reason == "pause"
        if ctx.run_id == 1:
            raise Paused()  # at its last checkpoint
        return Paused({"exact": "c2"}, count=3)

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            results = []
            for run in (1, 2):
                await peer.call(run, recoverable=True)
                assert (await peer.recv())["type"] == "checkpoint"
                await peer.send({"type": "cancel", "run": run, "reason": "pause"})
                results.append(await peer.recv_type("result"))
            first, second = results
            assert first == {"type": "result", "run": 1, "ok": True, "paused": True}
            assert second == {
                "type": "result",
                "run": 2,
                "ok": True,
                "count": 3,
                "paused": True,
                "cursor": {"exact": "c2"},
            }
            nursery.cancel_scope.cancel()


async def test_a_recoverable_handler_that_ignores_the_cancel_is_paused_after_the_grace(
    sock_path: Path,
) -> None:
    ended: list[float] = []
    worker = Worker("w", pause_grace=0.3)

    @worker.job("echo")
    async def handler(ctx: Context) -> int:
        await ctx.checkpoint({"page": 9}, count=9)
        await ctx.finding("slow", "s1")
        try:
            await trio.sleep_forever()  # never looks at ctx.cancelled
        finally:
            ended.append(trio.current_time())
        return 1  # pragma: no cover

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(6, recoverable=True)
            assert (await peer.recv())["type"] == "checkpoint"
            asked = trio.current_time()
            await peer.send({"type": "cancel", "run": 6, "reason": "stopping"})
            assert (await peer.recv())["type"] == "finding"  # flushed before the result
            assert await peer.recv() == {"type": "result", "run": 6, "ok": True, "paused": True}
            assert ended[0] - asked >= 0.3
            nursery.cancel_scope.cancel()


async def test_findings_buffered_when_a_handler_is_cancelled_still_precede_the_result(
    sock_path: Path,
) -> None:
    worker = Worker("w", pause_grace=0.1)

    @worker.job("echo")
    async def handler(ctx: Context) -> None:
        await ctx.finding("late", "l1", severity="error")
        await trio.sleep_forever()

    with trio.fail_after(GUARD):
        async with fake_daemon(sock_path) as daemon, trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, sock_path)
            peer = await daemon.accept()
            await peer.welcome()
            await peer.call(7, recoverable=True)
            await peer.send({"type": "cancel", "run": 7, "reason": "pause"})
            message = await peer.recv()
            assert message is not None
            assert message["findings"] == [
                {"kind": "late", "resource_id": "l1", "severity": "error"}
            ]
            assert await peer.recv() == {"type": "result", "run": 7, "ok": True, "paused": True}
            nursery.cancel_scope.cancel()


def test_the_worker_commands_tls_refusals_name_the_flag_and_the_file(tmp_path: Path) -> None:
    """They said only "[Errno 2] No such file or directory" or "[X509: KEY_VALUES_MISMATCH]
    key values mismatch (_ssl.c:3926)"."""
    import argparse

    import trustme

    from coordinator import worker as worker_mod

    ca = trustme.CA()
    one, other = ca.issue_cert("localhost"), ca.issue_cert("localhost")
    ca_file, cert, key = tmp_path / "ca.pem", tmp_path / "w.crt", tmp_path / "other.key"
    ca.cert_pem.write_to_path(str(ca_file))
    one.cert_chain_pems[0].write_to_path(str(cert))
    other.private_key_pem.write_to_path(str(key))

    def tls(**given: Any) -> Any:
        fields = {"tls": False, "tls_ca": None, "tls_cert": None, "tls_key": None}
        return worker_mod._tls(argparse.Namespace(tcp="127.0.0.1:1", **{**fields, **given}))

    missing = tmp_path / "nonexist.crt"
    with pytest.raises(ValueError, match=r"^--tls-ca: ") as caught:
        tls(tls_ca=str(missing))
    assert str(caught.value) == f"--tls-ca: cannot load {missing}: No such file or directory"
    with pytest.raises(ValueError, match=r"^--tls-cert/--tls-key: ") as caught:
        tls(tls_ca=str(ca_file), tls_cert=str(cert), tls_key=str(key))
    assert str(caught.value) == (
        f"--tls-cert/--tls-key: cannot load {cert} with {key}: key values mismatch"
    )
    assert tls(tls_ca=str(ca_file)) is not None


def test_the_worker_command_refuses_two_tokens(tmp_path: Path) -> None:
    """--token-file won over --token without a word."""
    import argparse

    from coordinator import worker as worker_mod

    token_file = tmp_path / "tok"
    token_file.write_text("from-the-file-" + "f" * 20 + "\n")
    both = argparse.Namespace(token="given-" + "g" * 20, token_file=str(token_file))
    with pytest.raises(ValueError, match=r"^--token and --token-file: give one of them$"):
        worker_mod._token(both)
    one = argparse.Namespace(token=None, token_file=str(token_file))
    assert worker_mod._token(one) == "from-the-file-" + "f" * 20


def test_the_worker_commands_bad_namespace_is_named_by_its_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It said "declare: 'namespace': 'bad ns': ...", the protocol's words."""
    from coordinator import worker as worker_mod

    (tmp_path / "cw_ns.py").write_text(
        "from coordinator.worker import Worker\n"
        "worker = Worker()\n"
        "@worker.job('t')\n"
        "async def t(ctx):\n"
        "    return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert worker_mod._prepare(["cw_ns:worker", "--namespace", "bad ns"]) == 2
    assert capsys.readouterr().err.strip() == (
        "coordinator worker: --namespace: 'bad ns': use letters, digits, '.', '_' and '-', "
        "starting with a letter or a digit"
    )
