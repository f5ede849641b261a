"""The README's worked example (a resumable keyset-paginated scan with checkpoints and
findings) is copyable: this test takes the file from the README as it is, runs it as a
``coordinator worker`` process against a real daemon and a table of orders, pauses it in
the middle of the scan, resumes it with a trigger and checks its findings."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import trio

from coordinator import client
from coordinator.db import aio, transaction
from coordinator.model import Schedule, Target

if TYPE_CHECKING:
    from .conftest import StartDaemon

README = Path(__file__).resolve().parents[2] / "README.md"
ORDERS = 30_000

APP_SCHEMA = f"""
CREATE TABLE customers (id bigint PRIMARY KEY);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL, total numeric NOT NULL);
CREATE TABLE order_lines (order_id bigint NOT NULL, amount numeric NOT NULL);
CREATE INDEX ON order_lines (order_id);
INSERT INTO customers SELECT g FROM generate_series(1, 100) g;
-- Every order has two lines adding up to its total, except every 997th (a wrong total);
-- every 1009th order's customer is gone.
INSERT INTO orders
SELECT g, CASE WHEN g % 1009 = 0 THEN 1000 + g ELSE 1 + g % 100 END,
       CASE WHEN g % 997 = 0 THEN 99.99 ELSE 10.50 END
  FROM generate_series(1, {ORDERS}) g;
INSERT INTO order_lines SELECT g, 4.25 FROM generate_series(1, {ORDERS}) g;
INSERT INTO order_lines SELECT g, 6.25 FROM generate_series(1, {ORDERS}) g;
"""


def example() -> str:
    """The fenced block after ``<!-- example: check_orders.py -->`` in the README."""
    text = README.read_text()
    match = re.search(r"<!-- example: check_orders\.py -->\n```python\n(.*?)\n```", text, re.S)
    assert match is not None, "the README lost its worked example"
    return match.group(1) + "\n"


async def test_the_readme_scan_pauses_resumes_and_finds_each_problem_once(
    start_daemon: StartDaemon, conn: asyncpg.Connection, database: str, tmp_path: Path
) -> None:
    await aio(conn.execute)(APP_SCHEMA)
    (tmp_path / "check_orders.py").write_text(example())
    await aio(client.define_job)(
        conn,
        name="check-orders",
        schedule=Schedule(kind="manual"),
        target=Target(kind="worker", worker_type="orders.check"),
        recoverable=True,
    )
    harness = await start_daemon()
    socket = harness.daemon.executors["worker"].socket_path  # type: ignore[attr-defined]
    proc = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "coordinator.worker",
            "check_orders:worker",
            "--socket",
            str(socket),
        ],
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])
            ),
            "APP_DSN": database,
        },
    )
    try:
        await harness.wait_event("wake", reason="workers.changed")
        run_id = await aio(client.trigger)(conn, "check-orders")
        with trio.fail_after(30):
            while (await aio(client.get_run)(conn, run_id)).cursor is None:
                await trio.sleep(0.02)
        # Hold the scan between two batches (its next page waits for this lock, taken by
        # another session) while the pause reaches the worker, so it cannot finish first.
        holder = await aio(asyncpg.connect)(database)
        try:
            async with transaction(holder):
                await aio(holder.execute)("LOCK TABLE customers IN ACCESS EXCLUSIVE MODE")
                assert await aio(client.pause_run)(conn, run_id) == "cancel_requested"
                await harness.wait_event("run.stop_requested", run=run_id)
                await trio.sleep(0.3)
        finally:
            await aio(holder.close)()
        paused = (await harness.wait_event("job.run", run=run_id, timeout=30))[0]
        assert paused["outcome"] == "paused"
        run = await aio(client.get_run)(conn, run_id)
        assert run.status == "paused"
        # The example raises Paused inside trio_asyncio.open_loop(), a nursery: read as
        # the pause it is (it said "the worker said: ExceptionGroup: Exceptions from Trio
        # nursery (1 sub-exception)", with a traceback in extra).
        assert run.error_message == "paused by operator"
        assert "traceback" not in (run.extra or {})
        after = run.cursor["after_id"]
        assert 0 < after < ORDERS
        assert run.count == after  # ids are 1..N: one per order

        assert await aio(client.trigger)(conn, "check-orders") == run_id
        done = (await harness.wait_event("job.run", run=run_id, count=2, timeout=60))[1]
        assert (done["outcome"], done["completed"]) == ("succeeded", True)
    finally:
        proc.terminate()
        with trio.fail_after(15):
            await proc.wait()
    run = await aio(client.get_run)(conn, run_id)
    assert (run.status, run.cursor, run.count, run.resumes) == (
        "succeeded",
        {"after_id": ORDERS},
        ORDERS,
        1,
    )
    mismatches = [g for g in range(1, ORDERS + 1) if g % 997 == 0]
    orphans = [g for g in range(1, ORDERS + 1) if g % 1009 == 0]
    assert run.finding_counts == {"error": len(mismatches), "data_loss": len(orphans)}
    page = await aio(client.list_findings)(conn, run_id, limit=1000)
    found = sorted((f.kind, int(f.resource_id)) for f in page.findings)
    assert found == sorted(
        [("total_mismatch", g) for g in mismatches] + [("orphan_order", g) for g in orphans]
    )
    first = next(f for f in page.findings if f.kind == "total_mismatch")
    assert first.detail == {"total": "99.99", "lines": "10.50"}
