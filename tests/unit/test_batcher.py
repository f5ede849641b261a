"""The store's group commit (:class:`coordinator.store.Batcher`), without a database: who
sends a batch, what goes in it, and in which order."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from coordinator.store import Batcher


class Recorder:
    """A ``send`` that records each batch and the task that sent it; ``gate`` (when set
    up) holds the statement "in flight" until it is set."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.senders: list[trio.lowlevel.Task] = []
        self.gate: trio.Event | None = None
        self.sending = trio.Event()

    async def send(self, items: list[int]) -> list[int | BaseException]:
        self.batches.append(list(items))
        self.senders.append(trio.lowlevel.current_task())
        self.sending.set()
        if self.gate is not None:
            await self.gate.wait()
        return [item * 10 for item in items]


async def test_a_lone_item_is_sent_by_its_caller_at_once() -> None:
    recorder = Recorder()
    batcher: Batcher[int, int] = Batcher(send=recorder.send)
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        assert await batcher.submit(7) == 70
        assert recorder.batches == [[7]]
        # The caller sent it (no hand-off to the batching task and back).
        assert recorder.senders == [trio.lowlevel.current_task()]
        nursery.cancel_scope.cancel()


async def test_items_submitted_in_one_turn_go_together_in_their_order() -> None:
    recorder = Recorder()
    batcher: Batcher[int, int] = Batcher(send=recorder.send)
    results: dict[int, int] = {}

    async def submit(item: int) -> None:
        results[item] = await batcher.submit(item, order=item)

    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        async with trio.open_nursery() as callers:
            for item in (5, 3, 8, 1, 4):  # started in this order, ordered by `order`
                callers.start_soon(submit, item)
        nursery.cancel_scope.cancel()
    assert recorder.batches == [[1, 3, 4, 5, 8]]
    assert results == {1: 10, 3: 30, 4: 40, 5: 50, 8: 80}


async def test_items_arriving_while_a_statement_is_in_flight_wait_for_the_next() -> None:
    recorder = Recorder()
    recorder.gate = trio.Event()
    batcher: Batcher[int, int] = Batcher(send=recorder.send)
    results: list[int] = []

    async def submit(item: int) -> None:
        results.append(await batcher.submit(item, order=item))

    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        nursery.start_soon(submit, 1)
        await recorder.sending.wait()  # the first statement is in flight
        for item in (4, 2, 3):
            nursery.start_soon(submit, item)
        await trio.testing.wait_all_tasks_blocked()
        assert recorder.batches == [[1]]  # nothing else sent meanwhile
        recorder.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert recorder.batches == [[1], [2, 3, 4]]
    assert sorted(results) == [10, 20, 30, 40]


async def test_a_failed_statement_fails_every_item_of_its_batch_only() -> None:
    calls = 0

    async def send(items: list[int]) -> list[int | BaseException]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("the statement failed")
        return [item for item in items]

    batcher: Batcher[int, int] = Batcher(send=send)
    outcomes: dict[int, object] = {}

    async def submit(item: int) -> None:
        try:
            outcomes[item] = await batcher.submit(item, order=item)
        except RuntimeError as exc:
            outcomes[item] = str(exc)

    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        async with trio.open_nursery() as callers:
            for item in (1, 2):
                callers.start_soon(submit, item)
        await submit(3)
        nursery.cancel_scope.cancel()
    assert outcomes == {1: "the statement failed", 2: "the statement failed", 3: 3}


async def test_a_cancelled_leader_still_sees_its_batch_through_and_leaves_nobody_behind(
    autojump_clock: trio.testing.MockClock,
) -> None:
    recorder = Recorder()
    recorder.gate = trio.Event()
    batcher: Batcher[int, int] = Batcher(send=recorder.send)
    results: dict[int, object] = {}

    async def submit(item: int, scope: trio.CancelScope) -> None:
        with scope:
            results[item] = await batcher.submit(item, order=item)
        if scope.cancelled_caught:
            results[item] = "cancelled"

    leader, other = trio.CancelScope(), trio.CancelScope()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(batcher.run)
            nursery.start_soon(submit, 1, leader)
            await recorder.sending.wait()  # the leader's statement is in flight
            nursery.start_soon(submit, 2, other)
            await trio.testing.wait_all_tasks_blocked()
            leader.cancel()  # e.g. the daemon abandoning calls at stop
            await trio.testing.wait_all_tasks_blocked()
            assert recorder.batches == [[1]]  # not cut short: still in flight
            recorder.gate.set()
            while 2 not in results:
                await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
    # The statement was seen through (its outcome is known to the batch), the caller
    # that left got its cancellation, and the item queued behind it was sent.
    assert recorder.batches == [[1], [2]]
    assert results == {1: "cancelled", 2: 20}


async def test_a_leader_cancelled_before_sending_withdraws_its_item() -> None:
    recorder = Recorder()
    batcher: Batcher[int, int] = Batcher(send=recorder.send)
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        with trio.CancelScope() as scope:
            scope.cancel()
            await batcher.submit(1)
        assert scope.cancelled_caught
        assert await batcher.submit(2) == 20
        nursery.cancel_scope.cancel()
    assert recorder.batches == [[2]]


@pytest.mark.parametrize("alone", [True, False])
async def test_an_item_alone_is_sent_without_yielding_for_company(alone: bool) -> None:
    recorder = Recorder()
    batcher: Batcher[int, int] = Batcher(send=recorder.send)
    results: dict[int, int] = {}

    async def submit(item: int) -> None:
        results[item] = await batcher.submit(item, order=item, alone=alone)

    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        async with trio.open_nursery() as callers:  # two submitters, started in one turn
            callers.start_soon(submit, 1)
            callers.start_soon(submit, 2)
        nursery.cancel_scope.cancel()
    if alone:
        # The first to run went at once; the other found a statement in flight and
        # went next.
        assert sorted(recorder.batches) == [[1], [2]]
    else:
        # The first to run yielded once first, and the other joined it, in order.
        assert recorder.batches == [[1, 2]]
    assert results == {1: 10, 2: 20}
