"""Text that is safe to keep: bounded, storable in jsonb, and short durations in words.

Executors, the protocol and the daemon all put strings that came from outside (a
command's stderr, a worker's error, a JSON report) into PostgreSQL; they share these
helpers so the limits and repairs are the same everywhere.

Layering: stdlib only (the worker SDK imports it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from datetime import timedelta

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


__all__ = ["ERROR_MESSAGE_LIMIT", "TRUNCATED", "clip", "seconds_text", "storable"]
