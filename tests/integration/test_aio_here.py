"""coordinator.db.aio_here against a real PostgreSQL: asyncpg's coroutines stepped in the
calling trio task give the same results, errors and cancellation as through an asyncio
task (coordinator.db.aio)."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
import trio
import trio.testing

from coordinator.db import aio, aio_here, at_once


async def test_results_and_errors_are_the_statements(conn: asyncpg.Connection) -> None:
    assert await aio_here(conn.fetchval("SELECT $1::int + 1", 41)) == 42
    rows = await aio_here(conn.fetch("SELECT g FROM generate_series(1, 3) AS g"))
    assert [r["g"] for r in rows] == [1, 2, 3]
    with pytest.raises(asyncpg.exceptions.DivisionByZeroError):
        await aio_here(conn.fetchval("SELECT 1 / 0"))
    # The connection is fine after an error.
    assert await aio_here(conn.fetchval("SELECT 'ok'")) == "ok"


async def test_cancelled_by_trio_the_statement_is_cancelled_on_the_server(
    aio_loop: Any, database: str, conn: asyncpg.Connection
) -> None:
    sleeper = await aio(asyncpg.connect)(
        database, server_settings={"application_name": "tests-aio-here"}
    )
    try:
        pid = sleeper.get_server_pid()
        with trio.move_on_after(0.5) as scope:
            await aio_here(sleeper.fetchval("SELECT pg_sleep(60)"))
        assert scope.cancelled_caught
        # asyncpg asked the server to cancel it: the backend is not sleeping for long.
        with trio.fail_after(20):
            while True:
                state = await aio(conn.fetchval)(
                    "SELECT state FROM pg_stat_activity WHERE pid = $1", pid
                )
                if state != "active":
                    break
                await trio.sleep(0.05)
        # The connection answers again (through a task: asyncpg first waits for the
        # cancellation under asyncio.timeout; the daemon's pool closes such a connection).
        with trio.fail_after(20):
            assert await aio(sleeper.fetchval)("SELECT 7") == 7
    finally:
        await aio(sleeper.close)()


async def test_a_done_future_wakes_the_waiting_task_at_once(aio_loop: Any) -> None:
    """The loop the product opens runs aio_here's wake-up as soon as the future is done:
    setting the result reschedules the waiting task itself, not trio-asyncio's loop task
    (which would take a scheduler round to reschedule it)."""
    future = aio_loop.create_future()
    results: list[int] = []
    waiting: list[trio.lowlevel.Task] = []

    async def wait() -> int:
        return int(await future)

    async def waiter() -> None:
        waiting.append(trio.lowlevel.current_task())
        results.append(await aio_here(wait()))

    class Scheduled(trio.abc.Instrument):
        def __init__(self) -> None:
            self.tasks: list[trio.lowlevel.Task] = []

        def task_scheduled(self, task: trio.lowlevel.Task) -> None:
            self.tasks.append(task)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        scheduled = Scheduled()
        trio.lowlevel.add_instrument(scheduled)
        try:
            future.set_result(7)
        finally:
            trio.lowlevel.remove_instrument(scheduled)
        assert scheduled.tasks == waiting
    assert results == [7]


async def test_a_callback_marked_at_once_runs_when_scheduled(aio_loop: Any) -> None:
    """asyncpg schedules a notification's callback with call_soon: one marked at_once
    (the listener's) runs then and there, in the task that read the notification."""
    called: list[str] = []

    @at_once
    def marked(what: str) -> None:
        called.append(what)

    class Holder:
        @at_once
        def method(self, what: str) -> None:
            called.append(what)

    aio_loop.call_soon(marked, "function")
    aio_loop.call_soon(Holder().method, "method")
    assert called == ["function", "method"]


async def test_other_callbacks_are_queued_as_before(aio_loop: Any) -> None:
    called: list[str] = []
    aio_loop.call_soon(called.append, "queued")
    assert called == []  # not run at once
    await trio.testing.wait_all_tasks_blocked()
    assert called == ["queued"]


async def test_a_reader_watches_again_without_waiting_for_the_loop_task(aio_loop: Any) -> None:
    """The loop the product opens lets an I/O task watch its descriptor again as soon as
    its callback ran: a read steps only that task, not trio-asyncio's loop task (which
    trio-asyncio's own task waits for after every callback: two task steps more per
    read). Reads keep coming in order, and removing the reader ends its task."""
    import socket

    a, b = socket.socketpair()
    a.setblocking(False)
    got: list[bytes] = []
    aio_loop.add_reader(a.fileno(), lambda: got.append(a.recv(100)))
    me = trio.lowlevel.current_task()
    try:
        await trio.testing.wait_all_tasks_blocked()

        class Stepped(trio.abc.Instrument):
            def __init__(self) -> None:
                self.names: list[str] = []

            def before_task_step(self, task: trio.lowlevel.Task) -> None:
                if task is not me:
                    self.names.append(task.name)

        stepped = Stepped()
        trio.lowlevel.add_instrument(stepped)
        try:
            b.send(b"one")
            await trio.testing.wait_all_tasks_blocked()
        finally:
            trio.lowlevel.remove_instrument(stepped)
        assert got == [b"one"]
        assert stepped.names, "the read stepped no task"
        assert all("_io_task" in name for name in stepped.names), stepped.names

        b.send(b"two")
        await trio.testing.wait_all_tasks_blocked()
        b.send(b"three")
        await trio.testing.wait_all_tasks_blocked()
        assert got == [b"one", b"two", b"three"]
    finally:
        aio_loop.remove_reader(a.fileno())
        await trio.testing.wait_all_tasks_blocked()
        b.send(b"after")
        await trio.testing.wait_all_tasks_blocked()
        a.close()
        b.close()
    assert got == [b"one", b"two", b"three"]


async def test_a_statement_leaves_nothing_for_the_loop_task(
    aio_loop: Any, conn: asyncpg.Connection
) -> None:
    """asyncpg's own callback on a statement's future (``_on_waiter_completed``) runs
    when the answer is read, as aio_here's wake-up does: a statement steps no task of
    trio-asyncio's loop. (A cancelled statement's callback is still queued: it sends the
    server a cancel request; test_cancelled_by_trio_... above.)"""
    assert await aio_here(conn.fetchval("SELECT 1")) == 1  # (the statement is prepared)
    await trio.testing.wait_all_tasks_blocked()

    class Stepped(trio.abc.Instrument):
        def __init__(self) -> None:
            self.names: list[str] = []

        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            self.names.append(task.name)

    stepped = Stepped()
    trio.lowlevel.add_instrument(stepped)
    try:
        assert await aio_here(conn.fetchval("SELECT 1")) == 1
        await trio.testing.wait_all_tasks_blocked()
    finally:
        trio.lowlevel.remove_instrument(stepped)
    assert not [name for name in stepped.names if "_main_loop" in name], stepped.names
