"""The daemon's real loop (coordinator.daemon.loop) under trio's MockClock, no database.

The loop is given a refresh and a dispatch that only record what they are asked;
deadlines, the coalescer and admission are the real core objects the daemon uses.
Wall time is derived from trio time, so the mock clock moves both together.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import attrs
import trio
import trio.testing

from coordinator.core.admission import Admission, Ticket
from coordinator.core.coalescer import RefreshCoalescer
from coordinator.core.deadlines import DeadlineSet
from coordinator.daemon.loop import DispatchLoop

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

ORIGIN = datetime(2026, 1, 1, tzinfo=UTC)


@attrs.define(eq=False)
class TrioWallClock:
    """Wall time that advances with trio's (mock) clock."""

    def now(self) -> datetime:
        return ORIGIN + timedelta(seconds=trio.current_time())


@attrs.define(eq=False)
class Rig:
    """A DispatchLoop with recording collaborators."""

    loop: DispatchLoop
    refreshed_at: list[float] = attrs.field(factory=list)
    dispatched: list[tuple[float, Ticket]] = attrs.field(factory=list)
    due: list[tuple[float, int]] = attrs.field(factory=list)
    hold_calls: trio.Event | None = None

    @property
    def deadlines(self) -> DeadlineSet:
        return self.loop.deadlines

    @property
    def admission(self) -> Admission:
        return self.loop.admission


def rig(*, spacing: float = 30.0, slots: int = 4) -> Rig:
    clock = TrioWallClock()
    admission = Admission(slots=slots)
    holder: list[Rig] = []

    def on_due(job_id: int, at: float) -> None:
        holder[0].due.append((trio.current_time(), job_id))
        admission.offer(Ticket(job_id=job_id, priority="background", due=at))

    async def refresh() -> None:
        holder[0].refreshed_at.append(trio.current_time())
        loop.coalescer.mark_refreshed(trio.current_time())

    async def dispatch(ticket: Ticket, _seq: int) -> None:
        r = holder[0]
        r.dispatched.append((trio.current_time(), ticket))
        if r.hold_calls is not None:
            await r.hold_calls.wait()
        admission.release(ticket.job_id)
        loop.kick()

    loop = DispatchLoop(
        clock=clock,
        deadlines=DeadlineSet(),
        coalescer=RefreshCoalescer(spacing=spacing),
        admission=admission,
        on_due=on_due,
        refresh=refresh,
        dispatch=dispatch,
    )
    # The startup refresh has happened: later wakes are spaced from it.
    loop.coalescer.mark_refreshed(0.0)
    holder.append(Rig(loop=loop))
    return holder[0]


async def running(r: Rig, body: Callable[[], Awaitable[Any]]) -> None:
    async with trio.open_nursery() as calls:
        calls.start_soon(r.loop.run, calls)
        await body()
        calls.cancel_scope.cancel()


def wall(seconds: float) -> float:
    return (ORIGIN + timedelta(seconds=seconds)).timestamp()


async def test_a_due_deadline_is_dispatched_at_its_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = rig()
    r.deadlines.set(7, wall(90.0))

    async def body() -> None:
        await trio.sleep(200)

    await running(r, body)
    assert r.due == [(90.0, 7)]
    assert [(t, ticket.job_id) for t, ticket in r.dispatched] == [(90.0, 7)]
    assert r.refreshed_at == []  # no wake, no refresh


async def test_with_nothing_armed_the_loop_sleeps_without_a_timer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = rig()

    async def body() -> None:
        await trio.sleep(1)
        assert r.loop.next_wake_at() == float("inf")
        turns = r.loop.turns
        await trio.sleep(10_000)
        assert r.loop.turns == turns  # not one turn in ten thousand seconds

    await running(r, body)


async def test_a_burst_of_wakes_is_one_refresh_per_spacing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = rig(spacing=30.0)

    async def body() -> None:
        await trio.sleep(5)
        for _ in range(10):
            r.loop.wake()
            await trio.sleep(0.1)
        await trio.sleep(60)
        r.loop.wake()  # long after: granted at once (spacing has passed)
        await trio.sleep(1)

    await running(r, body)
    # The first burst waits for the spacing counted from the startup refresh (t=0).
    assert r.refreshed_at == [30.0, 66.0]


async def test_an_urgent_wake_is_not_spaced(autojump_clock: trio.testing.MockClock) -> None:
    r = rig(spacing=30.0)

    async def body() -> None:
        await trio.sleep(2)
        r.loop.wake(urgent=True)
        await trio.sleep(1)

    await running(r, body)
    assert r.refreshed_at == [2.0]


async def test_admission_order_is_priority_then_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = rig(slots=1)
    r.hold_calls = trio.Event()

    async def body() -> None:
        # One slot, taken by a first call; then four tickets wait.
        r.admission.offer(Ticket(job_id=1, priority="background", due=0.0))
        r.loop.kick()
        await trio.sleep(1)
        r.admission.offer(Ticket(job_id=2, priority="background", due=5.0))
        r.admission.offer(Ticket(job_id=3, priority="interactive", due=9.0))
        r.admission.offer(Ticket(job_id=4, priority="background", due=1.0))
        r.admission.offer(Ticket(job_id=5, priority="interactive", due=2.0))
        r.loop.kick()
        await trio.sleep(1)
        assert [t.job_id for _, t in r.dispatched] == [1]
        assert r.hold_calls is not None
        r.hold_calls.set()  # every call finishes at once from now on
        await trio.sleep(1)

    await running(r, body)
    assert [t.job_id for _, t in r.dispatched] == [1, 5, 3, 4, 2]


async def test_an_overdue_deadline_runs_once_not_per_missed_tick(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = rig()
    r.deadlines.set(1, wall(-3600.0))  # an hour overdue

    async def body() -> None:
        await trio.sleep(10)

    await running(r, body)
    assert [t.job_id for _, t in r.dispatched] == [1]
    assert r.dispatched[0][0] == 0.0


async def test_a_kick_takes_a_turn_without_waiting_for_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = rig()
    r.deadlines.set(1, wall(500.0))

    async def body() -> None:
        await trio.sleep(3)
        r.admission.offer(Ticket(job_id=2, priority="interactive", due=3.0))
        r.loop.kick()
        await trio.sleep(0.5)
        assert [(t, x.job_id) for t, x in r.dispatched] == [(3.0, 2)]
        await trio.sleep(600)

    await running(r, body)
    assert [(t, x.job_id) for t, x in r.dispatched] == [(3.0, 2), (500.0, 1)]


async def test_a_failed_refresh_is_retried_at_the_policy_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = rig(spacing=30.0)
    attempts: list[float] = []

    async def failing_refresh() -> None:
        attempts.append(trio.current_time())
        if len(attempts) < 3:
            r.loop.coalescer.refresh_failed(trio.current_time() + 2.0)
        else:
            r.loop.coalescer.mark_refreshed(trio.current_time())

    r.loop.refresh = failing_refresh

    async def body() -> None:
        await trio.sleep(40)
        r.loop.wake()
        await trio.sleep(100)

    await running(r, body)
    assert attempts == [40.0, 42.0, 44.0]


async def test_turn_now_admits_in_the_callers_task_while_the_loop_sleeps(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = rig()

    async def body() -> None:
        await trio.sleep(1)
        turns = r.loop.turns
        r.admission.offer(Ticket(job_id=5, priority="interactive", due=wall(1.0)))
        r.loop.turn_now()
        # Admitted at once: its task is started (not yet run), and the loop itself was
        # not woken for it (no kick: its own turn count moves only by the inline one).
        assert r.loop.starting == 1
        assert r.loop.turns == turns + 1
        await trio.testing.wait_all_tasks_blocked()
        assert r.loop.starting == 0
        assert [ticket.job_id for _t, ticket in r.dispatched] == [5]

    await running(r, body)


async def test_turn_now_takes_a_due_deadline_first_and_keeps_priority_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = rig(slots=1)

    async def body() -> None:
        await trio.sleep(1)
        # A deadline due now whose loop turn has not run yet, and a background manual
        # ticket: the inline turn pops the deadline too, and admission orders them.
        r.deadlines.set(8, wall(0.5))
        r.admission.offer(Ticket(job_id=5, priority="background", due=wall(1.0)))
        r.loop.turn_now()
        await trio.testing.wait_all_tasks_blocked()
        assert [ticket.job_id for _t, ticket in r.dispatched][:1] == [8]

    await running(r, body)


async def test_turn_now_only_kicks_when_a_refresh_is_due_or_the_loop_is_busy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = rig(spacing=30.0)
    refreshing = trio.Event()
    release = trio.Event()
    plain = r.loop.refresh

    async def slow_refresh() -> None:
        refreshing.set()
        await release.wait()
        await plain()

    r.loop.refresh = slow_refresh

    async def body() -> None:
        await trio.sleep(40)
        r.loop.wake()  # due: the loop's own turn refreshes first
        r.admission.offer(Ticket(job_id=5, priority="interactive", due=wall(40.0)))
        r.loop.turn_now()
        assert r.loop.starting == 0  # nothing admitted inline: a refresh was due
        await refreshing.wait()
        r.admission.offer(Ticket(job_id=6, priority="interactive", due=wall(40.0)))
        r.loop.turn_now()  # mid-refresh: only a kick
        assert r.loop.starting == 0
        assert r.dispatched == []
        release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(ticket.job_id for _t, ticket in r.dispatched) == [5, 6]

    await running(r, body)
