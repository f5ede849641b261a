"""The retention prune as a deadline of its own: the daemon's real loop and the real
Pruner under trio's MockClock, with a store that records what it is asked (what the
SQL deletes is tested against PostgreSQL in tests/integration/test_retention.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from coordinator.core.admission import Admission
from coordinator.core.coalescer import RefreshCoalescer
from coordinator.core.deadlines import DeadlineSet
from coordinator.daemon.loop import DispatchLoop
from coordinator.daemon.policy import ErrorPolicy
from coordinator.daemon.retention import Pruner
from coordinator.events import EventBus, RetentionPruned
from coordinator.log import EventLog
from coordinator.schedule import parse_prune_at
from coordinator.store import PruneBatch, StoreUnavailable

#: Trio time 0 is this wall time: 2026-01-01 00:00 UTC.
ORIGIN = datetime(2026, 1, 1, tzinfo=UTC)


@attrs.define(eq=False)
class TrioWallClock:
    def now(self) -> datetime:
        return ORIGIN + timedelta(seconds=trio.current_time())


@attrs.define(eq=False)
class FakeStore:
    """Answers ``prune_batch`` with ``batches`` batches of work, each taking ``took``
    seconds of (mock) time; records when each was asked."""

    batches: int = 3
    took: float = 2.0
    fail_first: int = 0
    asked: list[tuple[float, tuple[int, int]]] = attrs.field(factory=list)

    async def prune_batch(self, *, resume: tuple[int, int], **_kw: Any) -> PruneBatch:
        self.asked.append((trio.current_time(), resume))
        if self.fail_first:
            self.fail_first -= 1
            raise StoreUnavailable("prune: database unavailable (test)")
        await trio.sleep(self.took)
        n = len([a for a in self.asked if a[1] != (-1, -1)])
        done = n % self.batches == 0
        return PruneBatch(deleted=100, removed_jobs=0, jobs_seen=1, resume=None if done else (n, 0))


def rig(
    store: FakeStore, cron: str | None = "17 3 * * *"
) -> tuple[DispatchLoop, Pruner, list[Any]]:
    events: list[Any] = []
    bus = EventBus(log=EventLog(stream=_Null()))
    bus.subscribe(events.append)
    clock = TrioWallClock()
    loop = DispatchLoop(
        clock=clock,
        deadlines=DeadlineSet(),
        coalescer=RefreshCoalescer(spacing=30.0),
        admission=Admission(slots=4),
        on_due=lambda _job, _at: None,
        refresh=_nothing,
        dispatch=_no_dispatch,
    )
    loop.coalescer.mark_refreshed(0.0)
    pruner = Pruner(
        store=store,  # type: ignore[arg-type]
        clock=clock,
        events=bus,
        policy=ErrorPolicy(log=bus.log, retry_cap=5.0),
        cron=cron,
        timezone="UTC",
        retention=timedelta(days=30),
        kick=loop.kick,
    )
    loop.chores.append(pruner)
    pruner.arm()
    return loop, pruner, events


async def _nothing() -> None:
    return None


async def _no_dispatch(*_args: Any) -> None:
    return None


class _Null:
    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass


STEP = 3 * 3600 + 17 * 60  # 03:17 on the first day, in seconds from ORIGIN


async def test_the_prune_falls_due_like_a_deadline_and_rearms_for_the_next_day(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore(batches=3, took=2.0)
    loop, _pruner, events = rig(store)
    assert loop.next_wake_at() == pytest.approx(STEP)
    async with trio.open_nursery() as calls:
        calls.start_soon(loop.run, calls)
        await trio.sleep(STEP + 60)
        # Three batches, each followed (but the last) by a pause as long as it took.
        assert [t for t, _ in store.asked] == [STEP, STEP + 4.0, STEP + 8.0]
        assert [r for _, r in store.asked] == [(0, 0), (1, 0), (2, 0)]
        (done,) = [e for e in events if isinstance(e, RetentionPruned)]
        assert (done.runs, done.batches, done.complete) == (300, 3, True)
        assert done.next_at == ORIGIN + timedelta(days=1, seconds=STEP)
        # Between prunes: the loop sleeps until the next one and takes no turn.
        turns = loop.turns
        await trio.sleep(86400 - 3600)
        assert loop.turns == turns
        assert len(store.asked) == 3
        await trio.sleep(3600)
        assert len(store.asked) == 6
        calls.cancel_scope.cancel()


async def test_off_means_no_timer_at_all(autojump_clock: trio.testing.MockClock) -> None:
    store = FakeStore()
    loop, pruner, _events = rig(store, cron=None)
    assert pruner.due_at() is None
    assert loop.next_wake_at() == float("inf")


async def test_a_failing_batch_is_retried_with_the_policy_and_a_stop_ends_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore(batches=1000, took=1.0, fail_first=2)
    loop, pruner, events = rig(store)
    async with trio.open_nursery() as calls:
        calls.start_soon(loop.run, calls)
        await trio.sleep(STEP + 10)
        times = [t for t, _ in store.asked]
        # Two failures paced by the policy's backoff (0.5 s, then 1 s), then the batch.
        assert times[:3] == [STEP, STEP + 0.5, STEP + 1.5]
        pruner.stopping = True
        await trio.sleep(10)
        (done,) = [e for e in events if isinstance(e, RetentionPruned)]
        assert done.complete is False
        assert pruner.due_at() is None  # stopping: not armed again
        calls.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("text", "cron"),
    [
        ("03:17", "17 3 * * *"),
        ("3:05", "5 3 * * *"),
        ("off", None),
        ("  OFF ", None),
        ("*/30  * * * *", "*/30 * * * *"),
        ("0 4 * * 0", "0 4 * * 0"),
    ],
)
def test_prune_at_forms(text: str, cron: str | None) -> None:
    assert parse_prune_at(text) == cron


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("24:00", "not a time of day"),
        ("3:7", "expected HH:MM"),
        ("noon", "expected 5 fields"),
        ("61 * * * *", "minute"),
    ],
)
def test_prune_at_refusals(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_prune_at(text)
