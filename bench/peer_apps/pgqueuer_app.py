"""pgqueuer, set up as its docs describe, for the peers benchmark.

Runs inside the peers' own virtual environment (bench/.peers, made by bench/peers.py),
never the project's. The schema comes from pgqueuer's CLI (``pgq install``). The worker
is what ``pgq run pgqueuer_app:create`` starts, through the documented Python equivalent
``pgqueuer.run("pgqueuer_app:create", ...)`` ("as pgq run does, without the CLI"):
``pgq run`` itself fails at start in pgqueuer 1.6.0 (its ``--log-level`` default reaches
``setup_fancy_logger`` as a string: ``AttributeError: 'str' object has no attribute
'name'``). Its options come from ``BENCH_WORKER_OPTIONS`` (JSON): ``dequeue_timeout`` and
``heartbeat_timeout`` (the idle knobs) in seconds, ``batch_size`` and
``max_concurrent_tasks`` (the throughput benchmark's slots) as integers. The connection
comes from ``PGDSN``.

* the ``ping`` entrypoint prints ``{"seq": n, "t": time.time()}`` on stdout first thing;
* ``BENCH_PERIODIC`` schedules (``@pgq.schedule``, 100 unless set) with far-future cron
  expressions;
* ``enqueue``: for each number read on stdin, ``Queries.enqueue("ping", b"n")`` and print
  ``{"seq": n, "t_before": ..., "t_after": ...}`` (the enqueue commits before returning).
"""

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import asyncpg
import pgqueuer
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job, Schedule
from pgqueuer.queries import Queries

SCHEDULES = int(os.environ.get("BENCH_PERIODIC", "100"))
#: Options given in seconds; the others are passed as they are.
DURATIONS = ("dequeue_timeout", "heartbeat_timeout", "restart_delay")
FAR_FUTURE = os.environ.get("BENCH_FAR_FUTURE", "1 1")  # day-of-month month


@asynccontextmanager
async def create() -> AsyncIterator[PgQueuer]:
    # pgqueuer 1.6.0's runner wants an async context manager from the factory (the
    # README's plain `async def main() -> PgQueuer` is refused by pgqueuer.run()).
    connection = await asyncpg.connect(os.environ["PGDSN"])
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint("ping")
    async def ping(job: Job) -> None:
        t = time.time()
        seq = int((job.payload or b"-1").decode())
        print(json.dumps({"seq": seq, "t": t}), flush=True)

    def register(i: int) -> None:
        @pgq.schedule(f"scheduled_{i}", f"{i % 60} {i % 24} {FAR_FUTURE} *")
        async def scheduled(schedule: Schedule) -> None:
            print(json.dumps({"scheduled": i}), flush=True)

    for i in range(SCHEDULES):
        register(i)
    try:
        yield pgq
    finally:
        await connection.close()


async def enqueue() -> None:
    loop = asyncio.get_running_loop()
    connection = await asyncpg.connect(os.environ["PGDSN"])
    queries = Queries(AsyncpgDriver(connection))
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            seq = int(line)
            t_before = time.time()
            await queries.enqueue("ping", str(seq).encode())
            t_after = time.time()
            print(json.dumps({"seq": seq, "t_before": t_before, "t_after": t_after}), flush=True)
    finally:
        await connection.close()


async def worker() -> None:
    options = json.loads(os.environ.get("BENCH_WORKER_OPTIONS") or "{}")
    await pgqueuer.run(
        "pgqueuer_app:create",
        **{k: timedelta(seconds=v) if k in DURATIONS else v for k, v in options.items()},
    )


if __name__ == "__main__":
    asyncio.run({"enqueue": enqueue, "worker": worker}[sys.argv[1]]())
