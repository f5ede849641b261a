"""The admin HTTP server: the API and the web page, one Starlette app served by
hypercorn's trio worker.

Off unless a listen address is configured; loopback only unless remote listening is
explicitly allowed. Who may do what (the guard, :class:`_Guard`):

- ``/api/*`` and ``/metrics`` need ``Authorization: Bearer <token>``: 401 when missing,
  403 when no configured token matches (:class:`~coordinator.tokens.TokenSet`: found by
  hash, compared in constant time). ``/metrics`` is open with ``metrics_public``;
  ``/healthz`` always is.
- The web page (``/``, ``/jobs/...``, ``/runs/...``, ``/status``, ``/ui/...``) needs a
  session cookie from its sign-in form (:mod:`coordinator.admin.web`), which names the
  token it signed in with; without one a page redirects to ``/signin`` and anything else
  is 401. ``/signin`` and ``/static`` are open.
- Each token has a name and a scope (namespaces, ``read`` or ``operate``); what a
  request may see and do is decided in :mod:`coordinator.admin.access`, for the API and
  the page alike: outside its namespaces a job path is ``permission_denied`` (403), a
  run id ``run_not_found`` (404); listings, the status and the live events leave the
  rest out.
- Every response carries a strict Content-Security-Policy and friends.

Cost model (promise 1 holds with the API enabled): nothing here runs unless a request
arrives. ``/healthz``, ``/api/status`` and ``/metrics`` read the daemon's memory and send
no SQL; the other endpoints open one short connection per request
(``application_name = coordinator-admin``), use :mod:`coordinator.client` (all non-daemon
SQL lives there) and close it. No pool, no keepalive query, no background task.

Errors have one shape, ``{"error": code, "message": text}``:

====  ========================================================================
400   ``invalid_input`` (a bad parameter or body), ``too_large`` is 413
401   ``unauthorized`` (no bearer token)
403   ``forbidden`` (wrong token), ``permission_denied`` (outside the token's scope)
404   ``job_not_found``, ``run_not_found``, ``not_found`` (no such endpoint)
405   ``method_not_allowed``
409   ``conflict`` (e.g. resolving a run that is not unresolved)
503   ``database_unavailable``
500   ``database_error``, ``internal``
====  ========================================================================

Every POST, allowed or not, is passed to ``audit`` once its status is known: method,
path, status, remote address, the token's name, and the run it concerned.

Job names may contain ``/``: clients percent-encode them (:mod:`coordinator.admin.paths`).

``GET /api/events`` is the daemon's event stream as server-sent events
(:mod:`coordinator.admin.live`): what ``coordinator top`` and the web page follow.
``GET /api/jobs/{ns}/{name}/stats?since=...`` counts a job's runs per outcome in 8 to 30
buckets (:mod:`coordinator.buckets`), one aggregate.
"""

from __future__ import annotations

import errno
import json
import logging
import re
from collections.abc import Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from datetime import datetime
from functools import partial
from http.cookies import SimpleCookie
from typing import TYPE_CHECKING, Any, Final, cast
from urllib.parse import quote_from_bytes

import attrs
import hypercorn.trio
import trio
from hypercorn.config import Config as HypercornConfig
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import client, redact
from ..clock import SystemWallClock, WallClock
from ..config import parse_listen
from ..db import APP_ADMIN, aio, connection, trio_asyncio_loop
from ..errors import (
    ConfigError,
    CoordinatorError,
    InvalidInput,
)
from ..events import EventBus
from ..schedule import parse_duration
from ..status import DaemonStatus
from ..text import json_kind
from ..tokens import MIN_TOKEN_LENGTH as _MIN_TOKEN_LENGTH
from ..tokens import TokenSet, check_token, single
from . import access
from .live import EventSourceResponse
from .metrics import CONTENT_TYPE, Metrics
from .paths import KeepEncodedSlashes, job_key
from .session import SESSION_COOKIE, Sessions, holder
from .web import SESSION_KEY, Web, error_status, html_error

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from asyncpg import Connection
    from hypercorn.typing import Framework
    from starlette.requests import Request
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from ..log import EventLog


__all__ = ["APP_ADMIN", "audit_to", "make_app", "serve_admin"]

#: ``application_name`` of the API's database sessions.
#: Shortest token accepted: an empty or short token would leave the API open.
MIN_TOKEN_LENGTH: Final = _MIN_TOKEN_LENGTH
#: Largest request body read (resolve's is a few bytes).
MAX_BODY: Final = 64 * 1024
#: Requests talking to the database at once (each holds one connection).
MAX_DB_REQUESTS: Final = 8
#: Largest ``limit`` of a runs listing.
MAX_LIMIT: Final = 1000

_MAX_BIGINT: Final = 2**63 - 1

#: Sent with every response. Scripts, styles and images only from this server's
#: ``/static`` (no inline code at all), nothing framed, forms only posted here.
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
}
_SECURITY_RAW: Final = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

# --------------------------------------------------------------------------- errors


def _error(status: int, code: str, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status, headers=headers)


def _from_coordinator_error(exc: CoordinatorError) -> JSONResponse:
    status, code = error_status(exc)
    return _error(status, code, str(exc))


_HTTP_CODES: Final = {
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    400: "invalid_input",
}


def _is_page(request: Request) -> bool:
    """A web page's request (its errors are HTML), not the API's (JSON)."""
    path = request.url.path
    return not (path.startswith(("/api/", "/ui/")) or path in ("/metrics", "/healthz"))


async def _on_coordinator_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, CoordinatorError)
    response = _from_coordinator_error(exc)
    if _is_page(request):
        return html_error(response.status_code, str(exc))
    return response


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    if _is_page(request):
        return html_error(exc.status_code, exc.detail)
    return _error(
        exc.status_code, _HTTP_CODES.get(exc.status_code, "http_error"), exc.detail, **headers
    )


async def _on_unexpected(request: Request, _exc: Exception) -> Response:
    # Starlette re-raises after this response, so the server logs the traceback.
    if _is_page(request):
        return html_error(500, "internal error (see the daemon's log)")
    return _error(500, "internal", "internal error (see the daemon's log)")


# --------------------------------------------------------------------------- auth + audit


class _Guard:
    """Pure ASGI middleware: the bearer token for the API, the session cookie for the web
    page, then one audit record per POST; security headers on every response."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: TokenSet,
        public: frozenset[str],
        audit: Callable[[dict[str, Any]], None],
        sessions: Sessions,
        clock: WallClock,
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.public = public
        self.audit = audit
        self.sessions = sessions
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        notes: dict[str, Any] = {}
        scope[access.AUDIT_KEY] = notes
        audited = scope["method"] != "POST"

        def audit(status: int) -> None:
            nonlocal audited
            if not audited:
                audited = True
                record = {"method": "POST", "path": scope["path"], "status": status}
                self.audit({**record, "remote": _remote(scope), **notes})

        async def send_audited(message: Message) -> None:
            if message["type"] == "http.response.start":
                # Before the client can see the answer: the record is never missing.
                audit(int(message["status"]))
                message = {**message, "headers": [*message.get("headers", []), *_SECURITY_RAW]}
            await send(message)

        try:
            denied = self._admit(scope, notes)
            if denied is not None:
                await denied(scope, receive, send_audited)
            else:
                await self.app(scope, receive, send_audited)
        finally:
            audit(500)  # no answer was started: an error (logged by the server) or a cancel

    def _admit(self, scope: Scope, notes: dict[str, Any]) -> Response | None:
        """``None`` to let the request in (its token's scope recorded for the handlers
        and named in the audit), else the answer that refuses it."""
        path: str = scope["path"]
        if path in self.public or path.startswith("/static/"):
            return None
        if path.startswith("/api/") or path == "/metrics":
            return self._check(scope, notes)
        return self._check_session(scope, notes)

    def _check_session(self, scope: Scope, notes: dict[str, Any]) -> Response | None:
        jar: SimpleCookie = SimpleCookie()
        for key, value in scope["headers"]:
            if key == b"cookie":
                try:
                    jar.load(value.decode("latin-1"))
                except Exception:  # a malformed cookie header is no session
                    continue
        morsel = jar.get(SESSION_COOKIE)
        nonce = self.sessions.nonce(
            morsel.value if morsel is not None else None, self.clock.now().timestamp()
        )
        token = self.tokens.named(holder(nonce) or "") if nonce is not None else None
        if nonce is not None and token is not None:
            scope[SESSION_KEY] = nonce
            scope[access.TOKEN_KEY] = token
            notes["token"] = token.name
            return None
        if scope["method"] in ("GET", "HEAD") and not scope["path"].startswith("/ui/"):
            # Back to the page asked for once signed in (a run's link in an alert), as it
            # was sent (a job name may hold ? or #, escaped).
            asked = (scope.get("raw_path") or scope["path"].encode()) + (
                b"?" + scope["query_string"] if scope["query_string"] else b""
            )
            where = (
                "/signin" if asked == b"/" else "/signin?next=" + quote_from_bytes(asked, safe="")
            )
            return Response(status_code=303, headers={"Location": where})
        return _error(401, "unauthorized", "sign in first (/signin)")

    def _check(self, scope: Scope, notes: dict[str, Any]) -> Response | None:
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        scheme, _, credentials = (header or b"").strip().partition(b" ")
        credentials = credentials.strip()
        if scheme.lower() != b"bearer" or not credentials:
            return _error(
                401,
                "unauthorized",
                "a bearer token is required (Authorization: Bearer <token>)",
                **{"WWW-Authenticate": 'Bearer realm="coordinator"'},
            )
        token = self.tokens.find(credentials)
        if token is None:
            return _error(403, "forbidden", "the bearer token is not valid")
        scope[access.TOKEN_KEY] = token
        notes["token"] = token.name
        return None


def _remote(scope: Scope) -> str | None:
    peer = scope.get("client")
    if not peer:
        return None
    host, port = peer[0], peer[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


_note = access.note_audit


# --------------------------------------------------------------------------- inputs

_DIGITS: Final = re.compile(r"[0-9]{1,19}")


def _run_id(request: Request) -> int:
    text = str(request.path_params["id"])
    value = int(text) if _DIGITS.fullmatch(text) else 0
    if not 1 <= value <= _MAX_BIGINT:
        raise InvalidInput("id", f"a run id is a positive integer, not {text!r}")
    return value


_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


def _flag(request: Request, name: str) -> bool:
    """A boolean query parameter in any usual spelling (``?force=1``, ``=true``, ``=yes``,
    ``=on`` and their opposites, any case); absent means false."""
    value = request.query_params.get(name)
    if value is None:
        return False
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InvalidInput(name, f"must be 1/0, true/false, yes/no or on/off, not {value!r}")


def _positive(text: str, name: str) -> int:
    value = int(text) if _DIGITS.fullmatch(text) else 0
    if not 1 <= value <= _MAX_BIGINT:
        raise InvalidInput(name, f"must be a positive integer, not {text!r}")
    return value


def _instant(text: str | None, name: str, now: datetime) -> datetime | None:
    """An ISO 8601 instant with an offset (``2026-01-31T12:00:00Z``), or a duration back
    from ``now`` (``48h``, ``180d``); ``None`` when absent."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        try:
            return now - parse_duration(text, field=name, unit_required=True)
        except (InvalidInput, OverflowError):
            raise InvalidInput(
                name, f"an ISO 8601 instant with its offset or a duration like 48h, not {text!r}"
            ) from None
    if moment.tzinfo is None:
        raise InvalidInput(name, f"{text!r} has no offset: add Z or +hh:mm")
    return moment


def _limit(request: Request, default: int = 50) -> int:
    text = request.query_params.get("limit", str(default))
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise InvalidInput("limit", f"must be a whole number from 1 to {MAX_LIMIT}, not {text!r}")
    return int(text)


def _after(request: Request) -> int | None:
    """``?after=ID``: the last finding id of the previous page."""
    text = request.query_params.get("after")
    if text is None or text == "":
        return None
    if not _DIGITS.fullmatch(text) or int(text) > _MAX_BIGINT:
        raise InvalidInput("after", f"must be a finding id (a whole number), not {text!r}")
    return int(text)


def _due(request: Request) -> int | None:
    """``?due=N``: 1 to 1000."""
    text = request.query_params.get("due")
    if text is None or text == "":
        return None
    if not _DIGITS.fullmatch(text) or not 1 <= int(text) <= 1000:
        raise InvalidInput("due", f"must be a whole number from 1 to 1000, not {text!r}")
    return int(text)


async def _json_body(request: Request) -> dict[str, Any]:
    too_large = HTTPException(413, f"the body is larger than {MAX_BODY} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise too_large
    body = bytearray()
    async with aclosing(request.stream()) as chunks:
        async for chunk in chunks:
            body += chunk
            if len(body) > MAX_BODY:
                raise too_large
    try:
        value = json.loads(body or b"{}")
    except ValueError as exc:
        raise InvalidInput("body", f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput("body", "must be a JSON object")
    return value


# --------------------------------------------------------------------------- endpoints


@attrs.define(eq=False)
class _Api:
    dsn: str
    #: The daemon's typed snapshot (no SQL).
    status_of: Callable[..., DaemonStatus]
    metrics: Metrics
    clock: WallClock
    #: The daemon's events, for ``/api/events`` (``None``: no stream here).
    bus: EventBus | None = None
    limiter: trio.CapacityLimiter = attrs.field(
        factory=lambda: trio.CapacityLimiter(MAX_DB_REQUESTS)
    )

    @asynccontextmanager
    async def db(self) -> AsyncIterator[Connection]:
        """One short connection for this request, closed when it is answered."""
        async with self.limiter, connection(self.dsn, application_name=APP_ADMIN) as conn:
            yield conn

    # -- no SQL -------------------------------------------------------------------------

    async def healthz(self, _request: Request) -> Response:
        status = self.status_of()
        return JSONResponse({"state": status.role}, status_code=200 if status.healthy else 503)

    async def status(self, request: Request) -> Response:
        return JSONResponse(access.status_seen(self.status_of, request).to_json())

    async def metrics_text(self, request: Request) -> Response:
        # A scoped token sees the per-job series of its namespaces only; a public scrape
        # (metrics_public, no token) is the operator's choice to show everything.
        scoped = access.TOKEN_KEY in request.scope
        return Response(
            self.metrics.render(access.namespaces(request) if scoped else None),
            media_type=CONTENT_TYPE,
        )

    async def events(self, request: Request) -> Response:
        """The daemon's events as server-sent events, until the client goes (those the
        token may see)."""
        if self.bus is None:
            return _error(404, "not_found", "no event stream is served here")
        token = access.token_of(request)
        return EventSourceResponse(
            self.bus,
            visible=lambda e: access.event_visible(e, token),
            vague=lambda e: access.event_vague(e, token),
        )

    # -- reads --------------------------------------------------------------------------

    async def jobs(self, request: Request) -> Response:
        """Every job (``?namespace=``), or with ``?due=N`` the N due soonest (at most
        1000), earliest first."""
        namespace = request.query_params.get("namespace") or None
        if namespace is not None:
            access.require(request, namespace)
        due = _due(request)
        if due is not None:
            if namespace is not None:
                raise InvalidInput("due", "takes no namespace: it lists the soonest of all")
            async with self.db() as conn:
                soonest = await aio(client.due_jobs)(
                    conn, due, namespaces=access.namespaces(request)
                )
            return JSONResponse({"jobs": [j.to_json() for j in soonest]})
        async with self.db() as conn:
            jobs = await aio(client.list_jobs)(
                conn, namespace=namespace, namespaces=access.namespaces(request)
            )
        return JSONResponse({"jobs": [j.to_json() for j in jobs]})

    async def job(self, request: Request) -> Response:
        ns, name = job_key(request)
        access.require(request, ns)
        async with self.db() as conn:
            job = await aio(client.get_job)(conn, name, namespace=ns)
        return JSONResponse(job.to_json())

    async def job_runs(self, request: Request) -> Response:
        ns, name = job_key(request)
        access.require(request, ns)
        status = request.query_params.get("status") or None
        limit = _limit(request)
        async with self.db() as conn:
            job = await aio(client.get_job)(conn, name, namespace=ns)
            runs = await aio(client.list_runs)(  # (its own: not a removed namesake's)
                conn, job_id=job.id, status=status, limit=limit
            )
        return JSONResponse({"runs": [r.to_json() for r in runs]})

    async def runs(self, request: Request) -> Response:
        """The newest runs of every job (``?status=``, ``?limit=``, ``?before=``)."""
        status = request.query_params.get("status") or None
        limit = _limit(request)
        before_text = request.query_params.get("before")
        before = _positive(before_text, "before") if before_text else None
        async with self.db() as conn:
            runs = await aio(client.list_runs)(
                conn,
                status=status,
                limit=limit,
                before=before,
                namespaces=access.namespaces(request),
            )
        return JSONResponse({"runs": [r.to_json() for r in runs]})

    async def stats(self, request: Request) -> Response:
        """Runs per outcome per bucket since ``?since=`` (an ISO 8601 instant with its
        offset, or a duration back from now such as ``48h`` or ``180d``; default 7 days)
        until ``?until=`` (default now)."""
        ns, name = job_key(request)
        access.require(request, ns)
        now = self.clock.now()
        until = _instant(request.query_params.get("until"), "until", now) or now
        since = _instant(request.query_params.get("since") or "7d", "since", until)
        assert since is not None
        async with self.db() as conn:
            stats = await aio(client.run_stats)(conn, name, namespace=ns, since=since, until=until)
        return JSONResponse(stats.to_json())

    async def run(self, request: Request) -> Response:
        run_id = _run_id(request)
        async with self.db() as conn:
            run = await aio(client.get_run)(conn, run_id)
            access.check_run(request, run_id, run.namespace, operate=False)
            chain = await aio(client.run_chain)(conn, run_id)
        return JSONResponse(client.run_json(run, chain))

    async def findings(self, request: Request) -> Response:
        """A page of the run's findings, oldest first: ``?limit=`` (1 to 1000, default
        100), ``?after=`` (the previous page's ``next``), ``?severity=``."""
        run_id = _run_id(request)
        limit = _limit(request, default=100)
        after = _after(request)
        severity = request.query_params.get("severity") or None
        async with self.db() as conn:
            run = await aio(client.get_run)(conn, run_id)
            access.check_run(request, run_id, run.namespace, operate=False)
            page = await aio(client.list_findings)(
                conn, run_id, after=after, limit=limit, severity=severity
            )
        return JSONResponse(page.to_json())

    # -- writes (audited by _Guard) -----------------------------------------------------

    async def trigger(self, request: Request) -> Response:
        """Idempotent: while the job has an outstanding run, that run is the answer (a
        paused one is resumed)."""
        ns, name = job_key(request)
        _note(request, job=f"{ns}/{name}")
        access.require(request, ns, operate=True)
        force = _flag(request, "force")
        _note(request, force=force or None)
        # A body, if any, is {"args": {...}} (a body was read by nobody: a tester's args
        # were dropped with a 200).
        body = await _json_body(request)
        unknown = sorted(set(body) - {"args", "force"})
        if unknown:
            raise InvalidInput(
                "body",
                f'unknown key {unknown[0]!r}: a trigger takes {{"args": {{...}}, "force": true}}',
            )
        args = body.get("args", {})
        if not isinstance(args, dict):
            raise InvalidInput("args", f"must be a JSON object, not {json_kind(args)}")
        if "force" in body:
            if not isinstance(body["force"], bool):
                raise InvalidInput(
                    "force", f"must be true or false, not {json_kind(body['force'])}"
                )
            force = force or body["force"]
            _note(request, force=force or None)
        if force:
            args = {**args, "force": True}
        async with self.db() as conn:
            # (Read first for its refusals' words: a namespace no job could have is bad
            # input, not an unknown job.)
            await aio(client.get_job)(conn, name, namespace=ns)
            triggered = await aio(client.trigger_answer)(
                conn, name, namespace=ns, args=args or None
            )
        # (Told by the run's row, not by the job read before: racing callers all read "no
        # run", and each was told it had created the one run.)
        run_id, created, resumed = triggered.run_id, triggered.created, triggered.resumed
        _note(request, run=run_id, created=created, resumed=resumed or None)
        return JSONResponse(
            {"run": run_id, "created": created, "resumed": resumed, "status": triggered.status}
        )

    async def pause(self, request: Request) -> Response:
        """A running run of a recoverable job becomes ``cancel_requested`` (then
        ``paused``, once its worker stops at a cursor); a queued one ``paused``. Another
        job's run, or a finished one, is a conflict."""
        run_id = _run_id(request)
        _note(request, run=run_id)
        async with self.db() as conn:
            run = await aio(client.get_run)(conn, run_id)
            access.check_run(request, run_id, run.namespace, operate=True)
            status = await aio(client.pause_run)(conn, run_id)
        _note(request, run_status=status)
        return JSONResponse({"run": run_id, "status": status})

    async def cancel(self, request: Request) -> Response:
        """A queued or paused run becomes ``cancelled``; any other state is a conflict."""
        run_id = _run_id(request)
        _note(request, run=run_id)
        async with self.db() as conn:
            run = await aio(client.get_run)(conn, run_id)
            access.check_run(request, run_id, run.namespace, operate=True)
            await aio(client.cancel_run)(conn, run_id)
        return JSONResponse({"run": run_id, "status": "cancelled"})

    async def resolve(self, request: Request) -> Response:
        run_id = _run_id(request)
        _note(request, run=run_id)
        # Who may, before what: a read token's resolve with a missing body was told
        # "400 as: must be one of ...", not that it may only read. (The body is read with
        # no connection held: a slow sender does not keep one from the page and the API.)
        async with self.db() as conn:
            run = await aio(client.get_run)(conn, run_id)
        access.check_run(request, run_id, run.namespace, operate=True)
        body = await _json_body(request)
        outcome = body.get("as")
        if outcome not in client.RESOLUTIONS:
            raise InvalidInput("as", f"must be one of {', '.join(client.RESOLUTIONS)}")
        _note(request, resolved_as=outcome)
        async with self.db() as conn:
            current = await aio(client.resolve)(conn, run_id, outcome)
        retry_run = current if current != run_id else None
        _note(request, retry_run=retry_run)
        return JSONResponse({"run": run_id, "as": outcome, "retry_run": retry_run})


def audit_to(log: EventLog) -> Callable[[Mapping[str, Any]], None]:
    """Write each audit record to ``log`` as one ``audit`` line. Its ``token`` is the
    token's name (``billing-ops``, :mod:`coordinator.tokens`), never its secret: the line
    must name it, so that field is spared the log's rule that hides any field called
    token, and only its text is redacted, like every other value."""

    def write(record: Mapping[str, Any]) -> None:
        rules = redact.default()
        fields = rules.fields({k: v for k, v in record.items() if k != "token"})
        if record.get("token") is not None:
            fields["token"] = rules.value(record["token"])
        log.write("audit", "info", fields, redacted=True)

    return write


def make_app(
    *,
    dsn: str,
    token: str | None = None,
    tokens: TokenSet | None = None,
    status: Callable[[], DaemonStatus],
    metrics: Metrics,
    audit: Callable[[dict[str, Any]], None],
    metrics_public: bool = False,
    events: EventBus | None = None,
    clock: WallClock | None = None,
    sessions: Sessions | None = None,
) -> Starlette:
    """The admin API and web page as an ASGI app (serve it with :func:`serve_admin`).

    ``tokens`` are the named, scoped tokens; ``token``, the single all-powerful one (named
    ``admin``).
    ``audit`` receives one dict per POST (``method``, ``path``, ``status``, ``remote``,
    ``token``, and ``run``/``job``/... when known); the daemon logs it (:func:`audit_to`).
    ``metrics_public`` lets ``/metrics`` be scraped without the token. ``events`` is the
    daemon's bus: the live page and ``/api/events`` follow it (without it they have no
    stream). ``clock`` gives wall time (ages, sessions, the stats' default span).
    ``sessions`` signs the page's sessions (the service's: :meth:`Sessions.kept_in` its
    state directory); by default, keys derived from ``token``, else of this process.
    """
    scopes = tokens if tokens is not None else TokenSet()
    signed_by = Sessions.random()
    if token is not None:
        try:
            token = check_token(token, "admin token")
        except InvalidInput as exc:
            raise ConfigError(str(exc)) from None
        scopes = scopes.with_scope(single(token, name="admin"))
        signed_by = Sessions.for_token(token)  # sessions outlive a restart, not a new token
    if sessions is None:
        sessions = signed_by
    if not scopes:
        raise ConfigError("admin API: no token (admin_token, admin_token_file or admin_tokens)")
    wall = clock if clock is not None else SystemWallClock()
    api = _Api(dsn=dsn, status_of=status, metrics=metrics, clock=wall, bus=events)
    web = Web(tokens=scopes, status_of=status, db=api.db, clock=wall, sessions=sessions, bus=events)
    public = {"/healthz", "/signin"} | ({"/metrics"} if metrics_public else set())
    routes = [
        Route("/healthz", api.healthz, methods=["GET"]),
        Route("/metrics", api.metrics_text, methods=["GET"]),
        Route("/api/status", api.status, methods=["GET"]),
        Route("/api/events", api.events, methods=["GET"]),
        Route("/api/jobs", api.jobs, methods=["GET"]),
        Route("/api/jobs/{ns}/{name}", api.job, methods=["GET"]),
        Route("/api/jobs/{ns}/{name}/runs", api.job_runs, methods=["GET"]),
        Route("/api/jobs/{ns}/{name}/stats", api.stats, methods=["GET"]),
        Route("/api/jobs/{ns}/{name}/trigger", api.trigger, methods=["POST"]),
        Route("/api/runs", api.runs, methods=["GET"]),
        Route("/api/runs/{id}", api.run, methods=["GET"]),
        Route("/api/runs/{id}/findings", api.findings, methods=["GET"]),
        Route("/api/runs/{id}/pause", api.pause, methods=["POST"]),
        Route("/api/runs/{id}/cancel", api.cancel, methods=["POST"]),
        Route("/api/runs/{id}/resolve", api.resolve, methods=["POST"]),
        *web.routes(),
    ]
    return Starlette(
        routes=routes,
        middleware=[
            Middleware(KeepEncodedSlashes),
            Middleware(
                _Guard,
                tokens=scopes,
                public=frozenset(public),
                audit=audit,
                sessions=web.sessions,
                clock=wall,
            ),
        ],
        exception_handlers={
            HTTPException: _on_http_error,
            CoordinatorError: _on_coordinator_error,
            Exception: _on_unexpected,
        },
    )


# --------------------------------------------------------------------------- serving


async def serve_admin(
    app: ASGIApp,
    listen: str,
    *,
    shutdown: trio.Event,
    allow_remote: bool = False,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``listen`` until ``shutdown`` is set (then finish in-flight
    requests, up to 2 s). ``await nursery.start(serve_admin, ...)`` returns the base URL
    actually bound (``http://127.0.0.1:8787``). Errors go to the ``coordinator.admin``
    :mod:`logging` logger; hypercorn's access log is off."""
    host, port = parse_listen(
        listen, setting="admin_listen", allow_remote=allow_remote, allowed_by="admin_allow_remote"
    )
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("coordinator.admin")
    config.graceful_timeout = 2.0
    config.include_server_header = False
    async with trio_asyncio_loop(), trio.open_nursery() as nursery:
        try:
            binds: list[str] = await nursery.start(
                partial(
                    hypercorn.trio.serve,
                    cast("Framework", app),
                    config,
                    shutdown_trigger=shutdown.wait,
                    mode="asgi",
                )
            )
        except (OSError, BaseExceptionGroup) as exc:
            bind_error = _os_error(exc)
            if bind_error is None:
                raise
            # (In use: most often this daemon's own service, already running.)
            busy = (
                " (another process listens there: a daemon already running? `coordinator "
                "status` asks it)"
                if bind_error.errno == errno.EADDRINUSE
                else ""
            )
            raise ConfigError(
                f"admin_listen: cannot listen on {listen}: "
                f"{bind_error.strerror or bind_error}{busy}"
            ) from None
        task_status.started(binds[0])


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError a bind failed with (hypercorn raises it inside a task group)."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _os_error(inner)
            if found is not None:
                return found
    return None
