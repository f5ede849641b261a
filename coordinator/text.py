"""Names and printable text: what a namespace or a job may be called, and how any other
text (errors, outputs, names already stored) is made safe for a terminal or a log line.

The rules are the database's too (``migrations/0005_front_doors.sql``), so a name the
front doors accept is one PostgreSQL stores, and a name they refuse gets one clear line
here instead of a constraint violation there.

* namespace: 1 to 63 characters, letters, digits, ``.``, ``_`` and ``-``, starting with a
  letter or a digit (``^[A-Za-z0-9][A-Za-z0-9._-]*$``);
* job name: 1 to 200 characters, no control character (:data:`CONTROL`), no whitespace
  at either end. Anything else is allowed, ``/`` and markup included.

Control characters are C0 (U+0000-U+001F), DEL (U+007F), C1 (U+0080-U+009F) and the
line and paragraph separators U+2028/U+2029: each can end a line or drive a terminal.
"""

from __future__ import annotations

import re
from typing import Final

from .errors import InvalidInput

__all__ = [
    "CONTROL",
    "NAMESPACE_MAX",
    "NAME_MAX",
    "check_job_name",
    "check_namespace",
    "printable",
]

#: One control character (see the module docstring).
CONTROL: Final = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
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
    ``\\u2028``): one line, nothing a terminal acts on. Other text is unchanged."""
    return CONTROL.sub(_escape, text)


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
