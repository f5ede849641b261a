"""The one exception hierarchy.

Every failure that crosses a module boundary is a :class:`CoordinatorError`; the CLI turns
each into one line and an exit code (``exit_code``), so a user never sees a traceback for a
mistake of theirs. asyncpg errors are wrapped once, where the SQL is sent.
"""

from __future__ import annotations

from typing import Final

import trio


class CoordinatorError(Exception):
    """Base of every error this package raises on purpose."""

    #: The CLI's exit status for this error: 2 for bad input, 1 for everything else.
    exit_code = 1


class InvalidInput(CoordinatorError, ValueError):
    """A value given by a user or an application is not acceptable.

    ``field`` names what was wrong (``--cron``, ``timeout``, ``jobs[3].worker``) so the
    message can point at it.
    """

    exit_code = 2

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class InvalidSchedule(InvalidInput):
    """A schedule expression, timezone or timestamp cannot be used."""


#: Most characters of an unknown job's name an error quotes (a name is at most 200).
_SHOWN_NAME: Final = 200


class JobNotFound(CoordinatorError, LookupError):
    """No job has this namespace and name."""

    exit_code = 2

    def __init__(self, namespace: str, name: str) -> None:
        # (A name as asked, quoted whole, was 5,000 characters of a 404; a job asked for
        # by id alone is "#id", not "?/#id".)
        shown = name if len(name) <= _SHOWN_NAME else name[:_SHOWN_NAME] + "..."
        super().__init__(
            f"unknown job {shown}" if namespace == "?" else f"unknown job {namespace}/{shown}"
        )
        self.namespace = namespace
        self.name = name


class RunNotFound(CoordinatorError, LookupError):
    """No run has this id."""

    exit_code = 2

    def __init__(self, run_id: int) -> None:
        super().__init__(f"unknown run {run_id}")
        self.run_id = run_id


class Conflict(CoordinatorError):
    """The request is valid but the current state refuses it (e.g. resolving a finished run)."""

    exit_code = 2


class DatabaseUnavailable(CoordinatorError):
    """PostgreSQL could not be reached or refused the connection."""


class DatabaseError(CoordinatorError):
    """PostgreSQL answered with an error the caller could not have prevented."""


class ConfigError(CoordinatorError):
    """The configuration (file, environment or flags) is incomplete or wrong."""

    exit_code = 2


class PermissionDenied(CoordinatorError, PermissionError):
    """The caller may not do this in that namespace (a PostgreSQL grant, an admin
    token's or a worker token's scope); the message is
    ``permission denied for namespace "billing"``."""

    def __init__(
        self, namespace: str | None, detail: str | None = None, *, message: str | None = None
    ) -> None:
        what = f'namespace "{namespace}"' if namespace is not None else "this namespace"
        super().__init__(
            message or f"permission denied for {what}" + (f" ({detail})" if detail else "")
        )
        self.namespace = namespace
        self.detail = detail


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first error of a task group's that is not a cancellation (the group itself if
    none is): what a caller reports or classifies when sibling tasks were cancelled
    because of it."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return first_error(exc)
        if not isinstance(exc, trio.Cancelled):
            return exc
    return group
