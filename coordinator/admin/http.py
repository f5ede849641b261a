"""The admin HTTP API: a Starlette app served by hypercorn's trio worker.

Off unless a listen address is configured; loopback only unless remote listening is
explicitly allowed. Every endpoint but ``/healthz`` (and ``/metrics`` when
``metrics_public``) needs ``Authorization: Bearer <token>``, compared with
:func:`hmac.compare_digest` (constant time by construction): 401 when missing, 403 when
wrong.

Cost model (promise 1 holds with the API enabled): nothing here runs unless a request
arrives. ``/healthz``, ``/api/status`` and ``/metrics`` read the daemon's memory and send
no SQL; the other endpoints open one short connection per request
(``application_name = coordinator-admin``), use :mod:`coordinator.client` (all non-daemon
SQL lives there) and close it. No pool, no keepalive query, no background task.

Errors have one shape, ``{"error": code, "message": text}``:

====  ========================================================================
400   ``invalid_input`` (a bad parameter or body), ``too_large`` is 413
401   ``unauthorized`` (no bearer token)
403   ``forbidden`` (wrong token)
404   ``job_not_found``, ``run_not_found``, ``not_found`` (no such endpoint)
405   ``method_not_allowed``
409   ``conflict`` (e.g. resolving a run that is not unresolved)
503   ``database_unavailable``
500   ``database_error``, ``internal``
====  ========================================================================

Every POST, allowed or not, is passed to ``audit`` once its status is known: method,
path, status, remote address, and the run it concerned.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import re
from contextlib import aclosing, asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol, cast

import attrs
import hypercorn.trio
import trio
from hypercorn.config import Config as HypercornConfig
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import client
from ..daemon import Daemon
from ..db import APP_ADMIN, aio, connection, trio_asyncio_loop
from ..errors import (
    ConfigError,
    Conflict,
    CoordinatorError,
    DatabaseUnavailable,
    InvalidInput,
    JobNotFound,
    RunNotFound,
)
from .metrics import CONTENT_TYPE, Metrics

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

    from asyncpg import Connection
    from hypercorn.typing import Framework
    from starlette.requests import Request
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "APP_ADMIN",
    "DaemonView",
    "RetainedResult",
    "RunningCall",
    "Status",
    "make_app",
    "parse_listen",
    "serve_admin",
    "view_of",
]

#: ``application_name`` of the API's database sessions.
#: Shortest token accepted: an empty or short token would leave the API open.
MIN_TOKEN_LENGTH: Final = 16
#: Largest request body read (resolve's is a few bytes).
MAX_BODY: Final = 64 * 1024
#: Requests talking to the database at once (each holds one connection).
MAX_DB_REQUESTS: Final = 8
#: Largest ``limit`` of a runs listing.
MAX_LIMIT: Final = 1000

_MAX_BIGINT: Final = 2**63 - 1
_AUDIT_KEY: Final = "coordinator.audit"
_ROLES: Final = {"ready": "leader"}

# --------------------------------------------------------------------------- status


@attrs.frozen(kw_only=True)
class RunningCall:
    """A call in progress."""

    #: The job's ``namespace/name`` (its id when the daemon no longer lists it).
    job: str
    job_id: int
    #: The run being served.
    run: int
    #: Seconds since the call started.
    running_s: float


@attrs.frozen(kw_only=True)
class RetainedResult:
    """A result the database has not acknowledged yet."""

    run: int
    job: str
    #: The call's outcome (``succeeded``, ``failed`` ...), kept exactly.
    outcome: str
    #: Attempts to save it so far.
    attempts: int


@attrs.frozen(kw_only=True)
class Status:
    """The daemon as ``/api/status`` (and ``coordinator status``) reports it. No SQL."""

    #: ``leader`` (ready), ``standby``, ``degraded``, ``starting`` or ``stopping``.
    role: str
    #: The daemon's own state word (``ready`` for a leader).
    state: str
    #: ``host:pid:random`` of the daemon process.
    instance: str
    #: Seconds since the daemon (its view) started.
    uptime_s: float
    #: Jobs the daemon knows (valid ones, from the last refresh).
    jobs: int
    #: Jobs with an armed timer.
    armed_deadlines: int
    #: The earliest armed deadline and its job, or ``None``.
    next_deadline: datetime | None
    next_job: str | None
    #: Calls in progress, results not yet saved, worker types served.
    running: tuple[RunningCall, ...] = ()
    retained: tuple[RetainedResult, ...] = ()
    workers: tuple[str, ...] = ()
    #: Inventory refreshes done, and when the last one ended (``None`` before the first).
    refreshes: int = 0
    last_refresh: datetime | None = None

    @property
    def healthy(self) -> bool:
        """Leading and connected: ``/healthz`` answers 200 only then."""
        return self.role == "leader"

    @property
    def running_calls(self) -> int:
        return len(self.running)

    @property
    def retained_results(self) -> int:
        return len(self.retained)

    def to_json(self) -> dict[str, Any]:
        """The ``/api/status`` body."""
        return {
            "state": self.role,
            "daemon_state": self.state,
            "instance": self.instance,
            "uptime_s": round(self.uptime_s, 3),
            "jobs": self.jobs,
            "armed_deadlines": self.armed_deadlines,
            "next_deadline": (
                {"at": _iso(self.next_deadline), "job": self.next_job}
                if self.next_deadline is not None
                else None
            ),
            "running": [
                {"job": c.job, "job_id": c.job_id, "run": c.run, "running_s": c.running_s}
                for c in self.running
            ],
            "retained": [
                {"run": r.run, "job": r.job, "outcome": r.outcome, "attempts": r.attempts}
                for r in self.retained
            ],
            "workers": list(self.workers),
            "refreshes": self.refreshes,
            "last_refresh": _iso(self.last_refresh),
        }


class DaemonView(Protocol):
    """What the API needs from the daemon: one synchronous, SQL-free snapshot."""

    def status(self) -> Status: ...


def role_of(state: str) -> str:
    """The daemon's state word as the API reports it (``ready`` is ``leader``)."""
    return _ROLES.get(state, state)


@attrs.define(eq=False)
class _DaemonAdapter:
    """Reads a :class:`~coordinator.daemon.Daemon`'s attributes; changes nothing."""

    daemon: Daemon
    #: trio time the view was made (the daemon's start, when made with it).
    started: float
    last_refresh: datetime | None = None

    def observe(self, record: Mapping[str, Any]) -> None:
        if record.get("event") == "refresh":
            self.last_refresh = self.daemon.clock.now()

    def status(self) -> Status:
        d = self.daemon
        now = trio.current_time()
        earliest = d.deadlines.earliest()
        next_deadline = next_job = None
        if earliest is not None:
            next_deadline = datetime.fromtimestamp(earliest[0], UTC)
            next_job = self._key(earliest[1])
        return Status(
            role=role_of(d.state),
            state=d.state,
            instance=d.instance,
            uptime_s=now - self.started,
            jobs=len(d.jobs),
            armed_deadlines=len(d.deadlines),
            next_deadline=next_deadline,
            next_job=next_job,
            running=tuple(
                RunningCall(
                    job=self._key(job_id),
                    job_id=job_id,
                    run=run_id,
                    running_s=round(now - since, 3),
                )
                for job_id, (run_id, since) in sorted(d.running.items())
            ),
            retained=tuple(
                RetainedResult(
                    run=r.run_id, job=r.job_key, outcome=r.outcome.status, attempts=r.attempts
                )
                for r in sorted(d.retained.values(), key=lambda r: r.run_id)
            ),
            workers=tuple(sorted(d.worker_types())),
            refreshes=d.refreshes,
            last_refresh=self.last_refresh,
        )

    def _key(self, job_id: int) -> str:
        entry = self.daemon.jobs.get(job_id)
        return entry.key if entry is not None else f"#{job_id}"


def view_of(daemon: Daemon) -> DaemonView:
    """A :class:`DaemonView` of a running (or starting) daemon, without changing it.

    Call it inside trio when the daemon starts: uptime counts from this call, and the last
    refresh time is taken from the daemon's ``refresh`` events (an observer is added to
    its log), so it is known from the first refresh after this call.
    """
    adapter = _DaemonAdapter(daemon=daemon, started=trio.current_time())
    daemon.log.observers.append(adapter.observe)
    return adapter


# --------------------------------------------------------------------------- errors


def _error(status: int, code: str, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status, headers=headers)


def _from_coordinator_error(exc: CoordinatorError) -> JSONResponse:
    if isinstance(exc, InvalidInput):
        return _error(400, "invalid_input", str(exc))
    if isinstance(exc, JobNotFound):
        return _error(404, "job_not_found", str(exc))
    if isinstance(exc, RunNotFound):
        return _error(404, "run_not_found", str(exc))
    if isinstance(exc, Conflict):
        return _error(409, "conflict", str(exc))
    if isinstance(exc, DatabaseUnavailable):
        return _error(503, "database_unavailable", str(exc))
    return _error(500, "database_error", str(exc))


_HTTP_CODES: Final = {
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    400: "invalid_input",
}


async def _on_coordinator_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, CoordinatorError)
    return _from_coordinator_error(exc)


async def _on_http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    return _error(
        exc.status_code, _HTTP_CODES.get(exc.status_code, "http_error"), exc.detail, **headers
    )


async def _on_unexpected(_request: Request, _exc: Exception) -> Response:
    # Starlette re-raises after this response, so the server logs the traceback.
    return _error(500, "internal", "internal error (see the daemon's log)")


# --------------------------------------------------------------------------- auth + audit


class _Guard:
    """Pure ASGI middleware: bearer-token check, then one audit record per POST."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: bytes,
        public: frozenset[str],
        audit: Callable[[dict[str, Any]], None],
    ) -> None:
        self.app = app
        self.token = token
        self.public = public
        self.audit = audit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        notes: dict[str, Any] = {}
        scope[_AUDIT_KEY] = notes
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
            await send(message)

        try:
            denied = None if scope["path"] in self.public else self._check(scope)
            if denied is not None:
                await denied(scope, receive, send_audited)
            else:
                await self.app(scope, receive, send_audited)
        finally:
            audit(500)  # no answer was started: an error (logged by the server) or a cancel

    def _check(self, scope: Scope) -> Response | None:
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
        if not hmac.compare_digest(credentials, self.token):
            return _error(403, "forbidden", "the bearer token is not valid")
        return None


def _remote(scope: Scope) -> str | None:
    peer = scope.get("client")
    if not peer:
        return None
    host, port = peer[0], peer[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def _note(request: Request, **fields: Any) -> None:
    """Add fields to this request's audit record."""
    notes: dict[str, Any] | None = request.scope.get(_AUDIT_KEY)
    if notes is not None:
        notes.update({k: v for k, v in fields.items() if v is not None})


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


def _limit(request: Request) -> int:
    text = request.query_params.get("limit", "50")
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise InvalidInput("limit", f"must be a whole number from 1 to {MAX_LIMIT}, not {text!r}")
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


def _job_json(job: client.JobView) -> dict[str, Any]:
    return {**job.to_json(), "key": job.key, "state": job.state}


# --------------------------------------------------------------------------- endpoints


@attrs.define(eq=False)
class _Api:
    dsn: str
    daemon: DaemonView
    metrics: Metrics
    limiter: trio.CapacityLimiter = attrs.field(
        factory=lambda: trio.CapacityLimiter(MAX_DB_REQUESTS)
    )

    @asynccontextmanager
    async def _db(self) -> AsyncIterator[Connection]:
        """One short connection for this request, closed when it is answered."""
        async with self.limiter, connection(self.dsn, application_name=APP_ADMIN) as conn:
            yield conn

    # -- no SQL -------------------------------------------------------------------------

    async def healthz(self, _request: Request) -> Response:
        status = self.daemon.status()
        return JSONResponse({"state": status.role}, status_code=200 if status.healthy else 503)

    async def status(self, _request: Request) -> Response:
        return JSONResponse(self.daemon.status().to_json())

    async def metrics_text(self, _request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    # -- reads --------------------------------------------------------------------------

    async def jobs(self, request: Request) -> Response:
        namespace = request.query_params.get("namespace") or None
        async with self._db() as conn:
            jobs = await aio(client.list_jobs)(conn, namespace=namespace)
        return JSONResponse({"jobs": [_job_json(j) for j in jobs]})

    async def job(self, request: Request) -> Response:
        ns, name = request.path_params["ns"], request.path_params["name"]
        async with self._db() as conn:
            job = await aio(client.get_job)(conn, name, namespace=ns)
        return JSONResponse(_job_json(job))

    async def job_runs(self, request: Request) -> Response:
        ns, name = request.path_params["ns"], request.path_params["name"]
        status = request.query_params.get("status") or None
        limit = _limit(request)
        async with self._db() as conn:
            runs = await aio(client.list_runs)(
                conn, namespace=ns, job=name, status=status, limit=limit
            )
        return JSONResponse({"runs": [r.to_json() for r in runs]})

    async def run(self, request: Request) -> Response:
        run_id = _run_id(request)
        async with self._db() as conn:
            run = await aio(client.get_run)(conn, run_id)
        return JSONResponse(run.to_json())

    # -- writes (audited by _Guard) -----------------------------------------------------

    async def trigger(self, request: Request) -> Response:
        """Idempotent: while the job has an outstanding run, that run is the answer."""
        ns, name = request.path_params["ns"], request.path_params["name"]
        _note(request, job=f"{ns}/{name}")
        force = _flag(request, "force")
        _note(request, force=force or None)
        async with self._db() as conn:
            job = await aio(client.get_job)(conn, name, namespace=ns)
            run_id = await aio(client.trigger)(
                conn, name, namespace=ns, args={"force": True} if force else None
            )
        created = run_id != job.outstanding_run
        _note(request, run=run_id, created=created)
        return JSONResponse(
            {
                "run": run_id,
                "created": created,
                "status": "queued" if created else job.outstanding_status,
            }
        )

    async def cancel(self, request: Request) -> Response:
        """A queued run becomes ``cancelled``; any other state is a conflict."""
        run_id = _run_id(request)
        _note(request, run=run_id)
        async with self._db() as conn:
            await aio(client.cancel_run)(conn, run_id)
        return JSONResponse({"run": run_id, "status": "cancelled"})

    async def resolve(self, request: Request) -> Response:
        run_id = _run_id(request)
        _note(request, run=run_id)
        body = await _json_body(request)
        outcome = body.get("as")
        if outcome not in client.RESOLUTIONS:
            raise InvalidInput("as", f"must be one of {', '.join(client.RESOLUTIONS)}")
        _note(request, resolved_as=outcome)
        async with self._db() as conn:
            current = await aio(client.resolve)(conn, run_id, outcome)
        retry_run = current if current != run_id else None
        _note(request, retry_run=retry_run)
        return JSONResponse({"run": run_id, "as": outcome, "retry_run": retry_run})


def make_app(
    *,
    dsn: str,
    token: str,
    daemon: DaemonView,
    metrics: Metrics,
    audit: Callable[[dict[str, Any]], None],
    metrics_public: bool = False,
) -> Starlette:
    """The admin API as an ASGI app (serve it with :func:`serve_admin`).

    ``audit`` receives one dict per POST (``method``, ``path``, ``status``, ``remote``,
    and ``run``/``job``/... when known); the daemon logs it as an ``audit`` event.
    ``metrics_public`` lets ``/metrics`` be scraped without the token.
    """
    token = token.strip()
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"admin token: must be at least {MIN_TOKEN_LENGTH} characters")
    api = _Api(dsn=dsn, daemon=daemon, metrics=metrics)
    public = {"/healthz"} | ({"/metrics"} if metrics_public else set())
    routes = [
        Route("/healthz", api.healthz, methods=["GET"]),
        Route("/metrics", api.metrics_text, methods=["GET"]),
        Route("/api/status", api.status, methods=["GET"]),
        Route("/api/jobs", api.jobs, methods=["GET"]),
        Route("/api/jobs/{ns}/{name}", api.job, methods=["GET"]),
        Route("/api/jobs/{ns}/{name}/runs", api.job_runs, methods=["GET"]),
        Route("/api/jobs/{ns}/{name}/trigger", api.trigger, methods=["POST"]),
        Route("/api/runs/{id}", api.run, methods=["GET"]),
        Route("/api/runs/{id}/cancel", api.cancel, methods=["POST"]),
        Route("/api/runs/{id}/resolve", api.resolve, methods=["POST"]),
    ]
    return Starlette(
        routes=routes,
        middleware=[
            Middleware(_Guard, token=token.encode(), public=frozenset(public), audit=audit)
        ],
        exception_handlers={
            HTTPException: _on_http_error,
            CoordinatorError: _on_coordinator_error,
            Exception: _on_unexpected,
        },
    )


# --------------------------------------------------------------------------- serving


def parse_listen(listen: str, *, allow_remote: bool = False) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) → (host, port); a non-loopback host is
    refused unless ``allow_remote``. Port 0 picks a free port."""
    host, sep, port_text = listen.strip().rpartition(":")
    if not sep or not host or not port_text.isascii() or not port_text.isdigit():
        raise ConfigError(f"admin_listen: expected HOST:PORT, not {listen!r}")
    port = int(port_text)
    if port > 65535:
        raise ConfigError(f"admin_listen: port {port} is out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost":
        loopback = True
    else:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise ConfigError(
                f"admin_listen: {host!r} is not an IP address (or localhost)"
            ) from None
        loopback = address.is_loopback
    if not loopback and not allow_remote:
        raise ConfigError(
            f"admin_listen: {host} is not a loopback address; the admin API listens on "
            "loopback only unless remote access is allowed explicitly (put TLS in front)"
        )
    return host, port


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
    host, port = parse_listen(listen, allow_remote=allow_remote)
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("coordinator.admin")
    config.graceful_timeout = 2.0
    config.include_server_header = False
    async with trio_asyncio_loop(), trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(
            partial(
                hypercorn.trio.serve,
                cast("Framework", app),
                config,
                shutdown_trigger=shutdown.wait,
                mode="asgi",
            )
        )
        task_status.started(binds[0])


def _iso(value: datetime | None) -> str | None:
    return value.isoformat(timespec="milliseconds") if value is not None else None
