"""``python -m bench.report [--write]``: the "Latest results" section of bench/README.md,
made from ``bench/results/*.json`` (the tables the last runs printed, with their command,
date and machine). ``--write`` replaces the section in the README; without it, print it.
"""

from __future__ import annotations

import argparse
import json
import sys

from .common import BENCH_DIR, RESULTS_DIR

START = "<!-- results:start (python -m bench.report --write) -->"
END = "<!-- results:end -->"
ORDER = (
    "idle",
    "peers",
    "latency",
    "lateness",
    "throughput",
    "scale",
    "durability",
    "recoverable",
    "prune",
    "rls",
    "hosts",
)
TITLES = {
    "idle": "Idle silence",
    "peers": "Peers: idle statements and wake latency, same cluster, same window",
    "latency": "Wake latency",
    "lateness": "Lateness",
    "throughput": "Throughput and cost per run, side by side with the peers",
    "scale": "Scale",
    "durability": "Durability: standby takeover, spool replay",
    "recoverable": "Recoverable runs: checkpoint and finding writes, replay after SIGKILL",
    "prune": "Retention: a 10-million-run backlog pruned while claims go on",
    "rls": "Row-level security: the daemon's claims and settlements with RLS on and off",
    "hosts": "Beyond one host: 1,000 workers, a standby over TCP, PostgreSQL failover",
}


def section() -> str:
    parts: list[str] = []
    for name in ORDER:
        path = RESULTS_DIR / f"{name}.json"
        if not path.exists():
            parts.append(f"### {TITLES[name]}\n\nNot run yet.\n")
            continue
        data = json.loads(path.read_text())
        machine = data.get("machine", {})
        head = (
            f"### {TITLES[name]}\n\n"
            f"`{data.get('command', '?')}` on {machine.get('date', '?')}, "
            f"{machine.get('cpu_count')} CPUs ({machine.get('cpu_model')}), "
            f"PostgreSQL {machine.get('postgresql')}, Python {machine.get('python')}, "
            f"commit {str(machine.get('git', {}).get('commit', ''))[:10]}"
            f"{' (+ uncommitted changes)' if machine.get('git', {}).get('dirty') else ''}; "
            f"took {data.get('duration_s', '?')} s.\n"
        )
        captions = {
            "table": "",
            "table_idle": f"Idle statements, same {data.get('window_s', '?')} s window:\n\n",
            "table_latency": "Wake latency (ms), enqueue/trigger COMMIT returned -> task function "
            "/ call starts (`sent->start`: from before the enqueue was sent):\n\n",
            "table_summary": "Side by side (bursts: median (min-max) over the repetitions):\n\n",
            "table_bursts": f"Bursts: {data.get('burst_runs', '?')} jobs queued, then the "
            "consumer starts (runs/s from the first handler start to the last job done; CPU "
            "s per 1,000 runs over the same interval):\n\n",
            "table_steady": f"Steady: 4 connections commit one job per transaction flat out "
            f"for {data.get('steady_window_s', '?')} s, 64 slots (latency ms: COMMIT "
            "returned -> handler starts):\n\n",
        }
        if name == "idle":
            captions["table"] = f"Idle window {data.get('window_s', '?')} s per scenario.\n\n"
        tables = [captions[k] + data[k] for k in captions if k in data]
        extra = ""
        if name in ("peers", "throughput") and "peer_packages" in machine:
            peers = machine.get("peer_packages", {})
            extra = "Peer versions: " + ", ".join(f"{k} {v}" for k, v in peers.items()) + ".\n"
        parts.append(head + extra + "\n" + "\n\n".join(tables) + "\n")
    return "\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report")
    parser.add_argument("--write", action="store_true", help="update bench/README.md")
    args = parser.parse_args()
    text = section()
    if not args.write:
        print(text)
        return 0
    readme = BENCH_DIR / "README.md"
    content = readme.read_text()
    if START not in content or END not in content:
        print(f"{readme}: markers not found", file=sys.stderr)
        return 1
    before, rest = content.split(START, 1)
    _, after = rest.split(END, 1)
    readme.write_text(before + START + "\n\n" + text + "\n" + END + after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
