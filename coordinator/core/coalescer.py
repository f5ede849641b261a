"""Wakes in, refreshes out, at least ``spacing`` apart.

Promise 4: a wake (a NOTIFY, a worker connecting or leaving, capacity freeing) asks for
a refresh of the job inventory, and refreshes are at least ``refresh_spacing`` apart, so
a burst of wakes costs one refresh. It bounds *requested* refreshes; it is never a
recurring timer: with no wake pending, :meth:`RefreshCoalescer.due_at` is ``None`` and
the daemon arms nothing for it (promise 1).

The daemon's loop uses it like this, from one trio task::

    due = min(coalescer.due_at() or inf, earliest deadline or inf)
    with trio.move_on_at(due):
        await wake_event.wait()
    if coalescer.take(trio.current_time()):
        await refresh()

Times are trio clock seconds passed in by the caller and are expected not to go back.
"""

from __future__ import annotations

import math

import attrs


def _check_spacing(_instance: object, _attribute: object, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"spacing must be a finite number >= 0, not {value!r}")


@attrs.define(eq=False)
class RefreshCoalescer:
    """Turns any number of wakes into refreshes spaced at least ``spacing`` apart.

    State is one pending request (a flag, not a queue: ten wakes before a refresh are
    served by that one refresh), whether it is *urgent*, whether dispatch is *held*, and
    when the last refresh happened.

    - An **urgent** wake follows a lost listener connection: notifications may have been
      lost, so a full refresh is owed at once, ignoring spacing.
    - While **held** (stop in progress, or the store unavailable) wakes are recorded but
      never granted; :meth:`release` makes them grantable again, subject to spacing.
    """

    #: Minimum seconds between two granted (non-urgent) refreshes.
    spacing: float = attrs.field(default=30.0, validator=_check_spacing)

    _pending: bool = attrs.field(default=False, init=False)
    _urgent: bool = attrs.field(default=False, init=False)
    _held: bool = attrs.field(default=False, init=False)
    #: A failed refresh asked to be retried at this time, spacing notwithstanding.
    _retry_at: float | None = attrs.field(default=None, init=False)
    #: When the last refresh (granted or marked) happened; ``None`` before the first.
    _last: float | None = attrs.field(default=None, init=False)
    #: Time of the latest wake / latest urgent wake still pending.
    _latest_wake: float = attrs.field(default=-math.inf, init=False)
    _latest_urgent: float = attrs.field(default=-math.inf, init=False)
    _wakes_received: int = attrs.field(default=0, init=False)
    _refreshes_granted: int = attrs.field(default=0, init=False)

    def wake(self, now: float, *, urgent: bool = False) -> None:
        """Record a request for a refresh, made at ``now``.

        Wakes while one is pending merge into it. ``urgent=True`` (after the listener
        reconnected) makes the pending refresh grantable immediately, ignoring spacing.
        Wakes are recorded even while held: they are kept, never dropped.
        """
        self._wakes_received += 1
        self._pending = True
        self._latest_wake = max(self._latest_wake, now)
        if urgent:
            self._urgent = True
            self._latest_urgent = max(self._latest_urgent, now)

    def due_at(self) -> float | None:
        """When the pending refresh may be granted, in trio seconds; ``None`` if never.

        Exactly:

        - ``None`` when no wake is pending, or while held: arm no timer for it.
        - ``-inf`` ("immediately", whatever ``now`` is) when the pending request is urgent
          or no refresh has happened yet.
        - the retry time given to :meth:`refresh_failed`, when the last refresh failed.
        - otherwise ``last_refresh + spacing``, which may already be in the past.

        It does not depend on the current time, so ``take(now)`` grants exactly when
        ``now >= due_at()``. ``trio.move_on_at(-inf)`` expires at once, so the value can
        go straight into the loop's ``min()``.
        """
        if not self._pending or self._held:
            return None
        if self._urgent or self._last is None:
            return -math.inf
        if self._retry_at is not None:
            return self._retry_at
        return self._last + self.spacing

    def take(self, now: float) -> bool:
        """Grant the pending refresh if it is due at ``now``; the caller then refreshes.

        Returns ``True`` at most once per pending request, clearing it and recording
        ``now`` as the last refresh. Returns ``False`` when nothing is pending, while
        held, or before :meth:`due_at`.
        """
        due = self.due_at()
        if due is None or now < due:
            return False
        self._pending = False
        self._urgent = False
        self._retry_at = None
        self._latest_wake = self._latest_urgent = -math.inf
        self._record_refresh(now)
        self._refreshes_granted += 1
        return True

    def refresh_failed(self, retry_at: float) -> None:
        """The refresh just granted (or done) failed: one is owed again, at ``retry_at``
        (the error policy's pause), whatever the spacing. Later wakes merge into it."""
        self._pending = True
        self._retry_at = retry_at

    def mark_refreshed(self, now: float) -> None:
        """A refresh happened at ``now`` for another reason (the startup refresh).

        It counts towards spacing like a granted one, and it satisfies the wakes recorded
        at or before ``now``: if the latest pending wake is no later than ``now``, nothing
        remains pending (an urgent request is satisfied the same way, by the latest urgent
        wake). Wakes recorded after ``now`` stay pending. Pass the time the refresh
        *began* reading, so a wake that arrived while it ran (and may not be in what it
        read) is served by the next one. Holding does not matter: the refresh happened.
        """
        self._record_refresh(now)
        self._retry_at = None
        if self._latest_urgent <= now:
            self._urgent = False
            self._latest_urgent = -math.inf
        if self._latest_wake <= now:
            self._pending = False
            self._urgent = False
            self._latest_wake = self._latest_urgent = -math.inf

    def hold(self) -> None:
        """Stop granting refreshes (dispatch is drained); wakes keep accumulating.

        Idempotent: holding twice needs one :meth:`release`.
        """
        self._held = True

    def release(self) -> None:
        """Grant again: a wake kept while held is due per :meth:`due_at`. Idempotent."""
        self._held = False

    @property
    def pending(self) -> bool:
        """A wake is waiting for a refresh (whether or not held)."""
        return self._pending

    @property
    def urgent(self) -> bool:
        """The pending request ignores spacing."""
        return self._pending and self._urgent

    @property
    def held(self) -> bool:
        """Refreshes are not granted until :meth:`release`."""
        return self._held

    @property
    def last_refresh(self) -> float | None:
        """When the last refresh (granted or marked) happened, or ``None``."""
        return self._last

    @property
    def wakes_received(self) -> int:
        """Every wake ever recorded, including those merged into one refresh."""
        return self._wakes_received

    @property
    def refreshes_granted(self) -> int:
        """How many times :meth:`take` returned ``True``."""
        return self._refreshes_granted

    def _record_refresh(self, now: float) -> None:
        # max(): should a caller ever pass an older time, spacing still counts from the
        # most recent refresh, never from an earlier one.
        self._last = now if self._last is None else max(self._last, now)
