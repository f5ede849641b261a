"""Stats: ``GET /api/jobs/{ns}/{name}/stats``'s aggregate at 10,000 and 1,000,000 runs.

The web page's sparklines and the stats endpoint count a job's runs per outcome in 8 to
30 buckets with one statement (``coordinator.client.run_stats`` / ``jobs_stats``) over
the index ``runs_by_job_created`` (migrations/0008_web.sql). Per size, in a fresh
database (runs written with one ``INSERT ... SELECT generate_series``, then ``VACUUM
ANALYZE`` as autovacuum would):

* **one job** holds every run, spread evenly over a year (1,000,000 runs = one every
  32 s): the aggregate for spans of 2 days, 7 days, 30 days, 6 months and a year. The
  worst case: every run in the table is the measured job's.
* **jobs page**: the same runs spread over 50 jobs; one aggregate for all 50 sparklines
  (7 days), as the jobs view sends it.
* **without the index**: the one-job figures again after ``DROP INDEX
  runs_by_job_created`` (what 0008 buys).

Each figure is the median (and p95) of 20 timed calls of the aggregate after 3 warm-ups,
measured around the client call (a round trip on loopback; the endpoint adds one
primary-key lookup of the job), plus the plan's scan node from ``EXPLAIN ANALYZE``.
``--quick``: 10,000 and 100,000 runs.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from coordinator import buckets, client

from . import common
from .common import BenchCluster

SPANS = (("2d", 2), ("7d", 7), ("30d", 30), ("6mo", 183), ("1y", 365))
REPEAT = 20
WARMUP = 3
JOBS_PAGE = 50


async def _timed(call: Any) -> dict[str, float]:
    for _ in range(WARMUP):
        await call()
    samples = []
    for _ in range(REPEAT):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return {
        "median_ms": round(common.percentile(samples, 50), 2),
        "p95_ms": round(common.percentile(samples, 95), 2),
    }


async def _plan(conn: Any, job_ids: list[int], chosen: buckets.Buckets) -> str:
    rows = await conn.fetch(
        "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + client._RUN_STATS,
        job_ids,
        list(chosen.edges),
        chosen.edges[0],
        chosen.edges[-1],
    )
    lines = [r[0] for r in rows]
    return next((line.strip() for line in lines if "Scan" in line), lines[0].strip())


async def _fill(conn: Any, runs: int, jobs: int, now: datetime) -> list[client.JobView]:
    await conn.execute(
        """
        INSERT INTO coordinator.jobs (namespace, name, schedule_kind, target)
        SELECT 'bench', 'job-' || g, 'manual', '{"kind": "exec", "argv": ["true"]}'
          FROM generate_series(1, $1) g
        """,
        jobs,
    )
    await conn.execute(
        """
        INSERT INTO coordinator.runs (job_id, trigger, status, created_at, finished_at)
        SELECT j.id, 'schedule',
               CASE WHEN g % 100 < 90 THEN 'succeeded' WHEN g % 100 < 97 THEN 'failed'
                    ELSE 'timed_out' END,
               $2::timestamptz - (g * (365 * 86400.0 / $1)) * interval '1 second',
               $2::timestamptz - (g * (365 * 86400.0 / $1)) * interval '1 second'
          FROM generate_series(1, $1) g
          JOIN (SELECT id, row_number() OVER (ORDER BY id) - 1 AS k
                  FROM coordinator.jobs WHERE namespace = 'bench') j ON j.k = g % $3
        """,
        runs,
        now,
        jobs,
    )
    await conn.execute("VACUUM ANALYZE coordinator.runs")
    return [j for j in await client.list_jobs(conn, namespace="bench")]


async def _one_job(bc: BenchCluster, runs: int) -> dict[str, Any]:
    db = await bc.create_database(f"stats_{runs}")
    conn = await bc.connect(db)
    now = datetime.now(UTC)
    out: dict[str, Any] = {"runs": runs}
    try:
        started = time.perf_counter()
        (job,) = await _fill(conn, runs, 1, now)
        out["fill_s"] = round(time.perf_counter() - started, 1)
        for indexed in (True, False):
            if not indexed:
                await conn.execute("DROP INDEX coordinator.runs_by_job_created")
                await conn.execute("ANALYZE coordinator.runs")
            figures = {}
            for key, days in SPANS:
                chosen = buckets.choose(now - timedelta(days=days), now)

                async def call(chosen: buckets.Buckets = chosen) -> dict[int, client.RunStats]:
                    return await client.jobs_stats(conn, [job], chosen)

                stats = (await call())[job.id]
                figures[key] = {
                    **await _timed(call),
                    "counted": sum(stats.totals.values()),
                    "buckets": f"{chosen.count} x {chosen.width}",
                    "plan": await _plan(conn, [job.id], chosen),
                }
            out["indexed" if indexed else "no_index"] = figures
    finally:
        await conn.close()
    return out


async def _jobs_page(bc: BenchCluster, runs: int) -> dict[str, Any]:
    db = await bc.create_database(f"page_{runs}")
    conn = await bc.connect(db)
    now = datetime.now(UTC)
    try:
        jobs = await _fill(conn, runs, JOBS_PAGE, now)
        chosen = buckets.choose(now - timedelta(days=7), now)

        async def call() -> dict[int, client.RunStats]:
            return await client.jobs_stats(conn, jobs, chosen)

        stats = await call()
        return {
            "runs": runs,
            "jobs": len(jobs),
            **await _timed(call),
            "counted": sum(sum(s.totals.values()) for s in stats.values()),
            "plan": await _plan(conn, [j.id for j in jobs], chosen),
        }
    finally:
        await conn.close()


async def run(*, quick: bool = False) -> dict[str, Any]:
    sizes = (10_000, 100_000) if quick else (10_000, 1_000_000)
    common.banner(f"stats: the sparkline aggregate at {', '.join(f'{n:,}' for n in sizes)} runs")
    results: dict[str, Any] = {"sizes": list(sizes), "one_job": [], "jobs_page": []}
    async with BenchCluster("stats") as bc:
        for size in sizes:
            results["one_job"].append(await _one_job(bc, size))
            results["jobs_page"].append(await _jobs_page(bc, size))
        results["machine"] = common.machine_info(bc.server_version)
    rows = []
    for entry in results["one_job"]:
        for key, _ in SPANS:
            with_index, without = entry["indexed"][key], entry["no_index"][key]
            rows.append(
                [f"{entry['runs']:,}", key, with_index["buckets"], f"{with_index['counted']:,}",
                 with_index["median_ms"], with_index["p95_ms"], without["median_ms"]]
            )  # fmt: skip
    print(
        common.table(
            ["runs (one job)", "span", "buckets", "counted", "median ms", "p95 ms", "no index ms"],
            rows,
        )
    )
    for entry in results["one_job"]:
        common.note(f"{entry['runs']:,} runs, 7d plan: {entry['indexed']['7d']['plan']}")
    page_rows = [
        [f"{e['runs']:,}", e["jobs"], f"{e['counted']:,}", e["median_ms"], e["p95_ms"]]
        for e in results["jobs_page"]
    ]
    print(common.table(["runs", "jobs", "counted (7d)", "median ms", "p95 ms"], page_rows))
    return results
