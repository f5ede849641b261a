"""Wake payloads are hints: every shape the triggers send is read, anything else is
ignored, and no text can make the parser raise (fuzzed)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.daemon import wakes
from coordinator.daemon.wakes import Changed, Dispatch, Pause


def test_the_shapes_the_triggers_send() -> None:
    assert wakes.parse('{"job": 12}') == Changed(job_ids=(12,))
    assert wakes.parse('{"jobs": "many"}') == Changed()
    assert wakes.parse('{"run": 5}') == Changed()
    assert wakes.parse('{"runs": "many"}') == Changed()
    assert wakes.parse('{"sync": "billing"}') == Changed()
    assert wakes.parse('{"pause": 41}') == Pause(run_id=41)
    assert wakes.parse(
        '{"run": 5, "dispatch": true, "job": 12, "priority": "interactive", "worker": "images"}'
    ) == Dispatch(run_id=5, job_id=12, priority="interactive", worker_type="images")
    assert wakes.parse(
        '{"run": 5, "dispatch": true, "job": 12, "priority": "background", "worker": null}'
    ) == Dispatch(run_id=5, job_id=12, priority="background", worker_type=None)
    # Since migrations/0027 the run's created_at comes too, in epoch microseconds.
    assert wakes.parse(
        '{"run": 5, "dispatch": true, "job": 12, "priority": "background", "worker": null,'
        ' "at": 1764662400123456}'
    ) == Dispatch(
        run_id=5, job_id=12, priority="background", worker_type=None, created_us=1764662400123456
    )


def test_a_woken_run_and_a_refreshed_one_are_due_on_one_scale() -> None:
    """A run ordered by its wake's ``at`` and one a refresh read (``created_at``) compare
    exactly: the same instant gives the same float, a microsecond later a larger one."""
    created = datetime(2026, 12, 2, 8, 30, 1, 123457, tzinfo=UTC)
    us = (created - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    hint = Dispatch(run_id=1, job_id=1, priority="background", worker_type=None, created_us=us)
    assert hint.created == wakes.epoch(created)
    assert wakes.epoch(created + timedelta(microseconds=1)) > hint.created
    assert wakes.epoch(created - timedelta(microseconds=1)) < hint.created
    assert Dispatch(run_id=1, job_id=1, priority="background", worker_type=None).created is None


def test_forged_and_malformed_payloads_are_ignored() -> None:
    for text in [
        "",
        "not json",
        "[]",
        "null",
        '"job"',
        "{}",
        '{"job": "12"}',
        '{"job": -1}',
        '{"job": 0}',
        '{"job": true}',
        '{"job": 1.5}',
        '{"job": 99999999999999999999}',
        '{"job": 1, "extra": 2}',
        '{"jobs": "few"}',
        '{"sync": 3}',
        '{"pause": "41"}',
        '{"pause": 0}',
        '{"pause": true}',
        '{"pause": 41, "run": 41}',
        '{"dispatch": true, "run": 1, "job": 2}',  # no priority
        '{"dispatch": true, "run": 1, "job": 2, "priority": "urgent", "worker": null}',
        '{"dispatch": true, "run": 1, "job": 2, "priority": "background", "worker": ""}',
        '{"dispatch": true, "run": 1, "job": 2, "priority": "background", "worker": 7}',
        '{"dispatch": true, "run": "1", "job": 2, "priority": "background", "worker": null}',
        '{"dispatch": true, "run": 1, "job": 2, "priority": "background", "admin": true}',
        '{"dispatch": 1, "run": 1, "job": 2, "priority": "background", "worker": null}',
        '{"dispatch": true, "run": 1, "job": 2, "priority": "background", "worker": null, '
        '"at": "2026-12-02"}',
        '{"dispatch": true, "run": 1, "job": 2, "priority": "background", "worker": null, '
        '"at": -1}',
        '{"dispatch": true, "run": 1, "job": 2, "priority": "background", "worker": null, '
        '"at": 1.5}',
        '{"dispatch": true, "run": 1, "job": 2, "priority": "background", "worker": null, '
        '"at": true}',
        # (A reviewer's: its division overflowed, raised in the listener's callback and
        # stopped the daemon; any role may NOTIFY.)
        '{"dispatch": true, "run": 1, "job": 2, "priority": "background", "worker": null, '
        '"at": 1' + "0" * 400 + "}",
        '{"dispatch": true, "run": 1, "job": 2, "priority": "background", "worker": null, '
        '"at": 9223372036854775808}',
        "[" * 100_000,
        '{"job": 1}' + " " * 9000,
    ]:
        assert wakes.parse(text) is None, text


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)
_keys = st.sampled_from(
    ["job", "jobs", "run", "runs", "sync", "dispatch", "priority", "worker", "pause"]
)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=300))
def test_any_text_parses_or_is_ignored(text: str) -> None:
    assert wakes.parse(text) is None or isinstance(wakes.parse(text), Changed | Dispatch | Pause)


@settings(max_examples=1000, deadline=None)
@given(st.dictionaries(_keys, _json, max_size=6))
def test_lookalike_objects_give_only_valid_hints(data: dict[str, object]) -> None:
    hint = wakes.parse(json.dumps(data))
    if isinstance(hint, Dispatch):
        assert hint.run_id >= 1
        assert hint.job_id >= 1
        assert hint.priority in ("interactive", "background")
        assert hint.worker_type is None or (isinstance(hint.worker_type, str) and hint.worker_type)
    elif isinstance(hint, Changed):
        assert hint.job_ids is None or all(isinstance(j, int) and j >= 1 for j in hint.job_ids)
    elif isinstance(hint, Pause):
        assert set(data) == {"pause"}
        assert isinstance(hint.run_id, int)
        assert hint.run_id >= 1
    else:
        assert hint is None


# --------------------------------------------------------------------------- parked hints


def _hint(job: int, worker: str | None = "t") -> Dispatch:
    return Dispatch(run_id=job * 10, job_id=job, priority="background", worker_type=worker)


def test_parked_hints_are_taken_by_their_type_oldest_first_with_when_they_came() -> None:
    parked = wakes.Parked()
    parked.park(_hint(1), 10.0)
    parked.park(_hint(2, "u"), 11.0)
    parked.park(_hint(3), 12.0)
    parked.park(_hint(1), 12.5)  # the same run's wake again: it keeps its first place
    newer = Dispatch(run_id=11, job_id=1, priority="background", worker_type="t")
    parked.park(newer, 13.0)  # a newer run of job 1 replaces the older, and goes last
    assert len(parked) == 3
    assert parked.take(frozenset({"v"})) == []
    taken = parked.take(frozenset({"t", "v"}))
    assert [(h.run_id, came) for h, came in taken] == [(30, 12.0), (11, 13.0)]
    assert len(parked) == 1
    assert [h.job_id for h, _ in parked.take(frozenset({"u"}))] == [2]
    assert len(parked) == 0
    keep_none = wakes.Parked(limit=0)  # (a limit of none keeps the newest only)
    keep_none.park(_hint(1), 1.0)
    assert len(keep_none) == 1


def test_parked_hints_are_forgotten_when_a_refresh_reads_their_jobs_and_bounded() -> None:
    parked = wakes.Parked(limit=3)
    for job in range(1, 5):  # the fourth drops the oldest
        parked.park(_hint(job, "t" if job % 2 else "u"), float(job))
    assert len(parked) == 3
    parked.forget(frozenset({3, 99}))
    assert [h.job_id for h, _ in parked.take(frozenset({"t", "u"}))] == [2, 4]
    parked.park(_hint(5), 5.0)
    parked.forget(None)  # a full refresh reads every job
    assert len(parked) == 0
    assert parked.take(frozenset({"t", "u"})) == []


@settings(max_examples=300, deadline=None)
@given(at=st.integers(min_value=-(10**30), max_value=10**30))
def test_a_dispatch_hint_s_time_never_raises(at: int) -> None:
    """Whatever "at" a payload carries, a hint parsed from it yields its time."""
    text = json.dumps(
        {"dispatch": True, "run": 1, "job": 2, "priority": "background", "worker": None, "at": at}
    )
    hint = wakes.parse(text)
    assert hint is None or (isinstance(hint, Dispatch) and hint.created is not None)
