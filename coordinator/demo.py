"""``coordinator demo``: try it without touching anything else on the machine.

The demo keeps to itself. It uses its own state directory (a new temporary one, or with
``--state-dir`` an empty directory or one an earlier ``--keep`` demo left), so its own
embedded PostgreSQL, result spool and worker socket, and none of the service's settings
(database, state directory, worker socket, admin API). It serves the admin web page on
a loopback port of its own with a token it makes up, and prints both once the page is
served (the token is never part of the address). It says where on start and on
exit; on exit it removes its jobs and its directory, cluster included, unless
``--keep``. Each run's output is printed when the run ends (the daemon's ``job.run``
event names the run; its saved output tail is read once).

The steps are separate methods so that more can plug in.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from . import client, db
from .errors import InvalidInput, RunNotFound
from .files import private_text, write_private
from .model import Schedule, Target
from .text import printable

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from asyncpg import Connection

    from .config import Config
    from .log import EventLog

#: The demo's jobs: one of each kind a newcomer will want to see run.
DEMO_NAMESPACE: Final = "demo"
DEMO_JOBS: Final = (
    (
        "heartbeat",
        Schedule(kind="cron", expression="* * * * *"),
        ["sh", "-c", 'echo "heartbeat at $(date -u +%T)"'],
    ),
    (
        "tick",
        Schedule(kind="interval", expression="10s"),
        ["sh", "-c", 'echo \'{"count": 1, "note": "last stdout line as JSON"}\''],
    ),
    ("hello", Schedule(kind="manual"), ["echo", "hello from a manual run"]),
)
#: Written into a directory the demo made, so that a later ``--state-dir`` may reuse it.
MARKER: Final = ".coordinator-demo"
#: Lines of a run's output shown (the end of it).
OUTPUT_LINES: Final = 20
#: What a demo says of itself in its directory, for the CLI given it with ``--state-dir``
#: (:func:`read_state`): where its jobs are and, while it runs, its process and admin
#: API (address and token: the file is readable by its owner only). Rewritten whole
#: (a reader sees the old file or the new one), and without the running part on exit.
STATE_FILE: Final = "demo.json"


@attrs.frozen(kw_only=True)
class DemoState:
    """A demo directory's :data:`STATE_FILE`, as read by the CLI."""

    #: ``own`` (its embedded PostgreSQL in the directory) or ``given`` (``--dsn``);
    #: ``None`` for a directory an older demo left (no file).
    database: str | None = None
    #: The process of the demo running there, if one runs.
    pid: int | None = None
    #: The running demo's admin API (``host:port``, token), once it listens.
    admin: tuple[str, str] | None = None
    #: The file read.
    path: Path | None = None


def read_state(state_dir: Path) -> DemoState | None:
    """What ``state_dir`` says of its demo; None unless it is a demo's directory. The
    process and its admin API are only given while that process lives (the same one:
    its start time is kept too, so a reused pid is not taken for it), and only from a
    file its owner alone may read."""
    if not (state_dir / MARKER).exists():
        return None
    path = state_dir / STATE_FILE
    text = private_text(path)
    private = text is not None
    if text is None:  # (where its jobs are is no secret: read that much of it anyway)
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = path.read_text() if path.is_file() else None
    try:
        data = json.loads(text or "null")
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return DemoState()
    database = data.get("database") if data.get("database") in ("own", "given") else None
    pid = data.get("pid")
    if not private or not isinstance(pid, int) or not _alive(pid, data.get("started")):
        return DemoState(database=database, path=path)
    admin = None
    listen, token = data.get("listen"), data.get("token")
    if isinstance(listen, str) and isinstance(token, str) and listen and token:
        admin = (listen, token)
    return DemoState(database=database, pid=pid, admin=admin, path=path)


def _stat(pid: int) -> tuple[str, str] | None:
    """Process ``pid``'s state letter and when it started (clock ticks since boot), from
    ``/proc``, if known."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), fields[19].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return None


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, from ``/proc``), if known."""
    stat = _stat(pid)
    return None if stat is None else stat[1]


def _alive(pid: int, started: object) -> bool:
    """Process ``pid`` lives and is the one that started at ``started`` (if known)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (OSError, OverflowError, ValueError):
        # (Gone; or another user's process, which our own demo never is: the file that
        # names it is ours, 0600.)
        return False
    stat = _stat(pid)
    if stat is None:
        return True  # (alive by kill(0); /proc cannot tell more)
    state, now = stat
    if state in ("Z", "X"):
        return False  # killed, not yet reaped by its parent: it runs nothing
    return started is None or now == started


def say(message: str) -> None:
    print(f"demo: {message}", flush=True)


def _print(line: str) -> None:
    print(line, flush=True)


@attrs.define(eq=False)
class Demo:
    """One demo: its directory and what to clean up."""

    #: The demo's state directory.
    state_dir: Path
    #: Keep the directory, cluster and jobs on exit.
    keep: bool
    #: The database was given with ``--dsn`` (not the demo's own cluster): its demo jobs
    #: are removed on exit.
    external_database: bool
    #: The jobs were defined (a failure before that leaves nothing worth a word).
    began: bool = False
    #: The admin web page's token (made up for this demo).
    admin_token: str = attrs.field(factory=lambda: secrets.token_urlsafe(24))
    #: Where the admin API listens (``host:port``), once it does.
    _listen: str | None = None

    @classmethod
    def prepare(
        cls,
        chosen: Path | None,
        *,
        keep: bool,
        external_database: bool,
        not_these: Sequence[Path] = (),
    ) -> Demo:
        """Make (or check) the demo's directory. A chosen directory must be empty or an
        earlier demo's, and none of ``not_these`` (the service's state directories): it is
        deleted on exit."""
        if chosen is None:
            path = Path(tempfile.mkdtemp(prefix="coordinator-demo-"))
        else:
            path = chosen.expanduser().absolute()
            if any(os.path.realpath(path) == os.path.realpath(p) for p in not_these):
                raise InvalidInput(
                    "--state-dir",
                    f"{path} is the service's state directory; the demo uses its own "
                    "(leave --state-dir out for a new one)",
                )
            if path.is_dir() and any(path.iterdir()) and not (path / MARKER).exists():
                raise InvalidInput(
                    "--state-dir",
                    f"{path} is neither empty nor a demo's directory; the demo uses its own "
                    "directory and deletes it on exit (leave --state-dir out for a new one)",
                )
            path.mkdir(parents=True, exist_ok=True)
            running = read_state(path)
            if running is not None and running.pid is not None:
                raise InvalidInput(
                    "--state-dir",
                    f"{path} is the directory of a demo still running (pid {running.pid}): "
                    "stop it first (leave --state-dir out for a new one)",
                )
        (path / MARKER).write_text(
            "made by `coordinator demo`; deleted when the demo stops unless it runs with --keep\n"
        )
        demo = cls(state_dir=path, keep=keep, external_database=external_database)
        demo._write_state(running=True)
        return demo

    def settings(self, base: Config) -> Config:
        """The demo's configuration: ``base`` (log format and level, a ``--dsn``) with
        everything that could touch the service's state replaced by the demo's own, and
        the admin web page on a free loopback port with the demo's token."""
        return attrs.evolve(
            base,
            dsn=base.dsn if self.external_database else None,
            dsn_password_file=None,
            state_dir=self.state_dir,
            worker_socket=self.state_dir / "worker.sock",
            admin_listen="127.0.0.1:0",
            admin_allow_remote=False,
            admin_token=self.admin_token,
            admin_token_file=None,
            credentials_dir=None,
        )

    def observe(self, record: dict[str, Any]) -> None:
        """An :class:`~coordinator.log.EventLog` observer: when the admin server listens,
        say where and with which token to sign in."""
        if record.get("event") == "admin.listening" and isinstance(record.get("address"), str):
            address = record["address"]
            self._listen = address.removeprefix("http://").rstrip("/")
            self._write_state(running=True)
            say(f"admin web page: {address}/ (sign in with the token below)")
            say(f"admin token: {self.admin_token}")
            if not self.external_database:
                look = f" --state-dir {self.state_dir}"
                say(
                    f"`coordinator status{look}` and `coordinator top{look}` ask this "
                    "daemon (the address and token are in its directory meanwhile)"
                )

    def _write_state(self, *, running: bool) -> None:
        """Write :data:`STATE_FILE` whole (readable by its owner only): where the jobs
        are and, if ``running``, this process and its admin API once it listens."""
        data: dict[str, Any] = {"database": "given" if self.external_database else "own"}
        if running:
            data |= {"pid": os.getpid(), "started": _started(os.getpid())}
            if self._listen is not None:
                data |= {"listen": self._listen, "token": self.admin_token}
        with contextlib.suppress(OSError):  # the page is still served; the CLI won't know
            write_private(self.state_dir / STATE_FILE, json.dumps(data))

    def started(self, run_id: int) -> None:
        """Tell where everything is."""
        self.began = True
        where = (
            "the database given with --dsn (jobs in namespace 'demo')"
            if self.external_database
            else "its own PostgreSQL"
        )
        removal = "kept on exit (--keep)" if self.keep else "deleted on exit unless --keep"
        say(f"state directory {self.state_dir}: {where}, spool and worker socket; {removal}")
        say(
            f"jobs defined in namespace '{DEMO_NAMESPACE}': a cron job each minute, an "
            f"interval job every 10 s, a manual job; run {run_id} queued for 'hello'"
        )
        look = " --dsn DSN" if self.external_database else f" --state-dir {self.state_dir}"
        given = " (DSN: the one given to the demo)" if self.external_database else ""
        say(
            "the daemon's log follows, and each run's output when it ends. In another "
            f"shell: `coordinator jobs list{look}`, `coordinator runs list{look}`{given}; "
            f"a worker of yours: `coordinator worker MODULE:OBJECT --state-dir "
            f"{self.state_dir}`. Ctrl-C stops it."
        )

    async def check_database(self, conn: Connection) -> None:
        """A database given with ``--dsn`` must hold no other jobs: the demo's daemon
        would run them, and its sync would pause the other jobs of namespace ``demo``
        (both happened). Asked before anything is changed there (migrations included)."""
        if not self.external_database:
            return
        names = [name for name, _, _ in DEMO_JOBS]
        n, sample = await db.aio(client.jobs_besides)(conn, DEMO_NAMESPACE, names)
        if n:
            more = ", ..." if n > len(sample) else ""
            raise InvalidInput(
                "--dsn",
                f"the database holds {n} job(s) besides the demo's ({', '.join(sample)}"
                f"{more}): the demo's daemon would run them; give the demo a database "
                "of its own, or leave out --dsn (it then makes one)",
            )

    async def define(self, conn: Connection) -> int:
        """Define the demo's jobs and queue a run of ``hello``; its id."""
        entries = [
            client.job_entry(name=name, schedule=schedule, target=Target(kind="exec", argv=argv))
            for name, schedule, argv in DEMO_JOBS
        ]
        await db.aio(client.sync)(conn, DEMO_NAMESPACE, entries)
        run_id: int = await db.aio(client.trigger)(conn, "hello", namespace=DEMO_NAMESPACE)
        return run_id

    async def remove_jobs(self, conn: Connection) -> None:
        for name, _, _ in DEMO_JOBS:
            await db.aio(client.remove)(conn, name, namespace=DEMO_NAMESPACE)

    def finished(self) -> None:
        """Remove the directory (unless kept) and say what became of it."""
        state = read_state(self.state_dir)
        if state is None or state.pid in (None, os.getpid()):
            self._write_state(running=False)  # (not another demo's, run on this directory)
        if self.keep:
            dsn = " --dsn DSN" if self.external_database else ""
            say(
                f"kept {self.state_dir}: look with `coordinator runs list{dsn} --state-dir "
                f"{self.state_dir}`, run it again with `coordinator demo{dsn} --state-dir "
                f"{self.state_dir} --keep`, delete it with `rm -rf {self.state_dir}`"
                + (" (DSN: the one given to the demo)" if dsn else "")
            )
            return
        if (self.state_dir / "postgres" / "data" / "postmaster.pid").exists():
            say(
                f"kept {self.state_dir}: its PostgreSQL belongs to another command still "
                "running; delete the directory once that ends"
            )
            return
        worth_a_word = self.began or (self.state_dir / "postgres").exists()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        if worth_a_word:
            what = "spool" if self.external_database else "jobs, runs and PostgreSQL"
            say(f"deleted {self.state_dir} (its {what})")


class OutputFollower:
    """Prints each run's output when the daemon logs ``job.run`` for it."""

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[int](100)

    def observe(self, record: dict[str, Any]) -> None:
        """An :class:`~coordinator.log.EventLog` observer (runs on the trio thread)."""
        if record.get("event") == "job.run" and isinstance(record.get("run"), int):
            # If the terminal is behind, a run is skipped here; `runs list` still has it.
            with contextlib.suppress(trio.WouldBlock):
                self._send.send_nowait(record["run"])

    def attach(self, log: EventLog) -> None:
        log.observers.append(self.observe)

    async def follow(self, conn: Connection, write: Callable[[str], None] = _print) -> None:
        """Forever: read each announced run once and print its output.

        A run may be gone by the time it is read (its job removed meanwhile, with its
        history): that is said in a line, never the end of the demo and its directory.
        """
        async for run_id in self._receive:
            try:
                run = await db.aio(client.get_run)(conn, run_id)
            except RunNotFound:
                write(f"demo: run {run_id} ended, and is gone: its job was removed with it")
                continue
            for line in describe_run(run):
                write(line)


def describe_run(run: client.RunView) -> list[str]:
    """A finished run as the demo prints it: a headline, then its output's last lines."""
    extra = dict(run.extra or {})
    elapsed = ""
    if run.started_at is not None and run.finished_at is not None:
        ms = (run.finished_at - run.started_at).total_seconds() * 1000
        elapsed = f" in {ms:.0f} ms"
    error = f" ({run.error_cause}: {run.error_message})" if run.error_cause else ""
    lines = [
        printable(f"demo: run {run.id} {run.job_key} ({run.trigger}) {run.status}{elapsed}{error}")
    ]
    for key, prefix in (("stdout_tail", "  | "), ("stderr_tail", "  ! ")):
        text = str(extra.get(key) or "")
        # Escaped like every output the CLI prints: a job's bytes never drive the terminal.
        lines += [prefix + printable(line) for line in text.splitlines()[-OUTPUT_LINES:]]
    return lines
