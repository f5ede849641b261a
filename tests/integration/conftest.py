"""Helpers for running a daemon in-process against the test database (real clock)."""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import attrs
import pytest
import trio

from coordinator.clock import SystemWallClock, WallClock
from coordinator.daemon import Daemon, DaemonSettings
from coordinator.db import aio
from coordinator.log import EventLog
from coordinator.migrate import migrate
from coordinator.service import build_daemon

if TYPE_CHECKING:
    from coordinator.alerts import Sink
    from coordinator.embedded import Cluster


@pytest.fixture
async def fault_db(aio_loop: Any, private_cluster: Cluster) -> str:
    """The migrated ``postgres`` database of :func:`private_cluster`; its DSN."""
    dsn = private_cluster.dsn("postgres")
    conn = await aio(asyncpg.connect)(dsn, server_settings={"application_name": "tests-app"})
    try:
        await migrate(conn)
    finally:
        await aio(conn.close)()
    return dsn


@attrs.define(eq=False)
class Harness:
    """A running daemon plus the events it logged."""

    daemon: Daemon
    events: list[dict[str, Any]]
    status: int | None = None
    done: trio.Event = attrs.field(factory=trio.Event)

    def named(self, name: str, **match: Any) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e["event"] == name and all(e.get(k) == v for k, v in match.items())
        ]

    async def wait_event(
        self, name: str, *, timeout: float = 15, count: int = 1, **match: Any
    ) -> list[dict[str, Any]]:
        with trio.move_on_after(timeout):
            while len(self.named(name, **match)) < count:
                await trio.sleep(0.01)
            return self.named(name, **match)
        trail = "\n".join(str(e) for e in self.events[-30:])
        raise AssertionError(
            f"no {count} x {name} {match} within {timeout}s; last events:\n{trail}"
        )

    async def stop(self, timeout: float = 30) -> int | None:
        self.daemon.request_stop()
        with trio.fail_after(timeout):
            await self.done.wait()
        return self.status


StartDaemon = Callable[..., Awaitable[Harness]]


@pytest.fixture
async def start_daemon(
    aio_loop: Any, database: str, tmp_path: Path, nursery: trio.Nursery
) -> AsyncIterator[StartDaemon]:
    harnesses: list[Harness] = []
    sockets = Path(tempfile.mkdtemp(prefix="cw-"))  # short: a socket path has ~108 bytes

    def worker_socket(index: int) -> Path:
        return sockets / f"w{index}.sock"

    async def start(
        *,
        wait_ready: bool = True,
        ready_timeout: float = 30,
        dsn: str | None = None,
        spool_path: Path | None = None,
        clock: WallClock | None = None,
        jitter: Callable[[], float] | None = None,
        alert_sinks: Sequence[Sink] = (),
        alert_window: float = 6 * 3600.0,
        build: dict[str, Any] | None = None,
        **settings: Any,
    ) -> Harness:
        events: list[dict[str, Any]] = []
        log = EventLog(level="debug", stream=_Null())
        log.observers.append(events.append)
        daemon = build_daemon(
            dsn=dsn or database,
            settings=DaemonSettings(spool_path=spool_path or tmp_path / "spool.jsonl", **settings),
            clock=clock or SystemWallClock(),
            log=log,
            worker_socket=worker_socket(len(harnesses)),
            handle_signals=False,
            # Retry delays' jitter, deterministic: a seeded generator unless a test says.
            jitter=jitter or random.Random(13).random,
            alert_sinks=alert_sinks,
            alert_window=alert_window,
            **(build or {}),
        )
        harness = Harness(daemon=daemon, events=events)
        harnesses.append(harness)

        async def run() -> None:
            try:
                harness.status = await daemon.run()
            finally:
                harness.done.set()

        nursery.start_soon(run)
        if wait_ready:
            with trio.fail_after(ready_timeout):
                await daemon.ready.wait()
        return harness

    yield start
    for h in harnesses:
        if not h.done.is_set():
            await h.stop()


class _Null:
    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass


async def define(conn: asyncpg.Connection, name: str, **kw: Any) -> int:
    """coordinator.define_job through plain SQL, as an application would."""
    args: dict[str, Any] = {"schedule_kind": "manual", **kw}
    if "target" not in args:
        args["target"] = {"kind": "exec", "argv": ["true"]}
    if isinstance(args["target"], dict):
        args["target"] = json.dumps(args["target"])
    if isinstance(args.get("params"), dict):
        args["params"] = json.dumps(args["params"])
    named = ", ".join(f"{k} => ${i + 2}" for i, k in enumerate(args))
    job_id: int = await aio(conn.fetchval)(
        f"SELECT coordinator.define_job(name => $1, {named})", name, *args.values()
    )
    return job_id


def refreshes(statements: list[Any]) -> int:
    """How many inventory reads a list of logged statements holds."""
    return sum(1 for s in statements if "LEFT JOIN coordinator.runs r" in s.sql)
