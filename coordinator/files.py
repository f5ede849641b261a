"""Small files kept beside the daemon's state: written whole, readable by their owner only.

The web page's session key and sign-outs (:mod:`coordinator.admin.session`) and a
demo's ``demo.json`` (:mod:`coordinator.demo`) hold secrets, and a reader must never see
half of one. Each is written to a new temporary file in the same directory (created
exclusively, mode 0600, so nothing already there, a link included, is written through),
flushed to disk, and renamed over the old one.

Layering: stdlib only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


#: The mode of a state directory made here: others may pass through it (the embedded
#: PostgreSQL's user reaches its data below it), not list or write it.
STATE_DIR_MODE = 0o711
#: In a state directory: the ``flock`` its daemon holds, with that daemon's pid.
DAEMON_LOCK = "daemon.lock"


class StateDirInUse(Exception):
    """Another daemon holds the state directory (:func:`hold_state_dir`)."""


def hold_state_dir(state_dir: Path) -> int:
    """Hold ``state_dir`` for this daemon for as long as the returned descriptor is open
    (an exclusive ``flock`` on its :data:`DAEMON_LOCK`, which the kernel drops however
    the process ends), or raise :class:`StateDirInUse` naming the daemon that holds it.

    Two daemons sharing one state directory share its spool, alert outbox and command
    ledger: a tester's same-host pair sent an alert twice (both resumed one outbox), and
    either could clear the other's spool."""
    make_state_dir(state_dir)
    path = state_dir / DAEMON_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StateDirInUse(
            f"state directory {state_dir} is in use by another daemon (pid {holder}): give "
            "each daemon a state directory of its own (state_dir, COORDINATOR_STATE_DIR)"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def make_state_dir(path: Path) -> None:
    """Create ``path`` and its missing parents 0711 (an existing directory is kept as it
    is: the operator may have chosen its mode). ``mkdir(parents=True)`` gave the parents
    the umask's 0755: a state directory removed while the daemon ran came back so."""
    if path.is_dir():
        return
    missing = [path]
    while not missing[-1].parent.exists() and missing[-1].parent != missing[-1]:
        missing.append(missing[-1].parent)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=STATE_DIR_MODE)
            os.chmod(directory, STATE_DIR_MODE)  # (mkdir's mode is narrowed by the umask)


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``, readable by its owner only (``OSError`` if the
    directory will not do; nothing is left behind then)."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def private_text(path: Path) -> str | None:
    """The text of ``path`` if it is a regular file only its owner may read or write (not
    a link); None otherwise (absent, shared, or not text): a secret another user could
    read, or have put there, is no secret."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # (a FIFO: no wait)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        status = os.fstat(file.fileno())
        if not _private(status.st_mode, status.st_uid):
            return None
        try:
            return file.read().decode()
        except UnicodeDecodeError:
            return None


def _private(mode: int, uid: int) -> bool:
    import stat

    return stat.S_ISREG(mode) and mode & 0o077 == 0 and uid == os.geteuid()


__all__ = ["private_text", "write_private"]
