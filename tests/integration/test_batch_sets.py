"""The set-based batches (migrations/0015) answer and write exactly what the item-by-item
path (``_claim_each`` / ``_settle_each``, each item through ``_claim`` / ``_settle``)
answers and writes, for every outcome a claim or a settlement can have.

Each comparison runs both paths on the same rows inside one transaction (so ``now()`` is
the same), rolling back between them, and compares the rows returned and the whole of
``jobs`` and ``runs`` afterwards (runs inserted by a path are named by their job, since
their ids come from a sequence that a rollback does not rewind). It also checks, from
the server's per-transaction function statistics, that the set-based path really was the
one taken (no ``_claim``/``_settle`` call) when every item names a different job."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
import trio

from coordinator.db import aio

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
DUE = NOW - timedelta(seconds=5)  # a deadline just due
LATER = NOW + timedelta(minutes=1)
EXEC = {"kind": "exec", "argv": ["true"]}
WORKER = {"kind": "worker", "type": "noop"}
WORKERS = ["noop"]


async def job(conn: asyncpg.Connection, name: str, **cols: Any) -> int:
    """A job written with plain SQL (an interval job due at DUE unless told)."""
    row: dict[str, Any] = {
        "name": name,
        "schedule_kind": "interval",
        "schedule": "1m",
        "target": EXEC,
        "next_run_at": DUE,
        **cols,
    }
    for key in ("target", "params"):
        if isinstance(row.get(key), dict):
            row[key] = json.dumps(row[key])
    names = ", ".join(row)
    values = ", ".join(f"${i + 1}" for i in range(len(row)))
    job_id: int = await aio(conn.fetchval)(
        f"INSERT INTO coordinator.jobs ({names}) VALUES ({values}) RETURNING id", *row.values()
    )
    return job_id


async def run(conn: asyncpg.Connection, job_id: int, status: str, **cols: Any) -> int:
    """A run written with plain SQL."""
    row: dict[str, Any] = {"job_id": job_id, "status": status, "trigger": "manual", **cols}
    for key in ("args", "cursor"):
        if key in row and not isinstance(row[key], str):
            row[key] = json.dumps(row[key])
    names = ", ".join(row)
    values = ", ".join(f"${i + 1}" for i in range(len(row)))
    run_id: int = await aio(conn.fetchval)(
        f"INSERT INTO coordinator.runs ({names}) VALUES ({values}) RETURNING id", *row.values()
    )
    return run_id


async def _state(conn: asyncpg.Connection, name_new: Any) -> list[Any]:
    jobs = await aio(conn.fetch)("SELECT * FROM coordinator.jobs ORDER BY id")
    runs = await aio(conn.fetch)("SELECT * FROM coordinator.runs ORDER BY job_id, id")
    out: list[Any] = [dict(r) for r in jobs]
    for r in runs:
        row = dict(r)
        row["id"] = name_new(row["id"], row["job_id"])
        row["retry_of"] = name_new(row["retry_of"], None)
        out.append(row)
    return out


async def _calls(conn: asyncpg.Connection, function: str) -> int:
    n: int = await aio(conn.fetchval)(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions "
        "WHERE schemaname = 'coordinator' AND funcname = $1",
        function,
    )
    return n


async def both_paths(
    conn: asyncpg.Connection, each_sql: str, many_sql: str, args: tuple[Any, ...], per_item: str
) -> tuple[list[dict[str, Any]], list[Any], list[Any], int]:
    """Run the item-by-item path, roll back, run the batch function; return the batch's
    rows, both states (item-by-item's first) and how often the batch called ``per_item``.
    The rows of the two paths must be the same (checked here)."""
    tx = conn.transaction()
    await aio(tx.start)()
    try:
        await aio(conn.execute)("SET LOCAL track_functions = 'pl'")
        base: int = await aio(conn.fetchval)("SELECT coalesce(max(id), 0) FROM coordinator.runs")
        inserted: dict[int, int | None] = {}

        def name_new(run_id: int | None, job_id: int | None) -> Any:
            if run_id is None or run_id <= base:
                return run_id
            if job_id is not None:
                inserted[run_id] = job_id
            return ("new", inserted.get(run_id))

        def rows_of(records: list[Any]) -> list[dict[str, Any]]:
            out = []
            for rec in sorted(records, key=lambda r: r["i"]):
                row = dict(rec)
                for key in ("run_id", "retry_run_id"):
                    if row.get(key) is not None:
                        row[key] = name_new(row[key], None)
                out.append(row)
            return out

        await aio(conn.execute)("SAVEPOINT each")
        each_records = await aio(conn.fetch)(each_sql, *args)
        each_state = await _state(conn, name_new)
        each_rows = rows_of(each_records)
        await aio(conn.execute)("ROLLBACK TO SAVEPOINT each")
        inserted.clear()
        before = await _calls(conn, per_item)
        many_records = await aio(conn.fetch)(many_sql, *args)
        calls = await _calls(conn, per_item) - before
        many_state = await _state(conn, name_new)
        many_rows = rows_of(many_records)
    finally:
        await aio(tx.rollback)()
    assert many_rows == each_rows
    return many_rows, each_state, many_state, calls


CLAIM_EACH = "SELECT * FROM coordinator._claim_each($1::json, $2, $3, false)"
CLAIM_MANY = "SELECT * FROM coordinator._claim_many($1, $2, $3, NULL, 0, 0)"
SETTLE_EACH = "SELECT * FROM coordinator._settle_each($1::json, false)"
SETTLE_MANY = "SELECT * FROM coordinator._settle_many($1)"


def claim_item(job_id: int, run_id: int | None = None, **kw: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "job": job_id,
        "run": run_id,
        "at": None if run_id is not None else DUE.isoformat(),
        "v": None if run_id is not None else 1,
        "now": NOW.isoformat(),
        "skip": None,
    }
    item.update(kw)
    return item


async def test_every_claim_outcome_is_the_same_item_by_item_and_as_a_set(
    conn: asyncpg.Connection,
) -> None:
    items: list[dict[str, Any]] = []
    j = await job(conn, "manual", schedule_kind="manual", schedule=None, next_run_at=None)
    items.append(claim_item(j, await run(conn, j, "queued")))
    j = await job(
        conn,
        "resumed-by-trigger",
        schedule_kind="manual",
        schedule=None,
        next_run_at=None,
        target=WORKER,
        recoverable=True,
    )
    items.append(
        claim_item(
            j, await run(conn, j, "queued", started_at=DUE, resumes=1, cursor={"k": 1}, count=7)
        )
    )
    items.append(claim_item(await job(conn, "due")))
    j = await job(conn, "paused-run", target=WORKER, recoverable=True)
    await run(
        conn,
        j,
        "paused",
        trigger="schedule",
        scheduled_for=DUE - timedelta(minutes=1),
        started_at=DUE,
        paused_at=DUE,
        error_message="stopping",
        cursor={"k": 2},
    )
    items.append(claim_item(j))
    items.append(claim_item(await job(conn, "paused-job", paused=True)))
    items.append(claim_item(await job(conn, "invalid", invalid_reason="bad schedule")))
    j = await job(conn, "retry-not-due", retries=2)
    items.append(
        claim_item(
            j,
            await run(
                conn, j, "queued", trigger="retry", attempt=2, due_at=NOW + timedelta(hours=1)
            ),
            at=NOW.isoformat(),
        )
    )
    j = await job(conn, "retry-due", retries=2)
    items.append(
        claim_item(
            j,
            await run(conn, j, "queued", trigger="retry", attempt=2, scheduled_for=DUE, due_at=DUE),
            at=NOW.isoformat(),
        )
    )
    items.append(claim_item(await job(conn, "edited"), v=7))
    items.append(claim_item(await job(conn, "moved"), at=(DUE - timedelta(minutes=1)).isoformat()))
    late = NOW - timedelta(hours=1)
    items.append(
        claim_item(
            await job(
                conn,
                "misfired",
                misfire="skip",
                misfire_grace=timedelta(seconds=1),
                next_run_at=late,
            ),
            at=late.isoformat(),
            skip=LATER.isoformat(),
        )
    )
    items.append(claim_item(await job(conn, "no-worker", target={"kind": "worker", "type": "x"})))
    items.append(claim_item(10_000_000))
    other = await job(conn, "other", schedule_kind="manual", schedule=None, next_run_at=None)
    foreign = await run(conn, other, "queued")
    items.append(claim_item(await job(conn, "foreign-run"), foreign))
    j = await job(conn, "running", schedule_kind="manual", schedule=None, next_run_at=None)
    items.append(claim_item(j, await run(conn, j, "running")))
    j = await job(conn, "outstanding")
    await run(conn, j, "queued")
    items.append(claim_item(j))
    j = await job(
        conn, "worker", schedule_kind="manual", schedule=None, next_run_at=None, target=WORKER
    )
    items.append(claim_item(j, await run(conn, j, "queued", args={"a": 1})))
    for n, item in enumerate(reversed(items)):
        item["i"] = n

    rows, each_state, many_state, calls = await both_paths(
        conn, CLAIM_EACH, CLAIM_MANY, (json.dumps(items), "test", WORKERS), "_claim"
    )
    assert calls == 0  # the set-based path
    assert many_state == each_state
    reasons = sorted(str(r["reason"]) for r in rows)
    assert reasons == sorted(
        ["None"] * 6
        + [
            "paused",
            "invalid",
            "not_due",
            "version",
            "deadline",
            "misfire",
            "unavailable",
            "gone",
            "gone",
            "not_queued",
            "outstanding",
        ]
    )
    assert all(r["err_state"] is None for r in rows)

    # Two items of one job: item by item (the second sees the first), as before.
    dup = [claim_item(j, None, i=0), claim_item(j, None, i=1)]
    rows, each_state, many_state, calls = await both_paths(
        conn, CLAIM_EACH, CLAIM_MANY, (json.dumps(dup), "test", WORKERS), "_claim"
    )
    assert calls == 2
    assert many_state == each_state

    # One item (a lone trigger on an idle daemon): item by item, which is quicker for one.
    lone = [claim_item(j, None, i=0)]
    rows, each_state, many_state, calls = await both_paths(
        conn, CLAIM_EACH, CLAIM_MANY, (json.dumps(lone), "test", WORKERS), "_claim"
    )
    assert calls == 1
    assert many_state == each_state


def settle_item(run_id: int, status: str = "succeeded", **kw: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "run": run_id,
        "status": status,
        "started": DUE.isoformat(),
        "finished": NOW.isoformat(),
        "count": 3,
        "extra": {"progress": {"done": 3}},
        "cause": None if status in ("succeeded", "paused") else "handler",
        "message": None if status == "succeeded" else "it said no",
        "v": 1,
        "next": LATER.isoformat(),
        "category": None,
        "retryable": None,
        "jitter": 0.5,
    }
    item.update(kw)
    return item


async def test_every_settlement_outcome_is_the_same_item_by_item_and_as_a_set(
    conn: asyncpg.Connection,
) -> None:
    policy: dict[str, Any] = {
        "retries": 2,
        "retry_backoff": timedelta(seconds=10),
        "retry_max_delay": timedelta(hours=1),
    }

    async def running(name: str, **kw: Any) -> int:
        job_cols = {k: kw.pop(k) for k in list(kw) if k.startswith("job_")}
        j = await job(conn, name, **{**policy, **{k[4:]: v for k, v in job_cols.items()}})
        return await run(
            conn,
            j,
            kw.pop("status", "running"),
            trigger=kw.pop("trigger", "schedule"),
            scheduled_for=kw.pop("scheduled_for", DUE),
            started_at=DUE,
            **kw,
        )

    items = [
        settle_item(await running("ok")),
        settle_item(await running("retried"), "failed"),
        settle_item(await running("exhausted", attempt=3, trigger="retry"), "failed"),
        settle_item(await running("not-retryable"), "failed", retryable=False),
        settle_item(await running("invalid-input"), "failed", category="invalid-input"),
        settle_item(
            await running("invalid-but-retryable"),
            "failed",
            category="invalid-input",
            retryable=True,
        ),
        settle_item(await running("timed-out"), "timed_out", cause="timeout"),
        settle_item(await running("cancelled"), "cancelled", cause=None),
        settle_item(
            await running("paused", job_target=WORKER, job_recoverable=True, cursor={"k": 1}),
            "paused",
            cursor={"v": {"k": 9}},
        ),
        settle_item(
            await running(
                "recoverable-retry", job_target=WORKER, job_recoverable=True, cursor={"k": 1}
            ),
            "failed",
            cursor={"v": {"k": 5}},
        ),
        settle_item(
            await running(
                "resumed", job_target=WORKER, job_recoverable=True, resumes=2, cursor={"k": 1}
            ),
            cursor={"v": None},
        ),
        settle_item(
            await running("cancel-requested", status="cancel_requested"), "cancelled", cause=None
        ),
        settle_item(await running("already", status="succeeded", finished_at=DUE)),
        settle_item(await running("edited"), v=2),
        settle_item(
            await running("manual", trigger="manual", scheduled_for=None, job_next_run_at=DUE)
        ),
        settle_item(
            await running(
                "manual-early", trigger="manual", scheduled_for=None, job_next_run_at=LATER
            )
        ),
        settle_item(10_000_000),
    ]
    j = await job(conn, "already-retried", **policy)
    first = await run(
        conn,
        j,
        "failed",
        trigger="schedule",
        scheduled_for=DUE,
        finished_at=DUE,
        error_cause="handler",
    )
    await run(conn, j, "queued", trigger="retry", attempt=2, retry_of=first, due_at=LATER)
    items.append(settle_item(first, "failed"))
    for n, item in enumerate(reversed(items)):
        item["i"] = n

    rows, each_state, many_state, calls = await both_paths(
        conn, SETTLE_EACH, SETTLE_MANY, (json.dumps(items),), "_settle"
    )
    assert calls == 0  # the set-based path
    assert many_state == each_state
    outcomes = sorted(r["outcome"] for r in rows)
    assert outcomes == sorted(["saved"] * 15 + ["already", "already", "gone"])
    assert sum(1 for r in rows if r["retry_run_id"] is not None) == 5
    assert sum(1 for r in rows if r["exhausted"]) == 1
    assert all(r["err_state"] is None for r in rows)

    # Findings, or two results of one job: item by item, as before.
    findings = [
        settle_item(
            first,
            "failed",
            i=0,
            findings=[{"kind": "k", "resource_id": "r", "severity": "info", "detail": {}}],
        )
    ]
    rows, each_state, many_state, calls = await both_paths(
        conn, SETTLE_EACH, SETTLE_MANY, (json.dumps(findings),), "_settle"
    )
    assert calls == 1
    assert many_state == each_state


async def _rows_read(sessions: list[asyncpg.Connection], observer: asyncpg.Connection) -> int:
    """Rows of jobs and runs read so far: by sequential scans, and index entries returned
    (full index scans and bitmap scans included), from the server's statistics."""
    for c in sessions:
        await aio(c.execute)("SELECT pg_stat_force_next_flush()")
    await aio(observer.execute)("SELECT pg_stat_clear_snapshot()")
    n: int = await aio(observer.fetchval)(
        """
        SELECT (SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_user_tables
                 WHERE schemaname = 'coordinator' AND relname IN ('jobs', 'runs'))
             + (SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes
                 WHERE schemaname = 'coordinator' AND relname IN ('jobs', 'runs'))
        """
    )
    return n


async def test_a_set_based_batch_reads_its_own_rows_whatever_the_statistics_said(
    conn: asyncpg.Connection, database: str
) -> None:
    # As in test_stable_plans: the tables ANALYZEd while empty, the plans cached on tiny
    # tables; then many runs. A batch must still reach its rows by their keys (a join
    # planned as a hash join over a whole index would read every run: no seq scan, but
    # the same cost).
    await aio(conn.execute)(
        "ALTER TABLE coordinator.jobs SET (autovacuum_enabled = off);"
        "ALTER TABLE coordinator.runs SET (autovacuum_enabled = off);"
        "ANALYZE coordinator.jobs; ANALYZE coordinator.runs;"
    )
    daemon = await aio(asyncpg.connect)(
        database,
        server_settings={"application_name": "tests-daemon", "coordinator.origin": "daemon"},
    )
    observer = await aio(asyncpg.connect)(database)
    try:

        async def batch(job_ids: list[int], run_ids: list[int]) -> None:
            claims = [
                dict(claim_item(j, r), i=n)
                for n, (j, r) in enumerate(zip(job_ids, run_ids, strict=True))
            ]
            rows = await aio(daemon.fetch)(CLAIM_MANY, json.dumps(claims), "test", WORKERS)
            assert all(r["reason"] is None and r["err_state"] is None for r in rows), rows
            settles = [dict(settle_item(r), i=n, v=None, next=None) for n, r in enumerate(run_ids)]
            rows = await aio(daemon.fetch)(SETTLE_MANY, json.dumps(settles))
            assert all(r["outcome"] == "saved" for r in rows), rows

        async def queue(names: list[str]) -> tuple[list[int], list[int]]:
            rows = await aio(conn.fetch)(
                """
                WITH j AS (
                    INSERT INTO coordinator.jobs (name, schedule_kind, target)
                    SELECT n, 'manual', '{"kind": "exec", "argv": ["true"]}'
                      FROM unnest($1::text[]) n RETURNING id)
                INSERT INTO coordinator.runs (job_id, trigger, status)
                SELECT id, 'manual', 'queued' FROM j RETURNING job_id, id
                """,
                names,
            )
            return [r["job_id"] for r in rows], [r["id"] for r in rows]

        for n in range(7):  # PL/pgSQL keeps the generic plan after five executions
            await batch(*await queue([f"warm{n}-{k}" for k in range(3)]))
        # Many runs, settled (history), and the batch's own.
        await aio(conn.execute)(
            """
            INSERT INTO coordinator.jobs (name, schedule_kind, target)
            SELECT 'old' || g, 'manual', '{"kind": "exec", "argv": ["true"]}'
              FROM generate_series(1, 2000) g;
            INSERT INTO coordinator.runs (job_id, trigger, status, finished_at)
            SELECT id, 'manual', 'succeeded', now() FROM coordinator.jobs, generate_series(1, 2);
            """
        )
        jobs, runs = await queue([f"load-{k}" for k in range(20)])
        before = await _rows_read([conn, daemon], observer)
        await batch(jobs, runs)
        read = await _rows_read([conn, daemon], observer) - before
        assert 0 < read < 20 * 20, read  # a whole index is 4,000+ rows
    finally:
        await aio(daemon.close)()
        await aio(observer.close)()


async def test_batches_read_their_own_rows_while_many_runs_are_outstanding(
    conn: asyncpg.Connection, database: str
) -> None:
    # A burst: thousands of queued runs, more than the statistics (taken before) say. A
    # plan made again for each call's values (a custom plan: the PL/pgSQL arrays and the
    # settleable statuses as constants) found the partial index of outstanding runs usable
    # for the settlement's UPDATE and read all of it, every batch, instead of the batch's
    # runs by key (fixed in migrations/0021). Ten batches: the plan cache has chosen.
    daemon = await aio(asyncpg.connect)(
        database,
        server_settings={"application_name": "tests-daemon", "coordinator.origin": "daemon"},
    )
    observer = await aio(asyncpg.connect)(database)
    try:
        await aio(conn.execute)(
            "ALTER TABLE coordinator.jobs SET (autovacuum_enabled = off);"
            "ALTER TABLE coordinator.runs SET (autovacuum_enabled = off);"
            "ANALYZE coordinator.jobs; ANALYZE coordinator.runs;"
        )
        rows = await aio(conn.fetch)(
            """
            WITH j AS (
                INSERT INTO coordinator.jobs (name, schedule_kind, target)
                SELECT 'burst' || g, 'manual', '{"kind": "exec", "argv": ["true"]}'
                  FROM generate_series(1, 2200) g RETURNING id)
            INSERT INTO coordinator.runs (job_id, trigger, status)
            SELECT id, 'manual', 'queued' FROM j ORDER BY id RETURNING job_id, id
            """
        )
        pairs = sorted((r["job_id"], r["id"]) for r in rows)
        size = 20
        for start in range(0, 10 * size, size):  # ten batches of twenty
            batch = pairs[start : start + size]
            claims = [dict(claim_item(j, r), i=n) for n, (j, r) in enumerate(batch)]
            settles = [
                dict(settle_item(r), i=n, v=None, next=None) for n, (_, r) in enumerate(batch)
            ]
            before = await _rows_read([conn, daemon], observer)
            got = await aio(daemon.fetch)(CLAIM_MANY, json.dumps(claims), "test", WORKERS)
            assert all(g["reason"] is None and g["err_state"] is None for g in got), got
            got = await aio(daemon.fetch)(SETTLE_MANY, json.dumps(settles))
            assert all(g["outcome"] == "saved" for g in got), got
            read = await _rows_read([conn, daemon], observer) - before
            assert 0 < read < size * 20, (start, read)  # the outstanding runs: 2,000+
    finally:
        await aio(daemon.close)()
        await aio(observer.close)()


@pytest.mark.parametrize("recoverable", [True, False])
async def test_a_paused_run_changed_while_the_batch_waits_for_it_gives_way_to_a_new_run(
    conn: asyncpg.Connection, database: str, nursery: Any, recoverable: bool
) -> None:
    # _claim finds the paused run under its row lock; if another session changed it
    # meanwhile (here: cancelled it), there is no paused run and the deadline inserts a
    # new one. The set-based path decides "resume" before it locks that run, so it must
    # notice the change and insert too. (Not recoverable: the run the batch meant to
    # restart from scratch, 0036, keeps what it had, findings included.)
    j = await job(conn, "paused-run", target=WORKER, recoverable=recoverable)
    paused = await run(
        conn, j, "paused", trigger="schedule", scheduled_for=DUE, started_at=DUE,
        cursor={"i": 1}, resumes=1,
    )  # fmt: skip
    await aio(conn.execute)(
        "INSERT INTO coordinator.findings (run_id, kind, resource_id, severity) "
        "VALUES ($1, 'old', 'r1', 'warning')",
        paused,
    )
    other = await job(conn, "due")
    blocker = await aio(asyncpg.connect)(database)
    daemon = await aio(asyncpg.connect)(
        database, server_settings={"application_name": "tests-daemon"}
    )
    try:
        await aio(blocker.execute)("BEGIN")
        await aio(blocker.execute)(
            "UPDATE coordinator.runs SET status = 'cancelled', finished_at = now() WHERE id = $1",
            paused,
        )
        answer: list[Any] = []

        async def claim() -> None:
            items = [dict(claim_item(j), i=0), dict(claim_item(other), i=1)]
            answer.extend(await aio(daemon.fetch)(CLAIM_MANY, json.dumps(items), "test", WORKERS))

        nursery.start_soon(claim)
        with trio.fail_after(30):
            while not await aio(conn.fetchval)(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                "'tests-daemon' AND wait_event_type = 'Lock'"
            ):
                await trio.sleep(0.02)
        await aio(blocker.execute)("COMMIT")
        with trio.fail_after(30):
            while not answer:
                await trio.sleep(0.02)
    finally:
        await aio(blocker.close)()
        await aio(daemon.close)()
    rows = {r["i"]: r for r in answer}
    assert rows[0]["reason"] is None
    assert rows[0]["err_state"] is None
    assert rows[0]["run_id"] != paused
    assert rows[0]["trigger"] == "schedule"
    assert rows[1]["reason"] is None
    statuses = dict(
        await aio(conn.fetch)("SELECT id, status FROM coordinator.runs WHERE job_id = $1", j)
    )
    assert statuses == {paused: "cancelled", rows[0]["run_id"]: "running"}
    kept = await aio(conn.fetchrow)(
        "SELECT cursor, resumes, started_at, (SELECT count(*) FROM coordinator.findings f "
        "WHERE f.run_id = r.id) AS findings FROM coordinator.runs r WHERE id = $1",
        paused,
    )
    assert tuple(kept) == ('{"i": 1}', 1, DUE, 1)


async def test_a_run_whose_job_is_no_longer_recoverable_is_claimed_from_scratch(
    conn: asyncpg.Connection,
) -> None:
    """(0036) A paused run of a job redefined without `recoverable` runs from the start:
    the worker executor hands it no cursor. The claim still counted a resume and kept
    the old cursor, counter, progress and findings, so `runs show` read as a resume from
    that cursor. Now such a run is claimed as one never started, by both paths alike; a
    recoverable job's resume and a plain run are claimed as before."""
    old = {
        "started_at": DUE - timedelta(hours=1),
        "cursor": {"i": 9},
        "count": 9,
        "resumes": 1,
        "progress": json.dumps({"percent": 40}),
        "last_progress_at": DUE,
        "finding_counts": json.dumps({"warning": 1}),
    }
    manual = {"schedule_kind": "manual", "schedule": None, "next_run_at": None}
    runs: dict[str, int] = {}
    j = await job(conn, "triggered", target=WORKER, **manual)
    runs["triggered"] = await run(conn, j, "queued", **old)
    items = [claim_item(j, runs["triggered"])]
    j = await job(conn, "ticked", target=WORKER)
    runs["ticked"] = await run(
        conn, j, "paused", trigger="schedule", scheduled_for=DUE - timedelta(minutes=1),
        paused_at=DUE, error_message="paused by operator", **old,
    )  # fmt: skip
    items.append(claim_item(j))
    # A recoverable job's retry carries the failed attempt's cursor and counter; the
    # job is no longer recoverable: from scratch too.
    j = await job(conn, "retried", target=WORKER, retries=2, **manual)
    runs["retried"] = await run(
        conn, j, "queued", trigger="retry", attempt=2, cursor={"i": 3}, count=3
    )
    items.append(claim_item(j, runs["retried"]))
    # Unchanged: a recoverable job's resume, and a plain run.
    j = await job(conn, "recoverable", target=WORKER, recoverable=True, **manual)
    runs["recoverable"] = await run(conn, j, "queued", **old)
    items.append(claim_item(j, runs["recoverable"]))
    j = await job(conn, "plain", target=WORKER, **manual)
    runs["plain"] = await run(conn, j, "queued")
    items.append(claim_item(j, runs["plain"]))
    for name in ("triggered", "ticked", "recoverable"):
        await aio(conn.execute)(
            "INSERT INTO coordinator.findings (run_id, kind, resource_id, severity) "
            "VALUES ($1, 'old', 'r1', 'warning')",
            runs[name],
        )
    for n, item in enumerate(items):
        item["i"] = n
    payload = (json.dumps(items), "test", WORKERS)

    # The same rows by both paths (the set-based one taken: no _claim call).
    rows, each_state, many_state, calls = await both_paths(
        conn, CLAIM_EACH, CLAIM_MANY, payload, "_claim"
    )
    assert calls == 0
    assert many_state == each_state
    assert [r["reason"] for r in rows] == [None] * 5

    for sql in (CLAIM_EACH, CLAIM_MANY):
        tx = conn.transaction()
        await aio(tx.start)()
        try:
            answer = {r["run_id"]: r for r in await aio(conn.fetch)(sql, *payload)}
            now = await aio(conn.fetchval)("SELECT now()")
            after = {
                r["id"]: r
                for r in await aio(conn.fetch)(
                    "SELECT id, status, started_at, cursor, count, resumes, progress, "
                    "last_progress_at, finding_counts, paused_at FROM coordinator.runs"
                )
            }
            findings = set(
                await aio(conn.fetchval)(
                    "SELECT coalesce(array_agg(run_id), '{}') FROM coordinator.findings"
                )
            )
        finally:
            await aio(tx.rollback)()
        fresh = {
            "status": "running",
            "started_at": now,
            "cursor": None,
            "count": None,
            "resumes": 0,
            "progress": None,
            "last_progress_at": None,
            "finding_counts": None,
            "paused_at": None,
        }
        for name in ("triggered", "ticked", "retried"):
            row = after[runs[name]]
            assert {k: row[k] for k in fresh} == fresh, (sql, name)
            # What the daemon is handed says the same: nothing to resume from.
            claimed = answer[runs[name]]
            assert (claimed["cursor"], claimed["count"], claimed["resumes"]) == (None, None, 0)
        row = after[runs["recoverable"]]
        assert (row["started_at"], row["cursor"], row["count"], row["resumes"]) == (
            old["started_at"],
            '{"i": 9}',
            9,
            2,
        ), sql
        assert row["finding_counts"] == old["finding_counts"]
        assert answer[runs["recoverable"]]["cursor"] == '{"i": 9}'
        assert after[runs["plain"]]["started_at"] == now
        assert after[runs["plain"]]["resumes"] == 0
        # The old handler's findings go with the restart; a resume keeps its own.
        assert findings == {runs["recoverable"]}, sql
