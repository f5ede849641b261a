"""A held result is the same value in memory and in the spool: a recoverable run's paused
outcome, its cursor (JSON null included, and "no cursor" kept apart from it) and its
unwritten findings come back exactly (docs/design.md, "Settlement")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from coordinator.model import Cursor, Finding, Outcome
from coordinator.spool import HeldResult, Spool

if TYPE_CHECKING:
    from pathlib import Path

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def held(run_id: int, **outcome: Any) -> HeldResult:
    return HeldResult(
        run_id=run_id,
        job_id=3,
        job_key="ops/scan",
        schedule_version=2,
        next_run_at=T0 + timedelta(hours=1),
        outcome=Outcome(
            status=outcome.pop("status", "paused"),
            started_at=T0,
            finished_at=T0 + timedelta(seconds=90),
            **outcome,
        ),
    )


CASES = [
    held(
        1,
        count=1200,
        error_message="paused by operator",
        cursor=Cursor(value={"after": "k-1200", "nested": [1.5, None, "é", {"z": True}]}),
        findings=(
            Finding(kind="missing_blob", resource_id="ab", severity="data_loss", detail={"n": 1}),
            Finding(kind="size", resource_id="é/2", severity="warning"),
        ),
    ),
    held(2, cursor=Cursor(value=None)),  # a cursor that is JSON null
    held(3, status="succeeded", count=7),  # no cursor at all
    held(4, status="failed", error_cause="handler", error_message="x", cursor=Cursor(value=0)),
]


@pytest.mark.parametrize("record", CASES, ids=lambda r: str(r.run_id))
def test_a_recoverable_result_comes_back_from_the_spool_exactly(
    tmp_path: Path, record: HeldResult
) -> None:
    spool = Spool(tmp_path / "spool.jsonl")
    spool.append([record])
    contents = spool.read()
    assert contents.corrupt == []
    assert contents.records == [record]


def test_records_of_an_older_version_read_without_cursor_or_findings(tmp_path: Path) -> None:
    record = held(5, status="succeeded")
    data = record.to_json()
    assert "cursor" not in data["outcome"]
    assert "findings" not in data["outcome"]
    assert HeldResult.from_json(data) == record
    assert HeldResult.from_json(held(6, cursor=Cursor(value=None)).to_json()).outcome.cursor == (
        Cursor(value=None)
    )
