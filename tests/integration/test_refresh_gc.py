"""A daemon that owns its process tunes Python's cyclic garbage collector and freezes
what is alive after a full refresh out of its collections (daemon/cyclic_gc.py). With
a real inventory and a real database: the refresh's own work leaves no garbage cycle to
freeze, and repeated full refreshes keep the frozen set the size of what is alive
(nothing piles up)."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

import pytest
import trio

from coordinator.daemon.cyclic_gc import YOUNG_THRESHOLD
from coordinator.db import aio

if TYPE_CHECKING:
    from collections.abc import Iterator

    import asyncpg

    from .conftest import StartDaemon

JOBS = 300


@pytest.fixture
def _thawed_after() -> Iterator[None]:
    """The test process is not the daemon's: thawed and its thresholds put back after."""
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


async def _full_refresh(daemon: Any) -> None:
    daemon.inventory.request(None)
    assert await daemon.inventory.refresh()


@pytest.mark.usefixtures("_thawed_after")
async def test_full_refreshes_freeze_what_is_alive_and_no_garbage(
    start_daemon: StartDaemon, conn: asyncpg.Connection
) -> None:
    await aio(conn.execute)(
        "SELECT coordinator.define_job(name => 'j' || g, schedule_kind => 'interval',"
        ' schedule => \'3600\', target => \'{"kind": "exec", "argv": ["true"]}\')'
        " FROM generate_series(1, $1::int) g",
        JOBS,
    )
    harness = await start_daemon(build={"owns_process": True})
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD
    ready = harness.named("refresh")
    assert ready[0]["jobs"] == JOBS
    assert ready[0]["frozen"] > JOBS  # the start-up objects and the inventory

    counts = []
    for _ in range(5):
        await _full_refresh(harness.daemon)
        counts.append(gc.get_freeze_count())
        await trio.sleep(0.05)
    # The frozen set is what is alive, not a pile: each full refresh collects what is
    # not frozen first, and what the last one froze is freed as usual once replaced.
    assert max(counts) - min(counts) < JOBS, counts
    assert all(e["frozen"] > JOBS for e in harness.named("refresh"))

    # What the refresh itself made and froze holds no garbage cycle: thawed and
    # collected right after, nothing is found.
    # (The test process is long-lived: earlier tests left garbage, and objects the
    # refreshes above froze may have become garbage since. Collected first, for good:
    # only then are collected objects kept to be looked at.)
    gc.unfreeze()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        await _full_refresh(harness.daemon)
        gc.unfreeze()
        gc.collect()
        kinds = sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage})
    finally:
        gc.set_debug(0)
        del gc.garbage[:]
    assert kinds == [], kinds
    await harness.stop()


async def test_embedded_daemons_tune_and_freeze_nothing(
    start_daemon: StartDaemon, conn: asyncpg.Connection
) -> None:
    thresholds = gc.get_threshold()
    harness = await start_daemon()
    assert harness.named("refresh")[0].get("frozen") is None
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == thresholds
    await harness.stop()
