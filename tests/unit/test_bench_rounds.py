"""The peers bench takes latency in rounds (every system in turn) and merges each
system's rounds into one result: the summaries come from every round's measured samples,
each round's warm-up left out, and the counts add up."""

from __future__ import annotations

from typing import Any

from bench.common import summary
from bench.peers import _merged


def _part(values: list[float], warmup: int, *, statements: int | None = None) -> dict[str, Any]:
    samples = [{"commit_to_start_ms": v, "sent_to_start_ms": v + 1} for v in values]
    measured = samples[warmup:]
    part: dict[str, Any] = {
        "n": len(measured),
        "warmup": warmup,
        "commit_to_start_ms": summary([s["commit_to_start_ms"] for s in measured]),
        "sent_to_start_ms": summary([s["sent_to_start_ms"] for s in measured]),
        "samples": samples,
    }
    if statements is not None:
        part["daemon_statements"] = statements
        part["statuses"] = {"succeeded": len(measured)}
        part["warmup_commit_to_start_ms"] = [s["commit_to_start_ms"] for s in samples[:warmup]]
    return part


def test_rounds_merge_into_the_summaries_of_all_their_measured_samples() -> None:
    merged = _merged([_part([100.0, 1.0, 2.0], 1), _part([200.0, 3.0, 4.0, 5.0], 1)])
    assert merged["n"] == 5
    assert merged["rounds"] == 2
    assert merged["commit_to_start_ms"] == summary([1.0, 2.0, 3.0, 4.0, 5.0])
    assert merged["sent_to_start_ms"]["p50"] == 4.0
    assert len(merged["samples"]) == 7  # warm-ups kept in the raw samples


def test_the_daemons_counts_add_up_over_rounds() -> None:
    merged = _merged([_part([9.0, 1.0], 1, statements=4), _part([9.0, 2.0, 3.0], 1, statements=6)])
    assert merged["daemon_statements"] == 10
    assert merged["daemon_statements_per_run"] == 2.0  # per sample sent, warm-ups included
    assert merged["statuses"] == {"succeeded": 3}
    assert merged["warmup_commit_to_start_ms"] == [9.0, 9.0]
