"""The admin web page: jobs, run history, a run's detail, the daemon's status, live.

Server-rendered (Jinja2 through Starlette, autoescaped), one small hand-written script
(``static/app.js``) for the live parts, no build chain. With JavaScript off every view
reads and every button works (a form POST, then a redirect back); with it on, buttons
post in the background and the page follows the daemon's events
(:mod:`coordinator.admin.live`), fetching only the fragment an event says changed
(``/ui/...``: a job's row, a run's row, the status panel). An open page that sees no
event sends nothing, and the server no SQL.

Authentication (checked by the guard in :mod:`coordinator.admin.http`): a sign-in form
takes an admin token and sets a session cookie (:mod:`coordinator.admin.session`) that
names the token; every POST carries the session's CSRF token; responses carry a strict
Content-Security-Policy (scripts and styles from ``/static`` only, no inline code).
What the page shows and does is what the token may (:mod:`coordinator.admin.access`,
which the API asks too): its namespaces' jobs and runs, the status's running calls of
those namespaces, their live events; actions need ``operate``.

Cost: each view is one short connection and one to three statements
(:mod:`coordinator.client`): the jobs view reads the jobs and their sparklines' counts
(one aggregate for all of them); a run's detail reads the run, and its attempt chain
only when it was retried or is a retry, and a page of its findings only when it has
some; the status view and the event stream read no SQL.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qsl, quote, urlencode

import attrs
from asyncpg import Connection
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from .. import buckets, client
from ..clock import WallClock
from ..db import aio
from ..errors import (
    Conflict,
    CoordinatorError,
    DatabaseUnavailable,
    InvalidInput,
    JobNotFound,
    PermissionDenied,
    RunNotFound,
)
from ..events import EventBus
from ..model import Target
from ..status import DaemonStatus
from ..text import unbidi
from ..tokens import TokenSet
from . import access, present
from .live import EventSourceResponse
from .paths import job_key
from .session import PRESESSION_COOKIE, SESSION_COOKIE, Sessions

if TYPE_CHECKING:
    from datetime import datetime

    from starlette.requests import Request

__all__ = ["HERE", "SESSION_KEY", "Web"]

HERE: Final = Path(__file__).parent
#: Where the guard puts the signed-in session's nonce in the request scope.
SESSION_KEY: Final = "coordinator.session"
#: Runs per page of a job's history.
HISTORY_PAGE: Final = 25
#: Largest form body read (a CSRF token and a word or two).
MAX_FORM: Final = 4096
#: Findings per page of a run's detail.
FINDINGS_PAGE: Final = 25
#: Jobs per page of the jobs view (all of them on one page was 1.5 MB of HTML at 456
#: jobs, most of it sparklines, each one a statistics read).
JOBS_PAGE: Final = 100
#: Longest name filter taken: a namespace, ``/`` and a name (63 + 1 + 200).
MAX_NAME_FILTER: Final = 264

#: The sections of a run's detail, in order (templates/run_*.html). A new kind of
#: information about a run is one template and one name here.
RUN_SECTIONS: Final = (
    "run_summary.html",
    "run_attempts.html",
    "run_progress.html",
    "run_recovery.html",
    "run_error.html",
    "run_findings.html",
    "run_output.html",
    "run_timing.html",
    "run_extra.html",
)
#: Keys of a run's ``extra`` shown by a section of their own, not in "Reported".
SHOWN_ELSEWHERE: Final = frozenset({"stdout_tail", "stderr_tail", "progress", "log", "log_dropped"})

_RESOLVE_WORDS: Final = {"failed": "failed", "succeeded": "succeeded", "retry": "retried"}


def job_path(namespace: str, name: str, action: str = "") -> str:
    """``/jobs/<ns>/<name>[/action]`` with both parts percent-encoded (``/`` too, and a
    name of dots only: a browser resolves a ``..`` segment before it asks)."""
    tail = f"/{action}" if action else ""
    return f"/jobs/{quote(namespace, safe='')}/{_segment(name)}{tail}"


def _segment(text: str) -> str:
    """``text`` as one path segment: percent-encoded, and ``.``/``..`` as ``%2E``s."""
    return "%2E" * len(text) if text in (".", "..") else quote(text, safe="")


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
        # Every text shown has its bidirectional formatting characters escaped (a job
        # named "abc" + U+202E + "evil" was shown as "abclive"); markup made here is left.
        finalize=_unbidi,
    )
    env.globals.update(
        cadence=present.cadence,
        absolute=present.absolute,
        iso=present.iso,
        took=present.took,
        sparkline=present.sparkline,
        state_class=present.state_class,
        job_state=present.job_state,
        next_run=present.next_run,
        job_path=job_path,
        duration_words=present.duration_words,
        retry_policy=present.retry_policy,
        misfire_policy=present.misfire_policy,
        history_kept=present.history_kept,
        retry_of_total=present.retry_of_total,
        json_text=present.json_text,
        output_text=present.output_text,
        severity_word=present.severity_word,
        severities=present.SEVERITY_ORDER,
        cursor_shown=present.CURSOR_SHOWN,
        detail_shown=present.DETAIL_SHOWN,
        spans=present.SPANS,
        state_filters=present.STATE_FILTERS,
        pretty=_pretty,
        describe_target=_describe_target,
        progress_of=_progress_of,
        extra_rest=_extra_rest,
        seconds=lambda value: timedelta(seconds=value),
        run_sections=RUN_SECTIONS,
    )
    return env


def _unbidi(value: Any) -> Any:
    if isinstance(value, str) and not isinstance(value, Markup):
        return unbidi(value)
    return value


def _describe_target(target: dict[str, Any]) -> str:
    try:
        return Target.from_json(target).describe()
    except ValueError:
        return json.dumps(target)


def _progress_of(run: client.RunView) -> dict[str, Any]:
    """The run's latest progress snapshot: saved while it runs, in ``extra`` after."""
    for value in (run.progress, (run.extra or {}).get("progress")):
        if isinstance(value, dict) and value:
            return value
    return {}


def _extra_rest(extra: Any) -> dict[str, Any]:
    if not isinstance(extra, dict):
        return {} if extra is None else {"value": extra}
    return {k: v for k, v in extra.items() if k not in SHOWN_ELSEWHERE}


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@attrs.define(eq=False)
class Web:
    """The page's handlers (see :func:`coordinator.admin.http.make_app` for wiring)."""

    #: The admin tokens one may sign in with.
    tokens: TokenSet
    status_of: Callable[..., DaemonStatus]
    #: One short database connection per request (shared limiter with the API).
    db: Callable[[], AbstractAsyncContextManager[Connection]]
    clock: WallClock
    #: Signs sessions (keys from the single admin token, else the process's own).
    sessions: Sessions = attrs.field(factory=Sessions.random)
    bus: EventBus | None = None
    templates: Jinja2Templates = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.templates = Jinja2Templates(env=_environment())

    def routes(self) -> list[Route | Mount]:
        return [
            Route("/", self.jobs_page, methods=["GET"]),
            Route("/jobs/{ns}/{name}", self.job_page, methods=["GET"]),
            Route("/runs/{id}", self.run_page, methods=["GET"]),
            Route("/status", self.status_page, methods=["GET"]),
            Route("/signin", self.signin_form, methods=["GET"]),
            Route("/signin", self.signin, methods=["POST"]),
            Route("/signout", self.signout, methods=["POST"]),
            Route("/jobs/{ns}/{name}/run", self.run_job, methods=["POST"]),
            Route("/jobs/{ns}/{name}/pause", self.pause_job, methods=["POST"]),
            Route("/jobs/{ns}/{name}/resume", self.resume_job, methods=["POST"]),
            Route("/runs/{id}/resolve", self.resolve_run, methods=["POST"]),
            Route("/runs/{id}/cancel", self.cancel_run, methods=["POST"]),
            Route("/runs/{id}/pause", self.pause_run, methods=["POST"]),
            Route("/runs/{id}/resume", self.resume_run, methods=["POST"]),
            Route("/ui/events", self.events, methods=["GET"]),
            Route("/ui/jobs-table", self.jobs_table, methods=["GET"]),
            Route("/ui/job-row/{job_id}", self.job_row, methods=["GET"]),
            Route("/ui/job-head/{job_id}", self.job_head, methods=["GET"]),
            Route("/ui/run-row/{id}", self.run_row, methods=["GET"]),
            Route("/ui/run/{id}", self.run_detail, methods=["GET"]),
            Route("/ui/status", self.status_panel, methods=["GET"]),
            Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
        ]

    # -- rendering ----------------------------------------------------------------------

    def _now(self) -> datetime:
        return self.clock.now()

    def _render(
        self, request: Request, name: str, status_code: int = 200, **context: Any
    ) -> Response:
        now = self._now()
        nonce = request.scope.get(SESSION_KEY)
        status = context.setdefault("status", access.status_seen(self.status_of, request))
        fragment = request.url.path.startswith("/ui/")
        response = self.templates.TemplateResponse(
            request,
            name,
            {
                "now": now,
                "rel": lambda moment: present.relative(moment, now),
                "short": lambda moment: present.short_time(moment, now),
                "csrf": self.sessions.csrf(nonce) if nonce else "",
                "signed_in": nonce is not None,
                # Actions are offered only where the token may take them (a read-only
                # token's page showed Run and Pause, then answered "permission denied").
                "may_operate": lambda namespace: access.token_of(request).allows(
                    namespace, operate=True
                ),
                "here": None if fragment else _here(request),
                "note": None if fragment else self._note(request, nonce),
                "uptime": timedelta(seconds=round(status.uptime_s)),
                **context,
            },
            status_code=status_code,
        )
        response.headers["Cache-Control"] = "no-store"
        return response

    def _note(self, request: Request, nonce: str | None) -> str | None:
        """The note an action of this session answered (see :func:`_answer`), if the
        address carries one with its mark; any other text in ``note`` is not shown."""
        note, mark = request.query_params.get("note"), request.query_params.get("mark")
        return note if self.sessions.note_ok(nonce, note, mark) else None

    @staticmethod
    def _span(request: Request) -> tuple[str, timedelta]:
        return present.span(request.query_params.get("span"))

    def _buckets(self, request: Request) -> tuple[str, buckets.Buckets]:
        key, length = self._span(request)
        now = self._now()
        return key, buckets.choose(now - length, now)

    # -- views --------------------------------------------------------------------------

    async def _jobs_context(self, request: Request) -> dict[str, Any]:
        namespace = request.query_params.get("namespace") or ""
        state = request.query_params.get("state") or ""
        if state not in {key for key, _ in present.STATE_FILTERS}:
            raise InvalidInput("state", "not one of the offered filters")
        name = (request.query_params.get("q") or "").strip()
        if len(name) > MAX_NAME_FILTER:
            raise InvalidInput("q", f"longer than {MAX_NAME_FILTER} characters")
        page = _page(request)
        span_key, chosen = self._buckets(request)
        status = access.status_seen(self.status_of, request)
        wanted = name.casefold()
        async with self.db() as conn:
            every = await aio(client.list_jobs)(conn, namespaces=access.namespaces(request))
            matching = [
                job
                for job in every
                if (not namespace or job.namespace == namespace)
                and (not wanted or wanted in f"{job.namespace}/{job.name}".casefold())
                and present.matches(job, state, status)
            ]
            # A page past the last (jobs removed since the link was made) shows the last.
            pages = max(1, -(-len(matching) // JOBS_PAGE))
            page = min(page, pages)
            jobs = matching[(page - 1) * JOBS_PAGE : page * JOBS_PAGE]
            stats = await aio(client.jobs_stats)(conn, jobs, chosen)
        filters = {"namespace": namespace, "state": state, "q": name, "span": span_key}
        return {
            "jobs": jobs,
            "stats": stats,
            "namespaces": sorted({job.namespace for job in every}),
            "namespace": namespace,
            "state": state,
            "q": name,
            "span": span_key,
            "query": urlencode(filters),
            "page_query": urlencode({**filters, "page": page}),
            "page": page,
            "pages": pages,
            "first": (page - 1) * JOBS_PAGE + 1,
            "matched": len(matching),
            "total": len(every),
            "status": status,
        }

    async def jobs_page(self, request: Request) -> Response:
        return self._render(request, "jobs.html", **await self._jobs_context(request))

    async def jobs_table(self, request: Request) -> Response:
        return self._render(request, "jobs_table.html", **await self._jobs_context(request))

    async def job_row(self, request: Request) -> Response:
        job_id = _int_param(request, "job_id")
        state = request.query_params.get("state") or ""
        span_key, chosen = self._buckets(request)
        status = access.status_seen(self.status_of, request)
        async with self.db() as conn:
            job = _visible(request, await aio(client.get_job_by_id)(conn, job_id))
            if not present.matches(job, state, status):
                return Response(status_code=204)
            stats = await aio(client.jobs_stats)(conn, [job], chosen)
        query = urlencode({"namespace": "", "state": state, "span": span_key})
        return self._render(
            request, "job_row.html", job=job, stats=stats, query=query, span=span_key
        )

    async def _job_context(self, request: Request, job: client.JobView) -> dict[str, Any]:
        span_key, chosen = self._buckets(request)
        async with self.db() as conn:
            stats = (await aio(client.jobs_stats)(conn, [job], chosen))[job.id]
        return {"job": job, "stats": stats, "span": span_key}

    async def job_page(self, request: Request) -> Response:
        namespace, name = job_key(request)
        access.require(request, namespace)
        before = _optional_int(request, "before")
        span_key, chosen = self._buckets(request)
        async with self.db() as conn:
            job = await aio(client.get_job)(conn, name, namespace=namespace)
            stats = (await aio(client.jobs_stats)(conn, [job], chosen))[job.id]
            runs = await aio(client.list_runs)(  # (its own: not a removed namesake's)
                conn, job_id=job.id, limit=HISTORY_PAGE + 1, before=before
            )
        more = len(runs) > HISTORY_PAGE
        runs = runs[:HISTORY_PAGE]
        return self._render(
            request,
            "job.html",
            job=job,
            stats=stats,
            span=span_key,
            runs=runs,
            before=before,
            older=runs[-1].id if more and runs else None,
        )

    async def job_head(self, request: Request) -> Response:
        job_id = _int_param(request, "job_id")
        async with self.db() as conn:
            job = _visible(request, await aio(client.get_job_by_id)(conn, job_id))
        return self._render(request, "job_head.html", **await self._job_context(request, job))

    async def _run_context(self, request: Request) -> dict[str, Any]:
        """A run, its attempts (only when it has others: a retry, or retried) and a page
        of its findings (only when it has some), newest first, of one severity if asked."""
        run_id = _int_param(request, "id")
        severity = request.query_params.get("severity") or None
        if severity is not None and severity not in present.SEVERITY_ORDER:
            raise InvalidInput("severity", f"must be one of {', '.join(present.SEVERITY_ORDER)}")
        before = _optional_int(request, "findings_before")
        findings = None
        async with self.db() as conn:
            run = await aio(client.get_run)(conn, run_id)
            # Before anything else of the run is read: a run out of the token's scope.
            access.check_run(request, run_id, run.namespace, operate=False)
            retried = run.retry_of is not None or run.retried_by is not None
            chain = await aio(client.run_chain)(conn, run_id) if retried else [run]
            if run.finding_counts:
                findings = await aio(client.list_findings)(
                    conn,
                    run_id,
                    limit=FINDINGS_PAGE,
                    severity=severity,
                    newest_first=True,
                    before=before,
                )
        view = {"severity": severity or "", "findings_before": before or ""}
        return {
            "run": run,
            "chain": chain,
            "findings": findings,
            "severity": severity,
            "findings_before": before,
            "view_query": urlencode({k: v for k, v in view.items() if v}),
        }

    async def run_page(self, request: Request) -> Response:
        return self._render(request, "run.html", **await self._run_context(request))

    async def run_detail(self, request: Request) -> Response:
        return self._render(request, "run_detail.html", **await self._run_context(request))

    async def run_row(self, request: Request) -> Response:
        run_id = _int_param(request, "id")
        async with self.db() as conn:
            run = await aio(client.get_run)(conn, run_id)
        access.check_run(request, run_id, run.namespace, operate=False)
        return self._render(request, "run_row.html", run=run)

    async def status_page(self, request: Request) -> Response:
        return self._render(request, "status.html")

    async def status_panel(self, request: Request) -> Response:
        part = request.query_params.get("part") or "panel"
        if part not in ("panel", "line"):
            raise InvalidInput("part", "must be panel or line")
        return self._render(request, f"status_{part}.html")

    async def events(self, request: Request) -> Response:
        if self.bus is None:
            return PlainTextResponse("no event stream here", status_code=404)
        token = access.token_of(request)
        return EventSourceResponse(
            self.bus,
            visible=lambda e: access.event_visible(e, token),
            vague=lambda e: access.event_vague(e, token),
        )

    # -- signing in ---------------------------------------------------------------------

    async def signin_form(self, request: Request, *, failed: bool = False) -> Response:
        now = self._now().timestamp()
        value = self.sessions.issue(now, kind="p", lifetime=3600)
        nonce = self.sessions.nonce(value, now, kind="p")
        assert nonce is not None
        response = self._render(
            request,
            "signin.html",
            status_code=401 if failed else 200,
            signin_csrf=self.sessions.csrf(nonce),
            failed=failed,
            next=_local(request.query_params.get("next")),
        )
        _set_cookie(response, request, PRESESSION_COOKIE, value, max_age=3600)
        return response

    async def signin(self, request: Request) -> Response:
        form = await _form(request)
        now = self._now().timestamp()
        pre = self.sessions.nonce(request.cookies.get(PRESESSION_COOKIE), now, kind="p")
        if not self.sessions.csrf_ok(pre, form.get("csrf")):
            return _forbidden("the sign-in form expired or was not ours: load it again")
        token = self.tokens.find(form.get("token", "").strip())
        if token is None:
            return await self.signin_form(request, failed=True)
        response = RedirectResponse(_local(form.get("next")) or "/", status_code=303)
        _set_cookie(response, request, SESSION_COOKIE, self.sessions.issue(now, holder=token.name))
        response.delete_cookie(PRESESSION_COOKIE, path="/")
        return response

    async def signout(self, request: Request) -> Response:
        await self._checked_form(request)
        self.sessions.revoke(request.cookies.get(SESSION_COOKIE), self._now().timestamp())
        response = RedirectResponse("/signin", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    # -- actions ------------------------------------------------------------------------

    async def _checked_form(self, request: Request) -> dict[str, str]:
        form = await _form(request)
        if not self.sessions.csrf_ok(request.scope.get(SESSION_KEY), form.get("csrf")):
            raise _CsrfRefused
        return form

    async def _act(
        self, request: Request, act: Callable[[Connection, dict[str, str]], Any]
    ) -> Response:
        try:
            form = await self._checked_form(request)
        except _CsrfRefused:
            return _forbidden("the form's CSRF token is missing or wrong: reload the page")
        try:
            async with self.db() as conn:
                note, fields = await act(conn, form)
        except CoordinatorError as exc:
            note, fields = str(exc), {"ok": False, "http_status": error_status(exc)[0]}
        # The audit record says what the API's says of the same action (it had only the
        # method, path and status).
        access.note_audit(
            request,
            job=_job_of(request),
            run=fields.get("run"),
            run_status=fields.get("status"),
            created=fields.get("created"),
        )
        return _answer(request, form, note, self._marked, **fields)

    def _marked(self, request: Request, note: str) -> str:
        return self.sessions.note_mark(request.scope.get(SESSION_KEY) or "", note)

    async def run_job(self, request: Request) -> Response:
        namespace, name = job_key(request)

        async def act(conn: Connection, _form: dict[str, str]) -> tuple[str, dict[str, Any]]:
            access.require(request, namespace, operate=True)
            job = await aio(client.get_job)(conn, name, namespace=namespace)
            triggered = await aio(client.trigger_answer)(conn, name, namespace=namespace)
            run_id = triggered.run_id
            if not triggered.changed:  # (another's, even one made a moment ago)
                return f"run {run_id} is already {triggered.status}", {
                    "run": run_id,
                    "created": False,
                }
            if triggered.resumed:  # it was paused: same id, cursor and counter
                return f"run {run_id} resumed", {"run": run_id, "created": False}
            if job.paused:  # (as the CLI says it: the run waits)
                return f"run {run_id} queued; it waits while the job is paused", {
                    "run": run_id,
                    "created": True,
                }
            return f"run {run_id} queued", {"run": run_id, "created": True}

        return await self._act(request, act)

    async def pause_job(self, request: Request) -> Response:
        namespace, name = job_key(request)

        async def act(conn: Connection, _form: dict[str, str]) -> tuple[str, dict[str, Any]]:
            access.require(request, namespace, operate=True)
            job = await aio(client.get_job)(conn, name, namespace=namespace)
            await aio(client.pause)(conn, name, namespace=namespace)
            # (As the CLI says it: a second click changed nothing.)
            return f"{namespace}/{name} paused" + (" (it was already)" if job.paused else ""), {}

        return await self._act(request, act)

    async def resume_job(self, request: Request) -> Response:
        namespace, name = job_key(request)

        async def act(conn: Connection, _form: dict[str, str]) -> tuple[str, dict[str, Any]]:
            access.require(request, namespace, operate=True)
            job = await aio(client.get_job)(conn, name, namespace=namespace)
            await aio(client.resume)(conn, name, namespace=namespace)
            not_paused = "" if job.paused else " (it was not paused)"
            return f"{namespace}/{name} resumed{not_paused}", {}

        return await self._act(request, act)

    async def resolve_run(self, request: Request) -> Response:
        run_id = _int_param(request, "id")

        async def act(conn: Connection, form: dict[str, str]) -> tuple[str, dict[str, Any]]:
            outcome = form.get("as", "")
            if outcome not in client.RESOLUTIONS:
                raise InvalidInput("as", f"must be one of {', '.join(client.RESOLUTIONS)}")
            run = await aio(client.get_run)(conn, run_id)
            access.check_run(request, run_id, run.namespace, operate=True)
            current = await aio(client.resolve)(conn, run_id, outcome)
            retry = f": run {current} queued" if current != run_id else ""
            return f"run {run_id} resolved as {_RESOLVE_WORDS[outcome]}{retry}", {"run": current}

        return await self._act(request, act)

    async def cancel_run(self, request: Request) -> Response:
        run_id = _int_param(request, "id")

        async def act(conn: Connection, _form: dict[str, str]) -> tuple[str, dict[str, Any]]:
            run = await aio(client.get_run)(conn, run_id)
            access.check_run(request, run_id, run.namespace, operate=True)
            await aio(client.cancel_run)(conn, run_id)
            return f"run {run_id} cancelled", {"run": run_id}

        return await self._act(request, act)

    async def pause_run(self, request: Request) -> Response:
        """A running run of a recoverable job is asked to pause (``cancel_requested``,
        then ``paused`` once its worker stops at a cursor); a queued one pauses at once."""
        run_id = _int_param(request, "id")

        async def act(conn: Connection, _form: dict[str, str]) -> tuple[str, dict[str, Any]]:
            run = await aio(client.get_run)(conn, run_id)
            access.check_run(request, run_id, run.namespace, operate=True)
            status = await aio(client.pause_run)(conn, run_id)
            words = "paused" if status == "paused" else "pausing: its worker stops at a cursor"
            return f"run {run_id} {words}", {"run": run_id, "status": status}

        return await self._act(request, act)

    async def resume_run(self, request: Request) -> Response:
        """A paused run is resumed by a trigger of its job (same run, cursor, counter);
        a run that is not paused any more is refused, never replaced by a new one."""
        run_id = _int_param(request, "id")

        async def act(conn: Connection, _form: dict[str, str]) -> tuple[str, dict[str, Any]]:
            run = await aio(client.get_run)(conn, run_id)
            access.check_run(request, run_id, run.namespace, operate=True)
            await aio(client.resume_run)(conn, run_id)
            return f"run {run_id} resumed: queued again at its cursor", {"run": run_id}

        return await self._act(request, act)


# --------------------------------------------------------------------------- helpers


class _CsrfRefused(Exception):
    pass


def _visible(request: Request, job: client.JobView) -> client.JobView:
    """``job``, if the request's token reaches its namespace; else not found (a job id
    says nothing about other namespaces)."""
    if not access.token_of(request).allows(job.namespace):
        raise JobNotFound("?", f"#{job.id}")
    return job


#: A refusal's kind -> its HTTP status and code (the first that matches; else 500).
_REFUSALS: Final[tuple[tuple[type[CoordinatorError], int, str], ...]] = (
    (InvalidInput, 400, "invalid_input"),
    (JobNotFound, 404, "job_not_found"),
    (RunNotFound, 404, "run_not_found"),
    (Conflict, 409, "conflict"),
    (PermissionDenied, 403, "permission_denied"),
    (DatabaseUnavailable, 503, "database_unavailable"),
)


def error_status(exc: CoordinatorError) -> tuple[int, str]:
    """A refusal's HTTP status and code, for the API and the page's actions alike."""
    for kind, status, code in _REFUSALS:
        if isinstance(exc, kind):
            return status, code
    return 500, "database_error"


def _forbidden(message: str) -> Response:
    return PlainTextResponse(message, status_code=403)


def _answer(
    request: Request,
    form: dict[str, str],
    note: str,
    mark: Callable[[Request, str], str],
    *,
    ok: bool = True,
    http_status: int = 200,
    **fields: Any,
) -> Response:
    """A background post (the page's script) gets JSON, with the API's status for a
    refusal (404 for an unknown job, 400 for bad input, 409 for a conflict); a plain form
    post is sent back to the page it came from, the note in the address with its
    ``mark`` (shown escaped, and only with the mark: :meth:`Web._note`)."""
    if request.headers.get("x-requested-with") == "fetch":
        return JSONResponse({"ok": ok, "message": note, **fields}, status_code=http_status)
    back = _local(form.get("next")) or "/"
    glue = "&" if "?" in back else "?"
    query = urlencode({"note": note, "mark": mark(request, note)})
    return RedirectResponse(f"{back}{glue}{query}", status_code=303)


def _job_of(request: Request) -> str | None:
    """``namespace/name`` of a job action's path; ``None`` for a run's."""
    if "ns" not in request.path_params:
        return None
    namespace, name = job_key(request)
    return f"{namespace}/{name}"


def _here(request: Request) -> str:
    """This page's path and query, without a note shown after an action."""
    query = [(k, v) for k, v in request.query_params.multi_items() if k not in ("note", "mark")]
    # Percent-encoded (what is encoded already stays so): an attribute value goes back to
    # the server as given, and a name's bidirectional characters would otherwise be
    # shown escaped there (the page's finalize), which a redirect then followed.
    return quote(request.url.path, safe="/%") + (f"?{urlencode(query)}" if query else "")


def _local(target: str | None) -> str | None:
    """``target`` if it is a path on this server (never another site), else ``None``."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return None
    if any(ord(c) < 0x20 for c in target):
        return None
    return target


async def _form(request: Request) -> dict[str, str]:
    """The posted form (``application/x-www-form-urlencoded``, at most :data:`MAX_FORM`
    bytes; the page's script posts the same encoding). A repeated field keeps its first
    value."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in ("", "application/x-www-form-urlencoded"):
        raise InvalidInput("body", "must be a form (application/x-www-form-urlencoded)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise InvalidInput("body", f"a form is at most {MAX_FORM} bytes")
    try:
        pairs = parse_qsl(body.decode("utf-8"), max_num_fields=20)
    except (UnicodeDecodeError, ValueError):
        raise InvalidInput("body", "not a readable form") from None
    form: dict[str, str] = {}
    for key, value in pairs:
        form.setdefault(key, value)
    return form


def _set_cookie(
    response: Response, request: Request, name: str, value: str, *, max_age: int = 12 * 3600
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def _int_param(request: Request, key: str) -> int:
    text = str(request.path_params[key])
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) < 2**63:
        raise InvalidInput(key, f"must be a positive whole number, not {text!r}")
    return int(text)


def _page(request: Request) -> int:
    """``?page=``: a whole number from 1; one past the last page (however large) shows
    the last, as the view says (a huge one was a 400)."""
    text = request.query_params.get("page")
    if not text:
        return 1
    digits = text.lstrip("0") if text.isascii() and text.isdigit() else ""
    if not digits:
        raise InvalidInput("page", f"must be a positive whole number, not {text[:40]!r}")
    # (Past 19 digits: the last page, without int() of a huge string, which Python
    # refuses past 4,300 digits: a 500.)
    return int(digits) if len(digits) <= 19 else 2**63


def _optional_int(request: Request, key: str) -> int | None:
    text = request.query_params.get(key)
    if not text:
        return None
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) < 2**63:
        raise InvalidInput(key, f"must be a positive whole number, not {text!r}")
    return int(text)


def html_error(status: int, message: str) -> HTMLResponse:
    """A plain page for an error in a view (the API's errors stay JSON)."""
    from markupsafe import escape

    body = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>coordinator</title>'
        '<link rel="stylesheet" href="/static/app.css"></head><body><main class="error">'
        f'<h1>{status}</h1><p>{escape(message)}</p><p><a href="/">Jobs</a></p></main>'
        "</body></html>"
    )
    return HTMLResponse(body, status_code=status)
