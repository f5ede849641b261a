"""Sign-in sessions of the web page, and their CSRF tokens.

The page signs in with an admin token once, through a form; the answer sets a session
cookie (``HttpOnly``, ``SameSite=Strict``, ``Secure`` over HTTPS), so the token itself is
never in a URL, in page source, or in the cookie. A session is stateless and signed:
``v1.<expires>.<nonce>.<mac>``, the MAC an HMAC-SHA256 under a key derived from the
token ``make_app(token=...)`` is given (an embedding's single token: sessions survive a
restart and die with a token change) or else from a random key of the process, as the
service does (it passes every token as a named scope, whose hashes are no secret):
sessions end with the process, and so do sign-outs, which are kept in memory only. The nonce names
the token the session signed in with (``<random>~<name>``, the name base64url-encoded),
so the page shows only what that token may see (:mod:`coordinator.admin.access`).
Signing out revokes the session's nonce in memory (until it would have expired anyway).

Every POST of the page carries a CSRF token bound to its session (an HMAC of the nonce
under another derived key); the sign-in form's token is bound to a short-lived
pre-session cookie the same way. Comparisons are constant-time.

Pure apart from :mod:`secrets`: the clock is passed in (seconds since the epoch).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from typing import Final

import attrs

#: Session cookie (signed in) and pre-session cookie (the sign-in form).
SESSION_COOKIE: Final = "coordinator_session"
PRESESSION_COOKIE: Final = "coordinator_signin"
#: Seconds a session lasts, and a sign-in form stays valid.
SESSION_SECONDS: Final = 12 * 3600
PRESESSION_SECONDS: Final = 3600
#: Revoked nonces remembered at most (the oldest are forgotten first).
MAX_REVOKED: Final = 10_000


def _key(token: str, purpose: str) -> bytes:
    return hmac.new(token.encode(), f"coordinator-web:{purpose}".encode(), hashlib.sha256).digest()


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


@attrs.define(eq=False)
class Sessions:
    """Issues and checks session cookies and CSRF tokens for one admin token."""

    _session_key: bytes
    _csrf_key: bytes
    _revoked: dict[str, int] = attrs.field(factory=dict)

    @classmethod
    def for_token(cls, token: str) -> Sessions:
        return cls(_key(token, "session"), _key(token, "csrf"))

    @classmethod
    def random(cls) -> Sessions:
        """Keys of this process only (no secret token to derive them from)."""
        return cls.for_token(secrets.token_urlsafe(32))

    # -- sessions -----------------------------------------------------------------------

    def issue(
        self,
        now: float,
        *,
        kind: str = "s",
        lifetime: int = SESSION_SECONDS,
        holder: str | None = None,
    ) -> str:
        """A new signed value (``kind`` ``s`` for a session, ``p`` for a sign-in form);
        ``holder``: the name of the token that signed in (see :func:`holder`)."""
        nonce = secrets.token_urlsafe(18)
        if holder is not None:
            nonce += "~" + base64.urlsafe_b64encode(holder.encode()).decode().rstrip("=")
        body = f"v1{kind}.{int(now) + lifetime}.{nonce}"
        return f"{body}.{_mac(self._session_key, body)}"

    def nonce(self, value: str | None, now: float, *, kind: str = "s") -> str | None:
        """The nonce of a valid, unexpired, unrevoked ``value``, else ``None``."""
        if not value or len(value) > 400:
            return None
        body, _, mac = value.rpartition(".")
        parts = body.split(".")
        if len(parts) != 3 or parts[0] != f"v1{kind}" or not parts[1].isdigit():
            return None
        if not hmac.compare_digest(mac, _mac(self._session_key, body)):
            return None
        if int(parts[1]) <= now or parts[2] in self._revoked:
            return None
        return parts[2]

    def revoke(self, value: str | None, now: float) -> None:
        """Sign out: the session stops working at once."""
        nonce = self.nonce(value, now)
        if nonce is None:
            return
        self._revoked = {n: t for n, t in self._revoked.items() if t > now}
        while len(self._revoked) >= MAX_REVOKED:
            self._revoked.pop(next(iter(self._revoked)))
        self._revoked[nonce] = int(value.split(".")[1]) if value else int(now)

    # -- CSRF ---------------------------------------------------------------------------

    def csrf(self, nonce: str) -> str:
        """The CSRF token of the session (or pre-session) with ``nonce``."""
        return _mac(self._csrf_key, nonce)

    def csrf_ok(self, nonce: str | None, token: str | None) -> bool:
        if not nonce or not token:
            return False
        return hmac.compare_digest(token.encode(), self.csrf(nonce).encode())


def holder(nonce: str | None) -> str | None:
    """The token name a session's nonce carries (``None``: none, or not readable)."""
    if not nonce or "~" not in nonce:
        return None
    encoded = nonce.rsplit("~", 1)[1]
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def token_matches(given: str, token: str) -> bool:
    """The sign-in form's token is the admin token (constant time)."""
    return hmac.compare_digest(given.strip().encode(), token.encode())


__all__ = [
    "PRESESSION_COOKIE",
    "PRESESSION_SECONDS",
    "SESSION_COOKIE",
    "SESSION_SECONDS",
    "Sessions",
    "holder",
    "token_matches",
]
