"""Whether a claimed run may still be sent to a worker, as the lead goes and comes back:
a run claimed before the lead was lost is never sent after, even once it is taken again
(another daemon may have led and swept it in between)."""

from __future__ import annotations

import io
import itertools
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio
import trio.testing

from coordinator.daemon.leadership import (
    LEAD_RETRY_CAP,
    LEAD_RETRY_SPAN,
    STANDBY_YIELD,
    Leadership,
    sendable,
)
from coordinator.errors import DatabaseUnavailable
from coordinator.log import EventLog

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

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

    async def end_own_lingering_lead(self, _conn: Any) -> bool:
        return False


@attrs.define
class _Keeping:
    """A Leadership keeping a lock session that ends when the test says, and whose
    attempts to take it back reach a database that answers when ``reachable``."""

    lead: Leadership
    first: _Conn
    regained: trio.Event
    reachable: bool = True
    attempts: list[float] = attrs.field(factory=list)


@asynccontextmanager
async def _keeping(monkeypatch: pytest.MonkeyPatch, *, reachable: bool) -> AsyncIterator[_Keeping]:
    from coordinator.daemon import leadership as module

    first = _Conn()
    lead = Leadership(
        dsn="postgresql://x@y/z", store=_Store(), log=EventLog(stream=io.StringIO()),  # type: ignore[arg-type]
        instance="i", conn=first,  # type: ignore[arg-type]
    )  # fmt: skip
    k = _Keeping(lead=lead, first=first, regained=trio.Event(), reachable=reachable)

    async def connect(*_args: Any, **_kwargs: Any) -> _Conn:
        k.attempts.append(trio.current_time())
        if not k.reachable:
            raise DatabaseUnavailable("down")
        return _Conn()

    async def close_quietly(*_args: Any, **_kwargs: Any) -> None:
        return None

    monkeypatch.setattr(module, "connect", connect)
    monkeypatch.setattr(module, "close_quietly", close_quietly)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            partial(
                lead.keep, on_lost=lambda: None, on_regained=k.regained.set,
                on_stepped_down=lambda: None,
            )
        )  # fmt: skip
        await trio.sleep(1)
        yield k
        nursery.cancel_scope.cancel()


async def test_a_nudge_cuts_short_the_wait_to_take_the_lock_back(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    """After an outage the wait between attempts had grown to 30 s: the database was
    back, every claim came back fenced, and nothing ran until the next attempt."""
    async with _keeping(monkeypatch, reachable=False) as k:
        k.first.end()
        await trio.sleep(200)  # down for a while: the attempts are 30 s apart by now
        assert k.attempts[-1] - k.attempts[-2] == pytest.approx(30.0)
        k.reachable = True
        back = trio.current_time()
        k.lead.nudge()  # a claim came back fenced
        await k.regained.wait()
        assert trio.current_time() - back < 0.01  # (it waited for the next attempt, ~30 s)


async def test_a_leader_tries_every_second_for_the_first_minute(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    """A database restart ends the standby's session too: the live leader must be back
    before the standby, which lets it try first for STANDBY_YIELD."""
    async with _keeping(monkeypatch, reachable=False) as k:
        k.first.end()
        lost = trio.current_time()
        await trio.sleep(LEAD_RETRY_SPAN - 5)
        early = [b - a for a, b in itertools.pairwise(k.attempts) if b - lost > 2]
        assert early
        assert max(early) == pytest.approx(LEAD_RETRY_CAP)
        assert LEAD_RETRY_CAP * 2 < STANDBY_YIELD


async def test_the_first_attempt_after_a_loss_keeps_its_pause(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    # (A session cut on our side may linger on the server a moment, holding the lock:
    # taking it at once would find it held and step down.)
    async with _keeping(monkeypatch, reachable=True) as k:
        k.first.end()
        lost = trio.current_time()
        k.lead.nudge()
        await k.regained.wait()
        assert trio.current_time() - lost == pytest.approx(0.5)


async def test_nudges_make_at_most_an_attempt_a_second(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    # (Every fenced claim nudges; the database answering claims may still refuse new
    # sessions, "too many connections": no attempt at the claims' rate.)
    async with _keeping(monkeypatch, reachable=False) as k:
        k.first.end()
        await trio.sleep(100)
        start = trio.current_time()
        for _ in range(50):  # a fenced claim every 0.1 s for 5 s
            k.lead.nudge()
            await trio.sleep(0.1)
        during = [t for t in k.attempts if t >= start]
        assert 4 <= len(during) <= 6
        assert all(b - a >= 1.0 for a, b in itertools.pairwise(during))
