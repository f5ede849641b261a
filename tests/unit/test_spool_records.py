"""A held result's journal record keeps what the settlement needs to decide a retry."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from coordinator.model import Outcome
from coordinator.spool import HeldResult, Spool

if TYPE_CHECKING:
    from pathlib import Path

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _held(**outcome: object) -> HeldResult:
    return HeldResult(
        run_id=7,
        job_id=3,
        job_key="ns/job",
        schedule_version=2,
        next_run_at=T0 + timedelta(hours=1),
        outcome=Outcome(
            status="failed",
            started_at=T0,
            finished_at=T0 + timedelta(seconds=2),
            error_cause="handler",
            error_message="exit status 75",
            **outcome,  # type: ignore[arg-type]
        ),
        retry_jitter=0.625,
    )


def test_category_retryable_and_jitter_survive_the_spool(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.jsonl")
    held = _held(category="external-dependency", retryable=True)
    spool.append([held])
    assert spool.read().records == [held]


def test_records_of_older_versions_read_with_the_defaults() -> None:
    record = _held().to_json()
    del record["retry_jitter"]
    del record["outcome"]["category"]
    del record["outcome"]["retryable"]
    back = HeldResult.from_json(json.loads(json.dumps(record)))
    assert (back.retry_jitter, back.outcome.category, back.outcome.retryable) == (0.0, None, None)
    assert back.outcome.error_message == "exit status 75"


def test_a_give_back_keeps_the_claim_it_undoes() -> None:
    """A give-back (``queued``) undoes one claim of its run: the spool keeps which
    (``claimed_at``, the database's own value); older records read as ``None``."""
    claimed = T0 - timedelta(microseconds=123_457)
    held = HeldResult(
        run_id=7,
        job_id=3,
        job_key="ns/job",
        schedule_version=2,
        next_run_at=None,
        outcome=Outcome(status="queued", started_at=T0, finished_at=T0, error_message="x"),
        claimed_at=claimed,
    )
    back = HeldResult.from_json(json.loads(held.line().split(b"\t")[0]))
    assert back == held
    assert back.claimed_at == claimed
    record = held.to_json()
    del record["claimed_at"]
    assert HeldResult.from_json(record).claimed_at is None
