"""Capped exponential backoff, the one schedule every reconnect and retry uses."""

from __future__ import annotations


def backoff(attempt: int, *, base: float = 0.5, cap: float = 30.0) -> float:
    """Seconds to wait before attempt ``attempt`` (1-based): 0.5, 1, 2, 4 ... at most ``cap``."""
    return float(min(cap, base * 2 ** max(0, attempt - 1)))
