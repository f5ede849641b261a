"""What the token of a request may see and do: the admin face's one place for it.

The guard (:class:`coordinator.admin.http._Guard`, and the web page's sign-in) finds the
request's :class:`~coordinator.tokens.TokenScope` and records it on the ASGI scope;
every handler, of the API and of the page alike, asks this module rather than deciding
for itself:

* :func:`require` before anything about a namespace named in the request (a job path,
  a trigger): ``permission denied for namespace "billing"`` (403) when the token does
  not reach it, or only reads it and the request writes;
* :func:`namespaces` for listings (the SQL filters on it: a scoped token never even
  reads other namespaces' rows);
* :func:`check_run` for a run named by id: a run of a namespace the token does not
  reach is answered like a run that does not exist (404), so ids reveal nothing;
* :func:`status_seen`, :func:`event_visible` and :func:`event_vague` for the daemon's
  snapshot and its live events (running calls, held results, the next deadline, runs
  finishing: only those of the token's namespaces; a change a NOTIFY names by id only is
  "jobs changed" to a scoped token; aggregate counts and the worker list are the
  daemon's own).

The single ``admin_token`` (``admin``) reaches every namespace and may operate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import attrs

from ..errors import PermissionDenied, RunNotFound
from ..events import NotificationWake
from ..tokens import TokenScope

if TYPE_CHECKING:
    from collections.abc import Callable

    from starlette.requests import Request

    from ..events import Event
    from ..status import DaemonStatus

__all__ = [
    "TOKEN_KEY",
    "check_run",
    "event_vague",
    "event_visible",
    "namespaces",
    "require",
    "status_for",
    "status_seen",
    "token_of",
]

#: Where the guard puts the request's :class:`TokenScope` in the ASGI scope.
TOKEN_KEY: Final = "coordinator.token"

#: A request with no token (an open endpoint) sees nothing namespace-bound.
_NOBODY: Final = TokenScope(name="-", digest="-", namespaces=frozenset(), access="read")


#: Where a request's audit record gathers what its handler adds (:func:`note_audit`).
AUDIT_KEY: Final = "coordinator.audit"


def note_audit(request: Request, **fields: Any) -> None:
    """Add ``fields`` (``None`` ones left out) to this request's audit record: the API's
    handlers and the page's actions say the same things (job, run, created...)."""
    notes: dict[str, Any] | None = request.scope.get(AUDIT_KEY)
    if notes is not None:
        notes.update({k: v for k, v in fields.items() if v is not None})


def token_of(request: Request | dict[str, Any]) -> TokenScope:
    """The token the request was let in with (nothing, on an open endpoint)."""
    scope = request if isinstance(request, dict) else request.scope
    found = scope.get(TOKEN_KEY)
    return found if isinstance(found, TokenScope) else _NOBODY


def require(request: Request | TokenScope, namespace: str, *, operate: bool = False) -> None:
    """Raise :class:`PermissionDenied` unless the token may see (``operate``: change)
    ``namespace``."""
    token = request if isinstance(request, TokenScope) else token_of(request)
    if token.allows(namespace, operate=operate):
        return
    if operate and token.allows(namespace):
        raise PermissionDenied(namespace, f"token {token.name} may only read it")
    raise PermissionDenied(namespace, f"token {token.name} does not reach it")


def namespaces(request: Request | TokenScope) -> frozenset[str] | None:
    """The namespaces a listing may show; ``None``: every one."""
    token = request if isinstance(request, TokenScope) else token_of(request)
    return token.namespaces


def check_run(request: Request | TokenScope, run_id: int, namespace: str, *, operate: bool) -> None:
    """For a run named by id: unknown (404) outside the token's namespaces, refused (403)
    when the token may only read it and the request changes it."""
    token = request if isinstance(request, TokenScope) else token_of(request)
    if not token.allows(namespace):
        raise RunNotFound(run_id)
    if operate:
        require(token, namespace, operate=True)


def _key_visible(token: TokenScope, key: str | None) -> bool:
    """``namespace/name`` keys (``#id`` for a job no longer listed: hidden from scoped
    tokens, whose namespace cannot be told)."""
    if token.namespaces is None:
        return True
    if key is None or "/" not in key:
        return False
    return key.split("/", 1)[0] in token.namespaces


def status_seen(
    status_of: Callable[..., DaemonStatus], request: Request | TokenScope
) -> DaemonStatus:
    """The daemon's snapshot as the token may see it, its next deadline the earliest of
    the token's namespaces (``status_of``: the daemon's ``status``)."""
    token = request if isinstance(request, TokenScope) else token_of(request)
    if token.namespaces is None:
        return status_of()
    return status_for(status_of(visible=lambda key: _key_visible(token, key)), token)


def status_for(status: DaemonStatus, request: Request | TokenScope) -> DaemonStatus:
    """The snapshot as the token may see it (a next deadline of another namespace is
    left out: :func:`status_seen` asks for the token's own)."""
    token = request if isinstance(request, TokenScope) else token_of(request)
    if token.namespaces is None:
        return status
    next_visible = _key_visible(token, status.next_job)
    return attrs.evolve(
        status,
        next_deadline=status.next_deadline if next_visible else None,
        next_job=status.next_job if next_visible else None,
        running=tuple(r for r in status.running if _key_visible(token, r.job)),
        held=tuple(h for h in status.held if _key_visible(token, h.job)),
        # (A worker's other namespaces are not the token's to see.)
        workers=tuple(
            w
            if w.namespaces is None
            else attrs.evolve(w, namespaces=tuple(n for n in w.namespaces if token.allows(n)))
            for w in status.workers
        ),
    )


def event_vague(event: Event, token: TokenScope) -> bool:
    """Whether ``token``'s stream must say only "jobs changed" of ``event``: a NOTIFY
    names a job or run by id alone, whose namespace the stream cannot tell without a
    read, so a scoped token is not told which (its page then re-reads what it may see;
    a tester's scoped stream was told other namespaces' job ids as they changed)."""
    return token.namespaces is not None and isinstance(event, NotificationWake)


def event_visible(event: Event, request: Request | TokenScope) -> bool:
    """Whether a live event may be shown to the token: events about a job (a ``job``
    field holding ``namespace/name``) only within its namespaces; the daemon's own
    (state, workers, refreshes) to every token."""
    token = request if isinstance(request, TokenScope) else token_of(request)
    if token.namespaces is None:
        return True
    job = getattr(event, "job", None)
    if job is None:  # about a run or a job it does not name: not shown
        return getattr(event, "run", None) is None and getattr(event, "job_id", None) is None
    return _key_visible(token, str(job))
