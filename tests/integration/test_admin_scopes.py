"""Scoped admin tokens and redaction, end to end: a real daemon, a real PostgreSQL, the
admin API served by hypercorn, requests over HTTP.

Tokens: ``billing-ops`` operates ``billing``; ``reports-read`` reads ``reports``; the
single ``admin`` token reaches everything.
"""

from __future__ import annotations

import json
import re
import secrets
import stat
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import pytest
import trio

from coordinator import client
from coordinator.admin import Metrics, make_app
from coordinator.admin.access import status_for
from coordinator.alerts import EmailSink, WebhookSink
from coordinator.db import aio
from coordinator.model import Schedule, Target
from coordinator.status import DaemonStatus, HeldResultView, RunningCall, WorkerView
from coordinator.tokens import TokenScope, TokenSet, hash_token, parse_tokens

from .alerting import HttpReceiver, SmtpServer
from .conftest import StartDaemon, define
from .test_admin import serve

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    import asyncpg

ADMIN = secrets.token_urlsafe(32)
BILLING_OPS = secrets.token_urlsafe(32)
REPORTS_READ = secrets.token_urlsafe(32)
TOKENS = parse_tokens(
    {
        "billing-ops": {
            "hash": hash_token(BILLING_OPS),
            "namespaces": ["billing"],
            "access": "operate",
        },
        "reports-read": {
            "hash": hash_token(REPORTS_READ),
            "namespaces": ["reports"],
            "access": "read",
        },
    },
    "admin_tokens",
    kind="admin",
)


@attrs.define(eq=False)
class Api:
    http: httpx.AsyncClient
    audits: list[dict[str, Any]]
    #: Where the daemon's failure alerts go (a real SMTP server, a real HTTP receiver).
    smtp: SmtpServer
    hooks: HttpReceiver

    async def get(self, token: str, path: str) -> httpx.Response:
        with trio.fail_after(15):
            return await self.http.get(path, headers={"Authorization": f"Bearer {token}"})

    async def post(self, token: str, path: str, **kw: Any) -> httpx.Response:
        with trio.fail_after(15):
            return await self.http.post(path, headers={"Authorization": f"Bearer {token}"}, **kw)


@pytest.fixture
async def api(
    start_daemon: StartDaemon, database: str, nursery: trio.Nursery
) -> AsyncIterator[tuple[Api, Any]]:
    smtp, hooks = SmtpServer(), HttpReceiver()
    smtp.start()
    hooks.start()
    sinks = [
        EmailSink(
            host="127.0.0.1",
            port=smtp.port,
            sender="coordinator@test.invalid",
            recipients=("ops@test.invalid",),
        ),
        WebhookSink(url=hooks.url),
    ]
    harness = await start_daemon(refresh_spacing=0.2, alert_sinks=sinks)
    audits: list[dict[str, Any]] = []
    metrics = Metrics(status=harness.daemon.status)
    harness.daemon.events.subscribe(metrics.observe)
    app = make_app(
        dsn=database,
        token=ADMIN,
        tokens=TOKENS,
        status=harness.daemon.status,
        metrics=metrics,
        audit=audits.append,
        events=harness.daemon.events,
    )
    shutdown = trio.Event()
    url = await serve(nursery, app, shutdown)
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        yield Api(http=http, audits=audits, smtp=smtp, hooks=hooks), harness
    shutdown.set()
    smtp.stop()
    hooks.stop()


def denied(response: httpx.Response, namespace: str) -> None:
    assert response.status_code == 403, response.text
    body = response.json()
    assert body["error"] == "permission_denied"
    assert body["message"].startswith(f'permission denied for namespace "{namespace}"')


async def test_listing_and_reading_keep_to_the_token(
    api: tuple[Api, Any], conn: asyncpg.Connection
) -> None:
    http, _ = api
    for ns in ("billing", "reports", "ops"):
        await define(conn, "a", namespace=ns)
    listed = (await http.get(BILLING_OPS, "/api/jobs")).json()["jobs"]
    assert [j["key"] for j in listed] == ["billing/a"]
    listed = (await http.get(REPORTS_READ, "/api/jobs")).json()["jobs"]
    assert [j["key"] for j in listed] == ["reports/a"]
    assert len((await http.get(ADMIN, "/api/jobs")).json()["jobs"]) == 3
    denied(await http.get(BILLING_OPS, "/api/jobs?namespace=reports"), "reports")
    denied(await http.get(BILLING_OPS, "/api/jobs/reports/a"), "reports")
    denied(await http.get(BILLING_OPS, "/api/jobs/ops/a/runs"), "ops")
    assert (await http.get(REPORTS_READ, "/api/jobs/reports/a")).status_code == 200


async def test_trigger_cancel_and_resolve_outside_the_scope_are_refused(
    api: tuple[Api, Any], conn: asyncpg.Connection
) -> None:
    http, _harness = api
    for ns in ("billing", "reports"):
        await define(conn, "a", namespace=ns, target={"kind": "worker", "type": "nobody"})
    # read-only: refused; another namespace: refused; its own: done.
    denied(await http.post(REPORTS_READ, "/api/jobs/reports/a/trigger"), "reports")
    denied(await http.post(BILLING_OPS, "/api/jobs/reports/a/trigger"), "reports")
    answer = await http.post(BILLING_OPS, "/api/jobs/billing/a/trigger")
    assert answer.status_code == 200, answer.text
    billing_run = answer.json()["run"]
    reports_run = (await http.post(ADMIN, "/api/jobs/reports/a/trigger")).json()["run"]
    # A run outside the token's namespaces is unknown to it; a read-only one is refused.
    # (Its findings and its pause too: before, those two routes checked no scope, so
    # another namespace's token read a run's findings and paused its call.)
    for send, path in (
        (http.get, f"/api/runs/{reports_run}"),
        (http.get, f"/api/runs/{reports_run}/findings"),
        (http.post, f"/api/runs/{reports_run}/cancel"),
        (http.post, f"/api/runs/{reports_run}/pause"),
    ):
        response = await send(BILLING_OPS, path)
        assert response.status_code == 404, (path, response.text)
        assert response.json()["error"] == "run_not_found"
    assert (await http.get(REPORTS_READ, f"/api/runs/{reports_run}")).status_code == 200
    assert (await http.get(REPORTS_READ, f"/api/runs/{reports_run}/findings")).status_code == 200
    denied(await http.post(REPORTS_READ, f"/api/runs/{reports_run}/cancel"), "reports")
    denied(await http.post(REPORTS_READ, f"/api/runs/{reports_run}/pause"), "reports")
    response = await http.post(
        REPORTS_READ, f"/api/runs/{reports_run}/resolve", json={"as": "failed"}
    )
    denied(response, "reports")
    # With no body, or a wrong one, still refused as a reader (it was 400 "as: ...").
    for body in ({}, {"as": "maybe"}):
        response = await http.post(REPORTS_READ, f"/api/runs/{reports_run}/resolve", json=body)
        denied(response, "reports")
    # Nothing refused happened; what was allowed did.
    runs = {r.id: r.status for r in await aio(client.list_runs)(conn, limit=10)}
    assert runs == {billing_run: "queued", reports_run: "queued"}
    assert (await http.post(BILLING_OPS, f"/api/runs/{billing_run}/cancel")).status_code == 200
    # Every POST was audited with the token's name.
    by_token = [(a["token"], a["path"], a["status"]) for a in http.audits if "token" in a]
    assert ("billing-ops", "/api/jobs/billing/a/trigger", 200) in by_token
    assert ("reports-read", "/api/jobs/reports/a/trigger", 403) in by_token
    assert ("admin", "/api/jobs/reports/a/trigger", 200) in by_token
    assert ("billing-ops", f"/api/runs/{reports_run}/cancel", 404) in by_token
    assert ("billing-ops", f"/api/runs/{reports_run}/pause", 404) in by_token
    assert ("billing-ops", f"/api/runs/{billing_run}/cancel", 200) in by_token
    assert len(by_token) == len(http.audits)


def test_the_status_shows_only_the_tokens_namespaces() -> None:
    status = DaemonStatus(
        state="ready",
        instance="i",
        uptime_s=1.0,
        leading=True,
        jobs=4,
        armed_deadlines=2,
        next_job="reports/daily",
        running=(
            RunningCall(job="billing/a", job_id=1, run=10, running_s=1.0),
            RunningCall(job="reports/b", job_id=2, run=11, running_s=1.0),
            RunningCall(job="#3", job_id=3, run=12, running_s=1.0),
        ),
        held=(HeldResultView(run=9, job="reports/b", outcome="failed", attempts=2),),
        workers=(
            WorkerView(id="tenants", types=("t",), capacity=1, busy=0, draining=False,
                       transport="tls", peer="-", connected_at=datetime.now(UTC),
                       namespaces=("billing", "reports")),
            WorkerView(id="any", types=("t",), capacity=1, busy=0, draining=False,
                       transport="tls", peer="-", connected_at=datetime.now(UTC)),
        ),
    )  # fmt: skip
    billing = TOKENS.named("billing-ops")
    assert billing is not None
    seen = status_for(status, billing)
    # Workers are shown, but not the namespaces beyond the token's.
    assert [w.namespaces for w in seen.workers] == [("billing",), None]
    assert [r.job for r in seen.running] == ["billing/a"]
    assert seen.held == ()
    assert seen.next_job is None
    assert seen.next_deadline is None
    everything = TokenScope(name="admin", digest=hash_token(ADMIN))
    assert status_for(status, everything) is status


async def test_a_scoped_tokens_status_gives_the_next_deadline_of_its_namespaces(
    api: tuple[Api, Any], conn: asyncpg.Connection
) -> None:
    """Another namespace's job was due first: the scoped status said "none armed"
    beside the daemon's count of armed deadlines (a tester's billing token)."""
    http, harness = api
    await define(conn, "soon", namespace="ops", schedule_kind="interval", schedule="1h")
    await define(conn, "later", namespace="billing", schedule_kind="interval", schedule="3h")
    await harness.wait_event("refresh", count=2)
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET next_run_at = now() + CASE namespace"
        " WHEN 'ops' THEN interval '1 hour' ELSE interval '2 hours' END"
    )
    with trio.fail_after(10):
        while harness.daemon.status().next_job != "ops/soon":
            await trio.sleep(0.05)
    everything = (await http.get(ADMIN, "/api/status")).json()["next_deadline"]
    assert everything["job"] == "ops/soon"
    scoped = (await http.get(BILLING_OPS, "/api/status")).json()["next_deadline"]
    assert scoped is not None
    assert scoped["job"] == "billing/later"
    assert scoped["at"] > everything["at"]


def test_tokens_are_found_by_hash_and_misconfigurations_named() -> None:
    assert TOKENS.find(BILLING_OPS) == TOKENS.named("billing-ops")
    assert TOKENS.find(BILLING_OPS + "x") is None
    assert TOKENS.find("") is None
    with pytest.raises(Exception, match=r"admin_tokens\.x\.hash: expected sha256"):
        parse_tokens({"x": {"hash": "plain", "namespaces": ["a"]}}, "admin_tokens", kind="admin")
    with pytest.raises(Exception, match=r"admin_tokens\.x\.access: must be read or operate"):
        parse_tokens(
            {"x": {"hash": hash_token("t" * 20), "namespaces": ["*"], "access": "write"}},
            "admin_tokens",
            kind="admin",
        )
    # An empty list of types was shown as `types *` and refused every type.
    with pytest.raises(
        Exception, match=r'worker_tokens\.x\.types: list at least one job type, or "\*"'
    ):
        parse_tokens(
            {"x": {"hash": hash_token("t" * 20), "namespaces": ["*"], "types": []}},
            "worker_tokens",
            kind="worker",
        )
    with pytest.raises(Exception, match="same hash"):
        TokenSet(
            (
                TokenScope(name="a", digest=hash_token("t" * 20)),
                TokenScope(name="b", digest=hash_token("t" * 20)),
            )
        )


# -- redaction ---------------------------------------------------------------------------

SECRETS = ("hunter2", "sekr3t-b34rer-t0ken", "dsnpa55w0rd", "argsecret123", "paramsecret456")


def leaked(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


async def test_secrets_leave_no_trace_in_the_database_the_log_or_the_api(
    api: tuple[Api, Any], conn: asyncpg.Connection, tmp_path: Path
) -> None:
    http, harness = api
    script = tmp_path / "leaky.sh"
    # The secrets live in the script, not in the job's definition.
    script.write_text(
        "#!/bin/sh\n"
        "echo 'starting with password=hunter2'\n"
        "echo 'curl -H \"Authorization: Bearer sekr3t-b34rer-t0ken\" https://api.example'\n"
        "echo 'connecting to postgresql://app:dsnpa55w0rd@db.example/app' >&2\n"
        "echo 'FATAL: password authentication failed; password=hunter2' >&2\n"
        "exit 3\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    await aio(client.define_job)(
        conn,
        name="leaky",
        namespace="billing",
        schedule=Schedule(kind="manual"),
        target=Target(kind="exec", argv=(str(script),)),
        params={"token": "paramsecret456", "region": "eu"},
    )
    run_id = await aio(client.trigger)(
        conn, "leaky", namespace="billing", args={"api_key": "argsecret123", "n": 1}
    )
    await harness.wait_event("job.run", run=run_id)

    # The database: every column of every row, as text.
    dump = await aio(conn.fetchval)(
        "SELECT (SELECT string_agg(j::text, ' ') FROM coordinator.jobs j) || ' ' || "
        "(SELECT string_agg(r::text, ' ') FROM coordinator.runs r)"
    )
    assert "[redacted]" in dump
    assert leaked(dump) == []
    run = await aio(client.get_run)(conn, run_id)
    assert run.status == "failed"
    assert "password=[redacted]" in json.dumps(run.extra)
    assert run.args == {"api_key": "[redacted]", "n": 1}
    # The log: every event the daemon wrote.
    assert harness.named("job.run", run=run_id)[0]["outcome"] == "failed"
    assert leaked(json.dumps(harness.events, default=str)) == []
    # The API: the run, the job, the job's runs.
    served = [
        (await http.get(BILLING_OPS, f"/api/runs/{run_id}")).text,
        (await http.get(BILLING_OPS, "/api/jobs/billing/leaky")).text,
        (await http.get(BILLING_OPS, "/api/jobs/billing/leaky/runs")).text,
        (await http.get(ADMIN, "/api/status")).text,
    ]
    assert all(leaked(text) == [] for text in served), served
    # The web page: the run's detail (output tails, error, args), the job, the list.
    async with signed_in(http.http, ADMIN) as page:
        shown = [
            (await page.get(f"/runs/{run_id}")).text,
            (await page.get(f"/ui/run/{run_id}")).text,
            (await page.get("/jobs/billing/leaky")).text,
            (await page.get("/")).text,
        ]
    assert "[redacted]" in shown[0]
    assert all(leaked(text) == [] for text in shown)
    body = json.loads(served[0])
    assert "[redacted]" in body["reason"]
    assert len(body["reason"]) <= 300
    # The per-job metrics (#16) name the job and nothing of its output.
    scraped = (await http.get(BILLING_OPS, "/metrics")).text
    assert 'namespace="billing",outcome="failed"' in scraped
    assert leaked(scraped) == []
    # The alert (#16): the email and the webhook carry the redacted error, nothing more.
    with trio.fail_after(20):
        while not (http.smtp.messages and http.hooks.requests):
            await trio.sleep(0.05)
    mail = http.smtp.messages[0]
    assert mail["Subject"].startswith("[coordinator] billing/leaky failed")
    alerted = [str(mail.get_content()), http.hooks.requests[0].body.decode()]
    assert "[redacted]" in alerted[0]
    assert all(leaked(text) == [] for text in alerted), alerted


# -- the web page inherits the scope -------------------------------------------------------


@asynccontextmanager
async def signed_in(http: httpx.AsyncClient, token: str) -> AsyncIterator[httpx.AsyncClient]:
    """A browser-like client of the same server, signed in with ``token``."""
    async with httpx.AsyncClient(base_url=str(http.base_url), timeout=10) as page:
        with trio.fail_after(15):
            form = await page.get("/signin")
            csrf = re.search(r'name="csrf" value="([^"]*)"', form.text)
            assert csrf is not None
            done = await page.post("/signin", data={"token": token, "csrf": csrf.group(1)})
        assert done.status_code == 303, done.text
        yield page


async def test_the_web_page_shows_and_does_only_what_the_token_may(
    api: tuple[Api, Any], conn: asyncpg.Connection, tmp_path: Path
) -> None:
    http, harness = api
    for ns in ("billing", "reports"):
        await define(conn, f"{ns}-job", namespace=ns)
    reports_run = await aio(client.trigger)(conn, "reports-job", namespace="reports")
    await harness.wait_event("job.run", run=reports_run)
    async with signed_in(http.http, BILLING_OPS) as page:
        with trio.fail_after(15):
            jobs = await page.get("/")
            assert jobs.status_code == 200
            assert "billing-job" in jobs.text
            assert 'action="/jobs/billing/billing-job/run"' in jobs.text  # may operate
            assert "reports-job" not in jobs.text
            assert (await page.get("/jobs/reports/reports-job")).status_code == 403
            assert (await page.get(f"/runs/{reports_run}")).status_code == 404
            csrf = re.search(r'name="csrf" value="([^"]*)"', jobs.text)
            assert csrf is not None
            fetch = {"x-requested-with": "fetch"}
            refused = await page.post(
                "/jobs/reports/reports-job/run", data={"csrf": csrf.group(1)}, headers=fetch
            )
            assert refused.status_code == 403  # (the API's status for it)
            assert refused.json()["message"].startswith('permission denied for namespace "reports"')
            ran = await page.post(
                "/jobs/billing/billing-job/run", data={"csrf": csrf.group(1)}, headers=fetch
            )
            assert ran.status_code == 200, ran.text
    # The page's POSTs are audited under the token that signed in, with what the API's
    # audit says of the same action (the job, the run, whether it was created).
    audited = [a for a in http.audits if a["path"] == "/jobs/billing/billing-job/run"]
    assert [(a.get("token"), a["status"]) for a in audited] == [("billing-ops", 200)]
    assert audited[0]["job"] == "billing/billing-job"
    assert audited[0]["created"] is True
    assert isinstance(audited[0]["run"], int)
    # A read-only token signs in, sees its namespace, changes nothing.
    async with signed_in(http.http, REPORTS_READ) as page:
        with trio.fail_after(15):
            seen = await page.get(f"/runs/{reports_run}")
            assert seen.status_code == 200
            # No action is offered that the token may not take (the page showed Run and
            # Pause, then refused them).
            job_page = await page.get("/jobs/reports/reports-job")
            listing = await page.get("/")
            for html in (seen.text, job_page.text, listing.text):
                assert not re.search(r'action="/jobs/reports/reports-job/(run|pause|resume)"', html)
                assert f'action="/runs/{reports_run}/' not in html
            assert "reports-job" in listing.text
            csrf = re.search(r'name="csrf" value="([^"]*)"', seen.text)
            assert csrf is not None
            refused = await page.post(
                "/jobs/reports/reports-job/run",
                data={"csrf": csrf.group(1)},
                headers={"x-requested-with": "fetch"},
            )
            assert "may only read it" in refused.json()["message"]


async def test_the_event_stream_of_a_scoped_token_carries_its_namespaces_only(
    api: tuple[Api, Any], conn: asyncpg.Connection
) -> None:
    http, harness = api
    ids = {}
    for ns in ("billing", "reports"):
        ids[ns] = await define(
            conn, "echo", namespace=ns, target={"kind": "exec", "argv": ["true"]}
        )
    seen: list[str] = []

    async def follow() -> None:
        headers = {"Authorization": f"Bearer {BILLING_OPS}"}
        async with http.http.stream("GET", "/api/events", headers=headers) as events:
            async for line in events.aiter_lines():
                if line.startswith(("data:", "event:")):
                    seen.append(line)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow)
        await trio.sleep(0.3)
        reports = await aio(client.trigger)(conn, "echo", namespace="reports")
        await harness.wait_event("job.run", run=reports)
        # Changes a NOTIFY names by job id only (a tester's scoped stream was told
        # "job_id" of other namespaces' jobs as they were paused and redefined).
        await aio(client.pause)(conn, "echo", namespace="reports")
        other = await define(conn, "other", namespace="reports")
        billing = await aio(client.trigger)(conn, "echo", namespace="billing")
        await harness.wait_event("job.run", run=billing)
        with trio.fail_after(10):
            while not any('"billing/echo"' in line for line in seen):
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert not any("reports/" in line for line in seen), seen
    for job_id in (ids["reports"], other):
        assert not any(f'"job_id":{job_id}' in line for line in seen), seen
    assert not any(f'"run":{reports}' in line for line in seen), seen
    # It is still told that jobs changed (its page re-reads what it may see).
    assert "event: jobs" in seen


async def test_metrics_of_a_scoped_token_name_its_namespaces_jobs_only(
    api: tuple[Api, Any], conn: asyncpg.Connection
) -> None:
    http, harness = api
    for ns in ("billing", "ops"):
        await define(conn, "echo", namespace=ns, target={"kind": "exec", "argv": ["true"]})
        run_id = await aio(client.trigger)(conn, "echo", namespace=ns)
        await harness.wait_event("job.run", run=run_id)
    everything = (await http.get(ADMIN, "/metrics")).text
    assert 'coordinator_job_runs_total{job="echo",namespace="ops"' in everything
    scoped = (await http.get(BILLING_OPS, "/metrics")).text
    assert 'coordinator_job_runs_total{job="echo",namespace="billing"' in scoped
    assert 'namespace="ops"' not in scoped
    assert "coordinator_runs_total" in scoped  # the daemon-wide series stay
