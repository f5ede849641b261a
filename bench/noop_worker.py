"""The no-op worker the throughput and latency benchmarks call (``coordinator worker
bench.noop_worker:worker``): process start-up and job work are not measured."""

from coordinator.worker import Context, Worker

worker = Worker(worker_id="bench-noop", capacity=64)


@worker.job("noop")
async def noop(ctx: Context) -> int:
    return 1
