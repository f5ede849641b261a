"""A held result is never lost, whatever way the daemon leaves (docs/design.md,
"Settlement"): a refresh that PostgreSQL refuses leaves the daemon serving and the
result held; a bug that stops the daemon still spools it; the next start replays it;
the command ran once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from coordinator.daemon import EXIT_FAILED, EXIT_SPOOLED
from coordinator.db import aio
from coordinator.spool import Spool

from .conftest import StartDaemon, define

if TYPE_CHECKING:
    from pathlib import Path

    import asyncpg

REFUSE_SETTLEMENTS = """
CREATE TABLE public.faults (active boolean NOT NULL);
INSERT INTO public.faults VALUES (true);
CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT active FROM public.faults) AND NEW.status <> 'running' THEN
        RAISE EXCEPTION 'injected settlement fault';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse BEFORE UPDATE ON coordinator.runs
    FOR EACH ROW EXECUTE FUNCTION public.refuse();
"""


def slow_counter(tmp_path: Path) -> tuple[list[str], Path, Path]:
    started, count = tmp_path / "started", tmp_path / "count.txt"
    argv = ["sh", "-c", f"touch {started}; sleep 1; echo x >> {count}"]
    return argv, started, count


async def wait_file(path: Path) -> None:
    with trio.fail_after(15):
        while not await trio.Path(path).exists():
            await trio.sleep(0.02)


async def status_of(conn: asyncpg.Connection, run_id: int) -> str:
    return str(
        await aio(conn.fetchval)("SELECT status FROM coordinator.runs WHERE id = $1", run_id)
    )


async def test_refused_refresh_keeps_serving_then_stop_spools_and_restart_replays(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    argv, started, count = slow_counter(tmp_path)
    spool_path = tmp_path / "state" / "spool.jsonl"
    await define(conn, "slow", target={"kind": "exec", "argv": argv})
    harness = await start_daemon(spool_path=spool_path, refresh_spacing=0.1, retry_cap=0.5)
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'slow')")
    await wait_file(started)
    # A non-transient fault for every statement that touches runs: the refresh reads
    # runs, the settlement writes them. PostgreSQL answers; it just refuses.
    await aio(conn.execute)("ALTER TABLE coordinator.runs RENAME TO runs_elsewhere")
    await define(conn, "other", schedule_kind="interval", schedule="1h")  # a wake
    await harness.wait_event("settle.retained", run=run_id)
    failed = await harness.wait_event("refresh.failed", count=2)
    assert {e["kind"] for e in failed} == {"refused"}
    assert not harness.done.is_set()
    status = harness.daemon.status()
    assert status.state == "degraded"
    assert [h.run for h in status.held] == [run_id]
    assert any(reason.startswith("refresh:") for reason in status.degraded)

    assert await harness.stop() == EXIT_SPOOLED
    assert [r.run_id for r in Spool(spool_path).read().records] == [run_id]

    await aio(conn.execute)("ALTER TABLE coordinator.runs_elsewhere RENAME TO runs")
    second = await start_daemon(spool_path=spool_path)
    assert second.named("spool.replayed")[0]["saved"] == 1
    assert await status_of(conn, run_id) == "succeeded"
    assert count.read_text().count("x") == 1
    assert not spool_path.exists()


async def test_a_bug_in_the_refresh_stops_cleanly_and_spools_the_held_result(
    start_daemon: StartDaemon, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    argv, _started, count = slow_counter(tmp_path)
    spool_path = tmp_path / "state" / "spool.jsonl"
    await aio(conn.execute)(REFUSE_SETTLEMENTS)
    await define(conn, "slow", target={"kind": "exec", "argv": argv})
    harness = await start_daemon(spool_path=spool_path, refresh_spacing=0.1, retry_cap=0.5)
    run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'slow')")
    await harness.wait_event("settle.retained", run=run_id)

    async def broken() -> Any:
        raise RuntimeError("a bug in the refresh")

    harness.daemon.loop.refresh = broken
    await define(conn, "other", schedule_kind="interval", schedule="1h")  # a wake
    with trio.fail_after(20):
        await harness.done.wait()
    assert harness.status == EXIT_FAILED
    failed = harness.named("daemon.failed")
    assert failed
    assert "RuntimeError: a bug in the refresh" in failed[0]["error"]
    assert harness.named("settle.spooled", run=run_id)
    assert [r.run_id for r in Spool(spool_path).read().records] == [run_id]
    assert await status_of(conn, run_id) == "running"

    await aio(conn.execute)("UPDATE public.faults SET active = false")
    second = await start_daemon(spool_path=spool_path)
    assert second.named("spool.replayed")[0]["saved"] == 1
    assert await status_of(conn, run_id) == "succeeded"
    assert count.read_text().count("x") == 1
