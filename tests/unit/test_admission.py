"""Admission: due work waits only for a slot, in priority then FIFO order (promise 4)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from coordinator.core.admission import Admission, Coverage, Ticket


def ticket(job_id: int, **kwargs: Any) -> Ticket:
    fields: dict[str, Any] = {"priority": "background", "due": 0.0, "pool": None}
    fields.update(kwargs)
    return Ticket(job_id=job_id, **fields)


def ids(tickets: list[Ticket]) -> list[int]:
    return [t.job_id for t in tickets]


# -- Ticket -------------------------------------------------------------------------------


def test_ticket_defaults_and_claim_fields() -> None:
    t = Ticket(job_id=1, priority="interactive", due=5.0, pool="billing", run_id=9)
    assert t.scheduled_for is None
    assert t.schedule_version is None
    at = datetime(2026, 1, 1, tzinfo=UTC)
    t2 = attrs.evolve(t, scheduled_for=at, schedule_version=3)
    assert (t2.scheduled_for, t2.schedule_version) == (at, 3)


def test_ticket_is_keyword_only_and_frozen() -> None:
    with pytest.raises(TypeError):
        Ticket(1, "background", 0.0)  # type: ignore[call-arg]
    t = ticket(1)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        t.due = 3.0  # type: ignore[misc]


def test_ticket_rejects_unknown_priority_and_nan_due() -> None:
    with pytest.raises(ValueError, match="priority"):
        ticket(1, priority="urgent")
    with pytest.raises(ValueError, match="NaN"):
        ticket(1, due=math.nan)


# -- queueing -------------------------------------------------------------------------------


def test_slots_must_be_positive() -> None:
    with pytest.raises(ValueError, match="slots"):
        Admission(slots=0)


def test_one_outstanding_ticket_per_job() -> None:
    admission = Admission(slots=1)
    assert admission.offer(ticket(1))
    assert not admission.offer(ticket(1, due=-5.0))  # already waiting
    assert admission.is_waiting(1)
    assert ids(admission.admit()) == [1]
    assert admission.is_running(1)
    assert not admission.is_waiting(1)
    assert not admission.offer(ticket(1))  # already running
    assert admission.release(1) == ticket(1)
    assert not admission.is_running(1)
    assert admission.offer(ticket(1))  # free to be owed again


def test_release_of_an_unknown_job_is_harmless() -> None:
    admission = Admission(slots=1)
    assert admission.release(42) is None
    admission.offer(ticket(1))
    admission.admit()
    assert admission.release(1) is not None
    assert admission.release(1) is None
    assert admission.running_count == 0


def test_order_is_priority_then_due_then_arrival() -> None:
    admission = Admission(slots=10)
    admission.offer(ticket(1, priority="background", due=1.0))
    admission.offer(ticket(2, priority="interactive", due=9.0))
    admission.offer(ticket(3, priority="background", due=0.5))
    admission.offer(ticket(4, priority="interactive", due=3.0))
    admission.offer(ticket(5, priority="background", due=1.0))  # same due as 1, later
    admission.offer(ticket(0, priority="background", due=1.0))  # same due, later still
    assert ids(list(admission.waiting())) == [4, 2, 3, 1, 5, 0]
    assert ids(admission.admit()) == [4, 2, 3, 1, 5, 0]


def test_global_slots_bound_admission() -> None:
    admission = Admission(slots=2)
    for job_id in range(5):
        admission.offer(ticket(job_id, due=float(job_id)))
    assert ids(admission.admit()) == [0, 1]
    assert admission.admit() == []
    assert admission.free_slots == 0
    assert admission.running_count == 2
    assert admission.waiting_count == 3
    admission.release(0)
    assert admission.free_slots == 1
    assert ids(admission.admit()) == [2]


def test_pool_capacity_and_no_head_of_line_blocking() -> None:
    admission = Admission(slots=10)
    admission.set_capacity("billing", 1)
    admission.offer(ticket(1, pool="billing", due=1.0))
    admission.offer(ticket(2, pool="billing", due=2.0))  # blocked by the pool, not ...
    admission.offer(ticket(3, pool="mail", due=3.0))  # ... holding back these
    admission.offer(ticket(4, due=4.0))
    assert ids(admission.admit()) == [1, 3, 4]
    assert ids(list(admission.waiting())) == [2]
    admission.release(1)
    assert ids(admission.admit()) == [2]


def test_full_pool_lets_later_work_use_the_last_global_slot() -> None:
    admission = Admission(slots=2)
    admission.set_capacity("billing", 1)
    admission.offer(ticket(1, pool="billing", priority="interactive"))
    admission.offer(ticket(2, pool="billing", priority="interactive"))
    admission.offer(ticket(3, priority="background", due=100.0))
    assert ids(admission.admit()) == [1, 3]


def test_capacity_zero_means_unavailable_and_tickets_keep_their_place() -> None:
    admission = Admission(slots=5)
    admission.set_capacity("reports", 0)
    admission.offer(ticket(1, pool="reports", due=1.0))
    admission.offer(ticket(2, pool="reports", due=2.0))
    assert admission.admit() == []
    assert admission.capacity("reports") == 0
    admission.set_capacity("reports", 1)  # a worker connected
    assert ids(admission.admit()) == [1]
    admission.set_capacity("reports", None)  # no limit but the global one
    assert admission.capacity("reports") is None
    assert ids(admission.admit()) == [2]


def test_claim_ahead_admits_beyond_a_pool_capacity_within_the_global_slots() -> None:
    """``ahead`` runs of a pool with workers may be admitted (claimed) beyond its
    capacity, to wait for a slot in the daemon; never beyond ``slots``, never for a pool
    without workers, and a pool without a capacity is unaffected."""
    admission = Admission(slots=6, ahead=2)
    admission.set_capacity("p", 3)
    admission.set_capacity("gone", 0)
    for job_id in range(8):
        admission.offer(ticket(job_id, pool="p", due=float(job_id)))
    admission.offer(ticket(20, pool="gone"))
    assert ids(admission.admit()) == [0, 1, 2, 3, 4]  # capacity 3, and 2 ahead
    assert admission.capacity("p") == 3  # (what the workers announced)
    admission.free_slot(0)  # a call ended: a slot for the next one ahead
    assert ids(admission.admit()) == [5]
    admission.offer(ticket(30, due=100.0))  # no pool: only the global slots
    assert ids(admission.admit()) == [30]
    assert admission.admit() == []  # 6 admitted: the global bound holds
    assert ids(list(admission.waiting())) == [20, 6, 7]


def test_a_namespace_no_worker_may_run_waits_and_the_others_go_on() -> None:
    """Workers confined to namespaces (their tokens' scope) split a pool: a namespace
    none of them may run waits, keeping its place, as a type without a worker does; a
    ticket whose namespace is not known counts against the pool's total only."""
    admission = Admission(slots=10)
    admission.set_capacity("t", 3)
    admission.set_coverage("t", Coverage(everywhere=0, scoped={"reports": 2, "hr": 1}))
    admission.offer(ticket(1, pool="t", namespace="billing", due=1.0))
    admission.offer(ticket(2, pool="t", namespace="reports", due=2.0))
    admission.offer(ticket(3, pool="t", namespace="reports", due=3.0))
    admission.offer(ticket(4, pool="t", namespace="reports", due=4.0))  # past its share
    admission.offer(ticket(5, pool="t", due=5.0))  # namespace not known
    assert ids(admission.admit()) == [2, 3, 5]  # the pool's 3: billing still waits
    assert ids(list(admission.waiting())) == [1, 4]
    admission.release(5)
    admission.offer(ticket(6, pool="t", namespace="hr", due=6.0))
    assert ids(admission.admit()) == [6]
    admission.release(2)
    assert ids(admission.admit()) == [4]
    # A worker reaching every namespace connects: billing's ticket goes first, in its place.
    admission.set_capacity("t", 4)
    admission.set_coverage("t", Coverage(everywhere=1, scoped={"reports": 2, "hr": 1}))
    assert ids(admission.admit()) == [1]
    # No confined worker any more: every namespace shares the pool.
    admission.set_coverage("t", None)
    admission.release(1)
    admission.offer(ticket(7, pool="t", namespace="billing", due=7.0))
    assert ids(admission.admit()) == [7]


def test_claim_ahead_applies_to_a_namespaces_share_too() -> None:
    admission = Admission(slots=10, ahead=1)
    admission.set_capacity("t", 4)
    admission.set_coverage("t", Coverage(everywhere=0, scoped={"a": 1, "b": 3}))
    for job_id in range(4):
        admission.offer(ticket(job_id, pool="t", namespace="a", due=float(job_id)))
    admission.offer(ticket(9, pool="t", namespace="c", due=9.0))  # no worker: no ahead
    assert ids(admission.admit()) == [0, 1]  # a's one slot, and one ahead


def test_claim_ahead_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="ahead"):
        Admission(slots=1, ahead=-1)


def test_lowering_capacity_stops_nothing_but_blocks_new_work() -> None:
    admission = Admission(slots=5)
    for job_id in range(4):
        admission.offer(ticket(job_id, pool="p", due=float(job_id)))
    assert ids(admission.admit()) == [0, 1, 2, 3]
    for job_id in range(4, 6):
        admission.offer(ticket(job_id, pool="p", due=float(job_id)))
    admission.set_capacity("p", 2)
    assert admission.running_count == 4
    admission.release(0)
    admission.release(1)
    assert admission.admit() == []  # 2 still run: at capacity
    admission.release(2)
    assert ids(admission.admit()) == [4]


def test_negative_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Admission(slots=1).set_capacity("p", -1)


def test_withdraw() -> None:
    admission = Admission(slots=1)
    admission.offer(ticket(1, due=1.0))
    admission.offer(ticket(2, due=2.0))
    assert admission.withdraw(1) == ticket(1, due=1.0)
    assert admission.withdraw(1) is None
    assert not admission.is_waiting(1)
    assert admission.waiting_count == 1
    assert ids(admission.admit()) == [2]
    assert admission.withdraw(2) is None  # running, not waiting


def test_withdraw_then_offer_again_keeps_one_ticket() -> None:
    admission = Admission(slots=5)
    admission.offer(ticket(1, due=1.0))
    admission.withdraw(1)
    admission.offer(ticket(1, due=5.0))
    admission.offer(ticket(2, due=3.0))
    assert [(t.job_id, t.due) for t in admission.admit()] == [(2, 3.0), (1, 5.0)]


def test_withdrawal_churn_keeps_heaps_bounded() -> None:
    admission = Admission(slots=1)
    admission.offer(ticket(-1, pool="keep"))
    for job_id in range(10_000):
        admission.offer(ticket(job_id, pool=f"p{job_id % 7}", due=float(job_id)))
        admission.withdraw(job_id)
    entries = sum(len(heap) for heap in admission._heaps.values())
    assert entries <= 3 * admission.waiting_count + 64
    assert ids(admission.admit()) == [-1]


def test_close_stops_admission_for_good_but_keeps_tickets_visible() -> None:
    admission = Admission(slots=2)
    admission.offer(ticket(1))
    assert ids(admission.admit()) == [1]
    admission.offer(ticket(2))
    admission.close()
    assert admission.closed
    assert admission.admit() == []
    assert not admission.offer(ticket(3))
    assert ids(list(admission.waiting())) == [2]
    assert ids(list(admission.running())) == [1]
    admission.release(1)  # admitted work still finishes
    assert admission.admit() == []
    assert admission.is_waiting(2)


# -- property: bounds, no starvation, order ---------------------------------------------

_POOLS: list[str | None] = [None, "a", "b", "c"]
_NAMESPACES: list[str | None] = [None, "x", "y"]


class AdmissionMachine(RuleBasedStateMachine):
    """Drives Admission against a plain model and checks every admit() step by step."""

    #: Tickets a pool with workers may have beyond its capacity (claim_ahead).
    AHEAD = 0

    def __init__(self) -> None:
        super().__init__()
        self.slots = 3
        self.admission = Admission(slots=self.slots, ahead=self.AHEAD)
        self.capacity: dict[str, int] = {}
        self.coverage: dict[str, Coverage] = {}
        # job_id -> (ticket, arrival) for waiting tickets; running tickets by job.
        self.waiting: dict[int, tuple[Ticket, int]] = {}
        self.running: dict[int, Ticket] = {}
        self.arrivals = 0

    def pool_running(self, pool: str | None) -> int:
        return sum(1 for t in self.running.values() if t.pool == pool)

    def has_room(self, t: Ticket) -> bool:
        pool = t.pool
        if len(self.running) >= self.slots:
            return False
        if pool is None:
            return True
        if pool in self.capacity:
            capacity = self.capacity[pool]
            if not (capacity > 0 and self.pool_running(pool) < capacity + self.AHEAD):
                return False
        coverage = self.coverage.get(pool)
        if coverage is None or t.namespace is None:
            return True
        share = coverage.capacity(t.namespace)
        here = sum(1 for r in self.running.values() if (r.pool, r.namespace) == (pool, t.namespace))
        return share > 0 and here < share + self.AHEAD

    def eligible(self) -> list[tuple[int, float, int, int]]:
        return [
            (0 if t.priority == "interactive" else 1, t.due, arrival, job_id)
            for job_id, (t, arrival) in self.waiting.items()
            if self.has_room(t)
        ]

    @rule(
        job_id=st.integers(0, 15),
        priority=st.sampled_from(["interactive", "background"]),
        due=st.integers(0, 5).map(float),
        pool=st.sampled_from(_POOLS),
        namespace=st.sampled_from(_NAMESPACES),
    )
    def offer(
        self, job_id: int, priority: str, due: float, pool: str | None, namespace: str | None
    ) -> None:
        t = Ticket(job_id=job_id, priority=priority, due=due, pool=pool, namespace=namespace)  # type: ignore[arg-type]
        expected = job_id not in self.waiting and job_id not in self.running
        assert self.admission.offer(t) == expected
        if expected:
            self.waiting[job_id] = (t, self.arrivals)
            self.arrivals += 1

    @rule(job_id=st.integers(0, 15))
    def withdraw(self, job_id: int) -> None:
        entry = self.waiting.pop(job_id, None)
        assert self.admission.withdraw(job_id) == (None if entry is None else entry[0])

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.running)))
        assert self.admission.release(job_id) == self.running.pop(job_id)

    @rule(pool=st.sampled_from(["a", "b", "c"]), capacity=st.none() | st.integers(0, 2))
    def set_capacity(self, pool: str, capacity: int | None) -> None:
        self.admission.set_capacity(pool, capacity)
        if capacity is None:
            self.capacity.pop(pool, None)
        else:
            self.capacity[pool] = capacity

    @rule(
        pool=st.sampled_from(["a", "b", "c"]),
        everywhere=st.integers(0, 2),
        x=st.integers(0, 2),
        y=st.integers(0, 2),
        clear=st.booleans(),
    )
    def set_coverage(self, pool: str, everywhere: int, x: int, y: int, clear: bool) -> None:
        coverage = None if clear else Coverage(everywhere, {"x": x, "y": y})
        self.admission.set_coverage(pool, coverage)
        if coverage is None:
            self.coverage.pop(pool, None)
        else:
            self.coverage[pool] = coverage

    @rule()
    def admit(self) -> None:
        for t in self.admission.admit():
            # Each admitted ticket is the best one eligible at that moment: within the
            # global slots and its pool's capacity, first by priority, due, arrival.
            eligible = self.eligible()
            assert eligible, "admitted beyond slots or capacity"
            assert min(eligible)[3] == t.job_id
            del self.waiting[t.job_id]
            self.running[t.job_id] = t
            assert len(self.running) <= self.slots
        # No starvation: nothing left could have started.
        assert self.eligible() == []

    @invariant()
    def counts_agree(self) -> None:
        assert self.admission.running_count == len(self.running)
        assert self.admission.waiting_count == len(self.waiting)
        assert self.admission.free_slots == max(0, self.slots - len(self.running))
        assert {t.job_id for t in self.admission.waiting()} == set(self.waiting)


AdmissionMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=60)
TestAdmissionMachine = AdmissionMachine.TestCase


class AdmissionAheadMachine(AdmissionMachine):
    """The same, with claim_ahead: a full pool with workers takes 2 more tickets."""

    AHEAD = 2


AdmissionAheadMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=60)
TestAdmissionAheadMachine = AdmissionAheadMachine.TestCase


# -- driven from trio: a freed slot admits waiting work at once, no refresh -------------


async def test_freed_slot_admits_waiting_work_without_a_refresh(
    autojump_clock: trio.testing.MockClock,
) -> None:
    admission = Admission(slots=2)
    started: list[tuple[int, float]] = []

    async def run(t: Ticket, send: trio.MemorySendChannel[int]) -> None:
        await trio.sleep(10 + t.job_id)  # the executor call
        await send.send(t.job_id)

    send, receive = trio.open_memory_channel[int](math.inf)
    async with trio.open_nursery() as nursery:
        for job_id in range(5):
            admission.offer(ticket(job_id, due=float(job_id)))

        def start_admitted() -> None:
            for t in admission.admit():
                started.append((t.job_id, trio.current_time()))
                nursery.start_soon(run, t, send)

        start_admitted()
        done = 0
        async for job_id in receive:
            admission.release(job_id)  # settled
            start_admitted()
            done += 1
            if done == 5:
                break
    assert [job_id for job_id, _ in started] == [0, 1, 2, 3, 4]
    # 0 and 1 start at once; 2 when 0 finishes (10), 3 when 1 does (11), 4 when 2 does
    # (10 + 12): each freed slot is taken immediately, with no refresh in between.
    assert [when for _, when in started] == pytest.approx([0, 0, 10, 11, 22])
