"""procrastinate, set up as its docs describe, for the peers benchmark.

Runs inside the peers' own virtual environment (bench/.peers, made by bench/peers.py),
never the project's. Configuration comes from the environment:

* ``BENCH_PEER_DSN``: libpq connection string (its own database and role);
* ``BENCH_WORKER_OPTIONS``: JSON object of worker options, given to the App as
  ``worker_defaults`` (the "tuned" variant raises the polling and heartbeat intervals);
* ``BENCH_PERIODIC``: how many periodic tasks to register (100 unless set; the
  throughput benchmark sets 0);
* ``BENCH_POOL_SIZE``: when set, the connector's pool has exactly that many connections
  (the throughput benchmark's load generator, ``load.py``).

The schema and the worker go through procrastinate's own CLI
(``procrastinate --app=procrastinate_app.app schema --apply`` and ``... worker``); the
worker listens for NOTIFY (the default) with the 100 periodic tasks registered, and the
``ping`` task prints ``{"seq": n, "t": time.time()}`` on stdout as its first action.

``python procrastinate_app.py enqueue``: for each number read on stdin, defer
``ping(seq=n)`` and print ``{"seq": n, "t_before": ..., "t_after": ...}`` (wall clock
around the deferral, which commits before it returns).
"""

import asyncio
import json
import os
import sys
import time

import procrastinate

PERIODIC_TASKS = int(os.environ.get("BENCH_PERIODIC", "100"))
FAR_FUTURE = os.environ.get("BENCH_FAR_FUTURE", "1 1")  # day-of-month month
POOL = (
    {"min_size": int(os.environ["BENCH_POOL_SIZE"]), "max_size": int(os.environ["BENCH_POOL_SIZE"])}
    if os.environ.get("BENCH_POOL_SIZE")
    else {}
)

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ["BENCH_PEER_DSN"], **POOL),
    worker_defaults=json.loads(os.environ.get("BENCH_WORKER_OPTIONS") or "{}"),
)


@app.task(name="ping")
async def ping(seq: int) -> None:
    print(json.dumps({"seq": seq, "t": time.time()}), flush=True)


def _register(i: int) -> None:
    @app.periodic(cron=f"{i % 60} {i % 24} {FAR_FUTURE} *", periodic_id=f"p{i}")
    @app.task(name=f"periodic_{i}")
    async def periodic(timestamp: int) -> None:
        print(json.dumps({"periodic": i, "timestamp": timestamp}), flush=True)


for _i in range(PERIODIC_TASKS):
    _register(_i)


async def enqueue() -> None:
    loop = asyncio.get_running_loop()
    async with app.open_async():
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            seq = int(line)
            t_before = time.time()
            await ping.defer_async(seq=seq)
            t_after = time.time()
            print(json.dumps({"seq": seq, "t_before": t_before, "t_after": t_after}), flush=True)


if __name__ == "__main__":
    # Use the module's App, not one living in __main__ (procrastinate warns about that).
    import procrastinate_app

    asyncio.run({"enqueue": procrastinate_app.enqueue}[sys.argv[1]]())
