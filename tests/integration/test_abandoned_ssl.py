"""asyncpg's TLS negotiation cut short leaves no unread failure behind
(coordinator.db._read_abandoned_ssl_answers).

Over TCP asyncpg first asks the server for TLS, on a protocol whose ``on_data`` future
fails when the connection is lost before the server answers. A connect cancelled in the
rounds before asyncpg awaits that future closed the transport, failed the future, and
nobody read it: "Future exception was never retrieved" (ConnectionError: unexpected
connection_lost() call), which trio-asyncio's loop raises into its nursery. It failed
``test_server_stopped_during_a_run_result_saved_after_restart`` now and then on a loaded
machine: at the end of the test the daemon's stop cancelled the lock session's
reconnection (``Leadership.keep``, still retrying after the server's restart) in that
window. asyncpg also cancels, itself, the side connection that carries a cancelled
statement's CancelRequest when the statement's connection is lost (a server stopping)
or closed: the same window, the same unread failure.

Each test cuts the connect short at every scheduler round in turn, so one of them lands
in that window whatever the machine's speed.
"""

from __future__ import annotations

import gc
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
import trio

from coordinator.db import aio, aio_here

ROUNDS = 40


class Unread:
    """The loop's exception handler for the test: what asyncio reported."""

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.reports: list[str] = []

    def __enter__(self) -> Unread:
        self.loop.set_exception_handler(self._record)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.loop.set_exception_handler(None)

    def _record(self, _loop: Any, context: dict[str, Any]) -> None:
        self.reports.append(f"{context.get('message')}: {context.get('exception')!r}")

    async def settle(self) -> None:
        """Let the loop run what was queued (connection_lost), then collect garbage."""
        for _ in range(5):
            await trio.sleep(0.005)
        gc.collect()


async def _rounds(count: int) -> None:
    for _ in range(count):
        await trio.lowlevel.cancel_shielded_checkpoint()


async def test_a_connect_cut_short_leaves_no_unread_failure(aio_loop: Any) -> None:
    """Our cancellation of a connect (a stop, a deadline) at any point of it."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    silent_closes = 0  # connections closed before the SSLRequest came: the window

    async def silent(stream: trio.SocketStream) -> None:
        nonlocal silent_closes
        async with stream:
            if not await stream.receive_some():
                silent_closes += 1
                return
            await trio.sleep_forever()  # (asked for TLS: never answers)

    with Unread(aio_loop) as unread:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, silent, listeners)
            for k in range(ROUNDS):
                with trio.CancelScope() as scope:

                    async def cut(k: int = k, scope: trio.CancelScope = scope) -> None:
                        await _rounds(k)
                        scope.cancel()

                    async with trio.open_nursery() as inner:
                        inner.start_soon(cut)
                        await aio(asyncpg.connect)(
                            f"postgresql://nobody@127.0.0.1:{port}/nothing", timeout=None
                        )
                await unread.settle()
            nursery.cancel_scope.cancel()
    assert silent_closes > 0  # (the sweep did reach the window)
    assert unread.reports == []


async def test_a_cancel_request_cut_short_leaves_no_unread_failure(
    aio_loop: Any, database: str
) -> None:
    """asyncpg's own cancellation of a statement's CancelRequest connection, when the
    statement's connection goes (closed here; lost when the server stops)."""
    if not urlsplit(database).hostname:
        pytest.skip("the test server is reached over a Unix socket: no TLS negotiation")
    with Unread(aio_loop) as unread:
        for k in range(ROUNDS):
            conn = await aio(asyncpg.connect)(
                database, server_settings={"application_name": "tests-app"}
            )
            with trio.move_on_after(0.05):
                await aio_here(conn.fetchval("SELECT pg_sleep(10)"))
            await _rounds(k)  # (the CancelRequest is on its way, k rounds in)
            conn.terminate()
            await unread.settle()
    assert unread.reports == []
