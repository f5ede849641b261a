"""The admin HTTP API and /metrics, served by hypercorn on a free loopback port, against
an in-process daemon and a real PostgreSQL (real clock; SQL counted from the server log).
"""

from __future__ import annotations

import secrets
from functools import partial
from typing import TYPE_CHECKING, Any

import asyncpg
import attrs
import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from coordinator import client
from coordinator.admin import APP_ADMIN, Metrics, make_app, serve_admin
from coordinator.config import parse_listen as parse_any_listen
from coordinator.db import aio
from coordinator.errors import ConfigError
from coordinator.status import DaemonStatus

from .conftest import Harness, StartDaemon, define

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from coordinator.embedded import StatementLog

TOKEN = secrets.token_urlsafe(32)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
IDLE_WINDOW = 21.0  # seconds of required silence


@attrs.define(eq=False)
class Admin:
    """A served admin API and what it reported."""

    url: str
    http: httpx.AsyncClient
    audits: list[dict[str, Any]]
    metrics: Metrics
    harness: Harness | None = None

    async def get(self, path: str, **kw: Any) -> httpx.Response:
        kw.setdefault("headers", AUTH)
        with trio.fail_after(15):
            return await self.http.get(path, **kw)

    async def post(self, path: str, **kw: Any) -> httpx.Response:
        kw.setdefault("headers", AUTH)
        with trio.fail_after(15):
            return await self.http.post(path, **kw)


@attrs.frozen
class StubView:
    """A daemon snapshot for tests that need no daemon (``state`` as the daemon says it)."""

    state: str = "ready"

    def __call__(self) -> DaemonStatus:
        return DaemonStatus(
            state=self.state,
            instance="stub:1:0",
            uptime_s=1.0,
            leading=self.state == "ready",
            jobs=0,
            armed_deadlines=0,
        )


def parse_listen(listen: str, *, allow_remote: bool = False) -> tuple[str, int]:
    return parse_any_listen(listen, setting="admin_listen", allow_remote=allow_remote)


async def serve(
    nursery: trio.Nursery, app: Any, shutdown: trio.Event, listen: str = "127.0.0.1:0"
) -> str:
    with trio.fail_after(10):
        url: str = await nursery.start(partial(serve_admin, app, listen, shutdown=shutdown))
    return url


@pytest.fixture
async def admin(
    start_daemon: StartDaemon, database: str, nursery: trio.Nursery
) -> AsyncIterator[Admin]:
    harness = await start_daemon(refresh_spacing=0.2)  # wakes from define() refresh soon
    metrics = Metrics(status=harness.daemon.status)
    harness.daemon.events.subscribe(metrics.observe)
    audits: list[dict[str, Any]] = []
    app = make_app(
        dsn=database,
        token=TOKEN,
        status=harness.daemon.status,
        metrics=metrics,
        audit=audits.append,
    )
    shutdown = trio.Event()
    url = await serve(nursery, app, shutdown)
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        yield Admin(url=url, http=http, audits=audits, metrics=metrics, harness=harness)
    shutdown.set()


@pytest.fixture
async def stub_admin(nursery: trio.Nursery) -> AsyncIterator[Any]:
    """Serve an app over a stub view (no daemon, no database); returns a factory."""
    shutdown = trio.Event()
    clients: list[httpx.AsyncClient] = []

    async def start(view: Any, **kw: Any) -> Admin:
        metrics = Metrics()
        audits: list[dict[str, Any]] = []
        app = make_app(
            dsn="postgresql://unused/unused",
            token=TOKEN,
            status=view,
            metrics=metrics,
            audit=audits.append,
            **kw,
        )
        url = await serve(nursery, app, shutdown)
        http = httpx.AsyncClient(base_url=url, timeout=10)
        clients.append(http)
        return Admin(url=url, http=http, audits=audits, metrics=metrics)

    yield start
    for http in clients:
        await http.aclose()
    shutdown.set()


def assert_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error", "message"}, body
    assert body["error"] == code
    assert isinstance(body["message"], str)
    assert body["message"]


def runs_total(text: str, outcome: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "coordinator_runs_total" and sample.labels["outcome"] == outcome:
                total += sample.value
    return total


# -- auth ------------------------------------------------------------------------------------


async def test_auth_missing_is_401_and_wrong_is_403(admin: Admin, conn: asyncpg.Connection) -> None:
    await define(conn, "guarded")
    gets = ["/api/jobs", "/api/jobs/default/guarded", "/api/status", "/metrics", "/api/runs/1"]
    posts = ["/api/jobs/default/guarded/trigger", "/api/runs/1/resolve", "/api/runs/1/cancel"]
    for path in gets + posts:
        send = admin.get if path in gets else admin.post
        missing = await send(path, headers={})
        assert_error(missing, 401, "unauthorized")
        assert missing.headers["www-authenticate"].startswith("Bearer")
        assert_error(
            await send(path, headers={"Authorization": "Basic " + TOKEN}), 401, "unauthorized"
        )
        assert_error(await send(path, headers={"Authorization": "Bearer"}), 401, "unauthorized")
        wrong = {"Authorization": "Bearer " + TOKEN[:-1] + ("x" if TOKEN[-1] != "x" else "y")}
        assert_error(await send(path, headers=wrong), 403, "forbidden")
        # A non-ASCII header value is refused like any wrong token, not a crash.
        odd = {"Authorization": "Bearer caf\u00e9".encode("latin-1")}
        assert_error(await send(path, headers=odd), 403, "forbidden")
    # Nothing was triggered by the refused POSTs, and each of them was audited.
    job = await aio(client.get_job)(conn, "guarded")
    assert job.last_run is None
    assert len(admin.audits) == len(posts) * 5
    assert {a["status"] for a in admin.audits} == {401, 403}
    assert all(a["method"] == "POST" and "run" not in a for a in admin.audits)
    # The right token passes.
    assert (await admin.get("/api/jobs")).status_code == 200


async def test_healthz_needs_no_token_and_reports_the_role(admin: Admin) -> None:
    response = await admin.get("/healthz", headers={})
    assert response.status_code == 200
    assert response.json() == {"state": "leader"}


@pytest.mark.parametrize("role", ["standby", "degraded", "starting", "stopping"])
async def test_healthz_is_503_unless_leading(stub_admin: Any, role: str) -> None:
    api = await stub_admin(StubView(state=role))
    response = await api.get("/healthz", headers={})
    assert response.status_code == 503
    assert response.json() == {"state": role}


async def test_metrics_public_only_when_asked(stub_admin: Any) -> None:
    private = await stub_admin(StubView())
    assert_error(await private.get("/metrics", headers={}), 401, "unauthorized")
    public = await stub_admin(StubView(), metrics_public=True)
    response = await public.get("/metrics", headers={})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    # Only /metrics opens up.
    assert_error(await public.get("/api/status", headers={}), 401, "unauthorized")


def test_short_token_refused() -> None:
    with pytest.raises(ConfigError, match="admin token"):
        make_app(
            dsn="postgresql://x/y", token="   short   ", status=StubView(), metrics=Metrics(),
            audit=lambda rec: None,
        )  # fmt: skip


# -- listen address ----------------------------------------------------------------------------


def test_parse_listen_loopback_only_by_default() -> None:
    assert parse_listen("127.0.0.1:8787") == ("127.0.0.1", 8787)
    assert parse_listen("[::1]:0") == ("::1", 0)
    assert parse_listen("localhost:9000") == ("localhost", 9000)
    assert parse_listen("127.0.0.2:1") == ("127.0.0.2", 1)
    for remote in ("0.0.0.0:8787", "[::]:8787", "192.0.2.1:8787"):
        with pytest.raises(ConfigError, match="not a loopback address"):
            parse_listen(remote)
        assert parse_listen(remote, allow_remote=True)[1] == 8787
    for bad in (
        "8787",
        ":8787",
        "127.0.0.1:",
        "127.0.0.1:http",
        "127.0.0.1:70000",
        "example.org:1",
    ):
        with pytest.raises(ConfigError, match="admin_listen"):
            parse_listen(bad, allow_remote=True)


async def test_serve_refuses_a_remote_address(nursery: trio.Nursery) -> None:
    app = make_app(
        dsn="postgresql://x/y", token=TOKEN, status=StubView(), metrics=Metrics(),
        audit=lambda rec: None,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="not a loopback address"):
        await serve(nursery, app, trio.Event(), listen="0.0.0.0:0")


async def test_serves_on_ipv6_loopback(nursery: trio.Nursery) -> None:
    app = make_app(
        dsn="postgresql://x/y", token=TOKEN, status=StubView(), metrics=Metrics(),
        audit=lambda rec: None,
    )  # fmt: skip
    shutdown = trio.Event()
    try:
        url = await serve(nursery, app, shutdown, listen="[::1]:0")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    assert url.startswith("http://[::1]:")
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        with trio.fail_after(10):
            assert (await http.get("/healthz")).status_code == 200
    shutdown.set()


# -- reads -------------------------------------------------------------------------------------


async def test_reads(admin: Admin, conn: asyncpg.Connection) -> None:
    await define(conn, "alpha")
    await define(conn, "beta", namespace="team")
    response = await admin.get("/api/jobs")
    assert response.status_code == 200
    keys = [j["key"] for j in response.json()["jobs"]]
    assert keys == ["default/alpha", "team/beta"]
    only = await admin.get("/api/jobs", params={"namespace": "team"})
    assert [j["name"] for j in only.json()["jobs"]] == ["beta"]

    job = (await admin.get("/api/jobs/team/beta")).json()
    expected = (await aio(client.get_job)(conn, "beta", namespace="team")).to_json()
    assert job == expected  # (one shape for the API and the CLI's --json)
    assert (job["key"], job["state"]) == ("team/beta", "active")

    assert (await admin.get("/api/jobs/team/beta/runs")).json() == {"runs": []}
    run_id = await aio(client.trigger)(conn, "beta", namespace="team")
    assert admin.harness is not None
    await admin.harness.wait_event("job.run", run=run_id)
    runs = (await admin.get("/api/jobs/team/beta/runs", params={"limit": "5"})).json()["runs"]
    assert [r["id"] for r in runs] == [run_id]
    shown = (await admin.get(f"/api/runs/{run_id}")).json()
    assert shown == {
        **(await aio(client.get_run)(conn, run_id)).to_json(),
        "attempts": [shown["attempts"][0]],
    }
    assert shown["attempts"][0]["id"] == run_id
    assert shown["attempts"][0]["status"] == "succeeded"
    succeeded = await admin.get("/api/jobs/team/beta/runs", params={"status": "succeeded"})
    assert [r["id"] for r in succeeded.json()["runs"]] == [run_id]
    # A job removed with its history kept, and defined again: the new job's runs are its
    # own (the kept ones stay where README says: `runs list --job`, `runs show`).
    await aio(client.remove)(conn, "beta", namespace="team", keep_history=True)
    await define(conn, "beta", namespace="team")
    assert (await admin.get("/api/jobs/team/beta/runs")).json() == {"runs": []}
    kept = await aio(client.list_runs)(conn, namespace="team", job="beta")
    assert [r.id for r in kept] == [run_id]
    # Reads were not audited.
    assert admin.audits == []


async def test_status_from_memory(admin: Admin, conn: asyncpg.Connection) -> None:
    await define(conn, "soon", schedule_kind="interval", schedule="1h")
    assert admin.harness is not None
    await admin.harness.wait_event("refresh", count=2)  # the wake brought the new job
    body = (await admin.get("/api/status")).json()
    assert body["state"] == "leader"
    assert body["daemon_state"] == "ready"
    assert body["instance"] == admin.harness.daemon.instance
    assert body["uptime_s"] >= 0
    assert body["armed_deadlines"] == 1
    assert body["next_deadline"]["job"] == "default/soon"
    assert body["next_deadline"]["at"].endswith("+00:00")
    assert body["running"] == []
    assert body["retained"] == []
    assert body["workers"] == []
    assert body["refreshes"] >= 2
    assert body["last_refresh"] is not None


# -- writes ------------------------------------------------------------------------------------


async def test_trigger_is_idempotent_and_audited(admin: Admin, conn: asyncpg.Connection) -> None:
    # Paused: the queued run stays outstanding, so the second trigger must find it.
    await define(conn, "held", paused=True)
    first = await admin.post("/api/jobs/default/held/trigger", params={"force": "true"})
    assert first.status_code == 200, first.text
    second = await admin.post("/api/jobs/default/held/trigger")
    assert second.status_code == 200
    run_id = first.json()["run"]
    assert first.json() == {"run": run_id, "created": True, "resumed": False, "status": "queued"}
    assert second.json() == {"run": run_id, "created": False, "resumed": False, "status": "queued"}
    runs = await aio(client.list_runs)(conn, job="held")
    assert [r.id for r in runs] == [run_id]
    assert runs[0].args == {"force": True}

    assert len(admin.audits) == 2
    for record in admin.audits:
        assert record["method"] == "POST"
        assert record["path"] == "/api/jobs/default/held/trigger"
        assert record["status"] == 200
        assert record["run"] == run_id
        assert record["job"] == "default/held"
        assert record["remote"].startswith("127.0.0.1:")
    assert [a["created"] for a in admin.audits] == [True, False]
    assert admin.audits[0]["force"] is True
    assert "force" not in admin.audits[1]


async def test_a_trigger_takes_args_in_its_body_and_refuses_a_body_it_cannot_use(
    admin: Admin, conn: asyncpg.Connection
) -> None:
    """A body was read by nobody: a tester's args were dropped with a 200."""
    await define(conn, "held", paused=True)
    for body, field in (
        ("not json", "body"),
        ('{"arg": {"x": 1}}', "body"),
        ('{"args": [1]}', "args"),
        ("[1]", "body"),
        ('{"force": "yes"}', "force"),
    ):
        refused = await admin.post(
            "/api/jobs/default/held/trigger",
            content=body,
            headers={**AUTH, "content-type": "application/json"},
        )
        assert_error(refused, 400, "invalid_input")
        assert refused.json()["message"].startswith(f"{field}:"), refused.json()
    assert await aio(client.list_runs)(conn, job="held") == []
    made = await admin.post(
        "/api/jobs/default/held/trigger", json={"args": {"x": 1, "password": "p"}, "force": True}
    )
    assert made.status_code == 200, made.text
    assert made.json()["created"] is True
    (run,) = await aio(client.list_runs)(conn, job="held")
    # (Stored redacted, as every front door but SQL stores args.)
    assert run.args == {"x": 1, "password": "[redacted]", "force": True}


async def test_a_trigger_racing_another_callers_says_the_run_was_not_its_own(
    admin: Admin, conn: asyncpg.Connection, database: str
) -> None:
    """`created` was decided by comparing the answer with the job as read before the
    trigger: callers racing each other all read "no run", and each was told it had
    created the one run (a tester saw 7 of 8). The race made deterministic: another
    transaction has inserted the run, uncommitted, when the API reads the job; its
    trigger waits for that insert and answers with its run."""
    await define(conn, "held", paused=True)
    other = await aio(asyncpg.connect)(database)
    answers: list[httpx.Response] = []
    try:
        await aio(other.execute)("BEGIN")
        run_id = await aio(other.fetchval)("SELECT coordinator.trigger('default', 'held')")

        async def post() -> None:
            answers.append(await admin.post("/api/jobs/default/held/trigger"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post)
            with trio.fail_after(10):
                while not await aio(conn.fetchval)(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE '%coordinator.trigger%' AND pid <> $1",
                    other.get_server_pid(),
                ):
                    await trio.sleep(0.02)
            await aio(other.execute)("COMMIT")
    finally:
        await aio(other.close)()
    assert answers[0].json() == {
        "run": run_id,
        "created": False,
        "resumed": False,
        "status": "queued",
    }
    assert admin.audits[-1]["created"] is False


async def test_error_shapes(admin: Admin, conn: asyncpg.Connection) -> None:
    await define(conn, "held", paused=True)
    assert_error(await admin.get("/api/jobs/default/nope"), 404, "job_not_found")
    assert_error(await admin.get("/api/jobs/default/nope/runs"), 404, "job_not_found")
    assert_error(await admin.post("/api/jobs/default/nope/trigger"), 404, "job_not_found")
    assert_error(await admin.get("/api/runs/987654"), 404, "run_not_found")
    # A namespace no job could have is bad input, not an unknown job.
    assert_error(await admin.get("/api/jobs/bad%20ns/held"), 400, "invalid_input")
    assert_error(await admin.get("/api/jobs/bad%20ns/held/runs"), 400, "invalid_input")
    assert_error(await admin.post("/api/jobs/bad%20ns/held/trigger"), 400, "invalid_input")
    assert_error(await admin.get("/api/runs/abc"), 400, "invalid_input")
    assert_error(await admin.get("/api/runs/0"), 400, "invalid_input")
    assert_error(await admin.get(f"/api/runs/{2**63}"), 400, "invalid_input")
    assert_error(await admin.get("/api/jobs/default/held/runs?limit=0"), 400, "invalid_input")
    assert_error(await admin.get("/api/jobs/default/held/runs?limit=x"), 400, "invalid_input")
    assert_error(await admin.get("/api/jobs/default/held/runs?status=odd"), 400, "invalid_input")
    assert_error(
        await admin.post("/api/jobs/default/held/trigger", params={"force": "maybe"}),
        400,
        "invalid_input",
    )
    assert_error(await admin.get("/api/nothing"), 404, "not_found")
    assert_error(await admin.get("/api/jobs/default/held/trigger"), 405, "method_not_allowed")

    run_id = (await admin.post("/api/jobs/default/held/trigger")).json()["run"]
    resolve = f"/api/runs/{run_id}/resolve"
    assert_error(await admin.post(resolve, content=b"{not json"), 400, "invalid_input")
    assert_error(await admin.post(resolve, json=["failed"]), 400, "invalid_input")
    assert_error(await admin.post(resolve, json={}), 400, "invalid_input")
    assert_error(await admin.post(resolve, json={"as": "bogus"}), 400, "invalid_input")
    assert_error(await admin.post(resolve, content=b" " * 70_000), 413, "too_large")
    # A queued run is not unresolved: the state refuses it.
    assert_error(await admin.post(resolve, json={"as": "failed"}), 409, "conflict")
    assert_error(
        await admin.post("/api/runs/987654/resolve", json={"as": "failed"}), 404, "run_not_found"
    )
    # Every POST above was audited once, with its status.
    statuses = [a["status"] for a in admin.audits]
    assert statuses == [404, 400, 400, 200, 400, 400, 400, 400, 413, 409, 404]
    assert [a.get("run") for a in admin.audits[-8:]] == [run_id] * 7 + [987654]


async def test_jobs_due_soonest(admin: Admin, conn: asyncpg.Connection) -> None:
    """``?due=N``: what `top` shows as the next deadlines, not every job (it read all,
    2.4 MB at 2,920 jobs, after each scheduled run)."""
    for name, hours in (("third", 3), ("first", 1), ("second", 2), ("held", 0)):
        await define(conn, name, schedule_kind="interval", schedule="1d", paused=name == "held")
        await aio(conn.execute)(
            "UPDATE coordinator.jobs SET next_run_at = now() + make_interval(hours => $2)"
            " WHERE name = $1",
            name,
            hours,
        )
    await define(conn, "manual")
    due = (await admin.get("/api/jobs", params={"due": "2"})).json()["jobs"]
    assert [j["name"] for j in due] == ["first", "second"]
    everything = (await admin.get("/api/jobs", params={"due": "1000"})).json()["jobs"]
    assert [j["name"] for j in everything] == ["first", "second", "third"]
    for bad in ("0", "1001", "x"):
        assert_error(await admin.get("/api/jobs", params={"due": bad}), 400, "invalid_input")


async def test_resolve(admin: Admin, conn: asyncpg.Connection) -> None:
    job_id = await define(conn, "stuck")
    lost = await aio(conn.fetchval)(
        "INSERT INTO coordinator.runs (job_id, trigger, status, error_cause) "
        "VALUES ($1, 'manual', 'unresolved', 'lost') RETURNING id",
        job_id,
    )
    response = await admin.post(f"/api/runs/{lost}/resolve", json={"as": "retry"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["run"] == lost
    assert body["as"] == "retry"
    retry = body["retry_run"]
    assert isinstance(retry, int)
    assert retry != lost
    assert (await aio(client.get_run)(conn, lost)).status == "failed"
    # The run's chain of attempts, as `runs show --json` gives it.
    chain = (await admin.get(f"/api/runs/{retry}")).json()["attempts"]
    assert [(a["id"], a["attempt"]) for a in chain] == [(lost, 1), (retry, 2)]
    assert_error(
        await admin.post(f"/api/runs/{lost}/resolve", json={"as": "failed"}), 409, "conflict"
    )
    assert [(a["run"], a["status"], a.get("retry_run")) for a in admin.audits] == [
        (lost, 200, retry),
        (lost, 409, None),
    ]
    assert admin.audits[0]["resolved_as"] == "retry"


async def test_cancel_queued_run(admin: Admin, conn: asyncpg.Connection) -> None:
    await define(conn, "held", paused=True)
    run_id = (await admin.post("/api/jobs/default/held/trigger")).json()["run"]
    response = await admin.post(f"/api/runs/{run_id}/cancel")
    assert response.status_code == 200, response.text
    assert response.json() == {"run": run_id, "status": "cancelled"}
    assert (await aio(client.get_run)(conn, run_id)).status == "cancelled"
    assert_error(await admin.post(f"/api/runs/{run_id}/cancel"), 409, "conflict")
    assert_error(await admin.post("/api/runs/987654/cancel"), 404, "run_not_found")
    assert [a["status"] for a in admin.audits] == [200, 200, 409, 404]


async def test_pause_a_run_and_trigger_resumes_it(admin: Admin, conn: asyncpg.Connection) -> None:
    """POST /api/runs/{id}/pause: a queued run of a recoverable job pauses at once (a
    running one becomes cancel_requested); the job's trigger resumes it; a run of another
    job, a finished run and an unknown one are refused with the usual shapes."""
    job = await define(
        conn, "scan", target={"kind": "worker", "type": "scan"}, recoverable=True, paused=True
    )
    await define(conn, "plain", paused=True)
    run_id = (await admin.post("/api/jobs/default/scan/trigger")).json()["run"]
    response = await admin.post(f"/api/runs/{run_id}/pause")
    assert response.status_code == 200, response.text
    assert response.json() == {"run": run_id, "status": "paused"}
    again = await admin.post(f"/api/runs/{run_id}/pause")  # idempotent
    assert again.json() == {"run": run_id, "status": "paused"}
    resumed = await admin.post("/api/jobs/default/scan/trigger")
    assert resumed.json() == {"run": run_id, "created": False, "resumed": True, "status": "queued"}
    assert (await aio(client.get_run)(conn, run_id)).status == "queued"

    await aio(conn.execute)(
        "UPDATE coordinator.runs SET status = 'running', started_at = now() WHERE id = $1",
        run_id,
    )
    running = await admin.post(f"/api/runs/{run_id}/pause")
    assert running.json() == {"run": run_id, "status": "cancel_requested"}

    plain_run = (await admin.post("/api/jobs/default/plain/trigger")).json()["run"]
    refused = await admin.post(f"/api/runs/{plain_run}/pause")
    assert_error(refused, 409, "conflict")
    assert "not recoverable" in refused.json()["message"]
    await aio(conn.execute)(
        "UPDATE coordinator.runs SET status = 'succeeded' WHERE id = $1", run_id
    )
    finished = await admin.post(f"/api/runs/{run_id}/pause")
    assert_error(finished, 409, "conflict")
    assert "is succeeded: only a running or queued run can be paused" in finished.json()["message"]
    assert_error(await admin.post("/api/runs/987654/pause"), 404, "run_not_found")
    assert_error(await admin.post("/api/runs/x/pause"), 400, "invalid_input")
    assert [(a["status"], a.get("run")) for a in admin.audits[-5:]] == [
        (200, plain_run),  # the trigger
        (409, plain_run),
        (409, run_id),
        (404, 987654),
        (400, None),
    ]
    assert (admin.audits[1]["status"], admin.audits[1]["run_status"]) == (200, "paused")
    assert (await aio(client.get_job)(conn, "scan")).id == job


async def test_findings_of_a_run_paged(admin: Admin, conn: asyncpg.Connection) -> None:
    job = await define(conn, "scan", target={"kind": "worker", "type": "scan"}, recoverable=True)
    run_id = await aio(conn.fetchval)(
        "INSERT INTO coordinator.runs (job_id, trigger, status) VALUES ($1, 'manual', 'paused') "
        "RETURNING id",
        job,
    )
    await aio(conn.execute)(
        "INSERT INTO coordinator.findings (run_id, kind, resource_id, severity, detail) "
        "SELECT $1, 'k', 'r' || g, CASE WHEN g % 3 = 0 THEN 'error' ELSE 'info' END, "
        "json_build_object('g', g) FROM generate_series(1, 25) g",
        run_id,
    )
    first = await admin.get(f"/api/runs/{run_id}/findings", params={"limit": 10})
    assert first.status_code == 200, first.text
    body = first.json()
    assert [f["resource_id"] for f in body["findings"]] == [f"r{g}" for g in range(1, 11)]
    assert body["findings"][0]["detail"] == {"g": 1}
    assert body["findings"][0]["run"] == run_id
    rest = (
        await admin.get(
            f"/api/runs/{run_id}/findings", params={"limit": 100, "after": body["next"]}
        )
    ).json()
    assert [f["resource_id"] for f in rest["findings"]] == [f"r{g}" for g in range(11, 26)]
    assert rest["next"] is None
    errors = (await admin.get(f"/api/runs/{run_id}/findings", params={"severity": "error"})).json()
    assert [f["resource_id"] for f in errors["findings"]] == [f"r{g}" for g in range(3, 26, 3)]
    empty = await admin.get(f"/api/runs/{run_id}/findings", params={"after": 10**9})
    assert empty.json() == {"findings": [], "next": None}
    for params in ({"limit": 0}, {"after": "x"}, {"severity": "fatal"}, {"limit": 1001}):
        assert_error(
            await admin.get(f"/api/runs/{run_id}/findings", params=params), 400, "invalid_input"
        )
    assert_error(await admin.get("/api/runs/987654/findings"), 404, "run_not_found")


# -- metrics -----------------------------------------------------------------------------------


async def test_metrics_parse_and_move_with_runs(admin: Admin, conn: asyncpg.Connection) -> None:
    await define(conn, "quick")
    before = await admin.get("/metrics")
    assert before.status_code == 200
    assert before.headers["content-type"].startswith("text/plain")
    families = {f.name for f in text_string_to_metric_families(before.text)}
    assert {"coordinator_runs", "coordinator_armed_deadlines", "coordinator_sql_statements"} <= (
        families
    )
    assert runs_total(before.text, "succeeded") == 0

    run = (await admin.post("/api/jobs/default/quick/trigger")).json()["run"]
    assert admin.harness is not None
    await admin.harness.wait_event("job.run", run=run)
    after = (await admin.get("/metrics")).text
    assert runs_total(after, "succeeded") == 1
    samples = {
        s.name: s.value
        for f in text_string_to_metric_families(after)
        for s in f.samples
        if not s.labels
    }
    assert samples["coordinator_claims_total"] == 1
    assert samples["coordinator_run_duration_seconds_count"] == 1
    assert samples["coordinator_running_calls"] == 0
    assert samples["coordinator_retained_results"] == 0


# -- cost --------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_enabled_but_unused_api_sends_no_sql(
    admin: Admin, conn: asyncpg.Connection, sql_log: StatementLog, database_name: str
) -> None:
    await define(conn, "later", schedule_kind="cron", schedule="0 0 1 1 *")
    assert admin.harness is not None
    await admin.harness.wait_event("refresh", count=2)
    await trio.sleep(0.5)  # let anything in flight land

    def sql(app: str) -> list[Any]:
        return sql_log.statements(app=app, db=database_name)

    sql_log.mark()
    with trio.fail_after(IDLE_WINDOW + 15):
        # Health checks, status and scrapes answer from memory: they cost no SQL either.
        for _ in range(3):
            await trio.sleep(IDLE_WINDOW / 3)
            assert (await admin.get("/healthz", headers={})).status_code == 200
            assert (await admin.get("/api/status")).status_code == 200
            assert (await admin.get("/metrics")).status_code == 200
    assert sql("coordinator") == []
    assert sql(APP_ADMIN) == []
    # The count is meaningful: a database read of the API shows up under its name.
    assert (await admin.get("/api/jobs")).status_code == 200
    assert len(sql(APP_ADMIN)) >= 1
    assert sql("coordinator") == []
