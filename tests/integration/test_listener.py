"""The LISTEN session (coordinator.listener) against a real PostgreSQL: payloads reach
``on_notify`` in commit order, in the callback itself, and a bug in ``on_notify`` is not
swallowed by asyncio's loop but ends the listener's task with that very error."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import pytest
import trio

from coordinator.db import aio
from coordinator.listener import CHANNEL, Listener
from coordinator.log import EventLog

if TYPE_CHECKING:
    import asyncpg


def _listener(dsn: str, on_notify: Any) -> Listener:
    return Listener(
        dsn=dsn, log=EventLog(stream=io.StringIO()), on_notify=on_notify, on_lost=lambda: None
    )


async def test_payloads_arrive_in_commit_order(
    aio_loop: Any, database: str, conn: asyncpg.Connection
) -> None:
    heard: list[str] = []
    got_all = trio.Event()

    def on_notify(payload: str) -> None:
        heard.append(payload)
        if len(heard) == 3:
            got_all.set()

    listener = _listener(database, on_notify)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(listener.run)
            for text in ("one", "two", "three"):
                await aio(conn.execute)(f"SELECT pg_notify('{CHANNEL}', '{text}')")
            await got_all.wait()
            nursery.cancel_scope.cancel()
    assert heard == ["one", "two", "three"]


async def test_an_error_in_on_notify_ends_the_listener_with_it(
    aio_loop: Any, database: str, conn: asyncpg.Connection
) -> None:
    calls: list[str] = []

    def on_notify(payload: str) -> None:
        calls.append(payload)
        raise LookupError(f"bug while handling {payload}")

    listener = _listener(database, on_notify)
    with (
        trio.fail_after(30),
        pytest.RaisesGroup(pytest.RaisesExc(LookupError, match="first"), flatten_subgroups=True),
    ):
        async with trio.open_nursery() as nursery:
            await nursery.start(listener.run)
            await aio(conn.execute)(f"SELECT pg_notify('{CHANNEL}', 'first')")
            await trio.sleep_forever()
    assert calls == ["first"]
