"""How the store classes what asyncpg raises: the daemon's error policy retries an
unavailable database and holds what it could not save; a refusal is the database's word
on that one item (a spooled result refused five times is set aside)."""

from __future__ import annotations

import asyncpg
import pytest

from coordinator.daemon.policy import Failure, classify
from coordinator.store import _wrap


@pytest.mark.parametrize(
    "exc",
    [
        # A session cut off mid-statement, then asked for the next one (a soak test saw
        # it when the daemon's backends were terminated under load): it was "refused".
        asyncpg.InternalClientError(
            "cannot switch to state 12; another operation (2) is in progress"
        ),
        asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        ConnectionResetError(104, "Connection reset by peer"),
    ],
)
def test_a_broken_session_is_unavailable(exc: BaseException) -> None:
    assert classify(_wrap(exc, "settle")) is Failure.UNAVAILABLE


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.CheckViolationError('new row violates check constraint "runs_status"'),
        # A bug of ours on the client side: retried forever as "unavailable" otherwise.
        asyncpg.InternalClientError("no decoder for OID 16384"),
    ],
)
def test_what_would_fail_the_same_again_is_refused(exc: BaseException) -> None:
    assert classify(_wrap(exc, "settle")) is Failure.REFUSED
