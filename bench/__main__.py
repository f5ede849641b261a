"""``python -m bench [BENCHMARK] [--quick]``: ``all`` (default), ``idle``, ``latency``,
``lateness``, ``throughput``, ``scale``, ``peers``, ``durability``, ``stats``,
``recoverable``, ``prune``, ``rls``, ``hosts``.

Each benchmark starts its own PostgreSQL cluster, prints a table and writes
``bench/results/<name>.json``. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import TYPE_CHECKING, Any

from . import common

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

BENCHMARKS = (
    "idle", "latency", "peers", "lateness", "throughput", "scale", "durability", "stats",
    "recoverable", "prune", "rls", "hosts",
)  # fmt: skip


def _runner(name: str) -> Callable[..., Awaitable[dict[str, Any]]]:
    if name == "idle":
        from .idle import run
    elif name == "latency":
        from .latency import run
    elif name == "peers":
        from .peers import run
    elif name == "lateness":
        from .lateness import run
    elif name == "throughput":
        from .throughput import run
    elif name == "scale":
        from .scale import run
    elif name == "durability":
        from .durability import run
    elif name == "stats":
        from .stats import run
    elif name == "recoverable":
        from .recoverable import run
    elif name == "prune":
        from .prune import run
    elif name == "rls":
        from .rls import run
    elif name == "hosts":
        from .hosts import run
    else:
        raise ValueError(name)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("benchmark", nargs="?", default="all", choices=("all", *BENCHMARKS))
    parser.add_argument(
        "--quick", action="store_true", help="shorter windows and fewer samples (minutes)"
    )
    parser.add_argument(
        "--window",
        type=float,
        default=None,
        metavar="SECONDS",
        help="override the idle window (idle, peers); the JSON records it",
    )
    args = parser.parse_args(argv)
    names = BENCHMARKS if args.benchmark == "all" else (args.benchmark,)
    command = "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv)
    failed = []
    for name in names:
        started = time.monotonic()
        kwargs: dict[str, Any] = {"quick": args.quick}
        if args.window is not None and name in ("idle", "peers"):
            kwargs["window"] = args.window
        try:
            result = asyncio.run(_runner(name)(**kwargs))
        except Exception as exc:
            failed.append(name)
            print(f"\n!! {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        result["command"] = command
        result["duration_s"] = round(time.monotonic() - started, 1)
        path = common.write_result(name, result)
        print(f"   -> {path.relative_to(common.REPO)} ({result['duration_s']} s)", flush=True)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
