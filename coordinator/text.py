"""Text that is safe to keep and to show: bounded, storable, printable, and names.

Executors, the protocol and the daemon all put strings that came from outside (a
command's stderr, a worker's error, a JSON report) into PostgreSQL; they share the
helpers here so the limits and repairs are the same everywhere. The name rules are the
database's too (``migrations/0005_front_doors.sql``), so a name the front doors accept
is one PostgreSQL stores, and a name they refuse gets one clear line here instead of a
constraint violation there.

* namespace: 1 to 63 characters, letters, digits, ``.``, ``_`` and ``-``, starting with a
  letter or a digit (``^[A-Za-z0-9][A-Za-z0-9._-]*$``);
* job name: 1 to 200 characters, no control character (:data:`CONTROL`), no whitespace
  at either end. Anything else is allowed, ``/`` and markup included.

Control characters are C0 (U+0000-U+001F), DEL (U+007F), C1 (U+0080-U+009F) and the
line and paragraph separators U+2028/U+2029: each can end a line or drive a terminal.
Bidirectional formatting characters (:data:`BIDI`) are allowed, but every display (the
CLI, ``top``, the web page) shows them escaped: they reorder the text around them.

Layering: stdlib and :mod:`coordinator.errors` only (the worker SDK imports it).
"""

from __future__ import annotations

import re
import unicodedata
from typing import TYPE_CHECKING, Any, Final

from .errors import InvalidInput

if TYPE_CHECKING:
    from datetime import timedelta


__all__ = [
    "BIDI",
    "CONTROL",
    "ERROR_MESSAGE_LIMIT",
    "NAMESPACE_MAX",
    "NAME_MAX",
    "TRUNCATED",
    "check_job_name",
    "check_namespace",
    "clip",
    "json_kind",
    "printable",
    "seconds_text",
    "storable",
    "unbidi",
]

#: One control character (see the module docstring).
CONTROL: Final = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: One bidirectional formatting character (ALM, LRM/RLM, the embeddings and overrides
#: U+202A-U+202E, the isolates U+2066-U+2069): allowed in names, but shown escaped, since
#: they reorder the text around them ("abc" + U+202E + "evil" reads "abclive").
BIDI: Final = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SHOWN_ESCAPED: Final = re.compile(f"{CONTROL.pattern}|{BIDI.pattern}")
NAMESPACE_MAX: Final = 63
NAME_MAX: Final = 200
_NAMESPACE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: How much of a refused value a message quotes.
_QUOTED: Final = 40
_ESCAPES: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _ESCAPES:
        return _ESCAPES[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character written as an escape (``\\n``, ``\\x1b``,
    ``\\u2028``), and every bidirectional formatting character (:data:`BIDI`): one line,
    nothing a terminal acts on, nothing that reorders what is shown. Other text is
    unchanged."""
    return _SHOWN_ESCAPED.sub(_escape, text)


def unbidi(text: str) -> str:
    """``text`` with its bidirectional formatting characters (:data:`BIDI`) written as
    escapes: what the web page shows of any text (its own escaping is HTML's)."""
    return BIDI.sub(_escape, text) if BIDI.search(text) else text


def width(text: str) -> int:
    """Terminal columns ``text`` takes: two for a wide (East Asian) character, none for a
    combining mark, one for any other (after :func:`printable`, no control is left)."""
    return sum(
        0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
        for ch in text
    )


def pad(text: str, columns: int) -> str:
    """``text`` padded with spaces to ``columns`` terminal columns (:func:`width`)."""
    return text + " " * (columns - width(text))


def _quoted(value: str) -> str:
    """``value`` for a message: quoted, cut short when long, escaped by :func:`repr` (which
    writes every control character as an escape)."""
    return repr(value if len(value) <= _QUOTED else value[: _QUOTED - 1] + "…")


def check_namespace(value: object, field: str = "namespace") -> str:
    """``value`` if it is an allowed namespace, else :class:`InvalidInput` ``(field, why)``."""
    if not isinstance(value, str) or not value:
        raise InvalidInput(field, "must be a non-empty string")
    if len(value) > NAMESPACE_MAX:
        raise InvalidInput(field, f"at most {NAMESPACE_MAX} characters, not {len(value)}")
    if _NAMESPACE.fullmatch(value) is None:
        raise InvalidInput(
            field,
            f"{_quoted(value)}: use letters, digits, '.', '_' and '-', "
            "starting with a letter or a digit",
        )
    return value


def check_job_name(value: object, field: str = "name") -> str:
    """``value`` if it is an allowed job name, else :class:`InvalidInput` ``(field, why)``."""
    if not isinstance(value, str) or not value:
        raise InvalidInput(field, "must be a non-empty string")
    if len(value) > NAME_MAX:
        raise InvalidInput(field, f"at most {NAME_MAX} characters, not {len(value)}")
    control = CONTROL.search(value)
    if control is not None:
        raise InvalidInput(
            field,
            f"{_quoted(value)}: control characters are not allowed "
            f"(U+{ord(control.group()):04X} at character {control.start() + 1})",
        )
    if value != value.strip():
        raise InvalidInput(field, f"{_quoted(value)}: must not start or end with whitespace")
    return value


#: Longest error message kept on a run (characters), whoever reported it.
ERROR_MESSAGE_LIMIT: Final = 2000
#: Appended to (or prefixed to) a text that lost part of itself.
TRUNCATED: Final = "…"


def clip(text: str, limit: int = ERROR_MESSAGE_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, marked with :data:`TRUNCATED` when cut."""
    return text if len(text) <= limit else text[:limit] + TRUNCATED


def storable(value: Any) -> Any:
    """``value`` with every string made acceptable to PostgreSQL's jsonb: NUL and
    unpaired surrogates become U+FFFD (lists and objects are repaired recursively)."""
    if isinstance(value, str):
        if "\x00" in value:
            value = value.replace("\x00", "\ufffd")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in value)
        return value
    if isinstance(value, list):
        return [storable(v) for v in value]
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    return value


def seconds_text(delta: timedelta) -> str:
    """``2`` for two seconds, ``0.5`` for half of one (as "timed out after 2s" says)."""
    seconds = delta.total_seconds()
    if seconds.is_integer():
        return str(int(seconds))
    return f"{seconds:.3f}".rstrip("0").rstrip(".")


def json_kind(value: object) -> str:
    """What a decoded JSON value is, in JSON's words (``an array``, not ``list``), for a
    refusal: the worker protocol's and the admin API's alike."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"
