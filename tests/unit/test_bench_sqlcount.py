"""The benchmarks' SQL counting counts a known number of statements exactly.

The bench counts what PostgreSQL itself logged (``log_statement=all``) through
``coordinator.embedded.StatementLog``, filtered by application and database
(``bench.common.count_statements`` / ``statements_by_app``). Here one session with a
distinct application name sends a known list of statements, in every shape the daemon
and the peers use (simple and extended protocol, multi-line text, parameters,
transaction control, a failing statement), next to a second application and around a
mark; the count must be exact.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from bench.common import count_statements, percentile, statements_by_app

APP = "bench-sqlcount"
OTHER = "bench-sqlcount-other"


async def _send(dsn: str, log) -> int:
    """Send the statements; return how many APP sent after the mark."""
    conn = await asyncpg.connect(dsn, server_settings={"application_name": APP})
    other = await asyncpg.connect(dsn, server_settings={"application_name": OTHER})
    try:
        await conn.execute("SELECT 'before the mark'")  # not counted
        log.mark()
        sent = 0
        # Simple query protocol.
        await conn.execute("SELECT 1")
        sent += 1
        # Several statements in one simple query: one message, one logged statement.
        await conn.execute("SELECT 1; SELECT 2")
        sent += 1
        # Extended protocol with parameters (logged as `execute ...` plus a DETAIL line).
        for i in range(5):
            await conn.fetchval("SELECT $1::integer + 1", i)
            sent += 1
        # Multi-line text.
        await conn.fetch("SELECT g\n  FROM generate_series(1, 3) AS g\n WHERE g > $1", 1)
        sent += 1
        # Transaction control.
        async with conn.transaction():
            await conn.execute("CREATE TEMP TABLE t (x integer)")
            await conn.execute("INSERT INTO t VALUES (1), (2)")
        sent += 4  # BEGIN, CREATE, INSERT, COMMIT
        # A statement that fails was still sent (and logged before it ran).
        with pytest.raises(asyncpg.PostgresError):
            await conn.execute("SELECT 1/0")
        sent += 1
        # LISTEN / NOTIFY are statements too.
        await conn.execute('LISTEN "bench_sqlcount"')
        await conn.execute("NOTIFY bench_sqlcount, 'x'")
        sent += 2
        # Another application's statements in the same database are not ours.
        for _ in range(3):
            await other.execute("SELECT 42")
        return sent
    finally:
        await conn.close()
        await other.close()


def test_counts_a_known_number_of_statements_exactly(pg_server, database, database_name):
    log = pg_server.statement_log()
    if log is None:
        pytest.skip("counting SQL needs the server log of a cluster made by the tests")
    sent = asyncio.run(_send(database, log))
    assert sent == 15

    count, sql = count_statements(log, app=APP, db=database_name)
    assert count == sent, sql
    assert count_statements(log, app=OTHER, db=database_name)[0] == 3
    assert count_statements(log, app=APP, db="some_other_database")[0] == 0
    by_app = statements_by_app(log, db=database_name)
    assert by_app[APP] == sent
    assert by_app[OTHER] == 3
    # The text comes back whole: multi-line statements are joined, parameters are not
    # mistaken for statements.
    assert any(s.startswith("SELECT g") and "generate_series" in s for s in sql)
    assert sum("$1::integer + 1" in s for s in sql) == 5

    # A new mark starts from zero.
    log.mark()
    assert count_statements(log, app=APP, db=database_name) == (0, [])


def test_percentile_interpolates():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile(values, 100) == 100.0
    assert percentile([3.0], 99) == 3.0
