"""The per-batch turnstile: the calls one claim statement granted start in the batch's
order, and a call whose first step is synchronous never waits for its turn."""

from __future__ import annotations

import trio
import trio.testing

from coordinator.daemon.dispatch import Turns, _Turn


def _turn(turns: Turns, rank: int, size: int, log: list[str], batch: int = 1) -> _Turn:
    turn = _Turn(turns, place=(batch, rank, size))
    turn.on_start = lambda: log.append(f"started {rank}")
    return turn


def test_steps_kept_out_of_order_are_taken_in_order_by_the_task_that_passes() -> None:
    turns, log = Turns(), []
    t0, t1, t2 = (_turn(turns, rank, 3, log) for rank in range(3))
    # Trio ran the woken tasks in reverse: the later calls take their turn first.
    t2.take(lambda: log.append("send 2"))
    t1.take(lambda: log.append("send 1"))
    assert log == []  # kept, and nobody waits for it
    t0.take(lambda: log.append("send 0"))
    assert log == [
        "started 0",
        "send 0",
        "started 1",
        "send 1",
        "started 2",
        "send 2",
    ]
    assert turns._batches == {}  # the batch is done with


def test_a_call_that_starts_nothing_lets_the_next_go() -> None:
    turns, log = Turns(), []
    t0, t1, t2 = (_turn(turns, rank, 3, log) for rank in range(3))
    t2.take(lambda: log.append("send 2"))
    t0.pass_()  # refused: no run.started, no step
    assert log == []
    t1.take(lambda: None)  # nothing to send (no worker): still tells it started
    assert log == ["started 1", "started 2", "send 2"]


def test_batches_do_not_wait_for_each_other() -> None:
    turns, log = Turns(), []
    first = _turn(turns, 1, 2, log, batch=1)  # rank 0 of batch 1 has not started
    second = _turn(turns, 0, 1, log, batch=2)
    first.take(lambda: log.append("send b1r1"))
    second.take(lambda: log.append("send b2r0"))
    assert log == ["started 0", "send b2r0"]


def test_a_step_taken_after_the_turn_passed_runs_at_once() -> None:
    turns, log = Turns(), []
    t0 = _turn(turns, 0, 1, log)
    t0.take(lambda: log.append("nothing yet"))  # e.g. passed before waiting for a slot
    t0.take(lambda: log.append("send"))
    assert log == ["started 0", "nothing yet", "send"]


async def test_waiting_calls_start_in_order_whatever_order_they_run_in() -> None:
    turns, log = Turns(), []
    size = 6
    ranks = list(range(size))
    done = trio.Event()

    async def call(rank: int) -> None:
        turn = _turn(turns, rank, size, log)
        await turn.reached()  # a process to spawn: waits for the ones before it
        turn.take(lambda: log.append(f"spawn {rank}"))  # (told as started, then spawned)
        if len(log) == 2 * size:
            done.set()

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            for rank in reversed(ranks):  # the worst order: every later one first
                nursery.start_soon(call, rank)
            await done.wait()
    assert log == [entry for rank in ranks for entry in (f"started {rank}", f"spawn {rank}")]


async def test_calls_waiting_before_anyone_took_a_turn_wait_for_the_first() -> None:
    turns, log = Turns(), []
    size = 5
    waiting = [_turn(turns, rank, size, log) for rank in range(1, size)]
    finished = 0

    async def wait(turn: _Turn) -> None:
        nonlocal finished
        await turn.reached()
        turn.take(lambda: None)
        finished += 1

    async with trio.open_nursery() as nursery:
        for turn in waiting:
            nursery.start_soon(wait, turn)
        await trio.testing.wait_all_tasks_blocked()
        assert finished == 0
        _turn(turns, 0, size, log).take(lambda: None)
    assert finished == size - 1
    assert log == [f"started {rank}" for rank in range(size)]


async def test_a_call_that_reached_its_turn_and_stops_is_not_told_started() -> None:
    """A command abandoned once its turn came never spawned: no ``run.started``; the
    dispatch passes its turn on, and the calls after it go."""
    turns, log = Turns(), []
    first, second = _turn(turns, 0, 2, log), _turn(turns, 1, 2, log)
    second.take(lambda: log.append("send 1"))  # a worker's call, kept for its turn
    await first.reached()
    assert log == []  # the turn is still the first call's
    first.pass_()  # (it stopped without starting: Dispatcher.dispatch's finally)
    assert log == ["started 1", "send 1"]


async def test_a_command_is_told_started_before_the_calls_after_it() -> None:
    """A batch mixing a command and a worker's call: the command, first in the batch,
    is told started and spawns before the call kept after it goes."""
    turns, log = Turns(), []
    command, call = _turn(turns, 0, 2, log), _turn(turns, 1, 2, log)
    call.take(lambda: log.append("send 1"))
    await command.reached()
    command.take(lambda: log.append("spawn 0"))
    assert log == ["started 0", "spawn 0", "started 1", "send 1"]
