"""RefreshCoalescer: a burst of wakes is one refresh, never a timer (promises 1 and 4)."""

from __future__ import annotations

import itertools
import math

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from coordinator.core.coalescer import RefreshCoalescer
from coordinator.core.deadlines import DeadlineSet

# -- plain unit tests -------------------------------------------------------------------


def test_nothing_pending_means_nothing_due() -> None:
    coalescer = RefreshCoalescer()
    assert coalescer.spacing == 30.0
    assert coalescer.due_at() is None
    assert not coalescer.pending
    assert not coalescer.take(0.0)
    assert not coalescer.take(1e9)
    assert coalescer.refreshes_granted == 0
    assert coalescer.last_refresh is None


def test_first_wake_before_any_refresh_is_due_immediately() -> None:
    coalescer = RefreshCoalescer(spacing=30)
    coalescer.wake(5.0)
    assert coalescer.due_at() == -math.inf
    assert coalescer.take(5.0)
    assert coalescer.last_refresh == 5.0
    assert not coalescer.pending
    assert coalescer.due_at() is None


def test_wakes_after_a_refresh_wait_for_spacing() -> None:
    coalescer = RefreshCoalescer(spacing=30)
    coalescer.mark_refreshed(100.0)
    coalescer.wake(101.0)
    assert coalescer.due_at() == 130.0
    assert not coalescer.take(129.999)
    assert coalescer.pending
    assert coalescer.take(130.0)
    assert not coalescer.take(130.0)  # once per pending request


def test_a_late_take_is_granted_and_spacing_counts_from_it() -> None:
    coalescer = RefreshCoalescer(spacing=30)
    coalescer.mark_refreshed(0.0)
    coalescer.wake(1.0)
    assert coalescer.take(500.0)
    coalescer.wake(501.0)
    assert coalescer.due_at() == 530.0


def test_a_burst_merges_into_one_refresh() -> None:
    coalescer = RefreshCoalescer(spacing=30)
    coalescer.mark_refreshed(0.0)
    for i in range(1000):
        coalescer.wake(i * 0.01)
    assert coalescer.wakes_received == 1000
    assert coalescer.due_at() == 30.0
    assert coalescer.take(30.0)
    assert not coalescer.take(1e9)
    assert coalescer.refreshes_granted == 1


def test_urgent_ignores_spacing_once() -> None:
    coalescer = RefreshCoalescer(spacing=30)
    coalescer.mark_refreshed(0.0)
    coalescer.wake(1.0)
    coalescer.wake(2.0, urgent=True)
    assert coalescer.urgent
    assert coalescer.due_at() == -math.inf
    assert coalescer.take(2.0)
    assert not coalescer.urgent
    coalescer.wake(3.0)  # an ordinary wake after it waits for spacing again
    assert coalescer.due_at() == 32.0


def test_mark_refreshed_satisfies_wakes_at_or_before_it() -> None:
    coalescer = RefreshCoalescer(spacing=30)
    coalescer.wake(1.0)
    coalescer.wake(2.0)
    coalescer.mark_refreshed(2.0)  # the startup refresh began reading at 2.0
    assert not coalescer.pending
    assert coalescer.due_at() is None
    assert coalescer.last_refresh == 2.0


def test_mark_refreshed_leaves_later_wakes_pending() -> None:
    coalescer = RefreshCoalescer(spacing=30)
    coalescer.wake(1.0)
    coalescer.wake(5.0)  # arrived while the refresh that began at 3.0 was running
    coalescer.mark_refreshed(3.0)
    assert coalescer.pending
    assert coalescer.due_at() == 33.0


def test_mark_refreshed_satisfies_an_earlier_urgent_request_only() -> None:
    coalescer = RefreshCoalescer(spacing=30)
    coalescer.wake(1.0, urgent=True)
    coalescer.wake(5.0)
    coalescer.mark_refreshed(3.0)  # a full refresh after the urgent wake
    assert coalescer.pending
    assert not coalescer.urgent
    assert coalescer.due_at() == 33.0

    coalescer.wake(10.0, urgent=True)
    coalescer.mark_refreshed(4.0)  # older than the urgent wake: still owed at once
    assert coalescer.urgent
    assert coalescer.due_at() == -math.inf


def test_mark_refreshed_never_moves_last_refresh_back() -> None:
    coalescer = RefreshCoalescer(spacing=30)
    coalescer.mark_refreshed(100.0)
    coalescer.mark_refreshed(50.0)
    assert coalescer.last_refresh == 100.0


def test_held_wakes_are_kept_and_granted_after_release() -> None:
    coalescer = RefreshCoalescer(spacing=30)
    coalescer.mark_refreshed(0.0)
    coalescer.hold()
    coalescer.hold()  # idempotent
    assert coalescer.held
    coalescer.wake(1.0)
    coalescer.wake(2.0, urgent=True)
    assert coalescer.pending
    assert coalescer.due_at() is None
    assert not coalescer.take(1000.0)
    coalescer.release()
    assert not coalescer.held
    assert coalescer.due_at() == -math.inf  # the urgent request survived the hold
    assert coalescer.take(1000.0)


def test_release_grants_per_spacing() -> None:
    coalescer = RefreshCoalescer(spacing=30)
    coalescer.mark_refreshed(0.0)
    coalescer.hold()
    coalescer.wake(1.0)
    coalescer.release()
    assert coalescer.due_at() == 30.0
    assert not coalescer.take(10.0)
    assert coalescer.take(30.0)


def test_zero_spacing_grants_every_pending_request() -> None:
    coalescer = RefreshCoalescer(spacing=0)
    coalescer.mark_refreshed(0.0)
    coalescer.wake(0.0)
    assert coalescer.take(0.0)


@pytest.mark.parametrize("spacing", [-1.0, math.inf, math.nan])
def test_spacing_must_be_finite_and_not_negative(spacing: float) -> None:
    with pytest.raises(ValueError, match="spacing"):
        RefreshCoalescer(spacing=spacing)


# -- property: spacing is respected and every wake is served ----------------------------

_events = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=100, allow_nan=False),
        st.sampled_from(["wake", "urgent", "take", "take", "hold", "release", "mark"]),
    ),
    max_size=200,
)


@given(events=_events, spacing=st.sampled_from([0.0, 1.0, 30.0, 45.5]))
def test_spacing_is_respected_and_every_wake_is_served(
    events: list[tuple[float, str]], spacing: float
) -> None:
    coalescer = RefreshCoalescer(spacing=spacing)
    now = 0.0
    wakes = granted_count = 0
    # Refreshes as (time, granted non-urgent?), in order.
    refreshes: list[tuple[float, bool]] = []
    for step, kind in events:
        now += step
        if kind in ("wake", "urgent"):
            coalescer.wake(now, urgent=kind == "urgent")
            wakes += 1
        elif kind == "take":
            pending, held, urgent = coalescer.pending, coalescer.held, coalescer.urgent
            last = coalescer.last_refresh
            granted = coalescer.take(now)
            # Granted exactly when a request is pending, not held, and due.
            assert granted == (
                pending and not held and (urgent or last is None or now >= last + spacing)
            )
            if granted:
                granted_count += 1
                refreshes.append((now, not urgent))
                assert not coalescer.pending
        elif kind == "hold":
            coalescer.hold()
        elif kind == "release":
            coalescer.release()
        else:
            coalescer.mark_refreshed(now)
            refreshes.append((now, False))
            assert not coalescer.pending  # time never goes back, so every wake is satisfied
        assert coalescer.wakes_received == wakes

    for (earlier, _), (later, ordinary) in itertools.pairwise(refreshes):
        if ordinary:
            assert later - earlier >= spacing

    # Eventually served: once released, one spacing later everything pending is granted.
    pending = coalescer.pending
    coalescer.release()
    now += spacing
    assert coalescer.take(now) == pending
    assert not coalescer.pending
    assert coalescer.due_at() is None
    assert coalescer.refreshes_granted == granted_count + pending


@given(wake_times=st.lists(st.floats(min_value=0, max_value=1000, allow_nan=False), max_size=100))
def test_refreshes_never_outnumber_wakes(wake_times: list[float]) -> None:
    coalescer = RefreshCoalescer(spacing=30)
    for now in sorted(wake_times):
        coalescer.wake(now)
        coalescer.take(now)
    coalescer.take(math.inf)
    assert coalescer.refreshes_granted <= len(wake_times)
    assert not coalescer.pending


# -- driven from trio with a mock clock, as the daemon's loop does ---------------------


@attrs.define(eq=False)
class DaemonLoop:
    """The daemon's loop in miniature: one timer at the earlier of the coalescer's due
    time and the earliest saved deadline, woken early by an event.
    """

    coalescer: RefreshCoalescer
    deadlines: DeadlineSet = attrs.field(factory=DeadlineSet)
    grants: list[float] = attrs.field(factory=list)
    fired: list[tuple[float, int]] = attrs.field(factory=list)
    iterations: int = 0
    _event: trio.Event = attrs.field(factory=trio.Event)

    def wake(self, *, urgent: bool = False) -> None:
        self.coalescer.wake(trio.current_time(), urgent=urgent)
        self._event.set()

    def release(self) -> None:
        self.coalescer.release()
        self._event.set()

    async def run(self) -> None:
        while True:
            self.iterations += 1
            now = trio.current_time()
            if self.coalescer.take(now):
                self.grants.append(now)  # the refresh would run here
            self.fired.extend(self.deadlines.pop_due(now))
            due = self.coalescer.due_at()
            earliest = self.deadlines.earliest()
            sleep_until = min(
                math.inf if due is None else due,
                math.inf if earliest is None else earliest[0],
            )
            with trio.move_on_at(sleep_until):
                await self._event.wait()
            self._event = trio.Event()


async def test_idle_loop_sleeps_and_grants_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    loop = DaemonLoop(RefreshCoalescer(spacing=30))
    loop.coalescer.mark_refreshed(trio.current_time())  # the startup refresh
    loop.deadlines.set(1, 1e6)  # jobs exist, none due within the window
    start = trio.current_time()
    with trio.move_on_after(3600):
        await loop.run()
    assert trio.current_time() - start == pytest.approx(3600)  # the mock clock jumped
    assert loop.grants == []
    assert loop.fired == []
    assert loop.iterations == 1  # armed once, never woke: no ticking
    assert loop.coalescer.refreshes_granted == 0


async def test_idle_loop_without_startup_refresh_grants_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    loop = DaemonLoop(RefreshCoalescer())
    with trio.move_on_after(3600):
        await loop.run()
    assert trio.current_time() == pytest.approx(3600)
    assert loop.grants == []
    assert loop.iterations == 1


async def test_burst_of_100_wakes_is_one_refresh_at_last_plus_spacing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    loop = DaemonLoop(RefreshCoalescer(spacing=30))
    start = trio.current_time()
    loop.coalescer.mark_refreshed(start)

    async def burst() -> None:
        for i in range(100):
            await trio.sleep_until(start + i * 29 / 99)  # 0 s .. 29 s
            loop.wake()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop.run)
        nursery.start_soon(burst)
        await trio.sleep(3600)
        nursery.cancel_scope.cancel()
    assert loop.coalescer.wakes_received == 100
    assert loop.grants == [pytest.approx(start + 30)]
    assert loop.coalescer.refreshes_granted == 1


async def test_later_wake_waits_for_spacing_from_the_last_refresh(
    autojump_clock: trio.testing.MockClock,
) -> None:
    loop = DaemonLoop(RefreshCoalescer(spacing=30))
    loop.coalescer.mark_refreshed(0.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop.run)
        await trio.sleep_until(10)
        loop.wake()
        await trio.sleep_until(45)
        loop.wake()  # last refresh at 30 -> granted at 60
        await trio.sleep_until(200)
        loop.wake()  # quiet for long enough -> granted at once
        await trio.sleep_until(3600)
        nursery.cancel_scope.cancel()
    assert loop.grants == [pytest.approx(30), pytest.approx(60), pytest.approx(200)]


async def test_urgent_wake_is_granted_at_once(autojump_clock: trio.testing.MockClock) -> None:
    loop = DaemonLoop(RefreshCoalescer(spacing=30))
    loop.coalescer.mark_refreshed(0.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop.run)
        await trio.sleep_until(5)
        loop.wake(urgent=True)  # the listener reconnected
        await trio.sleep_until(6)
        loop.wake()
        await trio.sleep_until(3600)
        nursery.cancel_scope.cancel()
    assert loop.grants == [pytest.approx(5), pytest.approx(35)]


async def test_held_wakes_are_granted_after_release(
    autojump_clock: trio.testing.MockClock,
) -> None:
    loop = DaemonLoop(RefreshCoalescer(spacing=30))
    loop.coalescer.mark_refreshed(0.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop.run)
        await trio.sleep_until(5)
        loop.coalescer.hold()  # the store became unavailable
        for t in (10, 20, 50, 90):
            await trio.sleep_until(t)
            loop.wake()
        await trio.sleep_until(100)
        assert loop.grants == []  # kept, not granted, no timer armed for them
        assert loop.coalescer.pending
        iterations = loop.iterations
        await trio.sleep_until(1000)
        assert loop.iterations == iterations  # held: the loop sleeps
        loop.release()  # spacing since the last refresh (0) has long passed
        await trio.sleep_until(3600)
        nursery.cancel_scope.cancel()
    assert loop.grants == [pytest.approx(1000)]
    assert loop.coalescer.wakes_received == 4


async def test_release_before_spacing_grants_at_last_plus_spacing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    loop = DaemonLoop(RefreshCoalescer(spacing=30))
    loop.coalescer.mark_refreshed(0.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop.run)
        await trio.sleep_until(1)
        loop.coalescer.hold()
        await trio.sleep_until(2)
        loop.wake()
        await trio.sleep_until(10)
        loop.release()
        await trio.sleep_until(3600)
        nursery.cancel_scope.cancel()
    assert loop.grants == [pytest.approx(30)]


async def test_deadlines_and_refreshes_share_the_one_timer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    loop = DaemonLoop(RefreshCoalescer(spacing=30))
    loop.coalescer.mark_refreshed(0.0)
    loop.deadlines.set(7, 100.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop.run)
        await trio.sleep_until(90)
        loop.wake()  # granted at once (last refresh at 0)
        await trio.sleep_until(95)
        loop.wake()  # due at 120, after the deadline at 100
        await trio.sleep_until(3600)
        nursery.cancel_scope.cancel()
    assert loop.fired == [(100.0, 7)]
    assert loop.grants == [pytest.approx(90), pytest.approx(120)]
    # first pass, two wakes, the deadline, the grant: five wake-ups in an hour
    assert loop.iterations == 5
