"""Job sets for the benchmarks, written the way an application may write them: plain SQL
into ``coordinator.jobs`` (one ``INSERT ... SELECT generate_series``), not the CLI."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

NOOP = json.dumps({"kind": "exec", "argv": ["true"]})
ABSENT_WORKER = json.dumps({"kind": "worker", "type": "absent"})
NOOP_WORKER = '{"kind": "worker", "type": "noop"}'  # bench/noop_worker.py serves it
NAMESPACE = "bench"


def far_future_cron() -> str:
    """A yearly cron template (``{m} {h} D M *``) whose next firing is weeks away: January
    1st, or July 1st when January 1st is less than two days off."""
    now = datetime.now(UTC)
    jan1 = datetime(now.year + 1, 1, 1, tzinfo=UTC)
    if jan1 - now < timedelta(days=2) or (now.month == 1 and now.day <= 2):
        return "1 7"
    return "1 1"


def _cron_expr_sql() -> str:
    # minute and hour vary with the row so the deadlines are not all equal.
    return f"((g % 60)::text || ' ' || (g % 24)::text || ' {far_future_cron()} *')"


#: kind -> (schedule_kind, schedule SQL expression over g, target, paused)
KINDS: dict[str, tuple[str, str, str, bool]] = {
    "cron": ("cron", "__CRON__", NOOP, False),
    "manual": ("manual", "NULL", NOOP, False),
    "paused": ("cron", "__CRON__", NOOP, True),
    "invalid": ("cron", "'61 25 * * * bogus ' || g::text", NOOP, False),
    "worker": ("cron", "__CRON__", ABSENT_WORKER, False),
    "manual-worker": ("manual", "NULL", NOOP_WORKER, False),
}


async def insert_jobs(
    conn: Any, kind: str, count: int, *, prefix: str | None = None, next_run_at: bool = False
) -> None:
    """Insert ``count`` jobs of ``kind`` named ``{prefix}{n}`` in one statement.

    ``next_run_at=True`` saves a far-future deadline (as a daemon that ran before would
    have), so startup has nothing to initialise.
    """
    schedule_kind, schedule, target, paused = KINDS[kind]
    schedule = schedule.replace("__CRON__", _cron_expr_sql())
    prefix = prefix if prefix is not None else f"{kind}-"
    deadline = "now() + interval '30 days'" if next_run_at else "NULL"
    await conn.execute(
        f"""
        INSERT INTO coordinator.jobs (namespace, name, schedule_kind, schedule, target,
                                      paused, next_run_at)
        SELECT $1, $2 || g::text, $3, {schedule}, $4::jsonb, $5, {deadline}
          FROM generate_series(1, $6::integer) AS g
        """,
        NAMESPACE,
        prefix,
        schedule_kind,
        target,
        paused,
        count,
    )


async def insert_once(conn: Any, *, prefix: str, deadlines: list[datetime]) -> None:
    """One-shot jobs (``schedule_kind = 'once'``) with the given deadlines (saved in
    ``next_run_at``, as ``coordinator.define_job`` does)."""
    await conn.execute(
        """
        INSERT INTO coordinator.jobs (namespace, name, schedule_kind, schedule, target,
                                      next_run_at)
        SELECT $1, $2 || o::text, 'once', to_char(d AT TIME ZONE 'UTC',
                                                  'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               $3::jsonb, d
          FROM unnest($4::timestamptz[]) WITH ORDINALITY AS u(d, o)
        """,
        NAMESPACE,
        prefix,
        NOOP,
        deadlines,
    )
