"""Python's cyclic garbage collector, tuned for a daemon that owns its process.

In a burst the daemon makes no garbage cycles at all (every collection in a 10,000-run
burst found nothing to collect), yet Python's defaults had it collecting all the time:

- **Young collections**, every 700 allocations net of deallocations -- but the count
  never drops below zero, so with objects made and freed a run at a time it was every
  700 allocations: 630 young and 57 middle collections per 10,000-run burst, 135 ms of
  the daemon's 3.2 s of CPU. A daemon that owns its process collects the young
  generation every :data:`YOUNG_THRESHOLD` instead: 11 and 1 per burst, 15 ms.
- **Full collections** walk every tracked object, and most of a daemon's objects live
  as long as it does and form no cycles: what it loaded at start (about 45,000 objects)
  and its inventory (about one and a half per loaded job). They took 25 ms each at
  2,000 jobs, 5 times per burst, and once a minute or so on an idle daemon, where one
  landed on a lone run's latency; at 100,000 jobs (146,000 objects) 71-84 ms, so about
  a second at a million, on the loop.

So after each full refresh, what is alive is frozen (``gc.freeze()``): later
collections skip it (a full collection in a burst then walks about 2,600 objects).
Frozen objects are still freed by reference counting -- the inventory a later refresh
replaces goes as before; only a *cycle* among them would outlive its use, and two rules
bound that:

- garbage is collected before it could be frozen: a full refresh first thaws the last
  freeze and runs a full collection (walking, once, what was frozen: the inventory it
  is about to replace), and only then builds;
- a refresh that fails (or is cancelled) freezes nothing: what it made stays in the
  collector's generations (a failure's traceback is a cycle).

An object frozen while in use that later becomes cyclic garbage (a worker connection
open at the time, say) is therefore collected at the next full refresh, and connecting
and disconnecting workers are among what asks for one (a lifecycle wake). Cycles made
*during* a successful refresh would be frozen with it until the next full refresh: a
real refresh makes none (``tests/integration/test_refresh_gc.py`` looks).

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


@contextmanager
def building(*, full: bool, freeze: bool) -> Iterator[None]:
    """Around a refresh's build (``full``: the whole inventory is rebuilt). With
    ``freeze`` (the daemon owns its process), a full build first collects what the last
    freeze kept and, if it succeeds, freezes what is alive after it. The collector's
    enabled state is restored either way."""
    enabled = gc.isenabled()
    if freeze and full:
        gc.unfreeze()
        gc.collect()
    gc.disable()
    built = False
    try:
        yield
        built = True
    finally:
        if not freeze:
            gc.freeze()
            gc.unfreeze()
        elif full and built:
            gc.freeze()
        if enabled:
            gc.enable()


def frozen() -> int:
    """Objects the collector skips (what the last full refresh froze and is still alive)."""
    return gc.get_freeze_count()


__all__ = ["YOUNG_THRESHOLD", "building", "frozen", "own_process"]
