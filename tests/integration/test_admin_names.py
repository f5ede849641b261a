"""Job names with ``/``, ``%`` and markup through the admin API (hypercorn on a loopback
port, a real PostgreSQL; no daemon: these endpoints only read and write the database)."""

from __future__ import annotations

import secrets
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
import pytest
import trio

from coordinator import client
from coordinator.admin import Metrics, make_app, serve_admin
from coordinator.db import aio
from coordinator.model import Schedule, Target

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import asyncpg

TOKEN = secrets.token_urlsafe(32)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NAMES = [
    "reports/daily",
    "/leading",
    "trailing/",
    "a//b",
    "100%/sure",
    "literal%2Fescape",
    "literal%252F",
    "<script>alert(1)</script>",
    "caf\u00e9/\u2615 q?x#y",
]


def _no_daemon() -> Any:
    """The job endpoints never ask the daemon anything."""
    raise AssertionError("not consulted by the job endpoints")


@pytest.fixture
async def api(
    database: str, nursery: trio.Nursery, aio_loop: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, list[dict[str, Any]]]]:
    audits: list[dict[str, Any]] = []
    app = make_app(
        dsn=database, token=TOKEN, status=_no_daemon, metrics=Metrics(), audit=audits.append
    )
    shutdown = trio.Event()
    with trio.fail_after(10):
        url = await nursery.start(partial(serve_admin, app, "127.0.0.1:0", shutdown=shutdown))
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=AUTH) as http:
        yield http, audits
    shutdown.set()


def _path(namespace: str, name: str, *rest: str) -> str:
    return "/".join(["/api/jobs", quote(namespace, safe=""), quote(name, safe=""), *rest])


async def test_names_with_slashes_are_reachable_percent_encoded(
    api: tuple[httpx.AsyncClient, list[dict[str, Any]]], conn: asyncpg.Connection
) -> None:
    http, audits = api
    for name in NAMES:
        await aio(client.define_job)(
            conn,
            name=name,
            schedule=Schedule(kind="manual"),
            target=Target(kind="exec", argv=["true"]),
            paused=True,  # the queued run stays put: no daemon here anyway
        )
    for name in NAMES:
        with trio.fail_after(15):
            job = await http.get(_path("default", name))
            assert job.status_code == 200, (name, job.text)
            assert job.json()["name"] == name
            assert job.json()["key"] == f"default/{name}"
            triggered = await http.post(_path("default", name, "trigger"))
            assert triggered.status_code == 200, (name, triggered.text)
            runs = await http.get(_path("default", name, "runs"))
        assert [r["id"] for r in runs.json()["runs"]] == [triggered.json()["run"]]
        assert runs.json()["runs"][0]["job"] == name
    # Each audit record names the job as it is; its path keeps the name's slashes encoded.
    assert [a["job"] for a in audits] == [f"default/{n}" for n in NAMES]
    assert [a["path"].count("/") for a in audits] == [5] * len(NAMES)


async def test_an_unencoded_slash_is_another_path(
    api: tuple[httpx.AsyncClient, list[dict[str, Any]]], conn: asyncpg.Connection
) -> None:
    http, _ = api
    await aio(client.define_job)(
        conn,
        name="reports/daily",
        schedule=Schedule(kind="manual"),
        target=Target(kind="exec", argv=["true"]),
    )
    with trio.fail_after(15):
        assert (await http.get("/api/jobs/default/reports/daily")).status_code == 404
        missing = await http.get(_path("default", "reports/weekly"))
        # An encoded '%' stays one: "%2F" in a name is not a slash.
        literal = await http.get("/api/jobs/default/reports%252Fdaily")
    assert missing.status_code == 404
    assert missing.json() == {
        "error": "job_not_found",
        "message": "unknown job default/reports/weekly",
    }
    assert literal.json()["message"] == "unknown job default/reports%2Fdaily"
