"""Wall time, injected.

Timers run on trio's clock; deadlines stored in PostgreSQL are wall time. Nothing in the
daemon calls ``datetime.now()`` inline: it asks a :class:`WallClock`, so tests can derive
wall time from trio's (mock) clock and move both together (``tests/unit/test_loop.py``
does, with a clock of its own).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol


class WallClock(Protocol):
    """Where wall time comes from."""

    def now(self) -> datetime:
        """The current time, timezone-aware (UTC)."""
        ...


class SystemWallClock:
    """The real wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)
