"""The no-op worker the throughput and latency benchmarks call (``coordinator worker
bench.noop_worker:worker``): process start-up and job work are not measured. It reports
when its handler started (wall clock, in ``extra``) so the latency bench can measure
trigger commit -> the worker's code running. ``BENCH_NOOP_CAPACITY``: calls at once
(default 64)."""

import os
import time

from coordinator.worker import Context, Worker

worker = Worker(worker_id="bench-noop", capacity=int(os.environ.get("BENCH_NOOP_CAPACITY", "64")))


@worker.job("noop")
async def noop(ctx: Context) -> dict[str, object]:
    return {"count": 1, "extra": {"handler_started": time.time()}}
