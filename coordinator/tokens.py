"""Named, scoped tokens: who may use the admin API, and which workers may connect.

A token is a random string its holder sends (``Authorization: Bearer ...`` to the admin
API, ``token`` in a worker's ``hello``). The configuration never holds the token itself,
only its hash (``sha256:<hex>``, from ``coordinator token hash``), with a name and a
scope::

    [admin_tokens.billing-ops]
    hash = "sha256:5e88..."
    namespaces = ["billing"]        # or ["*"]: every namespace
    access = "operate"              # or "read"

    [worker_tokens.reports-host-1]
    hash = "sha256:9f86..."
    namespaces = ["reports"]        # where its declared schedules may go, and whose
    types = ["reports.daily"]       # calls it may receive; types: the job types it may
                                    # serve (omitted or ["*"]: any)

Why a plain SHA-256 and not a slow password hash: the tokens are random (``coordinator
token hash --new`` makes 256-bit ones; at least 16 characters are required), so there is
nothing to guess and nothing a slow hash would protect; a fast hash lets every request
be checked without a cache. A lookup goes by the hash (a dict), then compares digests in
constant time.

Layering: a value module (stdlib, attrs, :mod:`coordinator.errors`, :mod:`coordinator.text`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal

import attrs

from .errors import ConfigError, InvalidInput
from .text import check_namespace

__all__ = [
    "ALL",
    "MIN_TOKEN_LENGTH",
    "Access",
    "TokenScope",
    "TokenSet",
    "hash_token",
    "new_token",
    "parse_tokens",
]

#: Shortest token accepted: an empty or short token would leave the door open.
MIN_TOKEN_LENGTH: Final = 16
#: ``namespaces``/``types`` wildcard: every one.
ALL: Final = "*"
_PREFIX: Final = "sha256:"
Access = Literal["read", "operate"]


def hash_token(token: str) -> str:
    """The form the configuration keeps: ``sha256:<64 hex digits>``."""
    return _PREFIX + hashlib.sha256(token.strip().encode()).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def check_token(token: str, what: str = "token") -> str:
    """``token`` stripped, if long enough; else :class:`InvalidInput`."""
    token = token.strip()
    if len(token) < MIN_TOKEN_LENGTH:
        raise InvalidInput(what, f"must be at least {MIN_TOKEN_LENGTH} characters")
    return token


@attrs.frozen(kw_only=True)
class TokenScope:
    """One named token and what it allows."""

    #: The name the audit log and the worker list show.
    name: str
    #: ``sha256:<hex>`` of the token.
    digest: str = attrs.field(repr=False)
    #: The namespaces it reaches; ``None``: every one.
    namespaces: frozenset[str] | None = None
    #: ``read`` (look only) or ``operate`` (trigger, cancel, resolve, pause...).
    access: Access = "operate"
    #: Worker tokens: the job types it may serve; ``None``: any.
    types: frozenset[str] | None = None

    def allows(self, namespace: str, *, operate: bool = False) -> bool:
        """Whether the holder may see (``operate``: change) ``namespace``."""
        if operate and self.access != "operate":
            return False
        return self.namespaces is None or namespace in self.namespaces

    def allows_type(self, job_type: str) -> bool:
        return self.types is None or job_type in self.types

    @property
    def everything(self) -> bool:
        """Every namespace, operate: the scope of the single admin token."""
        return self.namespaces is None and self.access == "operate"

    def describe(self) -> str:
        """``billing, reports (read)`` / ``every namespace (operate)``."""
        where = "every namespace" if self.namespaces is None else ", ".join(sorted(self.namespaces))
        return f"{where} ({self.access})"


@attrs.frozen
class TokenSet:
    """The configured tokens, found by the token a caller sends."""

    scopes: tuple[TokenScope, ...] = ()
    _by_digest: Mapping[str, TokenScope] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        by_digest: dict[str, TokenScope] = {}
        for scope in self.scopes:
            if scope.digest in by_digest:
                raise ConfigError(
                    f"tokens {by_digest[scope.digest].name!r} and {scope.name!r} have the "
                    "same hash: give each its own token"
                )
            by_digest[scope.digest] = scope
        object.__setattr__(self, "_by_digest", by_digest)

    def __bool__(self) -> bool:
        return bool(self.scopes)

    def find(self, token: str | bytes | None) -> TokenScope | None:
        """The scope of ``token``, or ``None`` for an unknown (or missing) one."""
        if not token:
            return None
        text = token.decode("utf-8", "replace") if isinstance(token, bytes) else token
        digest = hash_token(text)
        scope = self._by_digest.get(digest)
        if scope is None or not hmac.compare_digest(scope.digest, digest):
            return None
        return scope

    def named(self, name: str) -> TokenScope | None:
        return next((s for s in self.scopes if s.name == name), None)

    def with_scope(self, scope: TokenScope) -> TokenSet:
        return TokenSet((*self.scopes, scope))


_ADMIN_KEYS: Final = ("hash", "namespaces", "access")
_WORKER_KEYS: Final = ("hash", "namespaces", "types")


def parse_tokens(value: Any, setting: str, *, kind: Literal["admin", "worker"]) -> TokenSet:
    """The ``admin_tokens``/``worker_tokens`` setting: a TOML table of tables (or, from
    the environment, the same as a JSON object). Errors name the setting and the token."""
    if isinstance(value, str) and not setting.startswith("COORDINATOR_"):
        # A TOML file (or code) gives a table; only the environment gives JSON text.
        raise ConfigError(f"{setting}: expected a table of named tokens, got a string")
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError as exc:
            raise ConfigError(f"{setting}: expected a JSON object of tokens: {exc}") from None
    if isinstance(value, TokenSet):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"{setting}: expected a table of named tokens, got {value!r}")
    known = _ADMIN_KEYS if kind == "admin" else _WORKER_KEYS
    scopes = []
    for name, raw in value.items():
        where = f"{setting}.{name}"
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{where}: expected a table (hash, namespaces, ...)")
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(known)})")
        digest = raw.get("hash")
        if not isinstance(digest, str) or not _is_digest(digest):
            raise ConfigError(
                f"{where}.hash: expected sha256:<64 hex digits> (coordinator token hash)"
            )
        namespaces = _names(raw.get("namespaces"), f"{where}.namespaces", namespace=True)
        if namespaces is not None and not namespaces:
            raise ConfigError(f'{where}.namespaces: list at least one namespace, or "*"')
        access: Access = "operate"
        types = None
        if kind == "admin":
            given = raw.get("access", "read")
            if given not in ("read", "operate"):
                raise ConfigError(f"{where}.access: must be read or operate, not {given!r}")
            access = given
        else:
            types = _names(raw.get("types", [ALL]), f"{where}.types", namespace=False)
            if types is not None and not types:
                # (Accepted, it was shown as `types *` and refused every type.)
                raise ConfigError(f'{where}.types: list at least one job type, or "*"')
        scopes.append(
            TokenScope(
                name=str(name),
                digest=digest.lower(),
                namespaces=namespaces,
                access=access,
                types=types,
            )
        )
    return TokenSet(tuple(scopes))


def _is_digest(text: str) -> bool:
    hexdigits = text[len(_PREFIX) :]
    return (
        text.lower().startswith(_PREFIX)
        and len(hexdigits) == 64
        and all(c in "0123456789abcdefABCDEF" for c in hexdigits)
    )


def _names(value: Any, where: str, *, namespace: bool) -> frozenset[str] | None:
    if value is None:
        raise ConfigError(f'{where}: required (a list, or ["*"] for every one)')
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ConfigError(f"{where}: expected a list of names, got {value!r}")
    names = list(value)
    if ALL in names:
        return None
    for item in names:
        if not isinstance(item, str) or not item:
            raise ConfigError(f"{where}: expected names, got {item!r}")
        if namespace:
            try:
                check_namespace(item, where)
            except InvalidInput as exc:
                raise ConfigError(str(exc)) from None
    return frozenset(names)


def single(token: str, *, name: str = "admin") -> TokenScope:
    """The scope of the single, all-powerful ``admin_token``: every namespace, operate."""
    return TokenScope(name=name, digest=hash_token(token), namespaces=None, access="operate")
