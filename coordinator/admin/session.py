"""Sign-in sessions of the web page, and their CSRF tokens.

The page signs in with an admin token once, through a form; the answer sets a session
cookie (``HttpOnly``, ``SameSite=Strict``, ``Secure`` over HTTPS), so the token itself is
never in a URL, in page source, or in the cookie. A session is stateless and signed:
``v1.<expires>.<nonce>.<mac>``, the MAC an HMAC-SHA256 under a key derived from the
token ``make_app(token=...)`` is given (an embedding's single token: sessions survive a
restart and die with a token change), or from a random key of the process, or, as the
service does (it passes every token as a named scope, whose hashes are no secret), from
a random key kept in its state directory (:meth:`Sessions.kept_in`: ``web-session.key``,
readable by its owner only), so that a restart of the daemon signs nobody out. The
nonce names the token the session signed in with (``<random>~<name>``, the name
base64url-encoded), so the page shows only what that token may see
(:mod:`coordinator.admin.access`); with a kept key the MAC also covers that token's hash
and scope as configured, so a session ends when its token is removed, replaced or given
another scope, restart or not. Signing out revokes the session's nonce (until it would
have expired anyway): in memory, and with a kept key in ``web-signouts.jsonl`` beside
it too, so that a sign-out outlives a restart as the session would have.

Every POST of the page carries a CSRF token bound to its session (an HMAC of the nonce
under another derived key); the sign-in form's token is bound to a short-lived
pre-session cookie the same way. Comparisons are constant-time.

Pure apart from :mod:`secrets` and those two files: the clock is passed in (seconds
since the epoch).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs

from ..files import make_state_dir, private_text, write_private

if TYPE_CHECKING:
    from ..tokens import TokenSet

#: Session cookie (signed in) and pre-session cookie (the sign-in form).
SESSION_COOKIE: Final = "coordinator_session"
PRESESSION_COOKIE: Final = "coordinator_signin"
#: Seconds a session lasts, and a sign-in form stays valid.
SESSION_SECONDS: Final = 12 * 3600
PRESESSION_SECONDS: Final = 3600
#: The longest signed value read (a cookie holds about 4 KB; a token's name is in it).
MAX_VALUE: Final = 3500
#: Revoked nonces remembered at most (the oldest are forgotten first).
MAX_REVOKED: Final = 10_000
#: The kept key and sign-outs (:meth:`Sessions.kept_in`), in the daemon's state directory.
KEY_FILE: Final = "web-session.key"
SIGNOUTS_FILE: Final = "web-signouts.jsonl"


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
    #: What a session of a token (by name) is bound to besides the key: its hash and
    #: scope as configured (``None``: no such token now, no session of it is valid).
    _binding: Callable[[str | None], str | None] = attrs.field(default=lambda _name: "")
    #: Where sign-outs are written too (:meth:`kept_in`), and the lines it holds.
    _signouts: Path | None = None
    _signout_lines: int = 0
    #: Its last line has no end (a crash mid-write): the next one starts on a new line.
    _torn: bool = False
    #: Told why a sign-out could not be kept (the daemon logs it); it holds in memory.
    _warn: Callable[[str], None] | None = None

    @classmethod
    def for_token(cls, token: str) -> Sessions:
        return cls(_key(token, "session"), _key(token, "csrf"))

    @classmethod
    def random(cls) -> Sessions:
        """Keys of this process only (no secret token to derive them from)."""
        return cls.for_token(secrets.token_urlsafe(32))

    @classmethod
    def kept_in(
        cls,
        directory: Path,
        binding: Callable[[str | None], str | None],
        warn: Callable[[str], None] | None = None,
    ) -> Sessions:
        """Keys from a random secret kept in ``directory`` (made on first use, readable by
        its owner only), sessions bound to their token's ``binding``, sign-outs written
        there too: both outlive a restart. ``OSError`` if the directory will not do;
        ``warn`` is told of a sign-out it could not keep (it holds until a restart)."""
        secret = _kept_secret(directory / KEY_FILE)
        sessions = cls(
            _key(secret, "session"),
            _key(secret, "csrf"),
            binding=binding,
            signouts=directory / SIGNOUTS_FILE,
            warn=warn,
        )
        sessions._read_signouts()
        return sessions

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
        mac = self._sign(body, nonce)
        if mac is None:
            raise ValueError(f"no token named {holder!r} to bind a session to")
        if len(body) + 65 > MAX_VALUE:
            raise ValueError(f"the token's name is too long for a session cookie: {holder!r}")
        return f"{body}.{mac}"

    def _sign(self, body: str, nonce: str) -> str | None:
        """The MAC of ``body``, bound to its holder's token (``None``: none is there).
        (``|`` separates the two: neither a body nor a nonce ever holds one.)"""
        name = holder(nonce)
        if "|" in nonce or (name is None and "~" in nonce):
            return None  # (not issued here: a holder that does not decode names nobody)
        bound = self._binding(name)
        return None if bound is None else _mac(self._session_key, f"{body}|{bound}")

    def nonce(self, value: str | None, now: float, *, kind: str = "s") -> str | None:
        """The nonce of a valid, unexpired, unrevoked ``value``, else ``None``."""
        if not value or len(value) > MAX_VALUE:
            return None
        body, _, mac = value.rpartition(".")
        parts = body.split(".")
        if len(parts) != 3 or parts[0] != f"v1{kind}" or not parts[1].isdigit():
            return None
        expected = self._sign(body, parts[2])
        if expected is None or not hmac.compare_digest(mac, expected):
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
        until = int(value.split(".")[1]) if value else int(now)
        self._revoked[nonce] = until
        self._write_signout(nonce, until)

    # -- kept sign-outs -------------------------------------------------------------------

    def _read_signouts(self) -> None:
        """The sign-outs kept; a line that does not read is skipped (a torn last line,
        or garbage: a housekeeping file never stops the page)."""
        if self._signouts is None:
            return
        try:
            data = self._signouts.read_bytes()
        except FileNotFoundError:
            return
        lines = data.decode(errors="replace").splitlines()
        for line in lines[-MAX_REVOKED:]:
            try:
                entry = json.loads(line)
                self._revoked[str(entry["nonce"])] = int(entry["until"])
            except Exception:
                continue
        self._signout_lines = len(lines)
        self._torn = bool(data) and not data.endswith(b"\n")

    def _write_signout(self, nonce: str, until: int) -> None:
        """Append the sign-out; rewrite the file whole (only the sign-outs not expired)
        once it holds twice as many lines as those."""
        if self._signouts is None:
            return
        try:
            if self._signout_lines > 2 * len(self._revoked) + 100:
                text = "".join(
                    json.dumps({"nonce": n, "until": t}) + "\n" for n, t in self._revoked.items()
                )
                write_private(self._signouts, text)
                self._signout_lines, self._torn = len(self._revoked), False
                return
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
            with os.fdopen(os.open(self._signouts, flags, 0o600), "a") as file:
                line = json.dumps({"nonce": nonce, "until": until}) + "\n"
                file.write("\n" + line if self._torn else line)
                file.flush()
                os.fsync(file.fileno())
            self._signout_lines, self._torn = self._signout_lines + 1, False
        except OSError as exc:
            # (Disk full, a file another user owns: the sign-out holds in this process,
            # not across its restart. The person is signed out either way.)
            if self._warn is not None:
                self._warn(f"a sign-out is kept in memory only, until a restart: {exc}")

    # -- CSRF ---------------------------------------------------------------------------

    def csrf(self, nonce: str) -> str:
        """The CSRF token of the session (or pre-session) with ``nonce``."""
        return _mac(self._csrf_key, nonce)

    def csrf_ok(self, nonce: str | None, token: str | None) -> bool:
        if not nonce or not token:
            return False
        return hmac.compare_digest(token.encode(), self.csrf(nonce).encode())

    # -- notes after an action ------------------------------------------------------------

    def note_mark(self, nonce: str, note: str) -> str:
        """The mark of a note an action of the session with ``nonce`` answered. A plain
        form post is answered by a redirect with the note in the address; the page shows
        it only with its mark, so that a link someone sends cannot make the page say
        what they wrote ("your token expired, sign in at ...")."""
        return _mac(self._csrf_key, f"note:{nonce}:{note}")[:32]

    def note_ok(self, nonce: str | None, note: str | None, mark: str | None) -> bool:
        if not nonce or not note or not mark:
            return False
        return hmac.compare_digest(mark.encode(), self.note_mark(nonce, note).encode())


def _kept_secret(path: Path) -> str:
    """The secret kept in ``path``; made (at random) if there is none, or none only its
    owner may read (a key another user could read, or have put there, is no secret)."""
    secret = (private_text(path) or "").strip()
    if len(secret) >= 32:
        return secret
    secret = secrets.token_urlsafe(32)
    make_state_dir(path.parent)
    write_private(path, secret + "\n")
    return secret


def bound_to(tokens: TokenSet) -> Callable[[str | None], str | None]:
    """A session's binding for :meth:`Sessions.kept_in`: its token's hash and scope as
    ``tokens`` configure them now (``None`` for a token no longer there; ``""`` for a
    sign-in form's pre-session, which names none)."""

    def binding(name: str | None) -> str | None:
        if name is None:
            return ""
        scope = tokens.named(name)
        if scope is None:
            return None
        where = "*" if scope.namespaces is None else ",".join(sorted(scope.namespaces))
        return f"{scope.digest}|{scope.access}|{where}"

    return binding


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
    "bound_to",
    "holder",
    "token_matches",
]
