"""Opening PostgreSQL connections from trio.

asyncpg is an asyncio library; trio-asyncio runs it inside the trio loop. Every
connection is opened here, with ``application_name`` set so operators (and the
benchmarks, and the tests that count statements in the server log) can tell the daemon's
sessions from the CLI's. The daemon's sessions are also marked
``coordinator.origin = 'daemon'``: the wake triggers skip them (see migrations/0001).

Calls into asyncpg go through :func:`aio` (``trio_asyncio.aio_as_trio``) and therefore
need an open trio-asyncio loop (``trio_asyncio.open_loop()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import types
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, cast
from urllib.parse import parse_qs, urlsplit

import asyncpg
import trio
import trio_asyncio

from .errors import ConfigError, DatabaseUnavailable

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine

    from asyncpg import Connection

APP_DAEMON: Final = "coordinator"
APP_CLI: Final = "coordinator-cli"
APP_ADMIN: Final = "coordinator-admin"

P = ParamSpec("P")
T = TypeVar("T")


def aio(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Wrap an asyncio coroutine function so trio code can await it."""
    return trio_asyncio.aio_as_trio(fn)  # type: ignore[no-any-return]


async def aio_here(awaitable: Coroutine[Any, Any, T]) -> T:
    """Await an asyncio coroutine in this trio task, stepping it as an asyncio task would.

    :func:`aio` wraps the coroutine in an asyncio task of trio-asyncio's loop: starting
    that task costs a scheduler round, and its end another hand-off back to the trio task.
    The store's statements (claims and settlements above all) go through here: the
    coroutine runs until it waits on a future (asyncpg has written the statement), this
    task sleeps until that future is done, and the coroutine goes on with its result --
    two rounds fewer per statement. Cancellation is asyncio's: the future is cancelled,
    the coroutine sees ``CancelledError`` (asyncpg then cancels the statement on the
    server, as under :func:`aio`), and once it has ended this raises ``trio.Cancelled``.
    Only for asyncpg's queries without a timeout, on a connection whose last statement
    was not cancelled: asyncpg first waits for an unfinished cancellation, and applies a
    timeout, under ``asyncio.timeout``, which needs a task (the daemon's pool closes a
    connection whose statement was cancelled; a closing goes through :func:`aio`).
    """
    wake = _Wake(trio.lowlevel.current_task())
    raise_cancel: Callable[[], Any] | None = None
    error: BaseException | None = None
    try:
        while True:
            try:
                if error is None:
                    future: Any = awaitable.send(None)
                else:
                    future, error = awaitable.throw(error), None
            except StopIteration as stop:
                return cast("T", stop.value)
            if future is None:  # a bare yield (``asyncio.sleep(0)``): go round once
                await trio.lowlevel.cancel_shielded_checkpoint()
                continue
            if not getattr(future, "_asyncio_future_blocking", False):
                raise RuntimeError(f"aio_here: the coroutine yielded {future!r}")
            future._asyncio_future_blocking = False
            wake.deferred = True
            future.add_done_callback(wake)
            wake.deferred = False

            def abort(raise_cancel_arg: Callable[[], Any], future: Any = future) -> Any:
                nonlocal raise_cancel
                if raise_cancel is None:  # (once: the coroutine may await its clean-up)
                    raise_cancel = raise_cancel_arg
                    wake.deferred = True
                    future.cancel()
                return trio.lowlevel.Abort.FAILED

            await trio.lowlevel.wait_task_rescheduled(abort)
            try:
                future.result()  # (its value is the coroutine's to read)
            except BaseException as exc:
                error = exc
    except asyncio.CancelledError:
        if raise_cancel is not None:
            raise_cancel()  # trio.Cancelled, as the caller's scope asked
        raise
    finally:
        awaitable.close()  # (a no-op once it returned or raised)


class _Wake:
    """What :func:`aio_here` asks asyncpg's future to call when it is done: reschedule the
    waiting trio task. A loop set up by :func:`trio_asyncio_loop` calls it at once
    (:func:`_call_at_once`) unless ``deferred``."""

    __slots__ = ("deferred", "task")

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        #: Called back the usual way (queued): while the callback is added (a future
        #: done already calls back at once, from the waiting task itself) and once the
        #: wait is being cancelled (the future's cancel() runs inside trio's abort).
        self.deferred = False

    def __call__(self, _future: object) -> None:
        trio.lowlevel.reschedule(self.task)


C = TypeVar("C", bound="Callable[..., None]")


def at_once(callback: C) -> C:
    """Mark an asyncio callback that a loop set up by :func:`trio_asyncio_loop` runs as
    soon as asyncpg schedules it (``loop.call_soon``), in the task that read the message
    (asyncpg's notification callbacks: the listener's). Such a callback runs inside
    asyncpg's handling of the socket's data: it must be small, must not raise and must
    not use the connection."""
    callback._runs_at_once = True  # type: ignore[attr-defined]
    return callback


def _is_asyncpg_protocol(obj: object) -> bool:
    """``obj`` is an asyncpg connection's protocol (``BaseProtocol``)."""
    return type(obj).__module__.startswith("asyncpg.protocol")


def _runs_now(callback: Any, args: tuple[Any, ...]) -> bool:
    """Whether :func:`_call_at_once`'s loop runs ``callback(*args)`` as it is scheduled:
    an :func:`aio_here` wake-up not deferred, a callback marked :func:`at_once`, or
    asyncpg's ``_on_waiter_completed`` for a statement that was not cancelled."""
    if type(callback) is _Wake:
        return not callback.deferred
    if getattr(callback, "_runs_at_once", False) is True:
        return True
    return (
        getattr(callback, "__name__", None) == "_on_waiter_completed"
        and _is_asyncpg_protocol(getattr(callback, "__self__", None))
        and not args[0].cancelled()
    )


def _call_at_once(loop: Any) -> None:
    """Have ``loop`` run :func:`aio_here`'s wake-ups as soon as the future is done, and
    the few other callbacks that may (:func:`_runs_now`).

    asyncio's futures schedule every done-callback with ``loop.call_soon``, and
    trio-asyncio queues each for its loop task: a result that arrived waited a scheduler
    round for that task to reschedule the waiting one, and a second round for it to run.
    Rescheduling is safe from any trio task (the one reading the socket, usually), so
    that callback runs at once and the waiting task runs in the next round: a round less
    per statement. So do callbacks marked with :func:`at_once` (the listener's: a
    notification reaches the daemon in the task that read it), and asyncpg's own
    callback on a statement's future when the statement was not cancelled
    (``_on_waiter_completed``: without a timeout it then does nothing, and with one it
    only cancels the timer), which cost trio-asyncio's loop task a step per statement.
    Everything else asyncio schedules is queued as before (a cancelled statement's
    callback above all: it sends the server a cancel request).
    """
    if getattr(loop, "_wakes_at_once", False):
        return
    queue = loop.call_soon

    def call_soon(callback: Any, *args: Any, context: Any = None) -> Any:
        if _runs_now(callback, args):
            callback(*args)
            return None
        return queue(callback, *args, context=context)

    loop.call_soon = call_soon
    loop._wakes_at_once = True


def _watch_at_once(loop: Any) -> None:
    """Have ``loop``'s I/O tasks watch their descriptor again as soon as its callback ran.

    trio-asyncio runs each reader's (and writer's) callback in a trio task of its own,
    and after every callback that task waits for the loop task to run everything queued
    so far (``synchronize``) before it watches the descriptor again: on every asyncpg
    connection, for every read (a statement's answer, a notification), a handle, an
    event and two more task steps, none of them on the way to a result.

    Without that wait, a connection's next read may be handled before the callbacks its
    last read queued have run (asyncio's own loop polls before running them too, but runs
    them before the next read's callback). asyncpg does not depend on it: the wake-ups of
    a statement's answer run at once (:func:`_call_at_once`), and what can follow an
    answer unasked (a notification, a parameter or notice message, an error before the
    end of the stream) is handled by the protocol as it comes; ``connection_lost`` is
    still queued behind what came before it. The queued callbacks still run in order,
    by the loop task; a handle cancelled in its own callback (``pause_reading``, a close)
    or from elsewhere ends the task as before. One harmless difference: while a connect's
    queued completion waits for the loop task, its writer callback may run again and
    return at once. Connections opened before this was set keep the old task.
    """
    if getattr(loop, "_watches_at_once", False) or not hasattr(type(loop), "_io_task"):
        return  # (set already, or a trio-asyncio whose I/O tasks this does not know)
    loop._io_task = types.MethodType(_io_task, loop)
    loop._watches_at_once = True


async def _io_task(loop: Any, fd: Any, handle: Any, wait_ready: Any) -> None:
    """trio-asyncio's ``BaseTrioEventLoop._io_task`` (0.15, 0.16) without its
    ``await self.synchronize()`` after each callback (:func:`_watch_at_once`)."""
    with handle._scope:
        try:
            while not handle._cancelled:
                try:
                    await wait_ready(fd)
                except OSError:
                    # (the descriptor was closed after its handle was cancelled)
                    if handle._cancelled:
                        break
                    raise
                if handle._cancelled:
                    break
                handle._run()
        except Exception as exc:
            handle._raise(exc)


async def connect(
    dsn: str,
    *,
    application_name: str,
    daemon: bool = False,
    connect_timeout: float = 10.0,
) -> Connection:
    """Open one asyncpg connection (inside an open trio-asyncio loop).

    ``daemon=True`` marks the session so the wake triggers skip its writes, and turns on
    TCP keepalive so a dead server is noticed without sending any SQL.
    """
    problem = dsn_problem(dsn)
    if problem is not None:
        raise DsnError(problem)
    settings = {"application_name": application_name}
    if daemon:
        settings["coordinator.origin"] = "daemon"
        settings.update(SERVER_KEEPALIVE)
    try:
        # Bounded by trio, not by asyncpg's timeout: under trio-asyncio that one leaves an
        # asyncio timer behind which later wakes an otherwise idle process.
        with trio.fail_after(connect_timeout):
            conn = await aio(asyncpg.connect)(
                dsn, server_settings=settings, timeout=None, statement_cache_size=256
            )
    except trio.TooSlowError as exc:
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL{server_of(dsn)}: no answer within {connect_timeout:g}s"
        ) from exc
    except (OSError, TimeoutError) as exc:  # (the server never answered: say which)
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL{server_of(dsn)}: {one_line(exc)}"
        ) from exc
    except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise DatabaseUnavailable(f"cannot connect to PostgreSQL: {one_line(exc)}") from exc
    if daemon:
        _enable_keepalive(conn)
    return conn


#: What asyncpg takes for ``sslmode``.
_SSL_MODES: Final = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
#: What asyncpg takes for ``target_session_attrs``.
_SESSION_ATTRS: Final = ("any", "primary", "standby", "prefer-standby", "read-write", "read-only")


class DsnError(ConfigError):
    """A DSN no connection can be made with (:func:`dsn_problem`): ``dsn: <problem>``;
    the CLI names where the DSN was set instead (``--dsn``, ``COORDINATOR_DSN``...)."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"dsn: {problem}")
        self.problem = problem


def dsn_problem(dsn: str) -> str | None:
    """Why ``dsn`` cannot be used, ``invalid DSN: ...`` in words a person can act on
    (``None``: it may be).
    asyncpg's own refusals named a Python object (``expected to be one of <built-in
    method values of mappingproxy object at 0x...>``) or a conversion (``invalid literal
    for int() with base 10``), and a libpq keyword string got "scheme is expected"."""
    problem = _dsn_problem(dsn)
    return None if problem is None else f"invalid DSN: {problem}"


def _dsn_problem(dsn: str) -> str | None:
    if "://" not in dsn and "=" in dsn:
        return (
            "use the URI form, postgresql://USER@HOST:PORT/DATABASE (the keyword form, "
            "host=... dbname=..., is libpq's; asyncpg reads URIs only)"
        )
    try:
        parts = urlsplit(dsn)
        query = parse_qs(parts.query)
    except ValueError as exc:
        return f"not a URI: {exc}"
    if parts.scheme not in ("postgresql", "postgres"):
        return (
            f"the scheme must be postgresql:// (or postgres://), not "
            f"{parts.scheme + '://' if parts.scheme else 'none'}"
        )
    hosts = parts.netloc.rpartition("@")[2]
    for host in filter(None, hosts.split(",")):
        name, colon, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
        if colon and port and not _is_port(port):
            return f"port {port!r} of host {name or host!r} is not a number from 1 to 65535"
    for port in query.get("port", []):
        for one in port.split(","):
            if one and not _is_port(one):
                return f"port {one!r} is not a number from 1 to 65535"
    for mode in query.get("sslmode", []):
        if mode not in _SSL_MODES:
            return f"sslmode must be one of {', '.join(_SSL_MODES)}, not {mode!r}"
    for attrs in query.get("target_session_attrs", []):
        if attrs not in _SESSION_ATTRS:
            return f"target_session_attrs must be one of {', '.join(_SESSION_ATTRS)}, not {attrs!r}"
    return None


def _is_port(text: str) -> bool:
    """ASCII digits for 1 to 65535 (``'²'.isdigit()`` is true, and ``int('²')`` raised)."""
    return text.isascii() and text.isdecimal() and 0 < int(text) < 65536


def server_of(dsn: str) -> str:
    """`` at HOST:PORT`` (or the socket's path) a DSN names, for a refusal: "[Errno 2] No
    such file or directory" alone did not say what was tried. Never the password; empty
    when the DSN cannot be read."""
    try:
        parts = urlsplit(dsn)
        query = parse_qs(parts.query)
        hosts = query.get("host", [""])[0] or parts.netloc.rpartition("@")[2]
        port = query.get("port", [""])[0]
    except ValueError:
        return ""
    if not hosts:
        return ""
    if hosts.startswith("/"):  # a socket directory: libpq's file in it
        return f" at {hosts.rstrip('/')}/.s.PGSQL.{port or 5432}"
    return f" at {hosts}" + (f":{port}" if port and ":" not in hosts else "")


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (asyncpg's run to several)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


#: The daemon's sessions' TCP probes, both ends: idle seconds before the first, seconds
#: between them, how many go unanswered before the connection is dropped; and how long
#: data may stay unacknowledged (milliseconds).
KEEPALIVE_IDLE: Final = 30
KEEPALIVE_INTERVAL: Final = 10
KEEPALIVE_COUNT: Final = 3
USER_TIMEOUT_MS: Final = 60_000

#: The same probes from the server's side, for the daemon's sessions (ignored on a Unix
#: socket). Without them a session whose daemon's host vanished (a network cut, a host
#: lost) lingered on the server until its kernel's default keepalive, two hours: holding
#: the single-writer lock, so the daemon that came back as a standby waited that long for
#: its own dead session, and a claim's row locks with it. (PostgreSQL 12+, as the
#: schema's ``plan_cache_mode`` is.)
SERVER_KEEPALIVE: Final = {
    "tcp_keepalives_idle": str(KEEPALIVE_IDLE),
    "tcp_keepalives_interval": str(KEEPALIVE_INTERVAL),
    "tcp_keepalives_count": str(KEEPALIVE_COUNT),
    "tcp_user_timeout": str(USER_TIMEOUT_MS),
}


def _enable_keepalive(conn: Connection) -> None:
    """TCP keepalive and TCP_USER_TIMEOUT: zero-SQL liveness for long-lived sessions."""
    transport = getattr(conn, "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    options = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), KEEPALIVE_IDLE),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), KEEPALIVE_INTERVAL),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), KEEPALIVE_COUNT),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), USER_TIMEOUT_MS),
    ]
    for level, name, value in options:
        if name is None:
            continue
        with contextlib.suppress(OSError):  # a platform without the option
            sock.setsockopt(level, name, value)


async def close_quietly(conn: Connection | None, *, within: float = 5.0) -> None:
    """Close a connection, shielded and bounded; errors of a dead connection are ignored."""
    if conn is None:
        return
    with trio.CancelScope(shield=True), trio.move_on_after(within) as scope:
        try:
            await aio(conn.close)()
        except Exception:
            conn.terminate()
    if scope.cancelled_caught:
        conn.terminate()


@asynccontextmanager
async def connection(
    dsn: str, *, application_name: str, daemon: bool = False
) -> AsyncIterator[Connection]:
    """``async with connection(dsn, ...) as conn``: open, yield, always close."""
    conn = await connect(dsn, application_name=application_name, daemon=daemon)
    try:
        yield conn
    finally:
        await close_quietly(conn)


@asynccontextmanager
async def trio_asyncio_loop() -> AsyncIterator[Any]:
    """Open the trio-asyncio loop that every asyncpg call needs, if none is open yet;
    either way it is tuned for asyncpg (:func:`_tune`)."""
    existing = trio_asyncio.current_loop.get()
    if existing is not None:
        _tune(existing)
        yield existing
        return
    async with trio_asyncio.open_loop() as loop:
        _tune(loop)
        yield loop


def _tune(loop: Any) -> None:
    """Spare trio-asyncio's loop task the steps it takes for asyncpg: the callbacks that
    may run as they are scheduled do (:func:`_call_at_once`), and I/O tasks watch again
    as soon as their callback ran (:func:`_watch_at_once`); and have asyncpg's abandoned
    TLS negotiations leave no unread failure behind (:func:`_read_abandoned_ssl_answers`).
    Idempotent."""
    _call_at_once(loop)
    _watch_at_once(loop)
    _read_abandoned_ssl_answers()


def _read_abandoned_ssl_answers() -> None:
    """Have asyncpg's ``TLSUpgradeProto`` read its own failure when nobody else will.

    Over TCP (``sslmode`` ``prefer``, the default, and up) asyncpg opens every connection
    -- ours, and the side connection that carries a statement's CancelRequest -- with a
    protocol whose ``on_data`` future is failed by ``connection_lost()`` ("unexpected
    connection_lost() call") if the server has not answered the SSLRequest yet. The
    opening coroutine awaits that future only once ``loop.create_connection()`` has
    returned: cancelled in the rounds before that, its transport is closed, the future
    fails, and nobody ever reads it. Two things cancel it there: our own cancellations
    of a connect (a stop, a deadline: the daemon's stop cancelling the lock session's
    reconnection after a server restart, seen in a test), and asyncpg itself, which
    cancels a connection's CancelRequest task when that connection is lost (a server
    stop, a terminated backend) or closed. The future's garbage collection then reports
    "Future exception was never retrieved", which trio-asyncio's loop raises into its own
    nursery: the daemon (or a test) failed for a connection nobody was waiting for.

    The subclass reads the failure as it sets it (``exception()`` only marks it read; a
    coroutine still waiting for the future gets it as before). Process-wide, once:
    asyncpg looks the class up by name when it connects."""
    from asyncpg import connect_utils

    base = getattr(connect_utils, "TLSUpgradeProto", None)
    if not isinstance(base, type) or getattr(base, "_reads_abandoned_answer", False):
        return  # (done already, or an asyncpg whose negotiation this does not know)

    class TLSUpgradeProto(base):  # type: ignore[misc,valid-type]
        _reads_abandoned_answer = True

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)
            on_data = getattr(self, "on_data", None)
            if isinstance(on_data, asyncio.Future) and on_data.done() and not on_data.cancelled():
                on_data.exception()

    TLSUpgradeProto.__qualname__ = base.__qualname__
    TLSUpgradeProto.__module__ = base.__module__
    connect_utils.TLSUpgradeProto = TLSUpgradeProto


def transaction(conn: Connection, **kwargs: Any) -> Any:
    """``async with transaction(conn):`` from trio (an asyncpg transaction block)."""
    return trio_asyncio.aio_as_trio(conn.transaction(**kwargs))
