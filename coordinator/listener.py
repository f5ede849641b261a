"""The LISTEN connection: notifications from PostgreSQL become wakes.

A dedicated session (never pooled: releasing a pooled connection runs ``UNLISTEN *``)
listens on channel ``coordinator``. asyncpg calls our callback on the trio thread, in
the task that read the notification (the loop the daemon opens runs it at once:
:func:`~coordinator.db.at_once`; queued for trio-asyncio's loop task, it waited a
scheduler round), so the callback hands the payload to ``on_notify`` at once: a queue
and a delivering task in between cost a lone trigger a scheduler round of latency and
bought nothing (the text waits in asyncio's ready queue while the daemon is busy
either way). ``on_notify`` must not block; should it raise (a
bug of ours), the listener's task raises it in turn, as it would have from a task.

Liveness costs no SQL: TCP keepalive on the socket plus asyncpg's termination callback.
When the session ends, we reconnect with capped backoff, LISTEN again and request one
full refresh, because notifications sent meanwhile are gone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio

from .backoff import backoff
from .db import APP_DAEMON, aio, at_once, close_quietly, connect
from .errors import DatabaseUnavailable
from .log import EventLog

if TYPE_CHECKING:
    from asyncpg import Connection


CHANNEL = "coordinator"


@attrs.define(eq=False)
class Listener:
    """Keeps one LISTEN session open and forwards what it hears.

    ``on_notify(payload)`` gets each notification's payload text, undecoded (the daemon
    reads it as a hint: :mod:`coordinator.daemon.wakes`), synchronously, as it arrives.
    ``on_lost()`` is called when notifications may have been missed (the session was
    lost): the daemon does a full refresh. ``on_state(up)`` reports connectivity for
    ``degraded`` status; ``on_statement()`` counts the ``LISTEN`` each (re)connection
    sends.
    """

    dsn: str
    log: EventLog
    on_notify: Callable[[str], None]
    on_lost: Callable[[], None]
    on_state: Callable[[bool], None] = lambda up: None
    on_statement: Callable[[], None] = lambda: None
    max_backoff: float = 30.0
    #: Pause before the first reconnection attempt after the session is lost.
    first_retry: float = 0.5
    connected: bool = False
    #: What ``on_notify`` raised (re-raised by :meth:`run`), and the event that says so.
    _failed: BaseException | None = None
    _failure: trio.Event = attrs.field(factory=trio.Event)

    @at_once
    def _on_notification(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        if self._failed is not None:
            return
        try:
            self.on_notify(payload)
        except BaseException as exc:  # a bug: asyncio would only log it; raise it in run()
            self._failed = exc
            self._failure.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; ``task_status.started()`` once the first LISTEN is on."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._raise_failure)
            attempt = 0
            first = True
            while True:
                lost = trio.Event()
                conn: Connection | None = None
                try:
                    conn = await connect(self.dsn, application_name=APP_DAEMON, daemon=True)
                    conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                    self.on_statement()
                    await aio(conn.add_listener)(CHANNEL, self._on_notification)
                except BaseException as exc:  # unreachable or refused: retry with backoff
                    if not isinstance(exc, Exception):  # cancelled: close what we opened
                        await close_quietly(conn, within=1.0)
                        raise
                    await close_quietly(conn, within=1.0)
                    attempt += 1
                    delay = backoff(attempt, cap=self.max_backoff)
                    message = str(exc) if isinstance(exc, DatabaseUnavailable) else repr(exc)
                    self.log.warning("listener.retry", error=message, delay_s=delay)
                    await trio.sleep(delay)
                    continue
                attempt = 0
                self.connected = True
                self.on_state(True)
                if first:
                    first = False
                    task_status.started()
                else:
                    self.log.info("listener.reconnected")
                    self.on_lost()
                try:
                    await lost.wait()
                finally:
                    self.connected = False
                    await close_quietly(conn, within=1.0)
                self.log.warning("listener.lost", reconnect_in_s=self.first_retry)
                self.on_state(False)
                # A server that just dropped us is often restarting: do not hammer it.
                await trio.sleep(self.first_retry)

    async def _raise_failure(self) -> None:
        await self._failure.wait()
        assert self._failed is not None
        raise self._failed
