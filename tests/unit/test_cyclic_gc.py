"""Python's cyclic garbage collector around refreshes (daemon/cyclic_gc.py). A daemon
that owns its process freezes what is alive after a full refresh, having first collected
what is not frozen, and thaws the freeze at most every THAW_EVERY; embedded, nothing
stays frozen."""

from __future__ import annotations

import gc
import weakref
from typing import TYPE_CHECKING

import pytest

from coordinator.daemon.cyclic_gc import (
    THAW_EVERY,
    YOUNG_THRESHOLD,
    Collector,
    frozen,
    own_process,
)

if TYPE_CHECKING:
    from collections.abc import Iterator


class _Node:
    me: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    """A garbage cycle (only the collector can free it), and a way to see it go."""
    node = _Node()
    node.me = node
    return weakref.ref(node)


@pytest.fixture(autouse=True)
def _collector() -> Iterator[None]:
    """No automatic collection between the steps of a test; the state is put back."""
    was, thresholds = gc.isenabled(), gc.get_threshold()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        if was:
            gc.enable()


def test_embedded_what_a_refresh_made_skips_young_collections_but_not_the_full_one() -> None:
    embedded = Collector()
    with embedded.building(full=True, now=0.0):
        gone = _cycle()
    assert not gc.isenabled()  # the state before is restored
    assert frozen() == 0  # nothing stays frozen
    gc.collect(1)  # the young generations do not hold it
    assert gone() is not None
    gc.collect()  # the full collection finds it
    assert gone() is None
    gc.enable()
    with embedded.building(full=False, now=1.0):
        assert not gc.isenabled()
    assert gc.isenabled()


def test_full_refreshes_collect_what_is_not_frozen_then_freeze() -> None:
    collector = Collector(freeze=True)
    before_first = _cycle()
    with collector.building(full=True, now=0.0):
        assert before_first() is None  # collected first, not frozen
        assert not gc.isenabled()
        kept = _cycle()  # made during a refresh: frozen with it
    assert frozen() > 0
    assert not gc.isenabled()  # (off before: still off)
    gc.collect()  # a full collection skips it
    assert kept() is not None

    between = _cycle()  # garbage when the next full refresh begins
    with collector.building(full=True, now=THAW_EVERY - 1):
        assert between() is None  # collected, not frozen
        assert kept() is not None  # frozen: not thawed this soon
    with collector.building(full=True, now=THAW_EVERY):
        assert kept() is None  # thawed, then collected
    assert frozen() > 0


def test_a_failed_full_refresh_freezes_nothing_new() -> None:
    collector = Collector(freeze=True)
    failed: list[weakref.ref[_Node]] = []

    def refresh() -> None:
        with collector.building(full=True, now=0.0):
            failed.append(_cycle())
            raise RuntimeError("the statement failed")

    with pytest.raises(RuntimeError):
        refresh()
    assert frozen() == 0
    gc.collect()
    assert failed[0]() is None


def test_an_incremental_refresh_leaves_the_freeze_alone() -> None:
    collector = Collector(freeze=True)
    with collector.building(full=True, now=0.0):
        pass
    count = frozen()
    gc.enable()
    with collector.building(full=False, now=THAW_EVERY * 2):
        made = _cycle()
        assert not gc.isenabled()
    assert gc.isenabled()
    assert frozen() == count  # not thawed, not grown
    gc.collect()  # what it made is the collector's as usual
    assert made() is None


def test_a_daemon_that_owns_its_process_collects_the_young_generation_less_often() -> None:
    _young, middle, old = gc.get_threshold()
    own_process()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, middle, old)
