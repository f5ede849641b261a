"""Python's cyclic garbage collector, tuned for a daemon that owns its process.

In a burst the daemon makes no garbage cycles at all (in a 10,000-run burst the young
and middle collections found nothing to collect, the full ones only 156 objects left
over from start-up), yet Python's defaults had it collecting all the time:

- **Young collections** come every 700 allocations net of deallocations -- but the
  count never drops below zero, so with objects made and freed a run at a time it was
  every 700 allocations: 630 young and 57 middle collections per 10,000-run burst, about
  135 ms of the daemon's 3 s of CPU. A daemon that owns its process collects the young
  generation every :data:`YOUNG_THRESHOLD` instead: 4 young collections per burst.
- **Full collections** walk every tracked object, and most of a daemon's objects live
  as long as it does and form no cycles: what it loaded at start (about 45,000 objects)
  and its inventory (about one and a half per loaded job). They took 25 ms each at
  2,000 jobs, 5 times per burst, and now and then on an idle daemon, where one landed on
  a lone run's latency; at 100,000 jobs (146,000 objects) 71-84 ms, so about a second at
  a million, on the loop.

So each full refresh freezes what is alive after it (``gc.freeze()``): later
collections skip it (a full collection in a burst then walks a few thousand objects).
Frozen objects are still freed by reference counting -- the inventory a later refresh
replaces goes as before; only a *cycle* among them would outlive its use. What bounds
that:

- **Garbage is not frozen.** A full refresh first runs a full collection, which is
  cheap: it walks only what is not frozen, everything made since the last freeze.
- **A failed refresh freezes nothing**: what it made stays in the collector's
  generations (a failure's traceback is a cycle), as does a cancelled one's.
- **The freeze is thawed now and then.** An object frozen while in use that later
  becomes cyclic garbage (a worker connection open at the time, say) is found only once
  the freeze is undone: at most every :data:`THAW_EVERY` a full refresh thaws it first
  and its collection walks everything (the inventory too: a full collection took
  0.57-1.0 s at a million jobs unfrozen, on top of a full refresh's 4-6 s, which is why
  not every time).
- Cycles made *during* a successful refresh would be frozen with it: a real refresh
  makes none (``tests/integration/test_refresh_gc.py`` looks).

Either way the collector is off while a refresh builds: every object created counts
towards a collection, and at a million entries the young collections walking them cost
about as much as building them. An incremental refresh (a few named jobs) builds a
handful of objects and leaves them to the young generation. A daemon inside another
program (the tests' harness) tunes nothing and freezes nothing of its host's: there
the refresh's objects go straight to the oldest generation instead (``gc.freeze()``
then ``gc.unfreeze()``, two list splices).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

import attrs

if TYPE_CHECKING:
    from collections.abc import Iterator


#: Allocations (net of deallocations) between young collections in a daemon that owns
#: its process (Python's default: 700). Meanwhile at most that many more objects wait for
#: the collector: a megabyte or two, when any of them is garbage at all.
YOUNG_THRESHOLD: Final = 10_000


def own_process() -> None:
    """The daemon owns its process: young collections every :data:`YOUNG_THRESHOLD`
    allocations (the older generations' thresholds are left as they are)."""
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


#: Longest time (seconds) between thaws: a full refresh at least this long after the
#: last thaw thaws the freeze before collecting.
THAW_EVERY: Final = 3600.0


@attrs.define(eq=False)
class Collector:
    """The collector around refreshes. ``freeze``: the daemon owns its process."""

    freeze: bool = False
    #: Trio time of the last thaw (``None``: none yet; the first full refresh's
    #: collection walks what was made at start-up, nothing is frozen before it).
    _thawed_at: float | None = None

    @contextmanager
    def building(self, *, full: bool, now: float) -> Iterator[None]:
        """Around a refresh's build (``full``: the whole inventory is rebuilt; ``now``:
        trio time). With ``freeze``, a full build first collects what is not frozen
        (thawing the freeze first, at most every :data:`THAW_EVERY`) and, if it
        succeeds, freezes what is alive after it. The collector's enabled state is
        restored either way."""
        enabled = gc.isenabled()
        if self.freeze and full:
            if self._thawed_at is None or now - self._thawed_at >= THAW_EVERY:
                gc.unfreeze()
                self._thawed_at = now
            gc.collect()
        gc.disable()
        built = False
        try:
            yield
            built = True
        finally:
            if not self.freeze:
                gc.freeze()
                gc.unfreeze()
            elif full and built:
                gc.freeze()
            if enabled:
                gc.enable()


def frozen() -> int:
    """Objects the collector skips (what the last full refresh froze and is still alive)."""
    return gc.get_freeze_count()


__all__ = ["THAW_EVERY", "YOUNG_THRESHOLD", "Collector", "frozen", "own_process"]
