"""systemd's notify protocol and watchdog, written in-house (the PyPI options are stale
or need a C build).

A message is one datagram of ``KEY=VALUE`` lines sent to ``$NOTIFY_SOCKET``: a path, or
``@name`` for an abstract socket (a leading NUL on the wire). Outside systemd every call
is a no-op. The socket is non-blocking and not inherited by command children, so a stuck
or absent receiver can neither stall the trio loop nor raise into the daemon.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

import attrs
import trio

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


@attrs.define(eq=False)
class Notifier:
    """Sends state updates (``READY=1``, ``STATUS=...``, ``STOPPING=1``) to systemd."""

    #: Where datagrams go (``"\\0name"`` for an abstract socket); None outside systemd.
    address: str | None = None
    #: Datagrams handed to the kernel.
    sent: int = 0
    #: Datagrams that could not be sent (no receiver, queue full, closed socket).
    failures: int = 0
    _sock: socket.socket | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Notifier:
        """A notifier for ``$NOTIFY_SOCKET``; inert when it is unset, empty, or not a
        path or ``@name`` (e.g. ``vsock:``, which this daemon has no use for)."""
        value = environ.get("NOTIFY_SOCKET", "")
        if value.startswith("@"):
            address = "\0" + value[1:]
        elif value.startswith("/"):
            address = value
        else:
            return cls()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        return cls(address=address, sock=sock)

    def __call__(self, message: str) -> None:
        """Send one datagram; never raises, never blocks."""
        if self._sock is None or self.address is None:
            return
        try:
            self._sock.sendto(message.encode(), self.address)
        except OSError:
            self.failures += 1
        else:
            self.sent += 1

    def close(self) -> None:
        """Release the socket; later calls are no-ops."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval(environ: Mapping[str, str] = os.environ) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings: half of ``$WATCHDOG_USEC``, or None when
    systemd asked for no watchdog or asked another process (``$WATCHDOG_PID``)."""
    try:
        usec = int(environ.get("WATCHDOG_USEC", "0"))
        pid = int(environ.get("WATCHDOG_PID") or os.getpid())
    except ValueError:
        return None
    if usec <= 0 or pid != os.getpid():
        return None
    return usec / 2e6


async def watchdog(notify: Callable[[str], None], interval: float | None) -> None:
    """Ping ``WATCHDOG=1`` every ``interval`` seconds until cancelled; return at once
    when ``interval`` is None. Runs on the trio loop itself, so a wedged loop stops the
    pings; it never touches the database. The daemon's only periodic wake-up."""
    if interval is None:
        return
    while True:
        notify("WATCHDOG=1")
        await trio.sleep(interval)
