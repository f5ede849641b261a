"""Wall time, injected.

Timers run on trio's clock; deadlines stored in PostgreSQL are wall time. Nothing in the
daemon calls ``datetime.now()`` inline: it asks a :class:`WallClock`, so tests can derive
wall time from trio's (mock) clock and move both together.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol

import attrs
import trio


class WallClock(Protocol):
    """Where wall time comes from."""

    def now(self) -> datetime:
        """The current time, timezone-aware (UTC)."""
        ...


class SystemWallClock:
    """The real wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)


@attrs.define(eq=False)
class TrioWallClock:
    """Wall time that advances with trio's clock (a ``MockClock`` in tests).

    ``origin`` is the wall time that corresponds to trio time ``trio_origin``.
    """

    origin: datetime
    trio_origin: float = 0.0

    def now(self) -> datetime:
        return self.origin + timedelta(seconds=trio.current_time() - self.trio_origin)
