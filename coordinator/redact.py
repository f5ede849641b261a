"""Redaction: secrets are replaced with ``[redacted]`` before anything is stored, logged,
alerted or served.

A job's output, a worker's report, an error message or an application's arguments may
carry a secret by accident (``password=hunter2`` in a failing command's stderr, an
``Authorization: Bearer ...`` header in a traceback, a DSN with its password). Once in
``coordinator.runs`` it would be backed up, served by the admin API and the web page,
mailed in an alert and kept for the retention period. So the few places where text from
outside enters are made to pass through one :class:`Redactor`:

* the settlement (:class:`~coordinator.spool.HeldResult` is built from a redacted
  :class:`~coordinator.model.Outcome`: the database, the spool and the run's events see
  only that), progress snapshots and findings before they are written (a recoverable
  run's cursor is its resume state, kept as given);
* the event log (:class:`~coordinator.log.EventLog`: every field of every line);
* the Python front doors (``client.define_job``/``sync``/``trigger``: ``params`` and
  ``args``) and the API's serializers (``JobView``/``RunView``: what the admin API, the
  web page and ``--json`` serve, whoever wrote the row);
* worker declarations (their ``params``);
* alerts (#16): :func:`coordinator.alerts.message.render` applies :meth:`Redactor.text`
  of the rules in force to an alert's error text (``service.build_daemon`` wires it).

The rules (:data:`DEFAULT_KEYS`, :func:`Redactor.text`):

1. **Keys that look secret.** In a JSON object (args, params, extra, progress), the value
   of a key is replaced, whatever its type, when one of the key's words is a secret word:
   the key is split into words at ``_``, ``-``, ``.``, spaces and camelCase humps
   (``dbPassword`` -> ``db password``, ``X-Api-Key`` -> ``x api key``), and a secret word
   (``password``, ``passwd``, ``pwd``, ``secret``, ``token``, ``api_key``/``apikey``,
   ``authorization``, ``auth``, ``credential(s)``, ``private_key``, ``access_key``,
   ``cookie``, ``session``; more with the ``redact_keys`` setting) is a run of words.
   ``max_tokens`` and ``tokenizer`` are not secret (``tokens`` is not ``token``); nor is
   a key whose last word, after the secret word, names where the secret is or a fact
   about it (:data:`REFERENCE_WORDS`: ``password_file``, ``token_count``).
2. **Passwords in URLs.** ``scheme://user:password@host`` keeps the user:
   ``scheme://user:[redacted]@host``.
3. **Credentials in headers.** ``Authorization: <scheme> <credentials>`` keeps the
   scheme word (``Bearer``, ``Basic``, ``Token``...); ``Bearer <credentials>`` and
   ``Basic <credentials>`` are redacted wherever they appear.
4. **key=value in text.** ``password=hunter2``, ``DB_PASSWORD: x``, ``"api_key": "x"``,
   ``--token x``: a word containing a secret word, then ``=``, ``:`` or a space after a
   ``--`` option, then a value (quoted, or up to the next space, comma, semicolon or
   ``&``). Unlike rule 1, a secret word anywhere inside the key's word counts here
   (free text has no structure to trust, so it errs towards redacting).
5. **Configured patterns** (``redact_patterns``): every match of each regular expression
   is replaced (only its ``secret`` named group, when it has one).

Strings anywhere in a JSON value get rules 2-5; rule 1 applies to object keys, and, in a
list (a command's argv), to an option naming a secret (``--password``, ``-api-key``):
the string after it is replaced, as rule 4 reads ``--key value`` in text. Redacting
is idempotent: ``[redacted]`` is never itself redacted further into something else.

Layering: a value module (stdlib, :mod:`coordinator.errors`); the worker SDK does not
use it (the daemon redacts what a worker reports).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Protocol, TypeVar

import attrs

from .errors import ConfigError
from .text import TRUNCATED, printable


class _OutcomeLike(Protocol):
    """What :meth:`Redactor.outcome` reads (a :class:`~coordinator.model.Outcome`: named
    structurally, so the worker SDK, which loads this module, need not load the model)."""

    @property
    def extra(self) -> Mapping[str, Any]: ...

    @property
    def error_message(self) -> str | None: ...


_O = TypeVar("_O", bound=_OutcomeLike)


class _FindingLike(Protocol):
    """What :meth:`Redactor.findings` reads (a :class:`~coordinator.model.Finding`)."""

    @property
    def detail(self) -> Mapping[str, Any]: ...


_F = TypeVar("_F", bound=_FindingLike)
_V = TypeVar("_V")

__all__ = [
    "DEFAULT_KEYS",
    "REDACTED",
    "REFERENCE_WORDS",
    "SAFE_REASON_LIMIT",
    "Redactor",
    "default",
    "install",
]

#: What a secret is replaced with.
REDACTED: Final = "[redacted]"
#: Longest reason shown to people (:meth:`Redactor.safe_reason`).
SAFE_REASON_LIMIT: Final = 300

#: Secret words, as runs of key words (``api_key`` is the run ``api``, ``key``).
DEFAULT_KEYS: Final[tuple[str, ...]] = (
    "password",
    "passwd",
    "pwd",
    "passphrase",
    "secret",
    "token",
    "api_key",
    "apikey",
    "authorization",
    "auth",
    "credential",
    "credentials",
    "private_key",
    "access_key",
    "cookie",
    "session",
    "signature",
)

#: Last words that make a key name a reference to a secret or a fact about one, not the
#: secret itself (``password_file``, ``token_count``, ``auth_method``, ``cookie_policy``,
#: ``private_key_path``): rule 1 leaves such a key's value alone. Its value is an input
#: a job needs (a front door stores args and params redacted: ``password_file`` was
#: stored as ``[redacted]``, the very reference secrets are to be passed by). ``id`` is
#: not among them: a ``session_id`` is a credential.
REFERENCE_WORDS: Final = frozenset(
    {
        "file", "files", "path", "paths", "dir", "directory", "env", "var", "variable",
        "ref", "reference", "name", "names", "count", "length", "size", "method",
        "methods", "policy", "type", "kind", "mode", "format", "required", "enabled",
        "url", "uri", "endpoint", "ttl", "expiry", "expires", "lifetime",
    }
)  # fmt: skip

#: A key's words: split at separators, then at camelCase humps.
_SEPARATORS: Final = re.compile(r"[\s_.\-:/]+")
_HUMPS: Final = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")

#: Rule 2: the password of a URL's userinfo (``//user:password@``).
_URL_PASSWORD: Final = re.compile(
    r"(?P<head>(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@?#]*:)[^\s@/?#]+(?=@)"
)
#: Rule 3: an ``Authorization`` header's credentials (its scheme word kept), and
#: ``Bearer``/``Basic`` credentials anywhere.
_AUTH_HEADER: Final = re.compile(
    r"(?P<head>\bauthorization[\"']?\s*[:=]\s*[\"']?(?:[A-Za-z][\w\-]*\s+)?)"
    # (Not again: neither the credentials already redacted, nor, once the scheme is taken
    # back, the scheme before them: redacting stays idempotent.)
    r"(?!\[redacted\])(?![A-Za-z][\w\-]*\s+\[redacted\])[^\s\"',;]+",
    re.IGNORECASE,
)
_AUTH_SCHEME: Final = re.compile(
    r"(?P<head>\b(?:Bearer|Basic)\s+)(?!\[redacted\])[A-Za-z0-9._~+/=\-]+", re.IGNORECASE
)


def _words(key: str) -> list[str]:
    parts: list[str] = []
    for piece in _SEPARATORS.split(key):
        parts.extend(p.lower() for p in _HUMPS.split(piece) if p)
    return parts


def _runs(words: Iterable[str]) -> tuple[tuple[str, ...], ...]:
    runs = []
    for word in words:
        run = tuple(_words(word))
        if not run:
            raise ConfigError(f"redact_keys: {word!r} has no letters or digits")
        runs.append(run)
    return tuple(runs)


#: Texts up to this long are remembered once redacted, at most _MEMO_SIZE of them per
#: kind (then the memo starts over): bounded memory, and the repeats are what is short.
_MEMO_TEXT = 200
_MEMO_SIZE = 4096


def _remember(memo: dict[str, _V], key: str, value: _V) -> None:
    if len(memo) >= _MEMO_SIZE:
        memo.clear()
    memo[key] = value


@attrs.frozen(kw_only=True)
class Redactor:
    """The redaction rules in force (the module docstring lists them)."""

    #: Secret words added to :data:`DEFAULT_KEYS` (the ``redact_keys`` setting).
    keys: tuple[str, ...] = ()
    #: Regular expressions whose matches are redacted (the ``redact_patterns`` setting).
    patterns: tuple[str, ...] = ()
    _runs: tuple[tuple[str, ...], ...] = attrs.field(init=False, repr=False)
    _key_value: re.Pattern[str] = attrs.field(init=False, repr=False)
    #: Lower-case fragments one of which any text that rules 2-4 act on contains (a
    #: substring test per fragment is far cheaper than the rules: most text has none).
    _needles: tuple[str, ...] = attrs.field(init=False, repr=False)
    _compiled: tuple[re.Pattern[str], ...] = attrs.field(init=False, repr=False)
    #: Answers already worked out (the rules are fixed per instance): the same keys and
    #: short texts -- field names, job keys, statuses -- come back run after run.
    _key_memo: dict[str, bool] = attrs.field(init=False, repr=False, eq=False, factory=dict)
    _text_memo: dict[str, str] = attrs.field(init=False, repr=False, eq=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        words = (*DEFAULT_KEYS, *self.keys)
        object.__setattr__(self, "_runs", _runs(words))
        alternatives = sorted(
            {"[\\W_]*".join(re.escape(w) for w in run) for run in self._runs}, key=len, reverse=True
        )
        secret = "|".join(alternatives)
        # Rule 4: a word ending in a secret word (or in one followed by more words:
        # DB_PASSWORD, dbPassword, access_token, x-api-key.old), then "=" or ":" -- or a
        # --option and a space -- then a value: quoted, or up to a space, comma,
        # semicolon, ampersand or quote. An authentication scheme in front of the value
        # (Authorization: Bearer x) is left to rule 3.
        key = r"[\w.\-]*?(?:" + secret + r")(?:[_.\-][\w.\-]*)?"
        value = r"(?![^\s,;&\"']+\s+\[redacted\])(?!\[redacted\])"
        value += r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s,;&\"']+)"
        object.__setattr__(
            self,
            "_key_value",
            re.compile(
                r"(?P<head>(?<![\w.\-])(?:" + key + r"[\"']?\s*[=:]\s*|--" + key + r"\s+))" + value,
                re.IGNORECASE,
            ),
        )
        needles = {"://", "bearer", "basic", "authorization"} | {run[0] for run in self._runs}
        object.__setattr__(self, "_needles", tuple(sorted(needles)))
        compiled = []
        for pattern in self.patterns:
            try:
                compiled.append(re.compile(pattern))
            except re.error as exc:
                raise ConfigError(f"redact_patterns: {pattern!r}: {exc}") from None
        object.__setattr__(self, "_compiled", tuple(compiled))

    # -- keys ---------------------------------------------------------------------------

    def secret_key(self, key: str) -> bool:
        """Whether the value under ``key`` is a secret (rule 1)."""
        known = self._key_memo.get(key)
        if known is not None:
            return known
        words = _words(key)
        # (A secret word followed by a reference word names where the secret is, or a
        # fact about it: not a secret. One ending the key, or followed by other words --
        # db_password, password_old -- is.)
        referred = bool(words) and words[-1] in REFERENCE_WORDS
        found = any(
            tuple(words[i : i + len(run)]) == run and not (referred and i + len(run) < len(words))
            for run in self._runs
            for i in range(len(words) - len(run) + 1)
        )
        _remember(self._key_memo, key, found)
        return found

    # -- text ---------------------------------------------------------------------------

    def text(self, value: str) -> str:
        """``value`` with rules 2-5 applied."""
        if not value:
            return value
        known = self._text_memo.get(value)
        if known is not None:
            return known
        out = self._apply(value)
        if len(value) <= _MEMO_TEXT:
            _remember(self._text_memo, value, out)
        return out

    def _apply(self, value: str) -> str:
        out = value
        lowered = value.lower()
        if any(needle in lowered for needle in self._needles):
            out = _URL_PASSWORD.sub(lambda m: m["head"] + REDACTED, out)
            out = _AUTH_HEADER.sub(lambda m: m["head"] + REDACTED, out)
            out = _AUTH_SCHEME.sub(lambda m: m["head"] + REDACTED, out)
            out = self._key_value.sub(self._key_value_sub, out)
        for pattern in self._compiled:
            out = pattern.sub(_pattern_sub, out)
        return out

    @staticmethod
    def _key_value_sub(match: re.Match[str]) -> str:
        value = match["value"]
        quote = value[0] if value[:1] in ("'", '"') and len(value) >= 2 else ""
        return match["head"] + f"{quote}{REDACTED}{quote}"

    # -- JSON values ----------------------------------------------------------------------

    def value(self, value: Any) -> Any:
        """A JSON-like value with every rule applied: secret keys' values replaced,
        strings redacted; other values (numbers, booleans, null) unchanged."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {
                k: (REDACTED if isinstance(k, str) and self.secret_key(k) else self.value(v))
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            # An option naming a secret takes the next item as its value (a command's
            # argv: ["--password", "hunter2"]), as rule 4 reads ``--key value`` in text.
            out: list[Any] = []
            secret_next = False
            for item in value:
                out.append(REDACTED if secret_next and isinstance(item, str) else self.value(item))
                secret_next = isinstance(item, str) and self._secret_option(item)
            return out
        return value

    def changed(self, value: Mapping[str, Any]) -> list[str]:
        """The keys of ``value`` (dotted where nested) whose values :meth:`value` changes:
        what a front door that stores args or params redacted tells its caller it did
        not keep."""
        out: list[str] = []
        for key, item in value.items():
            if isinstance(key, str) and self.secret_key(key):
                if item != REDACTED:
                    out.append(key)
            elif isinstance(item, Mapping):
                out.extend(f"{key}.{inner}" for inner in self.changed(item))
            elif self.value(item) != item:
                out.append(str(key))
        return out

    def _secret_option(self, item: str) -> bool:
        """``--password``, ``-api-key``: an option (no ``=value`` of its own) whose name
        is a secret key."""
        return item.startswith("-") and "=" not in item and self.secret_key(item.lstrip("-"))

    def mapping(self, value: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """:meth:`value` for an optional JSON object (``None`` stays ``None``)."""
        if value is None:
            return None
        out: dict[str, Any] = self.value(value)
        return out

    def optional(self, value: str | None) -> str | None:
        """:meth:`text` for an optional string."""
        return None if value is None else self.text(value)

    def outcome(self, outcome: _O) -> _O:
        """A call's outcome as it may be kept: ``extra`` (output tails, a worker's report,
        progress) and ``error_message`` redacted. The same object when nothing changed."""
        extra = self.value(dict(outcome.extra))
        message = self.optional(outcome.error_message)
        found: tuple[Any, ...] = tuple(getattr(outcome, "findings", ()))
        clean = self.findings(found)
        if extra == dict(outcome.extra) and message == outcome.error_message and clean == found:
            return outcome
        changes: dict[str, Any] = {"extra": extra, "error_message": message}
        if found:
            changes["findings"] = clean
        changed: _O = attrs.evolve(outcome, **changes)  # type: ignore[misc]
        return changed

    def findings(self, findings: Sequence[_F]) -> tuple[_F, ...]:
        """Findings with their ``detail`` redacted (a recoverable run's reports)."""
        out = []
        for finding in findings:
            detail = self.value(dict(finding.detail))
            same = detail == dict(finding.detail)
            out.append(finding if same else attrs.evolve(finding, detail=detail))  # type: ignore[misc]
        return tuple(out)

    def fields(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """A log line's or an event's fields, each value redacted (a field whose name is
        secret is replaced whole)."""
        return {
            k: (REDACTED if self.secret_key(k) and v is not None else self.value(v))
            for k, v in fields.items()
        }

    def safe_reason(self, text: str | None, limit: int = SAFE_REASON_LIMIT) -> str | None:
        """A reason to show people: redacted, on one line (control characters escaped),
        at most ``limit`` characters (seed 004's bounded, redaction-safe reason)."""
        if text is None:
            return None
        shown = printable(self.text(text).strip())
        return shown if len(shown) <= limit else shown[: limit - 1] + TRUNCATED


def _pattern_sub(match: re.Match[str]) -> str:
    if "secret" in match.re.groupindex and match["secret"] is not None:
        start, end = match.span("secret")
        whole = match.group(0)
        offset = match.start()
        return whole[: start - offset] + REDACTED + whole[end - offset :]
    return REDACTED


_DEFAULT = Redactor()
_installed: Redactor = _DEFAULT


def default() -> Redactor:
    """The rules in force in this process: the built-in ones, or those :func:`install`
    set from the configuration at start (``redact_keys``, ``redact_patterns``)."""
    return _installed


def install(redactor: Redactor) -> None:
    """Make ``redactor`` the process's rules (the daemon and the CLI call this once,
    after reading the configuration; serializers and the log use :func:`default`)."""
    global _installed
    _installed = redactor
