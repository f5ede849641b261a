"""The admin web page and the stats endpoint over HTTP (httpx), against an in-process
daemon and a real PostgreSQL: sign-in, sessions, CSRF, escaping, the views and their
fragments, the live event stream, and ``GET /api/jobs/{ns}/{name}/stats``.

The same page in a real browser is tested in ``tests/acceptance/test_web_browser.py``.
"""

from __future__ import annotations

import json
import re
import secrets
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import trio

from coordinator import buckets, client
from coordinator.admin import Metrics, make_app, present
from coordinator.admin.web import FINDINGS_PAGE, JOBS_PAGE
from coordinator.db import aio
from coordinator.tokens import TokenSet, single

from .conftest import Harness, StartDaemon, define
from .test_admin import serve
from .test_recoverable import (
    BATCH,
    ITEMS,
    SEVENS,
    Scan,
    recoverable,
    run_row,
    run_worker,
    tune,
    wait_run,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    import asyncpg

TOKEN = secrets.token_urlsafe(32)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
XSS = "<script>alert(1)</script>"


class Site:
    """A served app, a browser-like client (cookies kept) and the daemon behind it."""

    def __init__(self, url: str, http: httpx.AsyncClient, harness: Harness) -> None:
        self.url = url
        self.http = http
        self.harness = harness
        self.audits: list[dict[str, Any]] = []

    async def get(self, path: str, **kw: Any) -> httpx.Response:
        with trio.fail_after(15):
            return await self.http.get(path, **kw)

    async def post(self, path: str, **kw: Any) -> httpx.Response:
        with trio.fail_after(15):
            return await self.http.post(path, **kw)

    async def sign_in(self, token: str = TOKEN) -> httpx.Response:
        form = await self.get("/signin")
        assert form.status_code == 200
        csrf = _hidden(form.text, "csrf")
        return await self.post("/signin", data={"token": token, "csrf": csrf})

    async def csrf(self, path: str = "/") -> str:
        return _hidden((await self.get(path)).text, "csrf")


def _hidden(html: str, name: str) -> str:
    found = re.search(rf'name="{name}" value="([^"]*)"', html)
    assert found is not None, html[:2000]
    return found.group(1)


@pytest.fixture
async def site(
    start_daemon: StartDaemon, database: str, nursery: trio.Nursery
) -> AsyncIterator[Site]:
    harness = await start_daemon(refresh_spacing=0.2)
    audits: list[dict[str, Any]] = []
    app = make_app(
        dsn=database,
        token=TOKEN,
        status=harness.daemon.status,
        metrics=Metrics(status=harness.daemon.status),
        audit=audits.append,
        events=harness.daemon.events,
    )
    shutdown = trio.Event()
    url = await serve(nursery, app, shutdown)
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        s = Site(url, http, harness)
        s.audits = audits
        yield s
    shutdown.set()


# -- signing in --------------------------------------------------------------------------------


async def test_pages_redirect_to_the_sign_in_form_and_fragments_are_401(site: Site) -> None:
    for path, location in [
        ("/", "/signin"),
        ("/status", "/signin?next=%2Fstatus"),
        ("/runs/1", "/signin?next=%2Fruns%2F1"),
        ("/jobs/default/x?page=2", "/signin?next=%2Fjobs%2Fdefault%2Fx%3Fpage%3D2"),
        # A job named "a?b": its page's path as sent, escaped once more.
        ("/jobs/default/a%3Fb", "/signin?next=%2Fjobs%2Fdefault%2Fa%253Fb"),
    ]:
        response = await site.get(path)
        assert response.status_code == 303, path
        assert response.headers["location"] == location
    head = await site.http.head("/runs/1")
    assert (head.status_code, head.headers["location"]) == (303, "/signin?next=%2Fruns%2F1")
    for path in ("/ui/status", "/ui/events", "/ui/job-row/1"):
        assert (await site.get(path)).status_code == 401, path
    assert (await site.post("/jobs/default/x/run", data={})).status_code == 401


async def test_signing_in_leads_back_to_the_page_asked_for(site: Site) -> None:
    """A run's link (as an alert carries it) opened while signed out: after the form,
    that run's page, not the front page."""
    asked = await site.get("/runs/7")
    form = await site.get(asked.headers["location"])
    assert _hidden(form.text, "next") == "/runs/7"
    answer = await site.post(
        "/signin", data={"token": TOKEN, "csrf": _hidden(form.text, "csrf"), "next": "/runs/7"}
    )
    assert (answer.status_code, answer.headers["location"]) == (303, "/runs/7")


async def test_sessions_with_named_tokens_end_with_the_process(
    start_daemon: StartDaemon, database: str, nursery: trio.Nursery
) -> None:
    """Keys of the process: another app (as after a restart) refuses the cookie, so a
    sign-out or a changed token cannot outlive a restart."""
    harness = await start_daemon(refresh_spacing=0.2)
    scopes = TokenSet().with_scope(single(TOKEN, name="admin"))

    async def status_page(cookie: str | None) -> httpx.Response:
        app = make_app(
            dsn=database,
            tokens=scopes,
            status=harness.daemon.status,
            metrics=Metrics(status=harness.daemon.status),
            audit=lambda _r: None,
        )
        shutdown = trio.Event()
        url = await serve(nursery, app, shutdown)
        try:
            async with httpx.AsyncClient(base_url=url, timeout=10) as http:
                if cookie is None:
                    answer = await Site(url, http, harness).sign_in()
                    assert answer.status_code == 303
                    return answer
                http.cookies.set("coordinator_session", cookie)
                with trio.fail_after(15):
                    return await http.get("/status")
        finally:
            shutdown.set()

    cookie = (await status_page(None)).cookies["coordinator_session"]
    later = await status_page(cookie)
    assert (later.status_code, later.headers["location"]) == (303, "/signin?next=%2Fstatus")


async def test_sign_in_sets_a_strict_http_only_cookie_and_never_shows_the_token(
    site: Site, conn: asyncpg.Connection
) -> None:
    await define(conn, "visible")
    wrong = await site.sign_in("not-the-token-at-all")
    assert wrong.status_code == 401
    assert "not one this daemon accepts" in wrong.text
    assert "coordinator_session" not in wrong.headers.get("set-cookie", "")

    answer = await site.sign_in()
    assert answer.status_code == 303
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith("coordinator_session=")
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
    assert TOKEN not in cookie
    page = await site.get("/")
    assert page.status_code == 200
    assert "visible" in page.text
    assert TOKEN not in page.text
    headers = page.headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "unsafe-inline" not in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"
    # Bearer tokens still work for the API, and a session cookie does not open the API.
    assert (await site.get("/api/jobs")).status_code == 401
    assert (await site.get("/api/jobs", headers=AUTH)).status_code == 200


async def test_sign_in_needs_the_forms_csrf_token(site: Site) -> None:
    await site.get("/signin")
    refused = await site.post("/signin", data={"token": TOKEN})
    assert refused.status_code == 403
    assert "coordinator_session" not in refused.headers.get("set-cookie", "")


async def test_sign_out_ends_the_session(site: Site) -> None:
    await site.sign_in()
    session = site.http.cookies.get("coordinator_session")
    csrf = await site.csrf()
    out = await site.post("/signout", data={"csrf": csrf})
    assert out.status_code == 303
    # The old cookie no longer works even if a client kept it.
    site.http.cookies.set("coordinator_session", session or "")
    assert (await site.get("/")).status_code == 303


# -- actions -----------------------------------------------------------------------------------


async def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(
    site: Site, conn: asyncpg.Connection
) -> None:
    await define(conn, "guarded")
    await site.sign_in()
    for data in ({}, {"csrf": "0" * 64}):
        refused = await site.post("/jobs/default/guarded/run", data=data)
        assert refused.status_code == 403
        assert "CSRF" in refused.text
    refused = await site.post("/jobs/default/guarded/pause", data={})
    assert refused.status_code == 403
    job = await aio(client.get_job)(conn, "guarded")
    assert job.last_run is None
    assert not job.paused
    assert {a["status"] for a in site.audits if a["path"].startswith("/jobs/")} == {403}


async def test_a_run_queued_again_is_not_shown_with_its_pause_as_an_error(
    site: Site, conn: asyncpg.Connection
) -> None:
    """A paused run queued again keeps "paused by operator" in its row until it ends; the
    page (like the CLI) showed it as the queued run's error."""
    job = await define(conn, "again", target={"kind": "worker", "type": "nobody"})
    run_id = await aio(conn.fetchval)(
        "INSERT INTO coordinator.runs (job_id, trigger, status, error_message, paused_at) "
        "VALUES ($1, 'manual', 'queued', 'paused by operator', now()) RETURNING id",
        job,
    )
    await site.sign_in()
    for path in (f"/runs/{run_id}", "/jobs/default/again"):
        page = (await site.get(path)).text
        assert f"/runs/{run_id}" in page, path
        assert "paused by operator" not in page, path


async def test_run_pause_resume_and_resolve_from_the_page(
    site: Site, conn: asyncpg.Connection
) -> None:
    await define(conn, "button")
    await site.sign_in()
    csrf = await site.csrf()
    # A plain form post (JavaScript off): a redirect back, with a note.
    ran = await site.post("/jobs/default/button/run", data={"csrf": csrf, "next": "/?span=2d"})
    assert ran.status_code == 303
    assert ran.headers["location"].startswith("/?span=2d&note=run+")
    shown = (await site.get(ran.headers["location"])).text
    assert '<p class="note" role="status">run ' in shown
    # Only a note an action of this session answered is shown: not text from a link.
    spoof = "Your token expired: sign in again at evil.example"
    for query in (
        {"note": spoof},
        {"note": spoof, "mark": "0" * 32},
        {"note": spoof, "mark": parse_qs(urlsplit(ran.headers["location"]).query)["mark"][0]},
    ):
        assert 'class="note"' not in (await site.get("/", params=query)).text
    # The page's script posts in the background and gets JSON.
    fetch = {"X-Requested-With": "fetch"}
    paused = await site.post("/jobs/default/button/pause", data={"csrf": csrf}, headers=fetch)
    assert paused.json() == {"ok": True, "message": "default/button paused"}
    assert (await aio(client.get_job)(conn, "button")).paused
    # A second click changes nothing, and says so (as the CLI does).
    again = await site.post("/jobs/default/button/pause", data={"csrf": csrf}, headers=fetch)
    assert again.json() == {"ok": True, "message": "default/button paused (it was already)"}
    resumed = await site.post("/jobs/default/button/resume", data={"csrf": csrf}, headers=fetch)
    assert resumed.json() == {"ok": True, "message": "default/button resumed"}
    assert not (await aio(client.get_job)(conn, "button")).paused
    again = await site.post("/jobs/default/button/resume", data={"csrf": csrf}, headers=fetch)
    assert again.json() == {"ok": True, "message": "default/button resumed (it was not paused)"}
    # Resolving a run that is not unresolved is refused with the reason.
    run = (await aio(client.get_job)(conn, "button")).last_run
    resolve = await site.post(
        f"/runs/{run}/resolve", data={"csrf": csrf, "as": "failed"}, headers=fetch
    )
    assert resolve.status_code == 409
    assert "unresolved" in resolve.json()["message"]
    # Other refusals get the API's status, not 409 for all.
    unknown = await site.post("/jobs/default/nosuch/run", data={"csrf": csrf}, headers=fetch)
    assert (unknown.status_code, unknown.json()["ok"]) == (404, False)
    gone = await site.post("/runs/999999/cancel", data={"csrf": csrf}, headers=fetch)
    assert gone.status_code == 404
    bad = await site.post(f"/runs/{run}/resolve", data={"csrf": csrf, "as": "x"}, headers=fetch)
    assert bad.status_code == 400
    # A run of a paused job waits, and the answer says so, as the CLI's does.
    await aio(client.pause)(conn, "button")
    waits = await site.post("/jobs/default/button/run", data={"csrf": csrf}, headers=fetch)
    assert waits.json()["message"].endswith("queued; it waits while the job is paused")
    await aio(client.resume)(conn, "button")
    # An open redirect is not possible through `next`.
    away = await site.post(
        "/jobs/default/button/run", data={"csrf": csrf, "next": "//evil.example/"}
    )
    assert away.headers["location"].startswith("/?note=")


# -- views ------------------------------------------------------------------------------------


async def test_every_name_argument_output_and_error_is_escaped(
    site: Site, conn: asyncpg.Connection
) -> None:
    job_id = await define(conn, XSS, schedule_kind="interval", schedule="1h")
    run_id = await aio(conn.fetchval)(
        "INSERT INTO coordinator.runs (job_id, trigger, status, args, extra, error_message,"
        " error_cause, finished_at) VALUES ($1, 'manual', 'failed', $2::jsonb, $3::jsonb, $4,"
        " 'handler', now()) RETURNING id",
        job_id,
        json.dumps({"x": XSS}),
        json.dumps({"stdout_tail": XSS, "note": XSS}),
        XSS,
    )
    await site.sign_in()
    pages = [
        "/",
        f"/jobs/default/{XSS.replace('/', '%2F')}",
        f"/runs/{run_id}",
        f"/ui/job-row/{job_id}",
        f"/ui/run/{run_id}",
        f"/ui/run-row/{run_id}",
    ]
    for path in pages:
        page = await site.get(path)
        assert page.status_code == 200, (path, page.text[:500])
        assert XSS not in page.text, path
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text, path


async def test_bidirectional_formatting_in_a_name_or_an_error_is_shown_escaped(
    site: Site, conn: asyncpg.Connection
) -> None:
    """A job named "abc" + U+202E + "evil" was shown as "abclive" (a tester)."""
    spoof = "invoice\u202eexe.pdf"
    job_id = await define(conn, spoof)
    run_id = await aio(conn.fetchval)(
        "INSERT INTO coordinator.runs (job_id, trigger, status, error_message, error_cause,"
        " finished_at) VALUES ($1, 'manual', 'failed', $2, 'handler', now()) RETURNING id",
        job_id,
        f"no such file {spoof}",
    )
    await site.harness.wait_event("refresh", count=2)
    await site.sign_in()
    for path in ("/", f"/jobs/default/{spoof}", f"/runs/{run_id}", f"/ui/job-row/{job_id}"):
        page = await site.get(path)
        assert page.status_code == 200, (path, page.text[:300])
        assert "\u202e" not in page.text, path
        assert "invoice\\u202eexe.pdf" in page.text, path
    # What goes back to the server is not shown text: the way back after an action is
    # the page's path percent-encoded (escaped, it led to a job that does not exist),
    # and a name filter is sent back as typed.
    job_page = (await site.get(f"/jobs/default/{spoof}")).text
    assert 'name="next" value="/jobs/default/invoice%E2%80%AEexe.pdf"' in job_page
    searched = (await site.get("/", params={"q": "invoice\u202e"})).text
    assert 'name="q" value="invoice\u202e"' in searched


async def test_a_runs_page_shows_the_end_of_a_huge_output_and_the_start_of_a_huge_error(
    site: Site, conn: asyncpg.Connection
) -> None:
    """Written by plain SQL, a row may hold megabytes the daemon would have cut: a
    tester's run page was 2.76 MB and took 1.1 s."""
    job_id = await define(conn, "loud")
    run_id = await aio(conn.fetchval)(
        "INSERT INTO coordinator.runs (job_id, trigger, status, extra, error_message,"
        " error_cause, finished_at) VALUES ($1, 'manual', 'failed', $2::jsonb, $3, 'handler',"
        " now()) RETURNING id",
        job_id,
        json.dumps({"stdout_tail": "o" * 1_700_000 + "LAST-LINE"}),
        "FIRST-WORDS" + "e" * 1_000_000,
    )
    await site.sign_in()
    page = (await site.get(f"/runs/{run_id}")).text
    assert len(page) < 100_000
    assert "LAST-LINE" in page
    assert "FIRST-WORDS" in page
    assert "the first 1,683,625 characters are not shown" in page
    assert "996,011 more characters are not shown" in page


async def test_the_jobs_view_says_cadence_state_and_next_run_in_words(
    site: Site, conn: asyncpg.Connection
) -> None:
    await define(conn, "ten", schedule_kind="interval", schedule="10m")
    await define(
        conn, "night", schedule_kind="cron", schedule="30 2 * * *", timezone="Europe/Berlin"
    )
    await define(conn, "thumbs", target={"kind": "worker", "type": "images"})
    await define(conn, "ops", namespace="ops", paused=True)
    await site.harness.wait_event("refresh", count=2)
    await site.sign_in()
    page = (await site.get("/")).text
    assert "every 10 min" in page
    assert "at 02:30 Europe/Berlin" in page
    assert "manual" in page
    assert "waiting for a worker serving images" in page
    assert ">night<" in page
    # Filters: by namespace and by state.
    ops = (await site.get("/?namespace=ops")).text
    assert "ops" in ops
    assert "thumbs" not in ops
    paused = (await site.get("/?state=paused")).text
    assert ">ops<" in paused
    # (Its row is filtered out; the header may still name it as the next run due.)
    assert ">night<" not in paused
    bad = await site.get("/?state=nonsense")
    assert bad.status_code == 400
    assert "state" in bad.text


async def test_the_jobs_view_pages_and_filters_by_name(
    site: Site, conn: asyncpg.Connection
) -> None:
    """A page holds JOBS_PAGE jobs with links to the others and keeps its page and name
    filter when it refreshes itself; a page past the last shows the last."""
    await aio(conn.execute)(
        "SELECT coordinator.define_job(name => format('job-%s', lpad(i::text, 3, '0')),"
        ' schedule_kind => \'manual\', target => \'{"kind": "exec", "argv": ["true"]}\')'
        " FROM generate_series(1, 230) AS i"
    )
    await define(conn, "Nightly-Report", namespace="ops")
    await site.harness.wait_event("refresh", count=2)
    await site.sign_in()

    def names(html: str) -> list[str]:
        return re.findall(r'<td class="name"><a href="[^"]*">([^<]*)</a>', html)

    first = (await site.get("/")).text
    assert names(first) == [f"job-{i:03}" for i in range(1, JOBS_PAGE + 1)]
    assert "Jobs <small" in first
    assert ">231</small>" in first
    assert "1&ndash;100 of 231" in first
    assert "page 1 of 3" in first
    assert "Previous" not in first
    following = re.search(r'href="(/\?[^"]*page=2)" rel="next"', first)
    assert following is not None
    second = (await site.get(following.group(1).replace("&amp;", "&"))).text
    assert names(second) == [f"job-{i:03}" for i in range(101, 201)]
    assert 'rel="prev"' in second
    assert 'rel="next"' in second
    # The last page, and one past it (jobs removed since the link was made).
    for asked in ("3", "99", "9" * 40, "9" * 5000):
        last = (await site.get(f"/?page={asked}")).text
        assert names(last) == [f"job-{i:03}" for i in range(201, 231)] + ["Nightly-Report"]
        assert "201&ndash;231 of 231" in last
        assert 'rel="next"' not in last
    # The live table refreshes the page it shows, not the first.
    source = re.search(r'<tbody data-live="jobs" data-src="([^"]*)"', second)
    assert source is not None
    assert "page=2" in source.group(1)
    fragment = (await site.get(source.group(1).replace("&amp;", "&"))).text
    assert names(fragment) == names(second)
    # A name filter: case-insensitive, on namespace/name, one page, kept by the refresh.
    found = (await site.get("/?q=ops/nightly")).text
    assert names(found) == ["Nightly-Report"]
    assert "1 of 231" in found
    assert "page 1 of" not in found
    assert names((await site.get("/?q=JOB-22")).text) == [f"job-22{i}" for i in range(10)]
    none = (await site.get("/?q=nothing-like-it")).text
    assert "No jobs match these filters." in none
    refresh = re.search(r'data-src="(/ui/jobs-table\?[^"]*)"', found)
    assert refresh is not None
    assert "q=ops%2Fnightly" in refresh.group(1)
    for bad, word in (("page=0", "page"), ("page=two", "page"), ("q=" + "x" * 265, "q")):
        answer = await site.get(f"/?{bad}")
        assert answer.status_code == 400, bad
        assert word in answer.text


async def test_job_history_pages_newest_first(site: Site, conn: asyncpg.Connection) -> None:
    job_id = await define(conn, "many")
    await aio(conn.execute)(
        "INSERT INTO coordinator.runs (job_id, trigger, status, finished_at)"
        " SELECT $1, 'manual', 'succeeded', now() FROM generate_series(1, 30)",
        job_id,
    )
    await site.sign_in()
    first = (await site.get("/jobs/default/many")).text
    ids = [int(i) for i in re.findall(r'<tr data-run="(\d+)"', first)]
    assert len(ids) == 25
    assert ids == sorted(ids, reverse=True)
    older = re.search(r'before=(\d+)">Older runs', first)
    assert older is not None
    second = (await site.get(f"/jobs/default/many?before={older.group(1)}")).text
    rest = [int(i) for i in re.findall(r'<tr data-run="(\d+)"', second)]
    assert len(rest) == 5
    assert max(rest) < min(ids)
    assert "Newest" in second


async def test_status_view_reads_no_sql(
    site: Site, conn: asyncpg.Connection, sql_log: Any, database_name: str
) -> None:
    await site.sign_in()
    sql_log.mark()
    page = await site.get("/status")
    assert page.status_code == 200
    assert "leading" in page.text
    assert (await site.get("/ui/status?part=line")).status_code == 200
    assert sql_log.statements(app="coordinator-admin", db=database_name) == []


# -- live ----------------------------------------------------------------------------------------


async def _events(site: Site, path: str, headers: dict[str, str], want: int) -> list[Any]:
    """The first ``want`` messages of an event stream, read from a plain socket (as a
    browser's EventSource reads it), which is closed afterwards."""
    host, port = site.url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    found: list[Any] = []
    async with stream:
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n{lines}\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some()
        head, _, data = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"content-type: text/event-stream" in head.lower()
        kind = None
        while len(found) < want:
            while b"\n" not in data:
                chunk = await stream.receive_some()
                assert chunk, "the stream ended"
                data += chunk
            line, _, data = data.partition(b"\n")
            text = line.decode().rstrip("\r")
            if text.startswith("event: "):
                kind = text[7:]
            elif text.startswith("data: "):
                found.append((kind, json.loads(text[6:])))
    return found


async def test_the_event_stream_says_what_changed(
    site: Site, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    job_id = await define(conn, "live", target={"kind": "exec", "argv": ["true"]})
    # The definition's own wake and the refresh it asks for are over before we listen.
    harness = site.harness
    await harness.wait_event("wake", payload={"job": job_id})
    woke = next(i for i, e in enumerate(harness.events) if e.get("payload") == {"job": job_id})
    with trio.fail_after(20):
        while not any(e["event"] == "refresh" for e in harness.events[woke:]):
            await trio.sleep(0.01)
    received: list[Any] = []

    async def follow() -> None:
        received.extend(await _events(site, "/api/events", AUTH, 3))

    with trio.fail_after(20):
        nursery.start_soon(follow)
        bus = site.harness.daemon.events
        while not bus._streams:
            await trio.sleep(0.01)
        run_id = await aio(client.trigger)(conn, "live")
        while len(received) < 3:
            await trio.sleep(0.01)
    assert received[0] == ("run", {"job_id": job_id, "run": run_id, "status": "queued"})
    assert received[1][0] == "run"
    assert received[1][1]["status"] == "running"
    assert received[2][1]["status"] == "succeeded"
    # The stream is closed once the client went.
    with trio.fail_after(5):
        while bus._streams:
            await trio.sleep(0.01)


async def test_event_stream_needs_a_session_or_a_token(site: Site) -> None:
    assert (await site.get("/api/events")).status_code == 401
    assert (await site.get("/ui/events")).status_code == 401


# -- stats ------------------------------------------------------------------------------------


async def _runs_at(
    conn: asyncpg.Connection, job_id: int, moments: list[datetime], status: str
) -> None:
    await aio(conn.executemany)(
        "INSERT INTO coordinator.runs (job_id, trigger, status, created_at, finished_at)"
        " VALUES ($1, 'schedule', $2, $3, $3)",
        [(job_id, status, moment) for moment in moments],
    )


async def test_stats_count_runs_per_outcome_per_bucket(
    site: Site, conn: asyncpg.Connection
) -> None:
    job_id = await define(conn, "reports/daily", schedule_kind="interval", schedule="1h")
    now = datetime.now(UTC)
    hourly = [now - timedelta(hours=h, minutes=5) for h in range(48)]
    await _runs_at(conn, job_id, hourly[::2], "succeeded")
    await _runs_at(conn, job_id, hourly[1::2], "failed")
    await _runs_at(conn, job_id, [now - timedelta(days=400)], "failed")  # outside the span
    since = (now - timedelta(days=2)).isoformat()
    response = await site.get(
        "/api/jobs/default/reports%2Fdaily/stats", params={"since": since}, headers=AUTH
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["unit"] == "hour"
    assert body["step"] == 2
    assert 24 <= len(body["buckets"]) <= 25
    assert (
        body["totals"] == {"succeeded": 24, "failed": 24} or sum(body["totals"].values()) == 47
    )  # the oldest run may fall just before `since`
    expected = buckets.choose(datetime.fromisoformat(since), datetime.fromisoformat(body["until"]))
    assert [b["start"] for b in body["buckets"]] == [s.isoformat() for s, _ in expected.spans()]
    for bucket in body["buckets"]:
        for status, n in bucket["counts"].items():
            assert status in ("succeeded", "failed")
            assert n >= 1

    half_year = await site.get(
        "/api/jobs/default/reports%2Fdaily/stats", params={"since": "183d"}, headers=AUTH
    )
    assert half_year.json()["unit"] == "week"
    assert 8 <= len(half_year.json()["buckets"]) <= 30
    assert sum(half_year.json()["totals"].values()) == 48


@pytest.mark.parametrize(
    ("since", "word"),
    [
        ("yesterday", "ISO 8601"),
        ("2026-01-01T00:00:00", "offset"),
        ("2100-01-01T00:00:00Z", "earlier"),
    ],
)
async def test_stats_refuse_a_bad_since_in_one_line(
    site: Site, conn: asyncpg.Connection, since: str, word: str
) -> None:
    await define(conn, "s")
    response = await site.get("/api/jobs/default/s/stats", params={"since": since}, headers=AUTH)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_input"
    assert word in response.json()["message"]
    missing = await site.get("/api/jobs/default/nope/stats", headers=AUTH)
    assert missing.status_code == 404


# -- recoverable runs, findings and attempts (issues 12 and 13 on the page) ---------------------

FETCH = {"X-Requested-With": "fetch"}


def _forms(html: str) -> set[str]:
    """The actions of the page's POST forms."""
    return set(re.findall(r'<form method="post" action="([^"]+)"', html))


async def _row(site: Site, job_id: int) -> str:
    page = await site.get(f"/ui/job-row/{job_id}")
    assert page.status_code == 200, page.text[:500]
    return page.text


async def test_pause_and_resume_a_recoverable_run_from_the_page(
    site: Site, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    harness = site.harness
    job_id = await recoverable(conn)
    tune(harness, checkpoint_interval=0.1)
    scan = Scan(hold_after=3)
    await run_worker(nursery, scan.worker(), harness)
    await site.sign_in()
    csrf = await site.csrf()
    started = await site.post("/jobs/default/scan/run", data={"csrf": csrf}, headers=FETCH)
    run_id = started.json()["run"]
    await wait_run(conn, run_id, lambda r: r["cursor"] == 3 * BATCH)

    running = (await site.get(f"/runs/{run_id}")).text
    assert f"/runs/{run_id}/pause" in _forms(running)
    assert f"/runs/{run_id}/resume" not in _forms(running)
    assert 'class="recovery"' in running
    assert '<pre class="cursor">30</pre>' in running
    assert '<dd class="counted">30</dd>' in running
    assert 'class="findings"' in running  # checkpoints carried findings

    # Without the CSRF token nothing happens.
    refused = await site.post(f"/runs/{run_id}/pause", data={})
    assert refused.status_code == 403
    assert (await run_row(conn, run_id))["status"] == "running"

    # Pause as a plain form post (JavaScript off): back to the run, with a note.
    paused = await site.post(
        f"/runs/{run_id}/pause", data={"csrf": csrf, "next": f"/runs/{run_id}"}
    )
    assert paused.status_code == 303
    assert paused.headers["location"].startswith(f"/runs/{run_id}?note=run+{run_id}+pausing")
    pausing = (await site.get(paused.headers["location"])).text
    assert "cancel_requested" in pausing
    assert "pausing" in pausing
    assert f"run {run_id}</a> pausing" in await _row(site, job_id)

    scan.gate.set()  # the handler sees the request at its next batch and pauses
    row = await wait_run(conn, run_id, lambda r: r["status"] == "paused")
    cursor = row["cursor"]
    assert 3 * BATCH <= cursor < ITEMS
    detail = (await site.get(f"/runs/{run_id}")).text
    assert f"/runs/{run_id}/resume" in _forms(detail)
    assert f"/runs/{run_id}/pause" not in _forms(detail)
    assert f"/runs/{run_id}/cancel" in _forms(detail)  # a paused run may be ended too
    assert f'<pre class="cursor">{cursor}</pre>' in detail
    assert f'<dd class="counted">{cursor}</dd>' in detail
    assert "paused by operator" in detail
    assert 'class="error-box"' not in detail  # a pause is not an error

    # The jobs and job views say it is paused, since when, and offer Resume.
    jobs_row = await _row(site, job_id)
    assert re.search(
        rf"run {run_id}</a> paused at <time[^>]*>(\d{{4}}-\d\d-\d\d )?\d\d:\d\d UTC<", jobs_row
    ), jobs_row
    assert f"/runs/{run_id}/resume" in _forms(jobs_row)
    job_view = (await site.get("/jobs/default/scan")).text
    assert "Recoverable" in job_view
    assert f"/runs/{run_id}/resume" in _forms(job_view)

    # Resume (the page's script posts in the background): the same run, from its cursor.
    resumed = await site.post(f"/runs/{run_id}/resume", data={"csrf": csrf}, headers=FETCH)
    assert resumed.json() == {
        "ok": True,
        "message": f"run {run_id} resumed: queued again at its cursor",
        "run": run_id,
    }
    await wait_run(conn, run_id, lambda r: r["status"] == "succeeded")
    assert scan.starts[-1] == (run_id, cursor, cursor)
    # A Resume from a page that is out of date starts nothing.
    again = await site.post(f"/runs/{run_id}/resume", data={"csrf": csrf}, headers=FETCH)
    assert again.status_code == 409
    assert "succeeded, not paused" in again.json()["message"]
    assert (
        await aio(conn.fetchval)("SELECT count(*) FROM coordinator.runs WHERE job_id = $1", job_id)
        == 1
    )

    done = (await site.get(f"/runs/{run_id}")).text
    assert '<dd class="resumes">1</dd>' in done
    assert f'<dd class="counted">{ITEMS}</dd>' in done
    shown = [int(i) for i in re.findall(r'<tr data-finding="(\d+)"', done)]
    assert len(shown) == min(SEVENS, FINDINGS_PAGE)
    assert shown == sorted(shown, reverse=True)  # newest first
    assert f"warning <small>{SEVENS}</small>" in done


async def _paused_run(
    conn: asyncpg.Connection, job_id: int, cursor: Any, findings: list[tuple[str, str, str, Any]]
) -> int:
    """A paused run with ``cursor`` and ``findings`` (kind, resource, severity, detail),
    written as the daemon would have written them."""
    counts: dict[str, int] = {}
    for _kind, _resource, severity, _detail in findings:
        counts[severity] = counts.get(severity, 0) + 1
    run_id: int = await aio(conn.fetchval)(
        "INSERT INTO coordinator.runs (job_id, trigger, status, cursor, count, started_at,"
        " paused_at, last_progress_at, error_message, finding_counts, resumes)"
        " VALUES ($1, 'manual', 'paused', $2::jsonb, 7, now(), now(), now(),"
        " 'paused by operator', $3::jsonb, 2) RETURNING id",
        job_id,
        json.dumps(cursor),
        json.dumps(counts),
    )
    await aio(conn.executemany)(
        "INSERT INTO coordinator.findings (run_id, kind, resource_id, severity, detail)"
        " VALUES ($1, $2, $3, $4, $5::jsonb)",
        [(run_id, k, r, s, json.dumps(d)) for k, r, s, d in findings],
    )
    return run_id


async def test_findings_page_newest_first_filter_by_severity_and_escape_everything(
    site: Site, conn: asyncpg.Connection
) -> None:
    job_id = await recoverable(conn, XSS)
    severities = ("info", "warning", "error", "data_loss")
    findings = [
        (f"kind{i}" if i else XSS, f"res-{i}" if i else XSS, severities[i % 4], {"i": i, "x": XSS})
        for i in range(60)
    ]
    cursor = {"after": XSS, "pad": "y" * 5000}  # bigger than the page shows
    run_id = await _paused_run(conn, job_id, cursor, findings)
    await site.sign_in()

    page = (await site.get(f"/runs/{run_id}")).text
    assert XSS not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    # The cursor is bounded: its start, its size, and a word that the rest is not shown.
    size = len(json.dumps(cursor, separators=(",", ":")).encode())
    assert f"{size} bytes, the first {present.CURSOR_SHOWN} characters shown" in page
    assert "y" * 5000 not in page
    assert '<dd class="resumes">2</dd>' in page
    first = [int(i) for i in re.findall(r'<tr data-finding="(\d+)"', page)]
    assert len(first) == FINDINGS_PAGE
    assert first == sorted(first, reverse=True)
    older = re.search(r'findings_before=(\d+)#findings">Older findings', page)
    assert older is not None
    rest: list[int] = []
    before: str | None = older.group(1)
    while before is not None:
        more = (await site.get(f"/runs/{run_id}?findings_before={before}")).text
        rest += [int(i) for i in re.findall(r'<tr data-finding="(\d+)"', more)]
        found = re.search(r'findings_before=(\d+)#findings">Older findings', more)
        before = found.group(1) if found else None
    assert len(first) + len(rest) == 60
    assert max(rest) < min(first)

    # By severity: only those, each counted in the filter.
    losses = (await site.get(f"/runs/{run_id}?severity=data_loss")).text
    assert "data loss <small>15</small>" in losses
    assert losses.count('<span class="sev sev-data_loss">') == 15
    assert '<span class="sev sev-info">' not in losses
    # The live fragment keeps the view's filter.
    assert f'data-src="/ui/run/{run_id}?severity=data_loss"' in losses
    fragment = (await site.get(f"/ui/run/{run_id}?severity=data_loss")).text
    assert fragment.count('<span class="sev sev-data_loss">') == 15
    assert XSS not in fragment
    bad = await site.get(f"/runs/{run_id}?severity=fatal")
    assert bad.status_code == 400
    assert "severity" in bad.text

    # The jobs view: the paused run, since when, and Resume; all escaped.
    jobs = (await site.get("/")).text
    assert XSS not in jobs
    assert f"/runs/{run_id}/resume" in _forms(jobs)
    only = (await site.get("/?state=run-paused")).text
    assert f'data-job="{job_id}"' in only


async def test_an_attempt_chain_a_waiting_retry_and_the_policies(
    site: Site, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.txt"
    flaky = await define(
        conn,
        "flaky",
        target={
            "kind": "exec",
            "argv": ["sh", "-c", f'echo x >> {calls}; [ "$COORDINATOR_ATTEMPT" -ge 3 ]'],
        },
        retries=4,
        retry_backoff=timedelta(milliseconds=100),
        misfire="skip",
        misfire_grace=timedelta(minutes=5),
    )
    patient = await define(
        conn,
        "patient",
        target={"kind": "exec", "argv": ["false"]},
        retries=3,
        retry_backoff=timedelta(hours=1),
        alert=False,
        keep_last=30,
        retention=timedelta(days=90),
    )
    harness = site.harness
    await site.sign_in()
    first = await aio(client.trigger)(conn, "flaky")
    waits = await aio(client.trigger)(conn, "patient")
    await harness.wait_event("job.run", job_id=flaky, outcome="succeeded", timeout=30)
    retry = (await harness.wait_event("job.run", run=waits))[0]["retry"]

    chain = await aio(client.run_chain)(conn, first)
    assert [r.attempt for r in chain] == [1, 2, 3]
    last = chain[-1].id
    detail = (await site.get(f"/runs/{last}")).text
    rows = re.findall(r'<tr class="attempt"(?: aria-current="true")?>(.*?)</tr>', detail, re.S)
    assert len(rows) == 3
    for attempt, (row, run) in enumerate(zip(rows, chain, strict=True), start=1):
        assert f"<td>{attempt}</td>" in row
        assert run.status in row
        if run.id == last:
            assert f"<strong>run {run.id}</strong>" in row  # this one, not a link
        else:
            assert f'<a href="/runs/{run.id}">run {run.id}</a>' in row
            assert '<span class="pill cat">unknown</span>' in row
    assert f'data-chain="{first} {chain[1].id} {last} "' in detail
    # The first attempt's detail lists the same chain, and who retried it.
    head = (await site.get(f"/runs/{first}")).text
    assert len(re.findall(r'<tr class="attempt"', head)) == 3
    assert f'Retried by</dt><dd><a href="/runs/{chain[1].id}">' in head
    history = (await site.get("/jobs/default/flaky")).text
    assert f'attempt 3, retries <a href="/runs/{chain[1].id}">run {chain[1].id}</a>' in history
    assert "4 retries, after 100 ms doubling to at most 1 h" in history
    assert "skip if more than 5 min late" in history
    assert '<dt>Alerts</dt><dd class="policy">on</dd>' in history
    assert "the defaults (the retention setting)" in history
    patient_view = (await site.get("/jobs/default/patient")).text
    assert "run once, however late" in patient_view
    assert "off: no alert is ever sent for it" in patient_view  # #16's opt-out
    assert "the newest 30 runs, none older than 90 days" in patient_view

    # A waiting retry: the jobs row and the job view say which and when.
    row = await _row(site, patient)
    assert re.search(rf'<a href="/runs/{retry}">retry 1 of 3</a> due <time[^>]*>in \d+ min', row)
    view = (await site.get("/jobs/default/patient")).text
    assert "retry 1 of 3</a> due" in view
    waiting = (await site.get(f"/runs/{retry}")).text
    assert "queued" in waiting
    assert f"/runs/{retry}/cancel" in _forms(waiting)
    assert len(re.findall(r'<tr class="attempt"', waiting)) == 2
    assert (await site.get("/?state=retrying")).text.count("<tr data-job=") == 1
