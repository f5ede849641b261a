"""Due work waiting for a slot.

Once the daemon knows a run is owed (a deadline passed, a manual dispatch arrived), the
only thing left to wait for is capacity: a global number of concurrent calls and, for
worker jobs, the capacity the connected workers announced. Promise 4 says such work is
admitted as soon as a slot frees, without a refresh, so this is kept in memory and
asked again on every :meth:`Admission.release` or capacity change.

Order is ``interactive`` before ``background``, then the earliest ``due``, then arrival.
A ticket whose pool is full does not hold back tickets of other pools behind it: each
pool has its own heap and :meth:`Admission.admit` merges the heads of the pools that
can take work, so a busy or absent worker type never starves the rest.

Workers whose tokens reach only some namespaces split a pool further (:class:`Coverage`):
a worker type's tickets wait in one heap per namespace, and a namespace that no
connected worker of the type may run waits, keeping its place, while the type's other
namespaces go on -- as a type no worker serves waits.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Literal

import attrs

#: ``interactive`` work is admitted before ``background`` work (the one definition:
#: :mod:`coordinator.model` re-exports it).
Priority = Literal["interactive", "background"]
_RANK: dict[str, int] = {"interactive": 0, "background": 1}

#: Below this many stale heap entries a rebuild is never worth it.
_COMPACT_FLOOR = 64

#: The heap key of a waiting ticket: (priority rank, due, arrival seq, job_id).
_Key = tuple[int, float, int, int]
#: A heap of waiting tickets: their pool, and their namespace where it matters (a worker
#: type's tickets whose namespace is known; ``None`` otherwise).
_Heap = tuple[str | None, str | None]


def _check_due(_instance: object, _attribute: object, value: float) -> None:
    if math.isnan(value):
        raise ValueError("due must not be NaN")


@attrs.frozen(kw_only=True)
class Ticket:
    """A job owed one run, waiting for (or holding) a slot."""

    #: The job; at most one ticket per job is outstanding.
    job_id: int
    #: ``interactive`` tickets are admitted before ``background`` ones.
    priority: Priority = attrs.field(validator=attrs.validators.in_(tuple(_RANK)))
    #: FIFO key within a priority: the deadline served, or when the trigger arrived
    #: (wall-clock epoch seconds, as the daemon passes them).
    due: float = attrs.field(validator=_check_due)
    #: The capacity pool the run needs (a worker type); ``None`` needs only a global slot.
    pool: str | None = None
    #: The job's namespace, for a pool whose workers' tokens reach only some namespaces
    #: (:class:`Coverage`); ``None`` when not known (only the pool's total counts).
    namespace: str | None = None
    #: A manual or retry dispatch carries its ``queued`` run; ``None`` for scheduled work.
    run_id: int | None = None
    #: The saved deadline a scheduled ticket serves, or the saved due time a retry's
    #: ticket was armed on (wall time); ``None`` for a manual run.
    scheduled_for: datetime | None = None
    #: The schedule version that deadline was armed for (the claim checks it).
    schedule_version: int | None = None


def _copied(value: Mapping[str, int]) -> dict[str, int]:
    return dict(value)


@attrs.frozen
class Coverage:
    """Which namespaces a pool's workers may run, and with how many slots: workers whose
    tokens reach every namespace lend their ``everywhere`` slots to all of them; workers
    confined to some namespaces add theirs to those only (``scoped``).

    A namespace's share is an upper bound, not a reservation: the pool's total still
    limits all its namespaces together, and a worker reaching two namespaces counts in
    both. What it rules out is claiming runs no connected worker may take.
    """

    #: Slots of the workers whose tokens reach every namespace.
    everywhere: int
    #: Namespace -> slots of the confined workers that reach it.
    scoped: Mapping[str, int] = attrs.field(factory=dict, converter=_copied)

    def capacity(self, namespace: str) -> int:
        """The slots of the workers that may run jobs of ``namespace``."""
        return self.everywhere + self.scoped.get(namespace, 0)


def _check_slots(_instance: object, _attribute: object, value: int) -> None:
    if value < 1:
        raise ValueError(f"slots must be >= 1, not {value!r}")


@attrs.define(eq=False)
class Admission:
    """Tickets waiting for a slot, and the ones that hold one until released.

    A ticket may start when fewer than ``slots`` tickets are running and its pool (if
    any, and if it has a capacity set) runs fewer than its capacity plus ``ahead``. Pools
    without a capacity are limited only by ``slots``; capacity ``0`` means unavailable (a
    worker type with no worker connected): its tickets wait, keeping their place, and
    ``ahead`` does not apply.

    ``ahead`` (the ``claim_ahead`` setting) lets a worker type's runs be claimed before
    a slot of its workers is free: they wait for one in the daemon (the worker
    executor's queue, in claim order), so that a freed slot's next call is claimed
    already instead of waiting for a claim's round trip. They count against ``slots``
    like calls: whatever the workers' capacities do (a worker may connect while runs
    wait, and they then start at once), calls at once never exceed ``slots``. (Runs
    claimed ahead holding no global slot would let a growing capacity start more calls
    than ``slots`` allows.)

    Costs: :meth:`offer` and :meth:`withdraw` O(log n) (withdrawal is lazy; heaps are
    rebuilt when stale entries outnumber live ones two to one); :meth:`admit` is
    O(h + k log n) for h heaps with waiting work (one per pool, and per namespace of a
    worker type's tickets) and k tickets admitted, however many tickets wait behind full
    pools.
    """

    #: Concurrent runs allowed in total.
    slots: int = attrs.field(validator=_check_slots)
    #: Runs a pool with workers may have admitted beyond its capacity (claimed ahead).
    ahead: int = attrs.field(default=0, validator=attrs.validators.ge(0))

    #: job_id -> (ticket, key) for every waiting ticket; the key identifies its entry.
    _waiting: dict[int, tuple[Ticket, _Key]] = attrs.field(factory=dict, init=False)
    #: (pool, namespace) -> heap of keys; only heaps with entries (live or stale) are
    #: present.
    _heaps: dict[_Heap, list[_Key]] = attrs.field(factory=dict, init=False)
    _stale: int = attrs.field(default=0, init=False)
    _running: dict[int, Ticket] = attrs.field(factory=dict, init=False)
    _pool_running: dict[str | None, int] = attrs.field(factory=dict, init=False)
    #: Admitted tickets per (pool, namespace), for the pools' :class:`Coverage`.
    _heap_running: dict[_Heap, int] = attrs.field(factory=dict, init=False)
    #: Jobs whose call ended and whose slot was given back, but whose dispatch is not
    #: over yet (the result is being saved): no new ticket for them until release().
    _settling: set[int] = attrs.field(factory=set, init=False)
    _capacity: dict[str, int] = attrs.field(factory=dict, init=False)
    _coverage: dict[str, Coverage] = attrs.field(factory=dict, init=False)
    _arrivals: Iterator[int] = attrs.field(factory=itertools.count, init=False)
    _closed: bool = attrs.field(default=False, init=False)

    # -- queueing ---------------------------------------------------------------------

    def offer(self, ticket: Ticket) -> bool:
        """Queue ``ticket``; ``False`` (and nothing queued) if its job already waits or
        runs, or once :meth:`close` was called.
        """
        job_id = ticket.job_id
        if (
            self._closed
            or job_id in self._waiting
            or job_id in self._running
            or job_id in self._settling
        ):
            return False
        key: _Key = (_RANK[ticket.priority], ticket.due, next(self._arrivals), job_id)
        self._waiting[job_id] = (ticket, key)
        where = _heap_of(ticket)
        heap = self._heaps.get(where)
        if heap is None:
            self._heaps[where] = [key]
        else:
            heapq.heappush(heap, key)
        return True

    def withdraw(self, job_id: int) -> Ticket | None:
        """Remove the waiting ticket of ``job_id`` and return it (``None`` if none waits).

        For a job that was paused, removed or rescheduled before it got a slot.
        """
        entry = self._waiting.pop(job_id, None)
        if entry is None:
            return None
        self._stale += 1
        if self._stale > _COMPACT_FLOOR and self._stale > 2 * len(self._waiting):
            self._compact()
        return entry[0]

    # -- admitting --------------------------------------------------------------------

    def admit(self) -> list[Ticket]:
        """Pop every ticket that can start now, in the order they should start.

        Each step takes the best (priority, due, arrival) ticket among pools (and their
        namespaces) with free capacity while a global slot is free. The returned tickets
        count as running until :meth:`release`. After :meth:`close`, always ``[]``.
        """
        free = self.slots - len(self._running)
        if self._closed or free <= 0 or not self._waiting:
            return []
        # Heads of the heaps that can take at least one more ticket.
        heads: list[tuple[_Key, _Heap]] = []
        for where in list(self._heaps):
            if self._free_in(where) > 0:
                key = self._head(where)
                if key is not None:
                    heads.append((key, where))
        heapq.heapify(heads)
        admitted: list[Ticket] = []
        while heads and free > 0:
            key, where = heads[0]
            if self._free_in(where) <= 0:
                # Another namespace of its pool took the pool's last slot meanwhile.
                heapq.heappop(heads)
                continue
            heap = self._heaps[where]
            heapq.heappop(heap)  # the head is live: _head() dropped stale entries
            ticket, _ = self._waiting.pop(key[3])
            self._running[ticket.job_id] = ticket
            self._count(ticket, where, 1)
            admitted.append(ticket)
            free -= 1
            nxt = self._head(where) if self._free_in(where) > 0 else None
            if nxt is None:
                heapq.heappop(heads)
            else:
                heapq.heapreplace(heads, (nxt, where))
        return admitted

    def free_slot(self, job_id: int) -> Ticket | None:
        """The call of ``job_id`` ended: give its slot back for other work, while the job
        itself stays busy (its result is being saved) until :meth:`release`.

        Returns its ticket, or ``None`` if it held no slot. Call :meth:`admit` afterwards.
        """
        ticket = self._free(job_id)
        if ticket is not None:
            self._settling.add(job_id)
        return ticket

    def release(self, job_id: int) -> Ticket | None:
        """The dispatch of ``job_id`` is over (settled): free its slot if it still holds
        one, and let the job be offered again.

        Returns its ticket, or ``None`` if it was not running (releasing twice is
        harmless). Call :meth:`admit` afterwards: the freed slot may start waiting work.
        """
        self._settling.discard(job_id)
        return self._free(job_id)

    def _free(self, job_id: int) -> Ticket | None:
        ticket = self._running.pop(job_id, None)
        if ticket is not None:
            self._count(ticket, _heap_of(ticket), -1)
        return ticket

    def _count(self, ticket: Ticket, where: _Heap, delta: int) -> None:
        """Count an admitted ticket in (``delta`` 1) or out (-1) of its pool and heap."""
        pool = ticket.pool
        left = self._pool_running.get(pool, 0) + delta
        if left:
            self._pool_running[pool] = left
        else:
            del self._pool_running[pool]
        if where[1] is not None:
            left = self._heap_running.get(where, 0) + delta
            if left:
                self._heap_running[where] = left
            else:
                del self._heap_running[where]

    def set_capacity(self, pool: str, capacity: int | None) -> None:
        """Limit ``pool`` to ``capacity`` concurrent runs; ``None`` removes the limit.

        ``0`` makes the pool unavailable: its tickets wait. Lowering a capacity below
        what already runs stops nothing; new tickets wait until the pool drains below it.
        """
        if capacity is None:
            self._capacity.pop(pool, None)
        elif capacity < 0:
            raise ValueError(f"capacity of pool {pool!r} must be >= 0, not {capacity!r}")
        else:
            self._capacity[pool] = capacity

    def set_coverage(self, pool: str, coverage: Coverage | None) -> None:
        """Which namespaces ``pool``'s workers may run (:class:`Coverage`); ``None``:
        every namespace, up to the pool's capacity. A namespace none of them may run
        waits, keeping its place, as a pool of capacity 0 does."""
        if coverage is None:
            self._coverage.pop(pool, None)
        else:
            self._coverage[pool] = coverage

    def close(self) -> None:
        """Stop admitting, for good (stop in progress). Waiting tickets stay inspectable
        and running ones are still released as they finish.
        """
        self._closed = True

    # -- inspection -------------------------------------------------------------------

    def capacity(self, pool: str) -> int | None:
        """The capacity of ``pool``, or ``None`` when only ``slots`` limits it."""
        return self._capacity.get(pool)

    def is_waiting(self, job_id: int) -> bool:
        return job_id in self._waiting

    def is_running(self, job_id: int) -> bool:
        """A dispatch of the job is under way (its call, or the saving of its result)."""
        return job_id in self._running or job_id in self._settling

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def running_count(self) -> int:
        return len(self._running)

    @property
    def waiting_count(self) -> int:
        return len(self._waiting)

    @property
    def free_slots(self) -> int:
        """Global slots not taken by a running ticket (pool limits aside)."""
        return max(0, self.slots - len(self._running))

    def waiting(self) -> Iterator[Ticket]:
        """A snapshot of the waiting tickets, in the order they would be admitted if no
        pool were full.
        """
        entries = sorted(self._waiting.values(), key=lambda entry: entry[1])
        return iter([ticket for ticket, _ in entries])

    def running(self) -> Iterator[Ticket]:
        """A snapshot of the admitted, not yet released tickets."""
        return iter(list(self._running.values()))

    # -- internals --------------------------------------------------------------------

    def _pool_free(self, pool: str | None) -> int:
        capacity = None if pool is None else self._capacity.get(pool)
        if capacity is None:
            return self.slots  # only the global limit applies
        if capacity:
            capacity += self.ahead
        return capacity - self._pool_running.get(pool, 0)

    def _free_in(self, where: _Heap) -> int:
        """How many more tickets of the heap ``where`` may start: its pool's free
        capacity, bounded by its namespace's share of the pool (:class:`Coverage`)."""
        pool, namespace = where
        free = self._pool_free(pool)
        if pool is None or namespace is None or free <= 0:
            return free
        coverage = self._coverage.get(pool)
        if coverage is None:
            return free
        capacity = coverage.capacity(namespace)
        if capacity:
            capacity += self.ahead
        return min(free, capacity - self._heap_running.get(where, 0))

    def _head(self, where: _Heap) -> _Key | None:
        """The best live key of the heap ``where`` (dropping stale ones), or ``None`` if
        empty."""
        heap = self._heaps[where]
        waiting = self._waiting
        while heap:
            key = heap[0]
            entry = waiting.get(key[3])
            if entry is not None and entry[1][2] == key[2]:  # same arrival: live
                return key
            heapq.heappop(heap)
            self._stale -= 1
        del self._heaps[where]
        return None

    def _compact(self) -> None:
        heaps: dict[_Heap, list[_Key]] = {}
        for ticket, key in self._waiting.values():
            heaps.setdefault(_heap_of(ticket), []).append(key)
        for heap in heaps.values():
            heapq.heapify(heap)
        self._heaps = heaps
        self._stale = 0


def _heap_of(ticket: Ticket) -> _Heap:
    """The heap a ticket waits in: its pool's, per namespace for a worker type's tickets
    whose namespace is known (a command's tickets need only a global slot)."""
    pool = ticket.pool
    return (pool, ticket.namespace if pool is not None else None)
