"""A job's policies checked: its retries, its misfire policy and its retention.

One set of rules for every way in -- :func:`coordinator.client.define_job` and
``job_entry`` (which a manifest's entries also go through, after
:mod:`coordinator.manifest` has worded its problems for TOML) and the schedules a worker
declares (:mod:`coordinator.daemon.declarations`) -- saying what
``coordinator.define_job`` in SQL would refuse, before it is sent. Pure: the refusal
is an :class:`~coordinator.errors.InvalidInput` naming the field.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from . import schedule as schedules
from .errors import InvalidInput
from .model import MAX_RETRIES, MIN_MISFIRE_GRACE, MISFIRE_POLICIES

__all__ = ["MAX_KEEP_LAST", "check_misfire", "check_retention", "check_retry_policy"]


#: Most runs a job may ask retention to keep.
MAX_KEEP_LAST: Final = 1_000_000_000


def check_retention(keep_last: int | None, retention: timedelta | None) -> None:
    """Refuse a ``keep_last`` outside 1..10^9 or a ``retention`` outside 0..3650d, naming
    the field (the database says the same)."""
    if keep_last is not None and (
        isinstance(keep_last, bool)
        or not isinstance(keep_last, int)
        or not 1 <= keep_last <= MAX_KEEP_LAST
    ):
        raise InvalidInput("keep_last", f"must be a whole number from 1 to {MAX_KEEP_LAST}")
    if retention is not None:
        if not isinstance(retention, timedelta):
            raise InvalidInput("retention", f"must be a timedelta, not {type(retention).__name__}")
        if retention <= timedelta(0):
            raise InvalidInput("retention", "must be greater than zero")
        schedules.check_duration(retention, "retention")


def _positive_duration(value: object, field: str) -> timedelta:
    if not isinstance(value, timedelta):
        raise InvalidInput(field, f"must be a timedelta, not {type(value).__name__}")
    if value <= timedelta(0):
        raise InvalidInput(field, "must be greater than zero")
    return schedules.check_duration(value, field)


def check_retry_policy(retries: object, retry_backoff: object, retry_max_delay: object) -> None:
    """Refuse a retry policy ``coordinator.define_job`` would refuse, naming the field."""
    if not isinstance(retries, int) or isinstance(retries, bool):
        raise InvalidInput("retries", f"must be an integer, not {type(retries).__name__}")
    if not 0 <= retries <= MAX_RETRIES:
        raise InvalidInput("retries", f"must be 0 to {MAX_RETRIES}, not {retries}")
    _positive_duration(retry_backoff, "retry_backoff")
    _positive_duration(retry_max_delay, "retry_max_delay")


def check_misfire(misfire: object, misfire_grace: object) -> None:
    """Refuse a misfire policy ``coordinator.define_job`` would refuse, naming the field."""
    if misfire not in MISFIRE_POLICIES:
        raise InvalidInput(
            "misfire", f"must be one of {', '.join(MISFIRE_POLICIES)}, not {misfire!r}"
        )
    if misfire == "skip" and misfire_grace is None:
        raise InvalidInput(
            "misfire_grace", "required with misfire skip (how late a deadline may still run)"
        )
    if misfire != "skip" and misfire_grace is not None:
        raise InvalidInput("misfire_grace", "only applies with misfire skip")
    if misfire_grace is not None:
        _positive_duration(misfire_grace, "misfire_grace")
        if misfire_grace < MIN_MISFIRE_GRACE:  # type: ignore[operator]
            raise InvalidInput("misfire_grace", "must be at least 1s")
