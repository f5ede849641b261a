"""The refresh builds with the cyclic garbage collector off (daemon/cyclic_gc.py). A
daemon that owns its process freezes what is alive after a full refresh, having first
collected what the last freeze kept; embedded, nothing stays frozen."""

from __future__ import annotations

import gc
import weakref
from typing import TYPE_CHECKING

import pytest

from coordinator.daemon.cyclic_gc import YOUNG_THRESHOLD, building, frozen, own_process

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
    with building(full=True, freeze=False):
        gone = _cycle()
    assert not gc.isenabled()  # the state before is restored
    assert frozen() == 0  # nothing stays frozen
    gc.collect(1)  # the young generations do not hold it
    assert gone() is not None
    gc.collect()  # the full collection finds it
    assert gone() is None
    gc.enable()
    with building(full=False, freeze=False):
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_full_refresh_collects_what_the_last_freeze_kept_then_freezes() -> None:
    with building(full=True, freeze=True):
        kept = _cycle()  # made during a refresh: frozen with it
    assert frozen() > 0
    gc.collect()  # a full collection skips it
    assert kept() is not None
    before = _cycle()  # garbage when the next full refresh begins
    with building(full=True, freeze=True):
        assert kept() is None  # thawed and collected first
        assert before() is None  # collected, not frozen
        assert not gc.isenabled()
    assert frozen() > 0
    assert not gc.isenabled()  # (off before: still off)


def test_a_failed_full_refresh_freezes_nothing() -> None:
    with building(full=True, freeze=True):
        pass
    failed: list[weakref.ref[_Node]] = []

    def refresh() -> None:
        with building(full=True, freeze=True):
            failed.append(_cycle())
            raise RuntimeError("the statement failed")

    with pytest.raises(RuntimeError):
        refresh()
    assert frozen() == 0  # thawed at the start, not frozen again
    gc.collect()
    assert failed[0]() is None


def test_an_incremental_refresh_leaves_the_freeze_alone() -> None:
    with building(full=True, freeze=True):
        pass
    count = frozen()
    gc.enable()
    with building(full=False, freeze=True):
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
