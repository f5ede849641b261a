"""Whether a claimed run may still be sent to a worker, as the lead goes and comes back:
a run claimed before the lead was lost is never sent after, even once it is taken again
(another daemon may have led and swept it in between)."""

from __future__ import annotations

import pytest

from coordinator.daemon.leadership import sendable

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
