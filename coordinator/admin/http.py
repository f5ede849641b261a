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

Job names may contain ``/`` (and ``%``): a client percent-encodes them in the path
(``/api/jobs/default/reports%2Fdaily``). Starlette routes on the decoded path, where that
``/`` would split the segment, so :class:`_KeepEncodedSlashes` routes on a path in which
``%2F`` and ``%25`` stay encoded, and :func:`_job_key` decodes them in the parameters.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
from collections.abc import Callable
from contextlib import aclosing, asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, Final, cast

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
from ..config import parse_listen
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
from ..status import DaemonStatus
from .metrics import CONTENT_TYPE, Metrics

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from asyncpg import Connection
    from hypercorn.typing import Framework
    from starlette.requests import Request
    from starlette.types import ASGIApp, Message, Receive, Scope, Send


__all__ = ["APP_ADMIN", "make_app", "serve_admin"]

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
#: Set in the scope when the path keeps ``%2F`` and ``%25`` encoded.
_KEPT_KEY: Final = "coordinator.kept_encoded"

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


# --------------------------------------------------------------------------- paths

_PERCENT: Final = re.compile(rb"%([0-9A-Fa-f]{2})")
_KEPT: Final = re.compile("%(2F|25)")
_KEPT_BYTES: Final = frozenset({0x2F, 0x25})


def _routed_path(raw_path: bytes) -> str:
    """``raw_path`` percent-decoded, except ``%2F`` and ``%25`` (normalised to upper case),
    so an encoded ``/`` stays inside its segment and an encoded ``%`` stays one."""

    def decode(match: re.Match[bytes]) -> bytes:
        code = int(match.group(1), 16)
        return b"%%%02X" % code if code in _KEPT_BYTES else bytes([code])

    # (As hypercorn decodes the path: invalid UTF-8 becomes U+FFFD.)
    return _PERCENT.sub(decode, raw_path).decode("utf-8", "replace")


class _KeepEncodedSlashes:
    """Pure ASGI: route on a path where ``%2F`` and ``%25`` are still encoded.

    Without ``raw_path`` (optional in ASGI) the server's decoded path is used as is, and
    path parameters are taken literally (a name with ``/`` is then out of reach).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_path = scope.get("raw_path")
        if scope["type"] == "http" and isinstance(raw_path, bytes):
            scope = {**scope, "path": _routed_path(raw_path), _KEPT_KEY: True}
        await self.app(scope, receive, send)


def _path_param(request: Request, key: str) -> str:
    value = str(request.path_params[key])
    if request.scope.get(_KEPT_KEY):
        value = _KEPT.sub(lambda m: "/" if m.group(1) == "2F" else "%", value)
    return value


def _job_key(request: Request) -> tuple[str, str]:
    """The ``{ns}`` and ``{name}`` of a job path, decoded (``%2F`` is ``/``).

    Looked up as given (no naming rule applied: a job stored before the rules of
    :mod:`coordinator.text` stays reachable); an unknown one is a 404.
    """
    return _path_param(request, "ns"), _path_param(request, "name")


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
    #: The daemon's typed snapshot (no SQL).
    status_of: Callable[[], DaemonStatus]
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
        status = self.status_of()
        return JSONResponse({"state": status.role}, status_code=200 if status.healthy else 503)

    async def status(self, _request: Request) -> Response:
        return JSONResponse(self.status_of().to_json())

    async def metrics_text(self, _request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    # -- reads --------------------------------------------------------------------------

    async def jobs(self, request: Request) -> Response:
        namespace = request.query_params.get("namespace") or None
        async with self._db() as conn:
            jobs = await aio(client.list_jobs)(conn, namespace=namespace)
        return JSONResponse({"jobs": [_job_json(j) for j in jobs]})

    async def job(self, request: Request) -> Response:
        ns, name = _job_key(request)
        async with self._db() as conn:
            job = await aio(client.get_job)(conn, name, namespace=ns)
        return JSONResponse(_job_json(job))

    async def job_runs(self, request: Request) -> Response:
        ns, name = _job_key(request)
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
        ns, name = _job_key(request)
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
    status: Callable[[], DaemonStatus],
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
    api = _Api(dsn=dsn, status_of=status, metrics=metrics)
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
            Middleware(_KeepEncodedSlashes),
            Middleware(_Guard, token=token.encode(), public=frozenset(public), audit=audit),
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
    host, port = parse_listen(listen, setting="admin_listen", allow_remote=allow_remote)
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
            raise ConfigError(
                f"admin_listen: cannot listen on {listen}: {bind_error.strerror or bind_error}"
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
