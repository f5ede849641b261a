"""One error policy for everything the daemon sends to PostgreSQL.

Every store call of the refresh, the claim, the settlement, the sweep and the startup
steps fails through :meth:`ErrorPolicy.failed`, which classifies the error once:

``conflict``
    a deadlock or serialization failure (:class:`~coordinator.store.StoreConflict`):
    nothing was written; retried at once, a few times, then with the backoff.
``unavailable``
    the connection or the server went away (:class:`~coordinator.errors.DatabaseUnavailable`):
    retried with the shared capped backoff.
``refused``
    PostgreSQL answered with an error (a read-only database, a check violation, a
    missing table...): logged with the statement's purpose, retried with the capped
    backoff; the caller sets the affected job (or result) aside meanwhile. The daemon
    keeps serving everything else and reports itself ``degraded`` with the reason.

Anything else is not a database failure but a bug: it is re-raised, the daemon stops
cleanly, and its held results are saved or spooled on the way out (never lost).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Final

import attrs

from ..backoff import backoff
from ..db import one_line
from ..errors import CoordinatorError, DatabaseUnavailable
from ..log import EventLog
from ..store import StoreConflict

#: Times a conflict is retried at once before the backoff applies.
CONFLICT_RETRIES: Final = 3


class Failure(enum.Enum):
    """What kind of failure a database error is (see the module docstring)."""

    CONFLICT = "conflict"
    UNAVAILABLE = "unavailable"
    REFUSED = "refused"


def classify(exc: BaseException) -> Failure | None:
    """The kind of a store failure; ``None`` when ``exc`` is not one (a bug)."""
    if isinstance(exc, StoreConflict):
        return Failure.CONFLICT
    if isinstance(exc, DatabaseUnavailable):
        return Failure.UNAVAILABLE
    if isinstance(exc, CoordinatorError):
        return Failure.REFUSED
    return None


def _nothing() -> None:
    return None


@attrs.define(eq=False)
class ErrorPolicy:
    """Classifies, logs and paces failures, and remembers which purposes are failing
    (the daemon is ``degraded`` while any is)."""

    log: EventLog
    #: Longest pause between two attempts.
    retry_cap: float = 30.0
    #: Called when the set of failing purposes changes (status and systemd's STATUS=).
    on_change: Callable[[], None] = _nothing
    #: purpose -> the last error, while that purpose keeps failing.
    _problems: dict[str, str] = attrs.field(factory=dict)

    def failed(
        self, purpose: str, exc: BaseException, attempt: int, *, event: str | None = None,
        log: bool = True, pause: float | None = None, **fields: Any,
    ) -> float:  # fmt: skip
        """Log that ``purpose`` failed on its ``attempt``-th try (1-based) and return the
        seconds to wait before the next. Re-raises ``exc`` when it is not a database
        failure: a bug must stop the daemon (cleanly), not be retried forever. Not
        ``log``: the caller said this failure already (a repeat of the same error).
        ``pause``: the caller tries again after this instead (logged as ``retry_s``)."""
        kind = classify(exc)
        if kind is None:
            raise exc
        if kind is Failure.CONFLICT and attempt <= CONFLICT_RETRIES:
            delay = 0.0
        else:
            delay = backoff(attempt, cap=self.retry_cap)
        message = one_line(exc)
        if log:
            self.log.warning(
                event or f"{purpose}.failed",
                error=message,
                kind=kind.value,
                retry_s=delay if pause is None else pause,
                **fields,
            )
        if kind is not Failure.CONFLICT or delay > 0:
            previous = self._problems.get(purpose)
            self._problems[purpose] = (
                message if message.startswith(f"{purpose}:") else f"{purpose}: {message}"
            )
            if previous is None:
                self.on_change()
        return delay

    def recovered(self, purpose: str) -> None:
        """``purpose`` succeeded: it no longer degrades the daemon."""
        if self._problems.pop(purpose, None) is not None:
            self.log.info(f"{purpose}.recovered")
            self.on_change()

    @property
    def problems(self) -> tuple[str, ...]:
        """One line per failing purpose (empty when all is well)."""
        return tuple(self._problems.values())


__all__ = ["CONFLICT_RETRIES", "ErrorPolicy", "Failure", "classify"]
