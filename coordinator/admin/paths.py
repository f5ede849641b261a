"""Paths with job names in them: ``/api/jobs/{ns}/{name}`` and ``/jobs/{ns}/{name}``.

Job names may contain ``/`` (and ``%``): a client percent-encodes them in the path
(``/api/jobs/default/reports%2Fdaily``). Starlette routes on the decoded path, where that
``/`` would split the segment, so :class:`KeepEncodedSlashes` routes on a path in which
``%2F`` and ``%25`` stay encoded, and :func:`job_key` decodes them in the parameters.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.types import ASGIApp, Receive, Scope, Send

#: Set in the scope when the path keeps ``%2F`` and ``%25`` encoded.
_KEPT_KEY: Final = "coordinator.kept_encoded"


_PERCENT: Final = re.compile(rb"%([0-9A-Fa-f]{2})")
_KEPT: Final = re.compile("%(2F|25)")
_KEPT_BYTES: Final = frozenset({0x2F, 0x25})


def routed_path(raw_path: bytes) -> str:
    """``raw_path`` percent-decoded, except ``%2F`` and ``%25`` (normalised to upper case),
    so an encoded ``/`` stays inside its segment and an encoded ``%`` stays one."""

    def decode(match: re.Match[bytes]) -> bytes:
        code = int(match.group(1), 16)
        return b"%%%02X" % code if code in _KEPT_BYTES else bytes([code])

    # (As hypercorn decodes the path: invalid UTF-8 becomes U+FFFD.)
    return _PERCENT.sub(decode, raw_path).decode("utf-8", "replace")


class KeepEncodedSlashes:
    """Pure ASGI: route on a path where ``%2F`` and ``%25`` are still encoded.

    Without ``raw_path`` (optional in ASGI) the server's decoded path is used as is, and
    path parameters are taken literally (a name with ``/`` is then out of reach).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_path = scope.get("raw_path")
        if scope["type"] == "http" and isinstance(raw_path, bytes):
            scope = {**scope, "path": routed_path(raw_path), _KEPT_KEY: True}
        await self.app(scope, receive, send)


def path_param(request: Request, key: str) -> str:
    value = str(request.path_params[key])
    if request.scope.get(_KEPT_KEY):
        value = _KEPT.sub(lambda m: "/" if m.group(1) == "2F" else "%", value)
    return value


def job_key(request: Request) -> tuple[str, str]:
    """The ``{ns}`` and ``{name}`` of a job path, decoded (``%2F`` is ``/``).

    Looked up as given (no naming rule applied: a job stored before the rules of
    :mod:`coordinator.text` stays reachable); an unknown one is a 404.
    """
    return path_param(request, "ns"), path_param(request, "name")


__all__ = ["KeepEncodedSlashes", "job_key", "path_param", "routed_path"]
