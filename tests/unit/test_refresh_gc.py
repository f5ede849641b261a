"""The refresh builds with the cyclic garbage collector off (daemon/inventory.py): what it
made is left to the next full collection, never frozen for good."""

from __future__ import annotations

import gc
import weakref

from coordinator.daemon.inventory import _no_cyclic_gc


class _Node:
    me: _Node | None = None


def test_what_a_refresh_made_skips_young_collections_but_not_the_full_one() -> None:
    was = gc.isenabled()
    gc.disable()  # no automatic collection may run between the steps below
    try:
        with _no_cyclic_gc():
            node = _Node()
            node.me = node  # a cycle: only the collector can free it
            gone = weakref.ref(node)
            del node
        assert not gc.isenabled()  # the state before is restored
        assert gc.get_freeze_count() == 0  # nothing stays frozen
        gc.collect(1)  # the young generations do not hold it
        assert gone() is not None
        gc.collect()  # the full collection finds it
        assert gone() is None
        gc.enable()
        with _no_cyclic_gc():
            assert not gc.isenabled()
        assert gc.isenabled()
    finally:
        if was:
            gc.enable()
        else:
            gc.disable()
