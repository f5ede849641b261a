"""Whether a claimed run may still be sent to a worker, as the lead goes and comes back:
a run claimed before the lead was lost is never sent after, even once it is taken again
(another daemon may have led and swept it in between)."""

from __future__ import annotations

import io
import itertools
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from coordinator.daemon.leadership import Leadership, sendable
from coordinator.errors import DatabaseUnavailable
from coordinator.log import EventLog

LEADER = 4242  # a backend pid: the lead is held


@pytest.mark.parametrize(
    ("leader_pid", "lost_at", "since", "expected"),
    [
        (LEADER, None, 10.0, True),  # never lost
        (None, None, 10.0, True),  # a store that never led (unfenced, as in tests)
        (0, 5.0, 10.0, False),  # lost now: nothing is sent
        (0, None, 10.0, False),  # (lost, whatever the mark says)
        (LEADER, 5.0, 10.0, True),  # lost and taken again before the call began
        (LEADER, 12.0, 10.0, False),  # lost after the call began, taken again since
        (LEADER, 10.0, 10.0, False),  # lost in the very tick it began: not sent
    ],
)
def test_a_claimed_run_is_sent_only_if_the_lead_was_not_lost_since_its_call_began(
    leader_pid: int | None, lost_at: float | None, since: float, expected: bool
) -> None:
    assert sendable(leader_pid, lost_at, since) is expected


# -- taking the lock back -------------------------------------------------------------------


class _Conn:
    """A lock session as Leadership.keep sees it: open until ``end()``."""

    def __init__(self) -> None:
        self.listeners: list[Any] = []
        self.closed = False

    def is_closed(self) -> bool:
        return self.closed

    def add_termination_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def end(self) -> None:
        self.closed = True
        for listener in self.listeners:
            listener(self)


class _Store:
    leader_pid: int | None = 4242

    async def try_lead(self, _conn: Any) -> bool:
        return True


async def test_a_nudge_cuts_short_the_wait_to_take_the_lock_back(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    """After an outage the wait between attempts had grown to 30 s: the database was
    back, every claim came back fenced, and nothing ran until the next attempt."""
    from coordinator.daemon import leadership as module

    reachable = False
    attempts: list[float] = []

    async def connect(*_args: Any, **_kwargs: Any) -> _Conn:
        attempts.append(trio.current_time())
        if not reachable:
            raise DatabaseUnavailable("down")
        return _Conn()

    async def close_quietly(*_args: Any, **_kwargs: Any) -> None:
        return None

    monkeypatch.setattr(module, "connect", connect)
    monkeypatch.setattr(module, "close_quietly", close_quietly)
    first = _Conn()
    lead = Leadership(
        dsn="postgresql://x@y/z", store=_Store(), log=EventLog(stream=io.StringIO()),  # type: ignore[arg-type]
        instance="i", conn=first,  # type: ignore[arg-type]
    )  # fmt: skip
    regained = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            partial(
                lead.keep, on_lost=lambda: None, on_regained=regained.set,
                on_stepped_down=lambda: None,
            )
        )  # fmt: skip
        await trio.sleep(1)
        first.end()
        await trio.sleep(100)  # down for a while: the attempts are 30 s apart by now
        assert attempts[-1] - attempts[-2] == pytest.approx(30.0)
        reachable = True
        back = trio.current_time()
        lead.nudge()  # a claim came back fenced
        await regained.wait()
        assert trio.current_time() - back < 0.01  # (it waited for the next attempt, ~30 s)
        nursery.cancel_scope.cancel()


async def test_the_first_attempt_after_a_loss_keeps_its_pause(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    # (A session cut on our side may linger on the server a moment, holding the lock:
    # taking it at once would find it held and step down.)
    from coordinator.daemon import leadership as module

    async def connect(*_args: Any, **_kwargs: Any) -> _Conn:
        return _Conn()

    async def close_quietly(*_args: Any, **_kwargs: Any) -> None:
        return None

    monkeypatch.setattr(module, "connect", connect)
    monkeypatch.setattr(module, "close_quietly", close_quietly)
    first = _Conn()
    lead = Leadership(
        dsn="postgresql://x@y/z", store=_Store(), log=EventLog(stream=io.StringIO()),  # type: ignore[arg-type]
        instance="i", conn=first,  # type: ignore[arg-type]
    )  # fmt: skip
    regained = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            partial(
                lead.keep, on_lost=lambda: None, on_regained=regained.set,
                on_stepped_down=lambda: None,
            )
        )  # fmt: skip
        await trio.sleep(1)
        first.end()
        lost = trio.current_time()
        lead.nudge()
        await regained.wait()
        assert trio.current_time() - lost == pytest.approx(0.5)
        nursery.cancel_scope.cancel()


async def test_nudges_make_at_most_an_attempt_a_second(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    # (Every fenced claim nudges; the database answering claims may still refuse new
    # sessions, "too many connections": no attempt at the claims' rate.)
    from coordinator.daemon import leadership as module

    attempts: list[float] = []

    async def connect(*_args: Any, **_kwargs: Any) -> _Conn:
        attempts.append(trio.current_time())
        raise DatabaseUnavailable("too many connections")

    async def close_quietly(*_args: Any, **_kwargs: Any) -> None:
        return None

    monkeypatch.setattr(module, "connect", connect)
    monkeypatch.setattr(module, "close_quietly", close_quietly)
    first = _Conn()
    lead = Leadership(
        dsn="postgresql://x@y/z", store=_Store(), log=EventLog(stream=io.StringIO()),  # type: ignore[arg-type]
        instance="i", conn=first,  # type: ignore[arg-type]
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            partial(
                lead.keep, on_lost=lambda: None, on_regained=lambda: None,
                on_stepped_down=lambda: None,
            )
        )  # fmt: skip
        await trio.sleep(1)
        first.end()
        await trio.sleep(100)
        start = trio.current_time()
        for _ in range(50):  # a fenced claim every 0.1 s for 5 s
            lead.nudge()
            await trio.sleep(0.1)
        during = [t for t in attempts if t >= start]
        assert 4 <= len(during) <= 6
        assert all(b - a >= 1.0 for a, b in itertools.pairwise(during))
        nursery.cancel_scope.cancel()
