"""The saved deadlines, earliest first.

Promise 2 says the only timers are saved ``next_run_at`` values, and style note 4 says
there is exactly one of them: the daemon sleeps until :meth:`DeadlineSet.earliest` (or
a wake), then takes what :meth:`DeadlineSet.pop_due` hands back. Everything else here
exists to keep that one question cheap while deadlines are added, moved and removed by
the thousand.

Deadlines are plain ``float`` seconds on one scale the caller chooses; the daemon uses
wall-clock epoch seconds (``next_run_at.timestamp()``) and compares them with its
injected wall clock, so this module never looks at a clock.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

#: Below this many heap entries, stale ones are never worth a rebuild.
_COMPACT_FLOOR = 64
#: Entries :meth:`DeadlineSet.first_where` walks best-first before it scans instead.
_WALK_BUDGET = 256


@attrs.define(eq=False)
class DeadlineSet:
    """The next saved deadline of every admissible job, at most one per job.

    A binary heap of ``(at, job_id)`` entries with lazy invalidation. The index maps each
    job to its live entry, and the entry object itself is the stamp: an entry in the heap
    is live only if it *is* (identity, not equality) the one the index holds, so setting
    a job back to an earlier value cannot revive a stale copy. Replacing or discarding a
    deadline only repoints the index (O(1), plus O(log n) to push the replacement); the
    stale entry is dropped when it surfaces. When stale entries outnumber live ones two
    to one the heap is rebuilt from the index, so memory stays proportional to the live
    set however much the deadlines churn.

    Ties on ``at`` are broken by ``job_id``, so the order is deterministic.
    """

    #: job_id -> its live heap entry. Sharing the tuple keeps one object per deadline.
    _live: dict[int, tuple[float, int]] = attrs.field(factory=dict, init=False)
    #: (at, job_id) entries, some of them stale.
    _heap: list[tuple[float, int]] = attrs.field(factory=list, init=False)

    def set(self, job_id: int, at: float) -> None:
        """Save ``at`` as the deadline of ``job_id``, replacing any previous one.

        Raises ``ValueError`` for NaN, which would corrupt the heap order.
        """
        if math.isnan(at):
            raise ValueError(f"deadline of job {job_id} is NaN")
        current = self._live.get(job_id)
        if current is not None and current[0] == at:
            return  # unchanged: leave the heap alone
        entry = (at, job_id)
        self._live[job_id] = entry
        heapq.heappush(self._heap, entry)
        self._maybe_compact()

    def set_many(self, items: list[tuple[float, int]]) -> None:
        """:meth:`set` for many ``(at, job_id)`` at once (a refresh arming every job): the
        new entries go into the heap in one O(n) step when they are many, instead of a
        push each. The tuples given become the entries.

        Raises ``ValueError`` for NaN (nothing is set then).
        """
        live = self._live
        added: list[tuple[float, int]] = []
        for entry in items:
            at = entry[0]
            if at != at:  # NaN, without a call per item
                raise ValueError(f"deadline of job {entry[1]} is NaN")
        for entry in items:
            current = live.get(entry[1])
            if current is not None and current[0] == entry[0]:
                continue  # unchanged: leave the heap alone
            live[entry[1]] = entry
            added.append(entry)
        heap = self._heap
        if len(added) > len(heap) // 8:
            heap.extend(added)
            heapq.heapify(heap)
        else:
            for entry in added:
                heapq.heappush(heap, entry)
        self._maybe_compact()

    def discard(self, job_id: int) -> None:
        """Forget the deadline of ``job_id``, if it has one."""
        if self._live.pop(job_id, None) is not None:
            self._maybe_compact()

    def get(self, job_id: int) -> float | None:
        """The deadline of ``job_id``, or ``None``."""
        entry = self._live.get(job_id)
        return None if entry is None else entry[0]

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._live

    def __len__(self) -> int:
        return len(self._live)

    def earliest(self) -> tuple[float, int] | None:
        """``(at, job_id)`` of the earliest deadline, or ``None`` when there is none.

        This is the one timer the daemon arms.
        """
        self._drop_stale_top()
        if not self._heap:
            return None
        return self._heap[0]

    def pop_due(self, now: float) -> list[tuple[float, int]]:
        """Remove and return every ``(at, job_id)`` with ``at <= now``, earliest first.

        An overdue deadline comes back once, however late ``now`` is: it is owed work,
        not a backlog to replay.
        """
        due: list[tuple[float, int]] = []
        heap = self._heap
        live = self._live
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if live.get(entry[1]) is entry:
                del live[entry[1]]
                due.append(entry)
        return due

    def clear(self) -> None:
        """Forget every deadline (the daemon rebuilds them on a full refresh)."""
        self._live.clear()
        self._heap.clear()

    def first_where(self, accept: Callable[[int], bool]) -> tuple[float, int] | None:
        """``(at, job_id)`` of the earliest deadline whose job ``accept`` takes, or
        ``None``: a scoped token's status asks for its namespaces' next deadline among
        a million armed.

        The heap is walked best-first (a second, small heap of the nodes reached) for
        at most :data:`_WALK_BUDGET` entries, so an answer near the top costs that walk
        and not a scan; past the budget (the answer is late, or there is none) one
        linear pass over the live deadlines finishes it. A best-first walk of the whole
        heap, stale copies included, cost 23 s at a million where the pass takes 0.3 s
        (the review of 02f7bd5 measured it)."""
        heap = self._heap
        live = self._live
        if not heap:
            return None
        frontier: list[tuple[tuple[float, int], int]] = [(heap[0], 0)]
        size = len(heap)
        for _ in range(_WALK_BUDGET):
            if not frontier:
                return None
            entry, index = heapq.heappop(frontier)
            if live.get(entry[1]) is entry and accept(entry[1]):
                return entry
            for child in (2 * index + 1, 2 * index + 2):
                if child < size:
                    heapq.heappush(frontier, (heap[child], child))
        if not frontier:
            return None
        best: tuple[float, int] | None = None
        for entry in live.values():
            if (best is None or entry < best) and accept(entry[1]):
                best = entry
        return best

    def items(self) -> Iterator[tuple[int, float]]:
        """``(job_id, at)`` pairs in no particular order; do not mutate while iterating."""
        for job_id, (at, _) in self._live.items():
            yield job_id, at

    def _drop_stale_top(self) -> None:
        heap = self._heap
        live = self._live
        while heap:
            entry = heap[0]
            if live.get(entry[1]) is entry:
                return
            heapq.heappop(heap)

    def _maybe_compact(self) -> None:
        # Stale entries = len(heap) - len(live); rebuild when they exceed twice the live
        # ones. Each rebuild is O(n) and follows at least n stale-making operations, so
        # the cost amortizes to O(1) per operation.
        size = len(self._heap)
        if size > _COMPACT_FLOOR and size > 3 * len(self._live):
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)
