"""DeadlineSet: one timer on the earliest saved deadline (promise 2, style note 4)."""

from __future__ import annotations

import math
import random

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from coordinator.core.deadlines import DeadlineSet


def test_empty() -> None:
    deadlines = DeadlineSet()
    assert len(deadlines) == 0
    assert deadlines.earliest() is None
    assert deadlines.pop_due(math.inf) == []
    assert deadlines.get(1) is None
    assert 1 not in deadlines
    assert list(deadlines.items()) == []


def test_set_get_contains_len_items() -> None:
    deadlines = DeadlineSet()
    deadlines.set(1, 10.0)
    deadlines.set(2, 5.0)
    assert len(deadlines) == 2
    assert 1 in deadlines
    assert 3 not in deadlines
    assert deadlines.get(1) == 10.0
    assert sorted(deadlines.items()) == [(1, 10.0), (2, 5.0)]
    assert deadlines.earliest() == (5.0, 2)


def test_replace_moves_the_deadline_both_ways() -> None:
    deadlines = DeadlineSet()
    deadlines.set(1, 10.0)
    deadlines.set(2, 20.0)
    deadlines.set(1, 30.0)
    assert deadlines.earliest() == (20.0, 2)
    assert len(deadlines) == 2
    deadlines.set(1, 1.0)
    assert deadlines.earliest() == (1.0, 1)
    assert deadlines.get(1) == 1.0


def test_stale_copy_with_the_same_value_is_not_revived() -> None:
    # 5 -> 6 -> 5 leaves two (5.0, 1) entries in the heap; only one is live.
    deadlines = DeadlineSet()
    deadlines.set(1, 5.0)
    deadlines.set(1, 6.0)
    deadlines.set(1, 5.0)
    assert deadlines.pop_due(100.0) == [(5.0, 1)]
    assert len(deadlines) == 0
    assert deadlines.earliest() is None


def test_setting_the_same_value_is_a_no_op() -> None:
    deadlines = DeadlineSet()
    for _ in range(1000):
        deadlines.set(1, 5.0)
    assert len(deadlines._heap) == 1


def test_ties_are_broken_by_job_id() -> None:
    deadlines = DeadlineSet()
    for job_id in (7, 3, 9, 1):
        deadlines.set(job_id, 42.0)
    assert deadlines.earliest() == (42.0, 1)
    assert deadlines.pop_due(42.0) == [(42.0, 1), (42.0, 3), (42.0, 7), (42.0, 9)]


def test_discard() -> None:
    deadlines = DeadlineSet()
    deadlines.set(1, 1.0)
    deadlines.set(2, 2.0)
    deadlines.discard(1)
    deadlines.discard(1)  # harmless twice
    deadlines.discard(99)  # and for an unknown job
    assert 1 not in deadlines
    assert deadlines.earliest() == (2.0, 2)
    assert deadlines.pop_due(10.0) == [(2.0, 2)]


def test_pop_due_takes_only_what_is_due_earliest_first_once() -> None:
    deadlines = DeadlineSet()
    deadlines.set(1, 30.0)
    deadlines.set(2, 10.0)
    deadlines.set(3, 20.0)
    deadlines.set(4, 40.0)
    assert deadlines.pop_due(9.99) == []
    assert deadlines.pop_due(30.0) == [(10.0, 2), (20.0, 3), (30.0, 1)]
    assert deadlines.pop_due(30.0) == []  # an overdue deadline is owed once
    assert len(deadlines) == 1
    assert deadlines.earliest() == (40.0, 4)


def test_overdue_deadline_is_returned_once_however_late() -> None:
    deadlines = DeadlineSet()
    deadlines.set(1, 0.0)
    assert deadlines.pop_due(1e9) == [(0.0, 1)]
    assert deadlines.pop_due(2e9) == []


def test_clear() -> None:
    deadlines = DeadlineSet()
    for job_id in range(100):
        deadlines.set(job_id, float(job_id))
    deadlines.clear()
    assert len(deadlines) == 0
    assert deadlines.earliest() is None
    deadlines.set(5, 5.0)
    assert deadlines.earliest() == (5.0, 5)


def test_infinite_deadlines_are_allowed_nan_is_not() -> None:
    deadlines = DeadlineSet()
    deadlines.set(1, math.inf)
    deadlines.set(2, -math.inf)
    assert deadlines.earliest() == (-math.inf, 2)
    with pytest.raises(ValueError, match="NaN"):
        deadlines.set(3, math.nan)
    assert 3 not in deadlines


def test_memory_stays_bounded_under_churn() -> None:
    rnd = random.Random(7)
    deadlines = DeadlineSet()
    live = 1000
    for job_id in range(live):
        deadlines.set(job_id, rnd.random())
    for _ in range(100_000):
        deadlines.set(rnd.randrange(live), rnd.random() * 1000)
        assert len(deadlines._heap) <= 3 * len(deadlines) + 64
    assert len(deadlines) == live
    for job_id in range(live - 10):
        deadlines.discard(job_id)
    assert len(deadlines._heap) <= 3 * len(deadlines) + 64
    expected = sorted((at, job_id) for job_id, at in deadlines.items())
    assert len(expected) == 10
    assert deadlines.pop_due(math.inf) == expected


# -- model-based property -------------------------------------------------------------

_job_ids = st.integers(min_value=0, max_value=20)
_times = st.integers(min_value=0, max_value=50).map(float)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), _job_ids, _times),
        st.tuples(st.just("discard"), _job_ids, st.just(0.0)),
        st.tuples(st.just("pop_due"), st.just(0), _times),
        st.tuples(st.just("earliest"), st.just(0), st.just(0.0)),
    ),
    max_size=300,
)


@given(_ops)
def test_behaves_like_a_dict_sorted_by_deadline_then_job(ops: list[tuple[str, int, float]]) -> None:
    deadlines = DeadlineSet()
    model: dict[int, float] = {}
    for op, job_id, at in ops:
        if op == "set":
            deadlines.set(job_id, at)
            model[job_id] = at
        elif op == "discard":
            deadlines.discard(job_id)
            model.pop(job_id, None)
        elif op == "pop_due":
            expected = sorted((t, j) for j, t in model.items() if t <= at)
            for _, j in expected:
                del model[j]
            assert deadlines.pop_due(at) == expected
        else:
            expected_min = min(((t, j) for j, t in model.items()), default=None)
            assert deadlines.earliest() == expected_min
        assert len(deadlines) == len(model)
        assert dict(deadlines.items()) == model
        assert len(deadlines._heap) <= 3 * len(model) + 64


_batches = st.lists(
    st.one_of(
        st.lists(st.tuples(_times, _job_ids), max_size=40).map(lambda b: ("set_many", b)),
        st.tuples(_job_ids, _times).map(lambda p: ("set", [(p[1], p[0])])),
        _job_ids.map(lambda j: ("discard", [(0.0, j)])),
        _times.map(lambda t: ("pop_due", [(t, 0)])),
    ),
    max_size=60,
)


@given(_batches)
def test_set_many_is_set_for_each(ops: list[tuple[str, list[tuple[float, int]]]]) -> None:
    """Many at once (a refresh arming everything) means what a ``set`` each would, in
    order, whether the new entries are heapified together or pushed one by one."""
    deadlines = DeadlineSet()
    model: dict[int, float] = {}
    for op, items in ops:
        if op == "set_many":
            deadlines.set_many(list(items))
            model.update({job_id: at for at, job_id in items})
        elif op == "set":
            deadlines.set(items[0][1], items[0][0])
            model[items[0][1]] = items[0][0]
        elif op == "discard":
            deadlines.discard(items[0][1])
            model.pop(items[0][1], None)
        else:
            at = items[0][0]
            expected = sorted((t, j) for j, t in model.items() if t <= at)
            for _, j in expected:
                del model[j]
            assert deadlines.pop_due(at) == expected
        assert dict(deadlines.items()) == model
        assert deadlines.earliest() == min(((t, j) for j, t in model.items()), default=None)
        assert len(deadlines._heap) <= 3 * len(model) + 64


def test_set_many_with_a_nan_sets_nothing() -> None:
    deadlines = DeadlineSet()
    deadlines.set(1, 1.0)
    with pytest.raises(ValueError, match="deadline of job 3 is NaN"):
        deadlines.set_many([(2.0, 2), (math.nan, 3), (0.5, 1)])
    assert dict(deadlines.items()) == {1: 1.0}


# -- driven from trio, the way the daemon arms its one timer ---------------------------


@attrs.define(eq=False)
class TimerLoop:
    """The daemon's deadline loop in miniature: sleep until the earliest deadline or a
    change, fire what is due, repeat.
    """

    deadlines: DeadlineSet = attrs.field(factory=DeadlineSet)
    fired: list[tuple[float, int, float]] = attrs.field(factory=list)  # (at, job, when)
    iterations: int = 0
    _changed: trio.Event = attrs.field(factory=trio.Event)

    def set(self, job_id: int, at: float) -> None:
        before = self.deadlines.earliest()
        self.deadlines.set(job_id, at)
        if self.deadlines.earliest() != before:  # a change matters only if it moves the timer
            self._changed.set()

    def discard(self, job_id: int) -> None:
        self.deadlines.discard(job_id)  # the timer may now fire early: harmless, it re-arms

    async def run(self) -> None:
        while True:
            self.iterations += 1
            now = trio.current_time()
            for at, job_id in self.deadlines.pop_due(now):
                self.fired.append((at, job_id, now))
            earliest = self.deadlines.earliest()
            with trio.move_on_at(math.inf if earliest is None else earliest[0]):
                await self._changed.wait()
            self._changed = trio.Event()


async def test_empty_set_sleeps_forever(autojump_clock: trio.testing.MockClock) -> None:
    loop = TimerLoop()
    start = trio.current_time()
    with trio.move_on_after(3600):
        await loop.run()
    assert trio.current_time() - start == pytest.approx(3600)
    assert loop.iterations == 1  # it never woke up
    assert loop.fired == []


async def test_deadlines_fire_at_their_time_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    loop = TimerLoop()
    loop.deadlines.set(1, 100.0)  # rebuilt at startup, before the loop runs
    loop.deadlines.set(2, 50.0)
    loop.deadlines.set(3, 50.0)
    with trio.move_on_after(1000):
        await loop.run()
    assert [(at, job) for at, job, _ in loop.fired] == [(50.0, 2), (50.0, 3), (100.0, 1)]
    assert all(when == pytest.approx(at) for at, _, when in loop.fired)
    # The first pass, then one wake-up per distinct deadline: no ticking.
    assert loop.iterations == 3


async def test_moving_a_deadline_re_arms_the_one_timer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    loop = TimerLoop()
    loop.set(1, 500.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop.run)
        await trio.sleep(10)
        loop.set(2, 20.0)  # earlier: wakes the loop, which re-arms at 20
        await trio.sleep(20)
        loop.set(1, 40.0)  # moved earlier
        loop.discard(2)  # already fired; harmless
        await trio.sleep(100)
        nursery.cancel_scope.cancel()
    assert [(at, job) for at, job, _ in loop.fired] == [(20.0, 2), (40.0, 1)]
    assert [when for _, _, when in loop.fired] == [pytest.approx(20.0), pytest.approx(40.0)]


@given(_ops, st.integers(min_value=1, max_value=5))
def test_first_where_is_the_earliest_accepted(
    ops: list[tuple[str, int, float]], modulus: int
) -> None:
    deadlines = DeadlineSet()
    model: dict[int, float] = {}
    for op, job_id, at in ops:
        if op == "set":
            deadlines.set(job_id, at)
            model[job_id] = at
        elif op == "discard":
            deadlines.discard(job_id)
            model.pop(job_id, None)
        elif op == "pop_due":
            for _, j in deadlines.pop_due(at):
                del model[j]
        # Stale copies in the heap are never the answer (only live entries count).
        expected = min(((t, j) for j, t in model.items() if j % modulus == 0), default=None)
        assert deadlines.first_where(lambda j: j % modulus == 0) == expected


def test_first_where_reads_only_the_deadlines_ahead_of_its_answer() -> None:
    deadlines = DeadlineSet()
    deadlines.set_many([(float(i), i) for i in range(100_000)])
    asked: list[int] = []

    def accept(job_id: int) -> bool:
        asked.append(job_id)
        return job_id >= 10

    assert deadlines.first_where(accept) == (10.0, 10)
    assert asked == list(range(11))  # best-first: not the 100,000
    assert deadlines.first_where(lambda _j: False) is None


def test_first_where_past_its_walk_budget_still_finds_the_earliest() -> None:
    """Past its budget of entries the best-first walk gives way to one pass over the
    live deadlines (walking the whole heap, stale copies included, took 23 s at a
    million where the pass takes 0.3 s): the answer is the same, late or absent."""
    deadlines = DeadlineSet()
    # Job ids inserted in the reverse of their deadlines' order, with stale copies.
    deadlines.set_many([(float(20_000 - i), i) for i in range(20_000)])
    for i in range(0, 20_000, 2):
        deadlines.set(i, float(20_000 - i) + 0.5)
    wanted = {5, 1_001, 7_777}  # late: after ~12,000 others
    assert deadlines.first_where(wanted.__contains__) == (12_223.0, 7_777)
    assert deadlines.first_where(lambda _j: False) is None
    # And within the budget, as before.
    assert deadlines.first_where(lambda j: j >= 19_990) == (1.0, 19_999)
