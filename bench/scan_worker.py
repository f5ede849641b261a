"""The recoverable scan the ``recoverable`` benchmark runs (``coordinator worker
bench.scan_worker:worker``). Its job's ``params`` say what to do:

* ``pace`` (seconds between checkpoints; 0: as fast as the connection takes them),
* ``seconds`` (how long to scan; the call then succeeds),
* ``findings`` (findings reported before each checkpoint, every one distinct),
* ``log`` (a file: one ``cursor monotonic-time`` line per checkpoint sent; the replay
  measurement reads it).

The cursor is the number of items done; each checkpoint counts one item.
"""

from __future__ import annotations

import time

import trio

from coordinator.worker import Context, Paused, Worker

worker = Worker(worker_id="bench-scan", capacity=4)


@worker.job("scan")
async def scan(ctx: Context) -> dict[str, object]:
    pace = float(ctx.params.get("pace", 0))
    seconds = float(ctx.params.get("seconds", 5))
    findings = int(ctx.params.get("findings", 0))
    log_path = ctx.params.get("log")
    log = await trio.open_file(log_path, "a", buffering=1) if log_path else None
    position = int(ctx.cursor or 0)
    started = time.monotonic()
    sent = 0
    try:
        while time.monotonic() - started < seconds:
            if ctx.cancelled.is_set():
                raise Paused()
            for i in range(findings):
                await ctx.finding("bench", f"{position}-{i}", severity="warning")
            position += 1
            await ctx.checkpoint(position, count=1)
            sent += 1
            if log is not None:
                await log.write(f"{position} {time.monotonic()}\n")
            await trio.sleep(pace)
    finally:
        if log is not None:
            with trio.CancelScope(shield=True):
                await log.aclose()
    return {"extra": {"checkpoints_sent": sent, "seconds": time.monotonic() - started}}
