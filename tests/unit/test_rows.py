"""Reading job rows: the shared targets and schedules give the same jobs as reading each
row afresh, and a bad stored target is still reported for every row that has it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from coordinator import rows
from coordinator.model import Schedule, Target


def _row(job_id: int, target: str, schedule: str = "*/5 * * * *") -> dict[str, Any]:
    return {
        "id": job_id, "namespace": "ns", "name": f"job-{job_id}", "schedule_kind": "cron",
        "schedule": schedule, "timezone": "UTC", "target": target, "params": '{"k": [1]}',
        "timeout": None, "priority": "background", "idempotent": False, "paused": False,
        "invalid_reason": None, "next_run_at": None, "schedule_version": 1, "retries": 0,
        "retry_backoff": timedelta(seconds=30), "retry_max_delay": timedelta(hours=1),
        "misfire": "run-once", "misfire_grace": None,
    }  # fmt: skip


def test_rows_sharing_a_target_and_schedule_share_the_values() -> None:
    first, error1 = rows.job_from_row(_row(1, '{"kind": "worker", "type": "billing"}'))
    second, error2 = rows.job_from_row(_row(2, '{"kind": "worker", "type": "billing"}'))
    other, _ = rows.job_from_row(_row(3, '{"kind": "worker", "type": "mail"}', "@daily"))
    assert error1 is None
    assert error2 is None
    assert first.target == Target(kind="worker", worker_type="billing")
    assert first.target is second.target
    assert first.schedule is second.schedule
    assert other.target == Target(kind="worker", worker_type="mail")
    assert other.schedule == Schedule(kind="cron", expression="@daily")
    assert first.params == {"k": [1]}
    assert first.params is not second.params
    assert (first.id, second.id, first.name) == (1, 2, "job-1")


def test_a_bad_target_is_reported_every_time() -> None:
    for job_id in (1, 2):
        job, error = rows.job_from_row(_row(job_id, '{"kind": "worker"}'))
        assert error == "worker target needs a non-empty 'type'"
        assert job.target == Target(kind="exec")


def test_the_memo_stays_bounded() -> None:
    for job_id in range(rows._MEMO_LIMIT + 10):
        rows.job_from_row(_row(job_id + 1, f'{{"kind": "worker", "type": "t{job_id}"}}'))
    assert len(rows._TARGETS) <= rows._MEMO_LIMIT


def test_a_job_read_again_unchanged_is_the_same_value() -> None:
    target = '{"kind": "worker", "type": "billing"}'
    first, _ = rows.job_from_row(_row(7, target), job_id=7)
    again, _ = rows.job_from_row(_row(7, target), job_id=7)
    assert again is first
    edited = {**_row(7, target), "params": '{"k": [2]}'}
    changed, _ = rows.job_from_row(edited, job_id=7)
    assert changed is not first
    assert changed.params == {"k": [2]}
    assert first.params == {"k": [1]}
    moved, _ = rows.job_from_row({**_row(7, target), "schedule_version": 2}, job_id=7)
    assert moved.schedule_version == 2


def test_a_row_with_decoded_json_columns_is_read_too() -> None:
    decoded = {**_row(8, "{}"), "target": {"kind": "worker", "type": "b"}, "params": {"k": 1}}
    job, error = rows.job_from_row(decoded)
    assert error is None
    assert (job.target.worker_type, job.params) == ("b", {"k": 1})


def test_the_job_memo_stays_bounded() -> None:
    for job_id in range(rows._MEMO_LIMIT + 10):
        rows.job_from_row(_row(job_id + 1, '{"kind": "worker", "type": "t"}'))
    assert len(rows._JOBS) <= rows._MEMO_LIMIT
