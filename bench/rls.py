"""rls: what row-level security costs the daemon's claims and settlements (#17).

The question: ``migrations/0014_namespaces.sql`` enables row-level security on jobs and
runs. Does it slow the daemon? The daemon's statements are measured directly -- the
store's own texts (``coordinator/store.py``): ``coordinator._claim_many`` and
``coordinator._settle_many`` for a batch, ``coordinator._claim`` and ``_settle`` for a
batch of one, fenced by a session that holds the leader's locks, with the daemon's
session setting (``coordinator.origin = 'daemon'``) -- in five configurations,
on one cluster, rounds interleaved so that whatever else the machine does falls on all
of them alike:

``off``           RLS disabled on jobs and runs (``ALTER TABLE ... DISABLE ROW LEVEL
                  SECURITY``): the schema before 0014. Superuser.
``superuser``     RLS on; the daemon connects as a superuser (the tests' and the
                  embedded database's case). PostgreSQL bypasses every policy.
``owner``         RLS on; the daemon connects as the tables' owner, not a superuser (the
                  usual production case: the role that ran ``coordinator migrate``).
                  Exempt from the policies: no qualifier is added.
``daemon-role``   RLS on; the daemon connects as a login role that is a member of
                  ``coordinator_daemon``: the policy it meets is ``USING (true)``.
``confined``      RLS on; an application role of ``coordinator_app`` granted every
                  namespace runs the same statements: the policies are really applied
                  (an InitPlan reading the grants, a check per row). Not the daemon: it
                  shows what the policies cost where they do apply.

Each round: the runs are truncated, the jobs' deadlines reset and the jobs vacuumed
(outside the timing, so that every configuration starts from the same physical state),
then every job is
claimed (in batches of 1, as an idle daemon sends a lone claim, and of 64, as a busy one
groups them) and settled the same way. Two figures per configuration:

* **claims/s** (and settlements/s): items divided by the statements' wall time, measured
  in the client around each statement: what the daemon sees, commit (fsync) included;
* **server µs per claim** (and per settlement): the statements' execution time inside
  PostgreSQL (``pg_stat_statements.total_exec_time``, per database, so per
  configuration) divided by the items: where the policies would cost, without the
  commit's fsync and the scheduling noise of a shared machine.

    python -m bench rls [--quick]
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

# The store's own statements and lock keys: what is measured is what the daemon sends.
from coordinator.store import (
    _ALIVE,
    _CLAIM_MANY,
    _CLAIM_ONE,
    _LOCK,
    _SETTLE_MANY,
    _SETTLE_ONE,
    LOCK_CLASS,
    LOCK_OBJECT,
)

from . import common

CONFIGS = ("off", "superuser", "owner", "daemon-role", "confined")
NAMESPACES = 10


async def _prepare(bench: common.BenchCluster, db: str, jobs: int, *, rls: bool) -> list[int]:
    await bench.create_database(db)
    conn = await bench.connect(db)
    try:
        await conn.execute(
            """
            INSERT INTO coordinator.jobs (namespace, name, schedule_kind, schedule, target,
                                          next_run_at)
            SELECT 'ns' || (g % $2), 'job' || g, 'interval', '1h',
                   '{"kind": "exec", "argv": ["true"]}', now()
              FROM generate_series(1, $1) g
            """,
            jobs,
            NAMESPACES,
        )
        await conn.execute("ANALYZE coordinator.jobs")
        if not rls:
            await conn.execute("ALTER TABLE coordinator.jobs DISABLE ROW LEVEL SECURITY")
            await conn.execute("ALTER TABLE coordinator.runs DISABLE ROW LEVEL SECURITY")
        ids = [r["id"] for r in await conn.fetch("SELECT id FROM coordinator.jobs ORDER BY id")]
    finally:
        await conn.close()
    return ids


async def _roles(bench: common.BenchCluster, owner_db: str, confined_db: str) -> None:
    """bench_owner owns the tables of ``owner_db``; bench_daemon is a coordinator_daemon
    member; bench_app is a confined application role granted every namespace."""
    admin = bench.admin
    assert admin is not None
    await admin.execute("CREATE ROLE bench_owner LOGIN")
    await admin.execute("CREATE ROLE bench_daemon LOGIN IN ROLE coordinator_daemon")
    await admin.execute("CREATE ROLE bench_app LOGIN")
    conn = await bench.connect(owner_db)
    try:
        await conn.execute("GRANT USAGE ON SCHEMA coordinator TO bench_owner")
        for table in ("jobs", "runs"):
            await conn.execute(f"ALTER TABLE coordinator.{table} OWNER TO bench_owner")
        await conn.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA coordinator TO bench_owner")
    finally:
        await conn.close()
    conn = await bench.connect(confined_db)
    try:
        for n in range(NAMESPACES):
            await conn.execute("SELECT coordinator.grant_namespace('bench_app', $1)", f"ns{n}")
        # An application could not call them (they are the daemon's); for the measure only.
        await conn.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA coordinator TO bench_app")
    finally:
        await conn.close()


async def _connect(bench: common.BenchCluster, db: str, user: str) -> Any:
    import asyncpg

    return await asyncpg.connect(
        bench.dsn(db, user=user),
        server_settings={"application_name": common.APP_BENCH, "coordinator.origin": "daemon"},
    )


async def _lead(bench: common.BenchCluster, db: str) -> tuple[Any, int]:
    """A session holding ``db``'s single-writer lock and its liveness lock, as a leading
    daemon's does, and its backend pid: the claims below are fenced by it, as the
    daemon's are (the fence lock, then the probe of the liveness lock)."""
    conn = await bench.connect(db)
    await conn.execute(_LOCK, LOCK_CLASS, LOCK_OBJECT)
    if not await conn.fetchval(_ALIVE, LOCK_CLASS):
        raise RuntimeError("the liveness lock is taken")
    return conn, await conn.fetchval("SELECT pg_backend_pid()")


async def _round(
    conn: Any, reset: Any, ids: list[int], batch: int, leader_pid: int
) -> tuple[float, float]:
    """Claim every job, then settle every run, ``batch`` at a time, as the store sends
    them (a batch of one straight to ``_claim``/``_settle``); the seconds each took
    (statements only)."""
    # Every configuration starts each round from the same physical state: no run rows,
    # no dead tuples (the rounds rewrite every job row twice), fresh statistics.
    await reset.execute("TRUNCATE coordinator.runs CASCADE")  # findings (0012) refer to runs
    at = await reset.fetchval(
        "UPDATE coordinator.jobs SET next_run_at = date_trunc('second', now()) "
        "RETURNING next_run_at"
    )
    await reset.execute("VACUUM ANALYZE coordinator.jobs")
    await reset.execute("ANALYZE coordinator.runs")
    claimed: list[int] = []
    claim_s = 0.0
    for start in range(0, len(ids), batch):
        items = [
            {"i": i, "job": job, "run": None, "at": at.isoformat(), "v": 1}
            for i, job in enumerate(ids[start : start + batch])
        ]
        t0 = time.perf_counter()
        if batch == 1:
            rows = [
                await conn.fetchrow(
                    _CLAIM_ONE,
                    ids[start],
                    None,
                    at.isoformat(),
                    1,
                    "bench",
                    [],
                    leader_pid,
                    LOCK_CLASS,
                    LOCK_OBJECT,
                    None,
                    None,
                )
            ]
        else:
            rows = await conn.fetch(
                _CLAIM_MANY, json.dumps(items), "bench", [], leader_pid, LOCK_CLASS, LOCK_OBJECT
            )
        claim_s += time.perf_counter() - t0
        refused = [r["reason"] or r.get("err_message") for r in rows if r["run_id"] is None]
        if refused:
            raise RuntimeError(f"claims refused: {refused[:3]}")
        claimed.extend(r["run_id"] for r in rows)
    now = datetime.now(UTC)
    settle_s = 0.0
    for start in range(0, len(claimed), batch):
        items = [
            {"i": i, "run": run, "status": "succeeded", "started": now.isoformat(),
             "finished": now.isoformat(), "count": 1, "extra": {}, "cause": None,
             "message": None, "v": 1, "next": (now + timedelta(hours=1)).isoformat()}
            for i, run in enumerate(claimed[start : start + batch])
        ]  # fmt: skip
        t0 = time.perf_counter()
        if batch == 1:
            one = items[0]
            rows = [
                await conn.fetchrow(
                    _SETTLE_ONE,
                    one["run"],
                    "succeeded",
                    one["started"],
                    one["finished"],
                    1,
                    "{}",
                    None,
                    None,
                    1,
                    one["next"],
                    None,
                    None,
                    0.0,
                    None,
                    None,
                )
            ]
        else:
            rows = await conn.fetch(_SETTLE_MANY, json.dumps(items))
        settle_s += time.perf_counter() - t0
        if any(r["outcome"] != "saved" for r in rows):
            raise RuntimeError(f"settlements refused: {[dict(r) for r in rows][:3]}")
    return claim_s, settle_s


async def _server_us(bench: common.BenchCluster, db: str, items: int) -> dict[str, float]:
    """Microseconds of server execution per item, for the claim and the settlement
    statements run in ``db`` since the last reset."""
    conn = await bench.connect("bench")
    try:
        rows = await conn.fetch(
            """
            SELECT s.query, sum(s.total_exec_time) AS ms
              FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
             WHERE d.datname = $1 AND (s.query LIKE '%coordinator.\\_claim%'
                                       OR s.query LIKE '%coordinator.\\_settle%')
             GROUP BY s.query
            """,
            db,
        )
    finally:
        await conn.close()
    out = {"claim": 0.0, "settle": 0.0}
    for row in rows:
        key = "claim" if "coordinator._claim" in row["query"] else "settle"
        out[key] += row["ms"] * 1000 / items
    return out


async def run(*, quick: bool = False) -> dict[str, Any]:
    jobs = 500 if quick else 2000
    rounds = 4 if quick else 10
    batches = (1, 64)
    common.banner(f"rls: claims and settlements with row-level security on and off "
                  f"({jobs} jobs, {rounds} rounds per configuration and batch size)")  # fmt: skip
    async with common.BenchCluster("rls") as bench:
        dbs = {config: f"rls_{config.replace('-', '_')}" for config in CONFIGS}
        ids: dict[str, list[int]] = {}
        for config, db in dbs.items():
            ids[config] = await _prepare(bench, db, jobs, rls=config != "off")
        await _roles(bench, dbs["owner"], dbs["confined"])
        users = {"off": "postgres", "superuser": "postgres", "owner": "bench_owner",
                 "daemon-role": "bench_daemon", "confined": "bench_app"}  # fmt: skip
        conns = {c: await _connect(bench, dbs[c], users[c]) for c in CONFIGS}
        leaders = {c: await _lead(bench, dbs[c]) for c in CONFIGS}
        resets = {c: await bench.connect(dbs[c]) for c in CONFIGS}
        samples: dict[str, dict[int, dict[str, list[float]]]] = {
            c: {b: {"claims_per_s": [], "settles_per_s": []} for b in batches} for c in CONFIGS
        }
        server: dict[str, dict[int, dict[str, float]]] = {c: {} for c in CONFIGS}
        busy_before = common.machine_busy()
        wall_before = time.monotonic()
        try:
            for config in CONFIGS:  # warm-up: plans cached, pages in memory
                await _round(conns[config], resets[config], ids[config], 64, leaders[config][1])
            for batch in batches:
                await bench.pgss_reset()
                for r in range(rounds):
                    order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
                    for config in order:
                        claim_s, settle_s = await _round(
                            conns[config],
                            resets[config],
                            ids[config],
                            batch,
                            leaders[config][1],
                        )
                        n = len(ids[config])
                        samples[config][batch]["claims_per_s"].append(n / claim_s)
                        samples[config][batch]["settles_per_s"].append(n / settle_s)
                for config in CONFIGS:
                    server[config][batch] = await _server_us(
                        bench, dbs[config], len(ids[config]) * rounds
                    )
        finally:
            for c in CONFIGS:
                await conns[c].close()
                await resets[c].close()
                await leaders[c][0].close()
        wall = time.monotonic() - wall_before
        busy = common.machine_busy() - busy_before
        machine = common.machine_info(bench.server_version)

    figures = {
        c: {
            str(b): {
                "claims_per_s": common.summary(samples[c][b]["claims_per_s"]),
                "settles_per_s": common.summary(samples[c][b]["settles_per_s"]),
                "server_us_per_claim": server[c][b]["claim"],
                "server_us_per_settle": server[c][b]["settle"],
            }
            for b in batches
        }
        for c in CONFIGS
    }
    rows = []
    for batch in batches:
        base = figures["off"][str(batch)]["claims_per_s"]["p50"]
        for c in CONFIGS:
            f = figures[c][str(batch)]
            server_base = figures["off"][str(batch)]["server_us_per_claim"]
            rows.append([
                batch, c, round(f["claims_per_s"]["p50"]),
                f"{round(f['claims_per_s']['min'])}-{round(f['claims_per_s']['max'])}",
                f"{100 * (f['claims_per_s']['p50'] / base - 1):+.1f}%",
                round(f["settles_per_s"]["p50"]),
                f"{f['server_us_per_claim']:.1f}",
                f"{100 * (f['server_us_per_claim'] / server_base - 1):+.1f}%",
                f"{f['server_us_per_settle']:.1f}",
            ])  # fmt: skip
    table = common.table(
        ["batch", "config", "claims/s p50", "min-max", "vs off", "settles/s p50",
         "server us/claim", "vs off", "server us/settle"], rows
    )  # fmt: skip
    print(table)
    common.note(
        f"machine busy {busy / wall / (machine['cpu_count'] or 1):.0%} of its CPUs over "
        f"{wall:.0f} s (this bench included)"
    )
    return {
        "machine": machine,
        "jobs": jobs,
        "rounds": rounds,
        "namespaces": NAMESPACES,
        "configs": list(CONFIGS),
        "figures": figures,
        "samples": samples,
        "server_us": {c: {str(b): server[c][b] for b in batches} for c in CONFIGS},
        "machine_busy_share": busy / wall / (machine["cpu_count"] or 1),
        "table": table,
    }
