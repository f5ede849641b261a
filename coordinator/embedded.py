"""A private PostgreSQL cluster made from the machine's server binaries.

Three users: the CLI's embedded default (no DSN given: a cluster under the state
directory, reachable only through a Unix socket there), the test suite and the benchmarks
(throwaway clusters whose server log records every statement with its application name).

``initdb`` and ``pg_ctl`` refuse to run as root, so as root the cluster belongs to an
unprivileged user (``postgres`` when it exists, else a system user ``coordinator`` made
for the purpose) and the commands run through ``runuser``.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import trio

from .errors import CoordinatorError

if TYPE_CHECKING:
    from .log import EventLog

INSTALL_HINT = (
    "no PostgreSQL server binaries found (initdb, pg_ctl); install them, e.g. "
    "`apt-get install -y postgresql`, put them on PATH, or give a DSN with --dsn / "
    "COORDINATOR_DSN"
)

#: The server log's line prefix: time, pid, application, database. StatementLog parses it.
LOG_LINE_PREFIX = "%m [%p] app=%a db=%d "


class NoServerBinaries(CoordinatorError):
    """initdb/pg_ctl are not on this machine."""

    exit_code = 2

    def __init__(self) -> None:
        super().__init__(INSTALL_HINT)


class ClusterError(CoordinatorError):
    """initdb or pg_ctl failed; the message carries their output's tail."""


class UnreachableDirectory(ClusterError):
    """The cluster's directory is out of the server user's reach (a bad state dir)."""

    exit_code = 2


class SocketPathTooLong(ClusterError):
    """The server's Unix socket would not fit a socket address (a deep state dir)."""

    exit_code = 2


#: Longest Unix socket path (``sun_path`` holds 108 bytes with its NUL).
SOCKET_PATH_MAX: Final = 107


def find_bin_dir(configured: Path | None = None) -> Path:
    """The directory holding ``initdb`` and ``pg_ctl``: the configured one, else PATH,
    else the newest ``/usr/lib/postgresql/*/bin``."""
    if configured is not None:
        if (configured / "initdb").exists() and (configured / "pg_ctl").exists():
            return configured
        raise NoServerBinaries()
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).resolve().parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: [int(x) for x in re.findall(r"\d+", p)] or [0],
        reverse=True,
    )
    for cand in candidates:
        if (Path(cand) / "initdb").exists() and (Path(cand) / "pg_ctl").exists():
            return Path(cand)
    raise NoServerBinaries()


def unprivileged_user(announce: Callable[[str], None] | None = None) -> str | None:
    """The user to run the server as when we are root (``None`` when we are not root).

    ``postgres`` when it exists, else ``coordinator``, else a system user ``coordinator``
    made with ``useradd``: a change to the machine, so ``announce`` is told first.
    """
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "coordinator"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    if announce is not None:
        announce(
            "PostgreSQL refuses to run as root and this machine has no user 'postgres' or "
            "'coordinator': creating the system user 'coordinator' (useradd --system) to "
            "run the embedded server as"
        )
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "coordinator"],
        check=True,
        capture_output=True,
    )
    return "coordinator"


def _server_user(root: Path, announce: Callable[[str], None] | None) -> str | None:
    """As root: the owner of an existing cluster's data directory (systemd may have
    handed it to the service's user), else :func:`unprivileged_user`."""
    if os.geteuid() != 0:
        return None
    with contextlib.suppress(OSError, KeyError):
        owner = pwd.getpwuid((root / "data").stat().st_uid).pw_name
        if owner != "root":
            return owner
    return unprivileged_user(announce)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _absolute(path: str | os.PathLike[str]) -> Path:
    return Path(path).absolute()


@attrs.define(eq=False)
class Cluster:
    """One PostgreSQL cluster in ``root`` (data in ``root/data``, socket and log beside it).

    ``port`` ``None`` means Unix socket only (the embedded default); tests and benchmarks
    also listen on 127.0.0.1 so that TCP-only code paths (keepalive) run.
    """

    #: Made absolute: the server runs in its data directory, and a libpq host that does
    #: not start with ``/`` is a host name.
    root: Path = attrs.field(converter=_absolute)
    port: int | None = None
    settings: Mapping[str, str] = attrs.field(factory=dict)
    bin_dir: Path = attrs.field(factory=find_bin_dir)
    user: str | None = attrs.field(factory=unprivileged_user)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "socket"

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    @property
    def socket_port(self) -> int:
        return self.port or 5432

    def dsn(self, dbname: str = "postgres", *, tcp: bool | None = None) -> str:
        """A libpq URL; over TCP when the cluster listens on a port (unless ``tcp=False``)."""
        if tcp is None:
            tcp = self.port is not None
        if tcp:
            return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"
        return f"postgresql://postgres@/{dbname}?host={self.socket_dir}&port={self.socket_port}"

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"{args[0]} timed out after {timeout:.0f}s") from exc
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise ClusterError(f"{args[0]} failed: " + " | ".join(tail))
        return proc

    def _own(self, path: Path) -> None:
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _ensure_reachable(self) -> None:
        """The unprivileged server user must be able to traverse down to the cluster.

        Inside the system's temporary directory (tests, benchmarks) a parent that others
        cannot traverse is opened (``o+x``); anywhere else nothing is changed behind the
        operator's back: the error names the directory to fix or a better place.
        """
        temp = Path(tempfile.gettempdir()).resolve()
        for parent in self.root.resolve().parents:
            mode = parent.stat().st_mode
            if mode & 0o001:
                continue
            if parent != temp and temp in parent.parents:
                os.chmod(parent, mode | 0o001)
                continue
            usual = Path("/var/lib/coordinator")
            example = "" if parent in (usual, *usual.parents) else f" (e.g. {usual})"
            raise UnreachableDirectory(
                f"the server runs as user {self.user!r}, which cannot enter {parent}: "
                f"choose a state directory it can reach{example} or "
                f"allow it in (chmod o+x {parent})"
            )

    @property
    def initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def check_socket_path(self) -> None:
        """Refuse a state directory so deep that the server's socket cannot be made
        there: found only by the server, after a whole initdb, it said "pg_ctl: could
        not start server | Examine the log output." (exit 1)."""
        path = self.socket_dir / f".s.PGSQL.{self.socket_port}"
        size = len(os.fsencode(path))
        if size > SOCKET_PATH_MAX:
            raise SocketPathTooLong(
                f"the embedded PostgreSQL's socket would be {path} ({size} bytes), over the "
                f"{SOCKET_PATH_MAX} a Unix socket path may have: choose a shorter state "
                "directory (--state-dir)"
            )

    def init(self) -> None:
        """Create the cluster (superuser ``postgres``, trust auth: reachable only by
        whoever can reach its socket or its loopback port)."""
        self.check_socket_path()
        self.root.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        for path in (self.root, self.socket_dir):
            self._own(path)
        if self.user is not None:
            self._ensure_reachable()
        self._run(
            "initdb",
            "-D",
            str(self.data_dir),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
            timeout=300,
        )

    def server_options(self) -> str:
        opts: dict[str, str] = {
            "listen_addresses": "127.0.0.1" if self.port is not None else "''",
            "port": str(self.socket_port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "log_line_prefix": f"'{LOG_LINE_PREFIX}'",
            # Authentication is trust: the socket is the only door, so only its user
            # (and root) may open it. At the default 0777 any local user passing
            # through the state directory logged in as the superuser.
            "unix_socket_permissions": "0700",
            # No JIT: the daemon's statements are tiny, and the hardened systemd unit
            # (MemoryDenyWriteExecute) forbids the executable memory JIT needs.
            "jit": "off",
        }
        opts.update(self.settings)
        return " ".join(f"-c {k}={v}" for k, v in opts.items())

    def start(self, *, timeout: float = 60) -> None:
        if self.is_running():
            return
        self.check_socket_path()
        if not self.log_path.exists():
            self.log_path.touch()
            self._own(self.log_path)
        self._run(
            "pg_ctl",
            "-D",
            str(self.data_dir),
            "-l",
            str(self.log_path),
            "-o",
            self.server_options(),
            "-w",
            "-t",
            str(int(timeout)),
            "start",
            timeout=timeout + 10,
        )

    def stop(self, mode: str = "fast", *, timeout: float = 60) -> None:
        if not self.is_running():
            return
        self._run(
            "pg_ctl",
            "-D",
            str(self.data_dir),
            "-m",
            mode,
            "-w",
            "-t",
            str(int(timeout)),
            "stop",
            timeout=timeout + 10,
        )

    def is_running(self) -> bool:
        return self.postmaster_pid() is not None

    def postmaster_pid(self) -> int | None:
        """The running server's pid (from ``postmaster.pid``), ``None`` if none runs."""
        pidfile = self.data_dir / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except PermissionError:
            pass  # (alive, as another user: the server's)
        except OSError:
            return None
        return None if _zombie(pid) else pid

    def statement_log(self) -> StatementLog:
        return StatementLog(self.log_path)


_LINE = re.compile(
    r"^\S+ \S+ \S+ \[(?P<pid>\d+)\] app=(?P<app>\S*) db=(?P<db>\S*) "
    r"(?P<level>[A-Z]+):\s+(?P<msg>.*)$"
)
_STATEMENT = re.compile(r"^(?:statement|execute [^:]*): (?P<sql>.*)$", re.S)


@attrs.frozen(kw_only=True)
class LoggedStatement:
    """One statement as the server logged it."""

    pid: int
    app: str
    db: str
    sql: str


@attrs.define(eq=False)
class StatementLog:
    """Counts statements in a server log written with ``log_statement=all`` and
    :data:`LOG_LINE_PREFIX`: PostgreSQL's own accounting of what clients sent.

    ``mark()`` remembers the current end of the log; ``statements()`` returns what was
    logged after the mark, optionally filtered by application and database.
    """

    path: Path
    offset: int = 0

    def mark(self) -> None:
        self.offset = self.path.stat().st_size

    def statements(self, *, app: str | None = None, db: str | None = None) -> list[LoggedStatement]:
        return [
            s for s in self._read() if (app is None or s.app == app) and (db is None or s.db == db)
        ]

    def _read(self) -> Iterator[LoggedStatement]:
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read().decode("utf-8", "replace")
        current: list[str] | None = None
        for line in data.splitlines():
            m = _LINE.match(line)
            if m is None:
                if current is not None and line.startswith(("\t", " ")):
                    current[3] += "\n" + line.strip()
                continue
            if current is not None:
                yield from _statement(current)
                current = None
            if m["level"] == "LOG":
                current = [m["pid"], m["app"], m["db"], m["msg"]]
        if current is not None:
            yield from _statement(current)


def _statement(parts: list[str]) -> Iterator[LoggedStatement]:
    sm = _STATEMENT.match(parts[3])
    if sm is not None:
        yield LoggedStatement(pid=int(parts[0]), app=parts[1], db=parts[2], sql=sm["sql"])


def private_cluster(
    root: Path, *, bin_dir: Path | None = None, announce: Callable[[str], None] | None = None
) -> Cluster:
    """The embedded default: a cluster in ``root`` reachable only through its Unix
    socket (no TCP port), created on first use. ``announce`` hears of changes to the
    machine (a user created) before they are made."""
    return Cluster(
        root=root, port=None, bin_dir=find_bin_dir(bin_dir), user=_server_user(root, announce)
    )


# --------------------------------------------------------------------------- ownership
#
# Two locks in the cluster's root, both ``flock``s (the kernel drops them however a
# command ends, ``kill -9`` included):
#
# - :data:`USERS_FILE`: every command using the server (the daemon, a standby beside it,
#   each CLI command) holds it shared for as long as it does. The last to leave -- the one
#   that then gets it exclusively -- stops the server. Before, the command that had
#   started the server stopped it when it ended, under a daemon that had come meanwhile
#   and then waited for a database that never came back (a tester's finding).
# - :data:`OWNER_FILE`: held exclusively by the command that started the server (or took
#   it over), with its pid. Others wait for that one to finish starting it. A server
#   running with this lock free and a pid in the file is an orphan (its owner was killed
#   and nobody else used it): the next command adopts it and says so. An owner that
#   leaves while others still use the server clears the pid: handed over, not orphaned.

#: In the cluster's root: the pid of the command that owns the running server, under an
#: exclusive ``flock`` that command holds.
OWNER_FILE = "owner.pid"
#: In the cluster's root: a shared ``flock`` per command using the server.
USERS_FILE = "users.lock"
#: How long a command waits for another live command to finish starting the server.
OWNER_START_WAIT = 60.0


class _Owner:
    """The ``flock`` this process holds on a cluster's :data:`OWNER_FILE`."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


_OWNERS: dict[Path, _Owner] = {}
#: root -> this process's open :data:`USERS_FILE`, locked shared.
_USES: dict[Path, int] = {}
#: Roots whose server this process started without an owner file it could open.
_STARTED_UNOWNED: set[Path] = set()


#: :func:`_claim`'s answer when the file cannot even be opened (no ownership at all).
_NO_FILE: Final = -1


def _claim(cluster: Cluster) -> tuple[_Owner | None, int | None]:
    """Try to become the owner: ``(owner, None)`` on success, else ``(None, pid)`` with
    the live owner's pid -- ``None`` when it has not written it yet, or cleared it while
    handing the server over -- (``(None, _NO_FILE)`` if the file cannot even be opened)."""
    path = cluster.root / OWNER_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None, _NO_FILE
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _read_pid(fd)
        os.close(fd)
        return None, holder
    return _Owner(fd), None


def _use(cluster: Cluster) -> None:
    """Count this process among the server's users (a shared lock). Blocks while the
    last user stops the server, so that this one then starts it again. A file this
    process may not open or lock leaves it uncounted (it then never stops the server
    unless it owns it, as before the count)."""
    if cluster.root in _USES:
        return  # counted already (a lock per open file: a second one would block the first)
    path = cluster.root / USERS_FILE
    fd = -1
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    if fd < 0:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY)  # (another user's file: a lock needs no write)
    if fd < 0:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:
        os.close(fd)
        return
    _USES[cluster.root] = fd


def _last_to_leave(fd: int) -> bool:
    """Drop this process's shared lock, then try for the exclusive one: granted only if
    no other user holds its lock. Of users leaving together, the last to try gets it
    (each has dropped its own first), so the server is never left running unused."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _read_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode().strip() or "x")
    return None


def _write_pid(owner: _Owner) -> None:
    os.ftruncate(owner.fd, 0)
    os.pwrite(owner.fd, f"{os.getpid()}\n".encode(), 0)


def ensure_running(cluster: Cluster, *, say: Callable[[str], None] | None = None) -> bool:
    """Create and start ``cluster`` as needed, and count this process among its users
    until :func:`leave`. True if this process started the server, or adopted an orphan
    that a killed command left running (``say`` is told).

    A server another live command started is used as it is: whoever leaves last stops it.
    """
    if not cluster.initialized:
        cluster.init()
    counted = cluster.root in _USES
    _use(cluster)
    try:
        return _own_or_wait(cluster, say)
    except BaseException:
        fd = None if counted else _USES.pop(cluster.root, None)
        if fd is not None:
            os.close(fd)
        raise


def _own_or_wait(cluster: Cluster, say: Callable[[str], None] | None) -> bool:
    if cluster.root in _OWNERS and cluster.is_running():
        return False  # ours already (a command connects more than once)
    owner, holder = _claim(cluster)
    if owner is None:
        if holder == _NO_FILE:  # no owner file we can use: the old way, no adoption
            if cluster.is_running():
                return False
            cluster.start()
            _STARTED_UNOWNED.add(cluster.root)
            return True
        _wait_for_start(cluster, holder)
        return False
    previous = _read_pid(owner.fd)
    started = False
    if cluster.is_running():
        if previous is None:
            # Handed over: its owner left while others used it. Ours now, quietly.
            _write_pid(owner)
            _OWNERS[cluster.root] = owner
            return False
        if say is not None:
            say(
                f"adopted the embedded PostgreSQL in {cluster.root}, left running by pid "
                f"{previous}, which is gone; stopping it when this command ends, unless another "
                "command still uses it"
            )
    else:
        # Our pid first: another command finding the lock held waits for this start
        # (locked with no pid read as "no owner file" and started a second server).
        _write_pid(owner)
        try:
            cluster.start()
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(owner.fd, 0)
            owner.release()
            raise
        started = True
    _write_pid(owner)
    _OWNERS[cluster.root] = owner
    return started or previous is not None


def _wait_for_start(cluster: Cluster, holder: int | None) -> None:
    deadline = time.monotonic() + OWNER_START_WAIT
    while not cluster.is_running():
        if time.monotonic() > deadline:
            who = f"pid {holder}" if holder is not None else "another command"
            raise ClusterError(
                f"the embedded PostgreSQL in {cluster.root} belongs to {who}, which "
                f"has not started it within {OWNER_START_WAIT:.0f}s"
            )
        time.sleep(0.1)


def _zombie(pid: int) -> bool:
    """The process has exited and waits to be reaped (a killed server whose parent, where
    no service manager adopts it, never reaps it: signals still reach its pid)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return any(
        line.startswith("State:") and "Z" in line.split()[1:2] for line in status.splitlines()
    )


#: Longest pause between tries to start the embedded server again.
RESTART_PAUSE_MAX: Final = 30.0


async def keep_running(cluster: Cluster, log: EventLog) -> None:
    """While a daemon runs on ``cluster``: start the server again when it exits (killed,
    crashed), said in the log (``embedded.exited``, ``embedded.restarted``). A tester's
    kill -9 of the postmaster left the daemon logging "Connection refused" for good,
    and commands then waited 60 s for an owner that would never start it.

    It waits on a pidfd (Linux 5.3): no timer, no wake-up while the server runs. Where
    one cannot be had, it does nothing (as before). Cancelled when the daemon ends,
    before the command stops the server."""
    pause = 1.0
    while True:
        pid = cluster.postmaster_pid()
        if pid is not None:
            try:
                fd = os.pidfd_open(pid)
            except (AttributeError, OSError):
                return
            try:
                await trio.lowlevel.wait_readable(fd)
            finally:
                os.close(fd)
            log.warning(
                "embedded.exited",
                pid=pid,
                root=str(cluster.root),
                action="starting it again",
            )
        try:
            # (Abandoned if the daemon stops meanwhile: a stop does not wait for pg_ctl.)
            await trio.to_thread.run_sync(cluster.start, abandon_on_cancel=True)
        except ClusterError as exc:
            log.error("embedded.restart_failed", root=str(cluster.root), error=str(exc))
            await trio.sleep(pause)
            pause = min(pause * 2, RESTART_PAUSE_MAX)
            continue
        pause = 1.0
        log.info("embedded.restarted", pid=cluster.postmaster_pid(), root=str(cluster.root))


def leave(cluster: Cluster) -> None:
    """This process is done with the server (:func:`ensure_running`): stop it if no
    other command uses it, owner or not; else leave it running for them (an owner hands
    it over by clearing its pid)."""
    root = cluster.root
    fd = _USES.pop(root, None)
    owner = _OWNERS.pop(root, None)
    try:
        # Uncounted (no users file): as before the count, the one that started it stops it.
        uncounted_last = owner is not None or root in _STARTED_UNOWNED
        last = uncounted_last if fd is None else _last_to_leave(fd)
        if last:
            cluster.stop()
        elif owner is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(owner.fd, 0)
    finally:
        _STARTED_UNOWNED.discard(root)
        if owner is not None:
            owner.release()
        if fd is not None:
            os.close(fd)
