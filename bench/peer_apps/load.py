"""The throughput benchmark's load generator, the same program for all three systems.

Runs inside the peers' virtual environment (bench/.peers), so that coordinator's triggers
and the peers' enqueues are sent by the same interpreter and client libraries' peers
(asyncpg for coordinator and pgqueuer, psycopg for procrastinate). The connection comes
from ``BENCH_PEER_DSN`` (the bench gives it ``application_name=bench``: the load is not
counted as the system's statements).

``python load.py SYSTEM burst N [FIRST]``
    Queue jobs FIRST .. FIRST+N-1 at once (one statement where the API allows it) and
    exit. coordinator: ``coordinator.trigger('bench', 'b-<n>')`` for manual jobs the bench
    created; procrastinate: ``ping.batch_defer_async``; pgqueuer: one ``Queries.enqueue``
    with lists.

``python load.py SYSTEM steady SECONDS OUT CONNECTIONS LIMIT``
    CONNECTIONS tasks, each on its own connection, enqueue one job per transaction flat
    out for SECONDS (job numbers 1, 2, ... shared; coordinator's job ``s-<n>``, at most
    LIMIT of them). Each enqueue is kept as ``{"seq", "t0", "t1", "run"}`` (wall clock
    before sending / after the COMMIT returned; coordinator's run id) and written to OUT
    as JSON lines at the end; the last stdout line is a JSON summary.
"""

import asyncio
import itertools
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

Enqueue = Callable[[int], Awaitable[Any]]
DSN = os.environ["BENCH_PEER_DSN"]


async def coordinator_session() -> tuple[Enqueue, Callable[[], Awaitable[None]]]:
    import asyncpg

    conn = await asyncpg.connect(DSN)
    stmt = await conn.prepare("SELECT coordinator.trigger('bench', $1)")

    async def enqueue(seq: int) -> Any:
        return await stmt.fetchval(f"s-{seq}")

    return enqueue, conn.close


async def pgqueuer_session() -> tuple[Enqueue, Callable[[], Awaitable[None]]]:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(DSN)
    queries = Queries(AsyncpgDriver(conn))

    async def enqueue(seq: int) -> Any:
        return (await queries.enqueue("ping", str(seq).encode()))[0]

    return enqueue, conn.close


async def burst(system: str, n: int, first: int) -> None:
    seqs = list(range(first, first + n))
    if system == "coordinator":
        import asyncpg

        conn = await asyncpg.connect(DSN)
        try:
            await conn.execute(
                "SELECT count(coordinator.trigger('bench', 'b-' || g::text)) "
                "FROM unnest($1::integer[]) AS g",
                seqs,
            )
        finally:
            await conn.close()
    elif system == "pgqueuer":
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        conn = await asyncpg.connect(DSN)
        try:
            await Queries(AsyncpgDriver(conn)).enqueue(
                ["ping"] * n, [str(s).encode() for s in seqs], [0] * n
            )
        finally:
            await conn.close()
    else:
        import procrastinate_app

        async with procrastinate_app.app.open_async():
            await procrastinate_app.ping.batch_defer_async(*({"seq": s} for s in seqs))
    print(json.dumps({"queued": n}), flush=True)


async def steady(system: str, seconds: float, out: str, connections: int, limit: int) -> None:
    counter = itertools.count(1)
    samples: list[tuple[int, float, float, Any]] = []
    errors: list[str] = []
    closers: list[Callable[[], Awaitable[None]]] = []
    enqueuers: list[Enqueue] = []
    app_cm: Any = None
    if system == "procrastinate":
        # A pool of exactly CONNECTIONS connections (set before the app is built).
        os.environ["BENCH_POOL_SIZE"] = str(connections)
        import procrastinate_app

        app_cm = procrastinate_app.app.open_async()
        await app_cm.__aenter__()

        async def defer(seq: int) -> Any:
            return await procrastinate_app.ping.defer_async(seq=seq)

        enqueuers = [defer] * connections
    else:
        make = coordinator_session if system == "coordinator" else pgqueuer_session
        for _ in range(connections):
            enqueue, close = await make()
            enqueuers.append(enqueue)
            closers.append(close)

    loop = asyncio.get_running_loop()
    exhausted = False

    async def worker(enqueue: Enqueue, deadline: float) -> None:
        nonlocal exhausted
        while loop.time() < deadline:
            seq = next(counter)
            if seq > limit:
                exhausted = True
                return
            t0 = time.time()
            try:
                result = await enqueue(seq)
            except Exception as exc:  # recorded, the load goes on
                errors.append(f"{seq}: {type(exc).__name__}: {exc}")
                continue
            samples.append((seq, t0, time.time(), result))

    started = time.time()
    deadline = loop.time() + seconds
    try:
        await asyncio.gather(*(worker(e, deadline) for e in enqueuers))
        ended = time.time()
    finally:
        for close in closers:
            await close()
        if app_cm is not None:
            await app_cm.__aexit__(None, None, None)
    write_samples(out, samples, runs=system == "coordinator")
    summary = {
        "count": len(samples),
        "started": started,
        "ended": ended,
        "connections": connections,
        "exhausted": exhausted,
        "errors": errors[:20],
        "error_count": len(errors),
    }
    print(json.dumps(summary), flush=True)


def write_samples(out: str, samples: list[tuple[int, float, float, Any]], *, runs: bool) -> None:
    with open(out, "w") as f:
        for seq, t0, t1, result in samples:
            run = result if runs else None
            f.write(json.dumps({"seq": seq, "t0": t0, "t1": t1, "run": run}) + "\n")


def main() -> None:
    system, mode, *rest = sys.argv[1:]
    if system not in ("coordinator", "procrastinate", "pgqueuer"):
        raise SystemExit(f"unknown system {system!r}")
    if mode == "burst":
        asyncio.run(burst(system, int(rest[0]), int(rest[1]) if len(rest) > 1 else 1))
    elif mode == "steady":
        seconds, out, connections, limit = rest
        asyncio.run(steady(system, float(seconds), out, int(connections), int(limit)))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
