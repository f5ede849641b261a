"""Leadership: one active daemon per database (promise 9).

The single-writer lock is a PostgreSQL session advisory lock held on a connection of
its own (a pooled connection would release it: asyncpg's pool reset runs
``pg_advisory_unlock_all()``). A daemon that finds it taken waits as a silent standby:
one blocking ``pg_advisory_lock`` statement and nothing else until the leader's session
ends.

While leading, claims are *fenced*: each carries the lock session's backend pid and
``coordinator._claim`` refuses it unless that pid still holds the lock. When the lock
session ends, the fence goes up at once (pid 0), and the lock is taken again as soon as
the database answers; if another daemon took it meanwhile, this one steps down and
stops (exit 1). The fence is also a lock in the database, held by each claim until it
commits and waited for by the next leader's crash sweep, so a claim still running on a
dead leader's backend cannot commit a run behind that sweep (docs/design.md, "Fencing").
A run claimed before the lock session ended is not sent to a worker after that, even
once the lock is taken again (:func:`sendable`): another daemon may have led and swept
it in between.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import attrs
import trio
from asyncpg import Connection
from asyncpg.exceptions import ClientConfigurationError

from ..backoff import backoff
from ..db import APP_DAEMON, close_quietly, connect, one_line
from ..errors import ConfigError, CoordinatorError
from ..log import EventLog
from ..store import Store

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


def _nothing() -> None:
    return None


#: Least seconds between two attempts to take the lock back, however often nudged.
NUDGE_FLOOR: Final = 1.0
#: Longest pause between a leader's attempts to take its lock back after its session
#: ended: short, so that a live leader is back before a standby that lost its waiting
#: session in the same event (a database restart ends every session at once) tries.
LEAD_RETRY_CAP: Final = 1.0
#: For how long after its session ended (seconds) a leader keeps to that cadence.
LEAD_RETRY_SPAN: Final = 60.0
#: How long a standby whose waiting session ended lets the leader try first once it
#: reaches the database again (a few of the leader's attempts): it took the lock first
#: after a routine database restart, 3 times of 3, and the healthy leader stepped down,
#: its calls stopped (a tester's finding).
STANDBY_YIELD: Final = 3.0
#: After ending our own lingering lock session: attempts to take the lock, and the pause
#: before each (the server releases the lock when that backend has exited).
OWN_SESSION_TRIES: Final = 20
OWN_SESSION_PAUSE: Final = 0.05


def sendable(leader_pid: int | None, lost_at: float | None, since: float) -> bool:
    """Whether a claimed run whose call began at trio time ``since`` may be sent now: the
    lead is held (``leader_pid`` 0 marks it lost; ``None``: a store that never led, as in
    tests, is not fenced) and was not lost after ``since`` (``lost_at``: when the lock's
    session last ended), since another daemon may have swept the run meanwhile."""
    return leader_pid != 0 and (lost_at is None or lost_at < since)


@attrs.define(eq=False)
class Leadership:
    """Takes, watches and re-takes the single-writer lock."""

    dsn: str
    store: Store
    log: EventLog
    instance: str
    #: Longest pause between two attempts to reach the database.
    retry_cap: float = 30.0
    #: The lock's connection while we hold (or wait for) it.
    conn: Connection | None = None
    #: Another daemon took the lock while ours was lost: we stepped down.
    stepped_down: bool = False
    #: When the lock's session last ended (trio time), if ever.
    lost_at: float | None = None
    #: Set by :meth:`nudge`: the database answers, try the lock again now.
    _nudged: trio.Event = attrs.field(factory=trio.Event)

    def nudge(self) -> None:
        """The database answers again (a claim came back fenced: it reached the server,
        but this daemon does not hold the lock): cut short the wait before the next
        attempt to take the lock. After an outage that wait had grown to 30 s, and
        nothing ran meanwhile (a soak test saw 28 s of fenced claims). The first
        attempt after a loss keeps its pause: a session cut on our side may linger on
        the server for a moment, holding the lock."""
        self._nudged.set()

    def may_send(self, since: float) -> bool:
        """See :func:`sendable` (``ExecutorHooks.may_send``)."""
        return sendable(self.store.leader_pid, self.lost_at, since)

    async def acquire(
        self,
        stop: trio.Event,
        *,
        on_standby: Callable[[], None] = _nothing,
        on_unavailable: Callable[[BaseException, float], None] | None = None,
        standing_by: Callable[[], Awaitable[None]] | None = None,
    ) -> bool:
        """Take the lock, standing by silently while another daemon holds it and retrying
        with backoff while the database is unreachable. ``False`` if ``stop`` was set
        first. ``standing_by`` runs beside the wait each time this daemon stands by, and
        is cancelled when the lock is taken (the daemon's spool replay: its results are
        saved while it waits, not only once it leads)."""
        attempt = 0
        #: The last waiting session ended: a leader may be taking its lock back.
        yielding = False
        while True:
            try:
                self.conn = await connect(self.dsn, application_name=APP_DAEMON, daemon=True)
                if yielding:
                    self.log.info(
                        "standby.yielding",
                        instance=self.instance,
                        seconds=STANDBY_YIELD,
                        reason="this standby's waiting session ended: the leader, if alive, "
                        "takes its lock back first",
                    )
                    with trio.move_on_after(STANDBY_YIELD):
                        await stop.wait()
                    if stop.is_set():
                        await self.release()
                        return False
                    yielding = False
                if await self.store.try_lead(self.conn):
                    return True
                # Reached the database: the next loss of the waiting session (hours or
                # weeks later) starts the backoff over, not at the cap of past outages.
                attempt = 0
                on_standby()
                waited: CoordinatorError | None = None
                with trio.CancelScope() as scope:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(_cancel_when_set, stop, scope)
                        if standing_by is not None:
                            nursery.start_soon(standing_by)
                        try:
                            await self.store.wait_lead(self.conn)
                        except CoordinatorError as exc:
                            # Raised here, it would leave the nursery inside an exception
                            # group that the retry below does not catch: a standby whose
                            # waiting session ended (a database restart, a failover)
                            # exited instead of waiting again.
                            waited = exc
                        nursery.cancel_scope.cancel()
                if waited is not None:
                    yielding = True
                    raise waited
                return not scope.cancelled_caught
            except ConfigError:  # a DSN no connection can be made with (db.dsn_problem)
                await self.release()
                raise
            except (ValueError, OverflowError) as exc:  # e.g. a port out of range
                await self.release()
                if isinstance(exc, UnicodeError):  # (not the DSN's: a bug, as before)
                    raise
                raise ConfigError(f"dsn: {one_line(exc)}") from exc
            except CoordinatorError as exc:
                await self.release()
                if isinstance(exc.__cause__, ClientConfigurationError):
                    # asyncpg refused the DSN itself: waiting will not fix it (it was
                    # retried forever, as if the database were unreachable).
                    raise ConfigError(f"dsn: {one_line(exc.__cause__)}") from exc
                attempt += 1
                delay = backoff(attempt, cap=self.retry_cap)
                if on_unavailable is not None:
                    on_unavailable(exc, delay)
                with trio.move_on_after(delay):
                    await stop.wait()
                if stop.is_set():
                    return False

    async def keep(
        self,
        *,
        on_lost: Callable[[], None],
        on_regained: Callable[[], None],
        on_stepped_down: Callable[[], None],
    ) -> None:
        """Watch the lock session until cancelled (run as a task while leading).

        When the session ends: claims are fenced at once, ``on_lost()``; the lock is
        taken again as soon as the database answers, ``on_regained()``; if another daemon
        took it meanwhile, ``on_stepped_down()`` and return.
        """
        attempt = 0
        while True:
            conn = self.conn
            lost = trio.Event()
            if conn is None or conn.is_closed():
                lost.set()
            else:
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
            await lost.wait()
            self.store.leader_pid = 0  # no backend has pid 0: every claim is refused
            self.lost_at = trio.current_time()
            self.log.warning("leadership.connection_lost", instance=self.instance)
            on_lost()
            tried_at = trio.current_time()
            while True:
                attempt += 1
                # (A second apart for the first minute, when a live leader must be back
                # before its standby; then the usual backoff, not a connection a second
                # for as long as an outage lasts.)
                early = trio.current_time() - self.lost_at < LEAD_RETRY_SPAN
                pause = backoff(attempt, cap=LEAD_RETRY_CAP if early else self.retry_cap)
                if attempt == 1:
                    await trio.sleep(pause)
                else:
                    with trio.move_on_after(pause):
                        await self._nudged.wait()
                    # (Every fenced claim nudges: at most one attempt a second all the same.)
                    await trio.sleep_until(max(trio.current_time(), tried_at + NUDGE_FLOOR))
                self._nudged = trio.Event()
                tried_at = trio.current_time()
                new_conn: Connection | None = None
                try:
                    new_conn = await connect(self.dsn, application_name=APP_DAEMON, daemon=True)
                    led = await self.store.try_lead(new_conn)
                    if not led and await self.store.end_own_lingering_lead(new_conn):
                        led = await self._take_freed(new_conn)
                except CoordinatorError:
                    await close_quietly(new_conn, within=1.0)
                    continue
                except BaseException:  # cancelled (a stop) mid-way: close what we opened
                    await close_quietly(new_conn, within=1.0)
                    raise
                if not led:
                    await close_quietly(new_conn, within=1.0)
                    self.log.error(
                        "leadership.lost",
                        instance=self.instance,
                        reason="another daemon took the lock while this one's session was "
                        "lost: this one stops (exit 1; under systemd it starts again, as a "
                        "standby)",
                    )
                    self.stepped_down = True
                    on_stepped_down()
                    return
                old, self.conn = self.conn, new_conn
                await close_quietly(old, within=1.0)
                attempt = 0
                self.log.info("leadership.regained", instance=self.instance)
                on_regained()
                break

    async def _take_freed(self, conn: Connection) -> bool:
        """Take the lock our own lingering session held, once the server has ended it
        (the lock goes when the backend exits, a moment after it is signalled). A standby
        waiting for the lock may take it first: then this daemon steps down, as it
        should."""
        self.log.warning(
            "leadership.own_session_ended",
            instance=self.instance,
            reason="this daemon's last lock session was still alive on the server after "
            "its connection was cut; ended it to take the lock again",
        )
        for _ in range(OWN_SESSION_TRIES):
            await trio.sleep(OWN_SESSION_PAUSE)
            if await self.store.try_lead(conn):
                return True
        return False

    async def release(self) -> None:
        """Close the lock's session (the lock goes with it); shielded and bounded."""
        conn, self.conn = self.conn, None
        await close_quietly(conn, within=1.0)


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


__all__ = ["Leadership"]
