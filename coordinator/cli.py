"""The ``coordinator`` command line.

::

    coordinator [--dsn DSN] COMMAND ...
    coordinator --version
      migrate
      jobs define NAME (--cron EXPR [--timezone TZ] | --every DUR | --at ISO | --manual)
                       [--timeout DUR] [--priority interactive|background] [--idempotent]
                       [--recoverable] [--paused | --no-paused] [--param KEY=JSON ...]
                       [--namespace NS]
                       [--retries N [--retry-backoff DUR] [--retry-max-delay DUR]]
                       [--misfire run-once | --misfire skip --misfire-grace DUR]
                       [--no-alert] [--keep-last N] [--retention DUR]
                       (-- COMMAND [ARG ...] [--env KEY=VALUE ...] [--cwd DIR] | --worker TYPE)
      jobs list [--namespace NS] [--json]
      jobs show NAME [--namespace NS] [--json]
      jobs trigger NAME [--namespace NS] [--force] [--arg KEY=JSON ...]
                        [--wait [--wait-timeout DUR]] [--json]
      jobs pause|resume NAME [--namespace NS]
      jobs remove NAME [--namespace NS] [--keep-history]
      runs list [--job NAME] [--namespace NS] [--status S] [--category C] [--limit N] [--json]
      runs show ID [--json]
      runs pause|cancel ID
      runs findings ID [--severity S] [--after ID] [--limit N] [--json]
      runs resolve ID --as failed|succeeded|retry
      sync MANIFEST.toml [--allow-invalid] [--json]
      run [--migrate] [--config FILE] [--refresh-spacing DUR] [--concurrency N] ...
      demo [--state-dir DIR] [--keep]
      status [--json] [--watch]
      top [--once]
      prune [--dry-run] [--json]
      grant ROLE NAMESPACE [--read-only]
      revoke ROLE NAMESPACE
      grants [--role ROLE] [--namespace NS] [--json]
      token hash [--new]
      config [--json]

Exit status: 0 on success, 2 for bad usage or input (one line on stderr naming the bad
field), 1 for anything else (the database unreachable, a ``--wait`` run that did not
succeed). Errors are one line, ``coordinator: <message>``, never a traceback.

``sync`` applies nothing and exits 2 when the manifest has any problem, listing each
with its line; ``--allow-invalid`` stores those entries inert instead and exits 0
(``--strict``, the default now, is still accepted).

Every command reads the configuration the service reads (:mod:`coordinator.config`):
``--config FILE``, else ``$COORDINATOR_CONFIG``, else ``/etc/coordinator/coordinator.toml``.
Without a DSN a command uses the embedded cluster under the state directory, but refuses
(exit 2) when the service's configuration names another database. When nothing seems to
happen, commands say why (:mod:`coordinator.why`), from PostgreSQL (is a daemon leading?)
and from the daemon's admin API (what it serves), each labelled.

The commands talk to PostgreSQL through :mod:`coordinator.client` (asyncpg, called from
trio through :func:`coordinator.db.aio`) on one connection whose ``application_name`` is
``coordinator-cli``.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import math
import os
import re
import shlex
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn

import attrs
import trio
import trio_asyncio

from . import client, db, embedded, probe, redact, tokens, why
from . import config as config_mod
from . import manifest as manifests
from . import migrate as migrations
from . import schedule as schedules
from .demo import DEMO_JOBS as DEMO_JOBS
from .demo import DEMO_NAMESPACE as DEMO_NAMESPACE
from .errors import (
    ConfigError,
    Conflict,
    CoordinatorError,
    DatabaseUnavailable,
    InvalidInput,
    JobNotFound,
    PermissionDenied,
    first_error,
)
from .model import (
    DEFAULT_KEEP_LAST,
    DEFAULT_RETRY_BACKOFF,
    DEFAULT_RETRY_MAX_DELAY,
    MAX_RETRIES,
    MIN_MISFIRE_GRACE,
    MISFIRE_POLICIES,
    PRIORITIES,
    Schedule,
    Target,
)
from .protocol import SEVERITIES
from .text import check_job_name, check_namespace, pad, printable
from .text import width as text_width

if TYPE_CHECKING:
    from asyncpg import Connection

    from .demo import Demo
    from .log import EventLog

PROG = "coordinator"

CommandHandler = Callable[[argparse.Namespace, "CommandContext"], Awaitable[int]]

#: Seconds a command failed by initdb or pg_ctl waits for the SIGINT that may have
#: failed them (a terminal's Ctrl-C reaches them too).
INTERRUPT_SETTLE: Final = 0.2
#: Seconds an unknown job's hint may take to find the namespaces that have one.
JOB_ELSEWHERE_WITHIN: Final = 5.0
#: A command's output kept in its run's extra, as `runs show` heads it.
OUTPUT_TAILS: Final = {
    "stdout_tail": "stdout (its end)",
    "stderr_tail": "stderr (its end)",
}
#: Findings per page of `runs findings` unless --limit says otherwise.
FINDINGS_PAGE: Final = 100


# --------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (``sys.exit(main())``)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["worker"]:
        from . import worker

        return worker.main(arguments[1:])
    try:
        args = _parse(build_parser(), arguments)
    except _UsageError as exc:
        # Already "coordinator ...: <message>"; it may quote what was typed.
        print(printable(str(exc)), file=sys.stderr, flush=True)
        return 2
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    if getattr(args, "worker_program", False):
        # (`coordinator worker ...` is taken before argparse; options came first here.)
        print(
            "coordinator worker: its options go after `worker`: coordinator worker "
            "MODULE:OBJECT [--socket PATH | --tcp HOST:PORT] ...",
            file=sys.stderr,
            flush=True,
        )
        return 2
    try:
        code: int = trio_asyncio.run(_invoke, args)
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except BaseExceptionGroup as group:
        # A Ctrl-C before _interruptible takes SIGINT (trio-asyncio's loop starting)
        # comes out of its nursery wrapped: one line all the same.
        interrupt, rest = group.split(KeyboardInterrupt)
        if interrupt is None or rest is not None:
            raise
        _error("interrupted")
        return 130
    return code


async def _invoke(args: argparse.Namespace) -> int:
    handler: CommandHandler = args.handler
    ctx = CommandContext(args=args)
    try:
        try:
            return await _interruptible(handler, args, ctx)
        except BaseExceptionGroup as group:
            # A nursery wraps what its tasks raise: a person sees the error, not the group.
            raise first_error(group) from None
    except JobNotFound as exc:
        _error(f"{exc}{await _job_elsewhere(ctx, exc)}")
        return exc.exit_code
    except CoordinatorError as exc:
        _error(str(exc))
        return exc.exit_code
    except BrokenPipeError:  # `coordinator runs list | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    finally:
        with trio.CancelScope(shield=True):
            await ctx.stop_cluster()


async def _job_elsewhere(ctx: CommandContext, missing: JobNotFound) -> str:
    """`` (there is demo/hello: add --namespace demo)`` when a job of that name is in
    another namespace (a demo's jobs are in ``demo``: `jobs trigger hello` said only
    "unknown job default/hello"); nothing if none is, or the database cannot say."""
    found: list[str] = []
    # (Bounded: the command is over, and this is only a hint.)
    with trio.move_on_after(JOB_ELSEWHERE_WITHIN):
        try:
            async with ctx.connection() as conn:
                found = await db.aio(client.namespaces_with)(
                    conn, missing.name, besides=missing.namespace
                )
        except CoordinatorError:
            return ""
    if not found:
        return ""
    there = ", ".join(f"{ns}/{missing.name}" for ns in found)
    verb = "add" if missing.namespace == "default" else "use"
    return f" (there is {there}: {verb} --namespace {shlex.quote(found[0])})"


async def _interruptible(
    handler: CommandHandler, args: argparse.Namespace, ctx: CommandContext
) -> int:
    """Run the command; Ctrl-C cancels it and it exits 130 with one line. Left to trio,
    the KeyboardInterrupt could land in trio-asyncio's loop task, under the command's
    asyncpg calls: the command then waited forever (a Ctrl-C right after `jobs trigger
    --wait` printed the run's id), or came out as a 76-line exception group. Commands
    that handle signals themselves (the daemon, `top`) take them while they run."""
    interrupted = False
    code = 130
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def interrupt() -> None:
                nonlocal interrupted
                async for _ in signals:
                    interrupted = True
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(interrupt)
            try:
                code = await handler(args, ctx)
            except embedded.ClusterError:
                # Ctrl-C reaches the terminal's whole process group: initdb or pg_ctl may
                # have died of it, or caught it and failed, before our own SIGINT was
                # taken ("initdb failed: ... Interrupt", exit 1). A SIGINT pending now
                # cancels this wait: the command was interrupted, not failed.
                await trio.sleep(INTERRUPT_SETTLE)
                raise
            nursery.cancel_scope.cancel()
    if interrupted:
        _error("interrupted")
        return 130
    return code


def _split_cron(typed: list[str], cron: str, extras: list[str]) -> list[str]:
    """The words typed right after ``--cron``'s value, if they are what an unquoted cron
    expression left over (at most four more fields, each one of cron's characters)."""
    head = typed[: typed.index("--")] if "--" in typed else typed
    for at, word in enumerate(head[:-1]):
        if word == "--cron" and head[at + 1] == cron:
            after = head[at + 2 : at + 6]
            taken = []
            for w in after:
                if w.startswith("-") or not re.fullmatch(r"[0-9A-Za-z*/,?LW#-]+", w):
                    break
                taken.append(w)
            if taken and all(w in extras for w in taken) and len(cron.split()) == 1:
                return taken
    return []


def _error(message: str) -> None:
    """One line on stderr; control characters (from names, outputs) escaped."""
    print(f"{PROG}: {printable(message)}", file=sys.stderr, flush=True)


def _note(message: str) -> None:
    print(f"{PROG}: note: {printable(message)}", file=sys.stderr, flush=True)


def _note_paused_redefined(before: client.JobView, job: client.JobView) -> None:
    """What a resume of the job's paused run will do under the new definition (a
    redefinition said nothing; the run then started over, or in another handler)."""
    run = before.outstanding_run
    if before.recoverable and not job.recoverable:
        _note(
            f"run {run} is paused at a saved cursor; the job is no longer recoverable, so a "
            "resume starts it over from the beginning (--recoverable keeps the cursor)"
        )
    elif before.target != job.target:
        cursor = " with its saved cursor" if job.recoverable else ""
        _note(f"run {run} is paused; a resume runs it under the new target{cursor}")


def _note_redacted(values: dict[str, Any], flag: str) -> None:
    """Say which of the ``--param``/``--arg`` values were stored as ``[redacted]`` (the
    front doors keep no secret; the job then gets ``[redacted]``, which went unsaid)."""
    changed = redact.default().changed(values)
    if changed:
        which = ", ".join(f"{flag} {key}" for key in changed)
        _note(
            f"{which} stored as [redacted] (it looks secret), and the job gets that: give "
            "a job secrets by reference (a file, an environment variable, a systemd "
            "credential)"
        )


def _say(message: str) -> None:
    """One line on stdout, control characters escaped (it may quote names as typed)."""
    print(printable(message))


@attrs.define(eq=False)
class CommandContext:
    """What a command handler may use besides its arguments."""

    args: argparse.Namespace
    #: The embedded cluster this command owns (started or adopted; stopped when it ends).
    used_cluster: embedded.Cluster | None = None
    #: The configuration, once loaded (or set by :meth:`use`).
    _config: config_mod.Config | None = None
    #: The command chose its own embedded database (the demo): no check against the
    #: service's configuration.
    _own_database: bool = False
    #: ``--state-dir`` named a demo's directory whose jobs are in the database that demo
    #: was given with ``--dsn``: a command needs that ``--dsn`` too.
    _demo_elsewhere: Path | None = None

    def config(self) -> config_mod.Config:
        if self._config is None:
            loaded = _load_config(self.args)
            if self.args.group in ("run", "demo"):  # (a daemon of its own: not the demo's)
                self._config = loaded
            else:
                self._config, self._own_database, self._demo_elsewhere = _with_demo(loaded)
            # What the command prints is redacted by the configured rules too.
            redact.install(self._config.redactor())
        return self._config

    def use(self, config: config_mod.Config, *, own_database: bool) -> None:
        """Talk to the database ``config`` names from now on (the demo's own)."""
        self._config, self._own_database = config, own_database

    async def database(self) -> str:
        """The database the command talks to: ``--dsn``, else the configured DSN
        (``COORDINATOR_DSN``, the config file; its password from the credential or
        ``dsn_password_file``), else the embedded private cluster under the state
        directory, created and started on first use, unless the service's configuration
        names another database. The one place that decides it."""
        config = self.config()
        if self._demo_elsewhere is not None and config.source("dsn").layer != "flag":
            raise ConfigError(
                f"{self._demo_elsewhere} is a demo's directory whose jobs are in the database "
                "that demo was given with --dsn: pass that --dsn too"
            )
        dsn = config.database_dsn()
        if dsn is not None:
            return dsn
        if not self._own_database:
            config_mod.refuse_another_embedded(
                config, state_dir_chosen=config.source("state_dir").layer == "flag"
            )
        cluster = embedded.private_cluster(
            config.embedded_root, bin_dir=config.pg_bin, announce=_note
        )
        started = not cluster.is_running()
        new = not cluster.initialized
        try:
            ours = await trio.to_thread.run_sync(
                partial(embedded.ensure_running, cluster, say=_note)
            )
        finally:
            self.used_cluster = cluster  # (left by stop_cluster, even if cancelled here)
        if ours and started:
            # A new one holds nothing: say why this one, should another be meant (a
            # forgotten --state-dir after the demo, a config not found).
            setup = "" if self.args.group == "migrate" else "; `coordinator migrate` sets it up"
            if self._own_database:
                # The demo's own, whatever DSN is configured; and it migrates itself.
                made = " (new: the demo's own database)" if new else ""
            else:
                made = (
                    f" (new: no DSN is configured and there was none in {config.state_dir}{setup})"
                    if new
                    else ""
                )
            _note(f"started the embedded PostgreSQL in {cluster.root}{made}")
        return cluster.dsn()

    async def stop_cluster(self) -> None:
        """Leave the embedded server: stopped if no other command uses it."""
        if self.used_cluster is not None:
            cluster, self.used_cluster = self.used_cluster, None
            await trio.to_thread.run_sync(embedded.leave, cluster)

    def _dsn_field(self) -> str:
        """Where the DSN came from, as a refusal names it (:meth:`Config.named`; it said
        ``--dsn`` for a DSN from the file)."""
        return self.config().named("dsn")

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """One connection (``application_name = coordinator-cli``), closed afterwards."""
        dsn = await self.database()
        try:
            conn = await db.connect(dsn, application_name=db.APP_CLI)
        except db.DsnError as exc:
            raise InvalidInput(self._dsn_field(), exc.problem) from exc
        except DatabaseUnavailable as exc:
            if isinstance(exc.__cause__, ValueError):  # asyncpg refused the DSN itself
                raise InvalidInput(self._dsn_field(), str(exc.__cause__).splitlines()[0]) from exc
            raise
        except (ValueError, OverflowError) as exc:  # e.g. a port out of range
            raise InvalidInput(self._dsn_field(), str(exc).splitlines()[0]) from exc
        try:
            yield conn
        finally:
            await db.close_quietly(conn)


# --------------------------------------------------------------------------- parser


class _UsageError(Exception):
    """argparse refused the command line; the message is one line."""


class _Parser(argparse.ArgumentParser):
    """argparse, with errors as one line (``<prog>: <message> (see <prog> --help)``),
    said by the command that was typed (``coordinator jobs define: ...``), naming an
    option it does not know and the one that was perhaps meant."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A word that starts with a minus and a digit is a value, never an option (none of
        # ours looks like one): `--every -5m` is then told "a duration must be positive",
        # where argparse took -5m for an option and said "expected one argument".
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        typed = list(sys.argv[1:] if args is None else args)
        try:
            parsed, extras = super().parse_known_args(typed, namespace)
        except _UsageError:
            # A misspelt option is left over, and argparse complains of what it then
            # lacks ("one of the arguments --cron --every ... is required"): name it.
            unknown = self._unknown_options(typed)
            if unknown:
                self.error(f"unknown option {unknown[0]}{self._meant(unknown[0])}")
            raise
        if extras and not self._has_subcommands():
            # Said here, by the command typed, rather than by `coordinator` afterwards.
            option = next((e for e in extras if e.startswith("-") and e != "-"), None)
            if option is not None and option.split("=", 1)[0] not in self._options():
                meant = self._meant(option)
            elif option is not None:
                meant = ""  # a known option, given where it is not read (after --)
            elif (cron := getattr(parsed, "cron", None)) is not None and (
                rest := _split_cron(typed, cron, extras)
            ):
                # `--cron 30 2 * * *` unquoted: the shell made five words of it, and may
                # have made file names of its stars (then the expression is not rebuilt).
                if len(rest) == 4 and not any(os.path.lexists(w) for w in rest):
                    meant = f" (quote the cron expression: --cron '{' '.join([cron, *rest])}')"
                else:
                    meant = (
                        " (quote the cron expression: the shell split it in words, and "
                        "makes file names of its *)"
                    )
            elif self.get_default("takes_command"):
                meant = " (the command goes after --: ... -- PROGRAM ARGS)"
            else:
                meant = ""
            self.error(f"unrecognized arguments: {' '.join(extras)}{meant}")
        return parsed, extras

    def _options(self) -> list[str]:
        return [o for action in self._actions for o in action.option_strings]

    def _has_subcommands(self) -> bool:
        return any(isinstance(a, argparse._SubParsersAction) for a in self._actions)

    def _unknown_options(self, typed: list[str]) -> list[str]:
        if self._has_subcommands():
            return []
        known = self._options()
        head = typed[: typed.index("--")] if "--" in typed else typed
        unknown = []
        for i, arg in enumerate(head):
            before = self._option_string_actions.get(head[i - 1]) if i else None
            if before is not None and before.nargs != 0:
                continue  # the value of the option before it
            # (A prefix of a known option is one: argparse takes abbreviations; a token
            # with a space is a value argparse reads as positional.)
            if (
                arg.startswith("--")
                and " " not in arg
                and not any(o.startswith(arg.split("=", 1)[0]) for o in known)
            ):
                unknown.append(arg)
        return unknown

    def _meant(self, option: str) -> str:
        close = difflib.get_close_matches(option.split("=", 1)[0], self._options(), n=1)
        return f" (did you mean {close[0]}?)" if close else ""


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: one ``_add_<group>`` call per command group."""
    parser = _Parser(
        prog=PROG,
        description="An idle-silent deadline coordinator: jobs and runs kept in PostgreSQL.",
    )
    parser.add_argument(
        "--dsn",
        default=None,
        help="PostgreSQL connection string (default: $COORDINATOR_DSN)",
    )
    # (Also accepted before the command, as --dsn is: `coordinator --config F config`.)
    parser.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help="TOML settings")
    parser.add_argument(
        "--state-dir", metavar="DIR", default=argparse.SUPPRESS, help="spool and embedded database"
    )
    parser.add_argument("--json", action="store_true", default=False, help=argparse.SUPPRESS)
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    groups = parser.add_subparsers(dest="group", metavar="COMMAND", required=True)
    _add_migrate(groups)
    _add_jobs(groups)
    _add_runs(groups)
    _add_sync(groups)
    _add_run(groups)
    _add_demo(groups)
    _add_status(groups)
    _add_top(groups)
    _add_prune(groups)
    _add_config(groups)
    _add_worker(groups)
    _add_grants(groups)
    _add_token(groups)
    # ---- Later command groups plug in here, one call each, e.g.:
    # A handler is `async def (args, ctx: CommandContext) -> int`, run inside trio-asyncio; it
    # gets the database from `ctx.database()` (or `ctx.connection()`).
    return parser


_Subparsers = Any  # argparse's _SubParsersAction is private


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("coordinator")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def _common() -> argparse.ArgumentParser:
    """Options every command accepts after its name too (``jobs list --dsn ...``)."""
    common = _Parser(add_help=False)
    common.add_argument("--dsn", default=argparse.SUPPRESS, help="PostgreSQL connection string")
    common.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help=f"TOML settings (default: {config_mod.DEFAULT_CONFIG_FILE} when it exists)",
    )
    common.add_argument(
        "--state-dir",
        metavar="DIR",
        default=argparse.SUPPRESS,
        help="spool and embedded database (the database is used when no DSN is set)",
    )
    return common


def _reading() -> argparse.ArgumentParser:
    reading = _Parser(add_help=False)
    reading.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON"
    )
    return reading


def _namespace(parser: argparse.ArgumentParser, default: str | None = "default") -> None:
    parser.add_argument(
        "--namespace",
        "-n",
        default=default,
        metavar="NS",
        help="the job's namespace (default: default)" if default else "only this namespace",
    )


def _command(
    subparsers: _Subparsers,
    name: str,
    handler: CommandHandler,
    help_text: str,
    *,
    reads: bool = False,
) -> argparse.ArgumentParser:
    parents = [_common(), _reading()] if reads else [_common()]
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help_text, description=help_text, parents=parents
    )
    parser.set_defaults(handler=handler)
    return parser


def _add_migrate(groups: _Subparsers) -> None:
    _command(groups, "migrate", _migrate, "apply pending schema migrations")


def _add_jobs(groups: _Subparsers) -> None:
    jobs = groups.add_parser("jobs", help="define, inspect and trigger jobs")
    sub = jobs.add_subparsers(dest="action", metavar="ACTION", required=True)

    define = _command(sub, "define", _jobs_define, "create or replace a job")
    define.usage = (
        "%(prog)s NAME (--cron EXPR [--timezone TZ] | --every DURATION | --at ISO8601 | "
        "--manual) [options] (-- COMMAND [ARG ...] | --worker TYPE)"
    )
    define.add_argument("name", metavar="NAME")
    _namespace(define)
    when = define.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help="5-field cron expression")
    when.add_argument("--every", metavar="DURATION", help="interval, e.g. 90s, 5m, 1h30m")
    when.add_argument("--at", metavar="ISO8601", help="one instant, with offset or Z")
    when.add_argument("--manual", action="store_true", help="only when triggered")
    define.add_argument("--timezone", metavar="TZ", help="IANA timezone of --cron (default UTC)")
    define.add_argument("--timeout", metavar="DURATION", help="longest a call may take")
    define.add_argument(
        "--priority",
        choices=PRIORITIES,
        default="background",
        help="interactive runs are admitted before background ones (default: background)",
    )
    define.add_argument("--idempotent", action="store_true", help="may be repeated after a crash")
    define.add_argument(
        "--paused",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="define it paused (--no-paused: resume it); neither keeps a job's state",
    )
    define.add_argument(
        "--retries",
        type=_retries,
        default=0,
        metavar="N",
        help="attempts after a failed or timed-out run (default 0)",
    )
    define.add_argument(
        "--retry-backoff",
        metavar="DURATION",
        help="delay before the first retry, doubling each time (default 30s)",
    )
    define.add_argument(
        "--retry-max-delay", metavar="DURATION", help="longest delay between attempts (default 1h)"
    )
    define.add_argument(
        "--misfire",
        choices=MISFIRE_POLICIES,
        default="run-once",
        help="an overdue deadline runs once (default), or is skipped past --misfire-grace",
    )
    define.add_argument(
        "--misfire-grace", metavar="DURATION", help="with --misfire skip: how late it may still run"
    )
    define.add_argument(
        "--recoverable",
        action="store_true",
        help="worker jobs: runs keep a cursor; a pause, stop, crash or timeout pauses them "
        "and a trigger resumes them",
    )
    define.add_argument(
        "--no-alert",
        dest="alert",
        action="store_false",
        help="never send a failure alert for this job",
    )
    define.add_argument(
        "--keep-last",
        type=_positive_int,
        metavar="N",
        help="retention keeps at most the newest N runs (default 100)",
    )
    define.add_argument(
        "--retention",
        metavar="DURATION",
        help="keep finished runs this long (default: the retention setting, 30d)",
    )
    define.add_argument(
        "--param",
        action="append",
        metavar="KEY=JSON",
        help="static parameter (repeatable; a value that is not JSON is a string)",
    )
    define.add_argument("--worker", metavar="TYPE", help="run on a worker serving TYPE")
    define.add_argument(
        "--env", action="append", metavar="KEY=VALUE", help="command environment (repeatable)"
    )
    define.add_argument("--cwd", metavar="DIR", help="command working directory")
    define.set_defaults(takes_command=True, command_argv=None)
    define.epilog = "The command to run follows '--': jobs define NAME --manual -- /bin/echo hi"

    listing = _command(sub, "list", _jobs_list, "list jobs", reads=True)
    _namespace(listing, default=None)

    show = _command(sub, "show", _jobs_show, "show one job", reads=True)
    show.add_argument("name", metavar="NAME")
    _namespace(show)

    trigger = _command(
        sub, "trigger", _jobs_trigger, "queue a run now and print its id", reads=True
    )
    trigger.add_argument("name", metavar="NAME")
    _namespace(trigger)
    trigger.add_argument("--force", action="store_true", help="pass force=true to the run")
    trigger.add_argument(
        "--arg",
        action="append",
        metavar="KEY=JSON",
        help="run argument (repeatable; a value that is not JSON is a string)",
    )
    trigger.add_argument(
        "--wait",
        action="store_true",
        help="wait for the run to end; exit 1 unless it succeeded (a failed attempt "
        "whose retry follows is one too: the retry run is named)",
    )
    trigger.add_argument(
        "--wait-timeout", metavar="DURATION", help="give up waiting after this (implies --wait)"
    )

    for action, handler, text in (
        ("pause", _jobs_pause, "pause a job"),
        ("resume", _jobs_resume, "resume a paused job"),
        ("remove", _jobs_remove, "delete a job and its run history"),
    ):
        parser = _command(sub, action, handler, text)
        parser.add_argument("name", metavar="NAME")
        _namespace(parser)
        if action == "remove":
            parser.add_argument(
                "--keep-history",
                action="store_true",
                help="hide and disarm the job but keep its runs until retention takes them",
            )


def _retries(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= value <= MAX_RETRIES:
        raise argparse.ArgumentTypeError(f"must be 0 to {MAX_RETRIES}, not {value}")
    return value


#: The largest id (and limit) PostgreSQL's bigint holds: beyond it an id names nothing.
BIGINT_MAX: Final = 2**63 - 1


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    if value > BIGINT_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {BIGINT_MAX}, not {value}")
    return value


def _add_runs(groups: _Subparsers) -> None:
    runs = groups.add_parser("runs", help="inspect and resolve runs")
    sub = runs.add_subparsers(dest="action", metavar="ACTION", required=True)

    listing = _command(sub, "list", _runs_list, "list runs, newest first", reads=True)
    listing.add_argument("--job", metavar="NAME", help="only this job's runs")
    _namespace(listing, default=None)
    listing.add_argument("--status", choices=client.RUN_STATUSES)
    listing.add_argument(
        "--category", choices=client.CATEGORIES, help="only runs that failed this way"
    )
    listing.add_argument("--limit", type=_positive_int, default=50, metavar="N")

    show = _command(sub, "show", _runs_show, "show one run", reads=True)
    show.add_argument("run_id", type=_positive_int, metavar="ID")

    pause = _command(
        sub, "pause", _runs_pause, "pause a running run of a recoverable job (trigger resumes it)"
    )
    pause.add_argument("run_id", type=_positive_int, metavar="ID")

    cancel = _command(sub, "cancel", _runs_cancel, "cancel a queued or paused run")
    cancel.add_argument("run_id", type=_positive_int, metavar="ID")

    findings = _command(
        sub, "findings", _runs_findings, "list a run's findings, oldest first", reads=True
    )
    findings.add_argument("run_id", type=_positive_int, metavar="ID")
    findings.add_argument("--severity", choices=SEVERITIES, help="only this severity")
    findings.add_argument(
        "--after", type=_positive_int, metavar="ID", help="only findings after this id (paging)"
    )
    findings.add_argument("--limit", type=_positive_int, default=FINDINGS_PAGE, metavar="N")

    resolve = _command(sub, "resolve", _runs_resolve, "settle an unresolved run")
    resolve.add_argument("run_id", type=_positive_int, metavar="ID")
    resolve.add_argument(
        "--as", dest="outcome", required=True, choices=client.RESOLUTIONS, help="the outcome"
    )


def _add_sync(groups: _Subparsers) -> None:
    sync = _command(
        groups, "sync", _sync, "declare a namespace's complete job set from TOML", reads=True
    )
    sync.add_argument("manifest", metavar="MANIFEST")
    choice = sync.add_mutually_exclusive_group()
    choice.add_argument(
        "--allow-invalid",
        action="store_true",
        help="store entries with problems inert and apply the rest "
        "(default: apply nothing, exit 2)",
    )
    sync.add_argument(
        "--dry-run",
        action="store_true",
        help="say which jobs would be created, changed or paused, and apply nothing (every "
        "check of a real sync runs, in a transaction rolled back)",
    )
    # The default since invalid entries stopped being applied silently; still accepted.
    choice.add_argument(
        "--strict",
        action="store_true",
        help="apply nothing when any entry has a problem (the default; accepted for old scripts)",
    )


def _daemon_settings(parser: argparse.ArgumentParser) -> None:
    """Flags of the daemon's settings (the last layer of coordinator.config)."""
    parser.add_argument(
        "--refresh-spacing",
        metavar="DUR",
        help="minimum time between inventory refreshes (default 30s)",
    )
    parser.add_argument("--concurrency", metavar="N", help="calls at once (default 16)")
    parser.add_argument(
        "--stop-timeout", metavar="DUR", help="longest wait for running calls at stop (default 60s)"
    )
    parser.add_argument("--log-format", metavar="FORMAT", help="logfmt (default) or json")
    parser.add_argument("--log-level", metavar="LEVEL", help="debug, info, warning, error")


def _with_demo(config: config_mod.Config) -> tuple[config_mod.Config, bool, Path | None]:
    """``config`` for a ``--state-dir`` that is a demo's directory (``coordinator.demo``):
    the demo's own database (its embedded PostgreSQL there, not the service's DSN from
    the file or environment, unless ``--dsn`` says otherwise), its worker socket and,
    only while that demo runs, its admin API (else none: the service's would answer for
    another daemon), so that ``jobs list``, ``status`` and ``top`` show the demo, as it
    tells them to. Also: whether the database is the demo's own (no check against the
    service's), and the directory if the demo was given its database with ``--dsn``
    (a command then needs that ``--dsn`` too)."""
    from .demo import read_state

    chosen = config.state_dir
    state = read_state(chosen) if config.source("state_dir").layer == "flag" else None
    if state is None:
        return config, False, None
    demo = config_mod.Source(layer="demo", origin=str(state.path or chosen))
    changes: dict[str, Any] = {"worker_socket": chosen / "worker.sock"}
    sources = {**config.sources, "worker_socket": demo}
    elsewhere = chosen if state.database == "given" else None
    own = (
        elsewhere is None
        and config.source("dsn").layer != "flag"
        and (state.database == "own" or config.embedded_root.is_dir())
    )
    if own:
        changes |= {"dsn": None, "dsn_password_file": None}
        sources["dsn"] = demo
        sources.pop("dsn_password_file", None)
    listen, token = state.admin if state.admin is not None else (None, None)
    changes |= {
        "admin_listen": listen,
        "admin_token": token,
        "admin_token_file": None,
        "admin_tokens": tokens.TokenSet(),
    }
    for name in ("admin_listen", "admin_token", "admin_tokens"):
        sources[name] = demo
    sources.pop("admin_token_file", None)
    return attrs.evolve(config, **changes, sources=sources), own, elsewhere


def _load_config(args: argparse.Namespace) -> config_mod.Config:
    """The configuration the service reads too: ``--config``, else
    ``$COORDINATOR_CONFIG``, else the default file; then the environment and flags."""
    names = ("dsn", "refresh_spacing", "concurrency", "stop_timeout", "state_dir")
    flags = {name: getattr(args, name, None) for name in (*names, "log_format", "log_level")}
    file = getattr(args, "config", None)
    return config_mod.load(file=Path(file) if file else None, flags=flags)


def _add_run(groups: _Subparsers) -> None:
    run = _command(groups, "run", _run, "run the daemon in the foreground (systemd: Type=notify)")
    _daemon_settings(run)
    run.add_argument(
        "--migrate", action="store_true", help="apply pending schema migrations before starting"
    )


def _add_demo(groups: _Subparsers) -> None:
    demo = _command(
        groups,
        "demo",
        _demo,
        "try it: example jobs and the daemon in the foreground, in a directory of its own",
    )
    _daemon_settings(demo)
    demo.add_argument(
        "--keep",
        action="store_true",
        help="keep the demo's directory, database and jobs on exit (default: delete them)",
    )


def _add_status(groups: _Subparsers) -> None:
    status = _command(
        groups,
        "status",
        _status,
        "the running daemon's state (via its admin API), else what the database says",
        reads=True,
    )
    status.add_argument(
        "--watch", action="store_true", help="follow it live on one screen (coordinator top)"
    )


def _add_top(groups: _Subparsers) -> None:
    top = _command(
        groups,
        "top",
        _top,
        "one live screen: running calls, next deadlines, workers, recent outcomes "
        "(follows the daemon's events over its admin API; Ctrl-C ends it)",
    )
    top.add_argument("--once", action="store_true", help="print one screen and exit")


def _add_prune(groups: _Subparsers) -> None:
    prune = _command(
        groups,
        "prune",
        _prune,
        "apply retention now (the daemon does at prune_at); --dry-run shows what would go",
        reads=True,
    )
    prune.add_argument(
        "--dry-run", action="store_true", help="delete nothing: list what a prune would delete"
    )


def _add_worker(groups: _Subparsers) -> None:
    # Its own parser (coordinator.worker.build_parser) reads the rest of the line; the
    # worker runs on plain trio, outside the CLI's database context.
    worker = groups.add_parser(
        "worker",
        help="run a worker process: coordinator worker MODULE:OBJECT [--socket PATH] ...",
        add_help=False,
    )
    worker.add_argument("worker_argv", nargs=argparse.REMAINDER)
    worker.set_defaults(handler=None, worker_program=True)


def _add_config(groups: _Subparsers) -> None:
    config = _command(
        groups,
        "config",
        _config,
        "print the effective configuration (secrets redacted)",
        reads=True,
    )
    _daemon_settings(config)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse, taking everything after the first ``--`` as ``jobs define``'s command.

    (argparse itself cannot: a ``nargs='*'`` positional after ``NAME`` is matched empty
    too early, and it drops a second ``--`` from the command.)
    """
    if "--" not in argv:
        return parser.parse_args(argv)
    cut = argv.index("--")
    head, tail = argv[:cut], argv[cut + 1 :]
    try:
        args = parser.parse_args(head)
    except _UsageError:
        if "define" in head:
            raise
        return parser.parse_args(argv)
    if getattr(args, "takes_command", False):
        args.command_argv = tail
        return args
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- output


#: The control characters ``json.dumps(ensure_ascii=False)`` leaves raw (it escapes C0).
_RAW_IN_JSON: Final = re.compile("[\x7f-\x9f\u2028\u2029]")


def _print_json(value: Any) -> None:
    text = json.dumps(value, indent=2, ensure_ascii=False)
    # They can only occur inside strings, where an escape means the same character.
    print(_RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text))


_when = why.when


def _duration(value: timedelta | None) -> str:
    return schedules.format_duration(value) if value is not None else "-"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Aligned columns, one line per row: control characters in cells are escaped."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [text_width(h) for h in headers]
    for row in rows:
        widths = [max(w, text_width(cell)) for w, cell in zip(widths, row, strict=True)]
    for row in (headers, *rows):
        cells = [pad(cell, w) for cell, w in zip(row, widths, strict=True)]
        print("  ".join(cells).rstrip())


def _fields(pairs: Sequence[tuple[str, str]]) -> None:
    width = max(len(key) for key, _ in pairs) + 1
    for key, value in pairs:
        print(f"{(key + ':').ljust(width)} {printable(value)}")


def _clip(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _describe_schedule(job: client.JobView) -> str:
    if job.schedule_kind == "manual":
        return "manual"
    if job.schedule_kind == "cron":
        zone = "" if job.timezone == "UTC" else f" ({job.timezone})"
        return f"cron {job.schedule}{zone}"
    if job.schedule_kind == "interval":
        return f"every {job.schedule}"
    return f"at {job.schedule}"


def _describe_retries(job: client.JobView) -> str:
    if job.retries == 0:
        return "0 (a failed run waits for the next deadline)"
    first = job.retry_backoff
    if job.retry_max_delay is not None and first is not None:
        first = min(first, job.retry_max_delay)  # (the cap holds for the first one too)
    return (
        f"{job.retries}, the first after {_duration(first)}, doubling up to "
        f"{_duration(job.retry_max_delay)} (less up to a quarter, at random)"
    )


def _describe_misfire(job: client.JobView) -> str:
    if job.misfire == "skip":
        return f"skip a deadline more than {_duration(job.misfire_grace)} late"
    return "run-once (an overdue deadline runs once)"


def _describe_outstanding(job: client.JobView) -> str:
    if job.outstanding_run is None:
        return "-"
    if job.outstanding_due_at is not None and job.outstanding_status == "queued":
        return f"{job.outstanding_run} (retry, due {_when(job.outstanding_due_at)})"
    return f"{job.outstanding_run} ({job.outstanding_status})"


def _describe_target(target: dict[str, Any]) -> str:
    try:
        return Target.from_json(target).describe()
    except ValueError:
        return json.dumps(target)


def _job_state(job: client.JobView, facts: probe.Facts) -> str:
    if job.invalid_reason is not None:
        return _clip(f"invalid: {job.invalid_reason}", 50)
    return why.job_state(job, facts)


def _yes(value: bool) -> str:
    return "yes" if value else "no"


# --------------------------------------------------------------------------- input


def _key_values(items: Sequence[str] | None, flag: str, *, as_json: bool) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; with ``as_json`` a value that parses as JSON is that JSON
    value, anything else the plain string (so ``--param region=eu`` works unquoted) --
    except text that opens an object or an array: that was meant as JSON, and is refused
    rather than stored as a string."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInput(flag, f"expected KEY={'JSON' if as_json else 'VALUE'}, got {item!r}")
        if key in out:
            # (The last one was kept without a word.)
            raise InvalidInput(flag, f"{key!r} is given twice; give each key once")
        if as_json:
            try:
                out[key] = json.loads(value)
            except json.JSONDecodeError as exc:
                if value.lstrip()[:1] in ("{", "["):
                    raise InvalidInput(
                        flag,
                        f"{item!r}: not JSON ({exc.msg} at character {exc.pos + 1}); "
                        f"a string that starts with {value.lstrip()[0]} needs JSON quotes",
                    ) from None
                out[key] = value
        else:
            out[key] = value
    return out


def _schedule_from(args: argparse.Namespace) -> Schedule:
    if args.timezone is not None and args.cron is None:
        raise InvalidInput("--timezone", "only applies to --cron schedules")
    if args.cron is not None:
        zone = "UTC" if args.timezone is None else args.timezone  # ("" is no zone: refused)
        schedule = Schedule(kind="cron", expression=args.cron, timezone=zone)
    elif args.every is not None:
        schedules.parse_duration(args.every, field="--every", unit_required=True)
        schedule = Schedule(kind="interval", expression=args.every)
    elif args.at is not None:
        schedule = Schedule(kind="once", expression=args.at)
    else:
        schedule = Schedule(kind="manual")
    schedules.validate(schedule, field_prefix="--")
    return schedules.normalize(schedule)


def _target_from(args: argparse.Namespace) -> Target:
    command: list[str] | None = args.command_argv or None
    if command is not None and args.worker is not None:
        raise InvalidInput("--worker", "give either a command after '--' or --worker, not both")
    if args.recoverable and args.worker is None:
        raise InvalidInput(
            "--recoverable",
            "only a worker job can be recoverable (a command cannot hand back a cursor): "
            "use --worker TYPE",
        )
    if args.worker is not None:
        for flag, value in (("--env", args.env), ("--cwd", args.cwd)):
            if value is not None:
                raise InvalidInput(flag, "only applies to a command, not to --worker")
        if not args.worker.strip():
            raise InvalidInput("--worker", "must name a job type")
        return Target(kind="worker", worker_type=args.worker)
    if command is None:
        raise InvalidInput(
            "command",
            "give the command after '--' (e.g. -- /usr/bin/backup --full) or --worker TYPE",
        )
    if not command[0]:
        raise InvalidInput("command", "the program name is empty")
    env = _key_values(args.env, "--env", as_json=False)
    return Target(kind="exec", argv=command, env=env, cwd=args.cwd)


def _duration_arg(text: str | None, flag: str) -> timedelta | None:
    if text is None:
        return None
    return schedules.parse_duration(text, field=flag, unit_required=True)


# --------------------------------------------------------------------------- handlers


async def _run(args: argparse.Namespace, ctx: CommandContext) -> int:
    # The daemon checks (or, with --migrate, applies) the schema itself, waiting with
    # backoff while the database is unreachable instead of exiting at once.
    from .service import preflight

    config = ctx.config()
    preflight(config)  # (refused before an embedded database is started or waited for)
    dsn = await ctx.database()
    return await _serve(config, dsn, migrate=args.migrate, cluster=ctx.used_cluster)


async def _check_schema(dsn: str, *, apply: bool) -> None:
    async with db.connection(dsn, application_name=db.APP_CLI) as conn:
        with client.translate_errors():
            if apply:
                for name in await migrations.migrate(conn):
                    _note(f"applied {name}")
            pending = await migrations.pending(conn)
    if pending:
        raise ConfigError(
            f"the schema lacks {', '.join(pending)}: run `coordinator migrate` "
            "(or `coordinator run --migrate`)"
        )


async def _serve(
    config: config_mod.Config,
    dsn: str,
    *,
    migrate: bool = False,
    log: EventLog | None = None,
    cluster: embedded.Cluster | None = None,
) -> int:
    """The daemon in the foreground, reporting to systemd when it runs under it;
    ``cluster``: the embedded server it runs on, started again should it exit."""
    from .service import event_log, serve
    from .systemd import Notifier, watchdog, watchdog_interval

    notifier = Notifier.from_environment()
    log = log if log is not None else event_log(config)
    try:
        async with trio.open_nursery() as nursery:
            # The daemon's only periodic wake-up, and only when systemd asks for it.
            nursery.start_soon(watchdog, notifier, watchdog_interval())
            if cluster is not None:
                nursery.start_soon(embedded.keep_running, cluster, log)
            status = await serve(config, dsn=dsn, notify=notifier, migrate=migrate, log=log)
            nursery.cancel_scope.cancel()
        return status
    finally:
        notifier.close()


async def _demo(args: argparse.Namespace, ctx: CommandContext) -> int:
    from .demo import Demo

    base = ctx.config()
    external = base.source("dsn").layer == "flag"
    chosen = base.state_dir if base.source("state_dir").layer == "flag" else None
    not_these = [config_mod.SERVICE_STATE_DIR, config_mod.default_state_dir()]
    with contextlib.suppress(ConfigError):  # an unreadable env file: the two above remain
        service = config_mod.service_database()
        if service is not None and service.embedded_root is not None:
            not_these.append(service.embedded_root.parent)
    demo = Demo.prepare(chosen, keep=args.keep, external_database=external, not_these=not_these)
    config = demo.settings(base)
    ctx.use(config, own_database=True)
    try:
        dsn = await ctx.database()
        async with ctx.connection() as conn:
            await demo.check_database(conn)
        await _check_schema(dsn, apply=True)
        async with ctx.connection() as conn:
            run_id = await demo.define(conn)
        demo.started(run_id)
        status = await _demo_serve(config, dsn, ctx, demo)
        if external and not demo.keep:
            async with ctx.connection() as conn:
                await demo.remove_jobs(conn)
        return status
    finally:
        with trio.CancelScope(shield=True):
            await ctx.stop_cluster()
        demo.finished()


async def _demo_serve(config: config_mod.Config, dsn: str, ctx: CommandContext, demo: Demo) -> int:
    """The daemon and its admin web page, each run's output as it ends, and ``jobs list``
    once after 12 s."""
    from .demo import OutputFollower
    from .service import event_log

    follower = OutputFollower()
    log = event_log(config)
    follower.attach(log)
    log.observers.append(demo.observe)

    async def show_jobs() -> None:
        await trio.sleep(12)
        print(f"\ndemo: coordinator jobs list --namespace {DEMO_NAMESPACE}", flush=True)
        listing = argparse.Namespace(namespace=DEMO_NAMESPACE, json=False)
        await _jobs_list(listing, ctx)
        sys.stdout.flush()

    async with ctx.connection() as conn, trio.open_nursery() as nursery:
        nursery.start_soon(follower.follow, conn)
        nursery.start_soon(show_jobs)
        status = await _serve(config, dsn, log=log)
        nursery.cancel_scope.cancel()
    return status


async def _top(args: argparse.Namespace, ctx: CommandContext) -> int:
    from . import top

    return await top.run(ctx.config(), once=getattr(args, "once", False))


async def _status(args: argparse.Namespace, ctx: CommandContext) -> int:
    config = ctx.config()
    if getattr(args, "watch", False):
        return await _top(args, ctx)
    answer = await trio.to_thread.run_sync(probe.fetch_status, config)
    live = answer.status
    database: dict[str, Any] | None = None
    leader: client.Leader | None = None
    unreachable: str | None = None
    try:
        async with ctx.connection() as conn:
            database = await db.aio(client.summary)(conn)
            leader = await db.aio(client.daemon_leader)(conn)
    except CoordinatorError as exc:  # the daemon's view is still worth showing
        if live is None:
            raise
        unreachable = str(exc)
    if database is not None:  # (the leader was read: tell another database's daemon)
        answer = probe.of_this_database(answer, leader)
        live = answer.status
    if live is not None:
        return _status_of_daemon(args, config, answer, database, unreachable, leader)
    assert database is not None
    return _status_of_database(args, answer, database, leader, probe.start_hint(config))


def _status_of_daemon(
    args: argparse.Namespace,
    config: config_mod.Config,
    answer: probe.ApiAnswer,
    database: dict[str, Any] | None,
    unreachable: str | None,
    leader: client.Leader | None = None,
) -> int:
    live = dict(answer.status or {})
    differences = (
        why.status_differences(live, database, refresh_spacing=config.refresh_spacing)
        if database is not None and live.get("state") != "standby"
        else []
    )
    if live.get("state") == "standby" and database is not None:
        # A standby loads and arms nothing: the differences above, worded for a leader
        # (manual jobs not loaded, changed since its last refresh...), misled (a tester's
        # finding). Say why, and who leads.
        leads = (
            f"PostgreSQL session {leader.pid} ({leader.application or '?'}) leads"
            if leader is not None
            else "no session holds the lock now"
        )
        differences = [
            f"this daemon stands by: it loads and arms nothing until it takes the lock; {leads}"
        ]
    if getattr(args, "json", False):
        _print_json(
            {
                "source": "daemon",
                "api": answer.label,
                **live,
                "database": database,
                "differences": differences,
            }
        )
        return 0
    armed = live.get("next_deadline") or {}
    jobs = str(live.get("jobs"))
    if database is not None:
        jobs += f" loaded (the database holds {database['jobs']})"
    pairs = [
        ("source", answer.label),
        ("state", str(live.get("state"))),
        ("instance", str(live.get("instance"))),
        ("uptime", _duration(timedelta(seconds=round(float(live.get("uptime_s") or 0))))),
        ("jobs", jobs),
        ("armed deadlines", str(live.get("armed_deadlines"))),
        ("next deadline", f"{armed.get('at') or '-'} {armed.get('job') or ''}".rstrip()),
        ("running calls", str(len(live.get("running") or ()))),
        ("retained results", str(len(live.get("retained") or ()))),
        ("workers", ", ".join(str(w) for w in live.get("workers") or ()) or "none"),
        ("last refresh", str(live.get("last_refresh") or "-")),
    ]
    pairs += [("degraded", str(reason)) for reason in live.get("degraded") or ()]
    if unreachable is not None:
        pairs.append(("database", f"not compared: {unreachable}"))
    pairs += [("difference", text) for text in differences]
    _fields(pairs)
    return 0


def _status_of_database(
    args: argparse.Namespace,
    answer: probe.ApiAnswer,
    facts: dict[str, Any],
    leader: client.Leader | None,
    start_hint: str,
) -> int:
    if leader is None:
        daemon = f"not running: no session holds its lock (start it: {start_hint})"
    else:
        since = f", since {why.when(leader.since)}" if leader.since is not None else ""
        daemon = f"leading: PostgreSQL session {leader.pid} ({leader.application or '?'}{since})"
    source = f"PostgreSQL (no daemon view: {answer.label})"
    if getattr(args, "json", False):
        _print_json(
            {
                "source": "database",
                "note": answer.label,
                "daemon": None
                if leader is None
                else {"pid": leader.pid, "application": leader.application},
                **facts,
            }
        )
        return 0
    next_job = f" {facts['next_job']}" if facts.get("next_job") else ""
    _fields(
        [
            ("source", source),
            ("daemon", daemon),
            ("jobs", f"{facts['jobs']} ({facts['paused']} paused, {facts['invalid']} invalid)"),
            ("next deadline", f"{facts['next_deadline'] or '-'}{next_job}"),
            (
                "outstanding runs",
                ", ".join(f"{k} {v}" for k, v in facts["outstanding"].items()) or "none",
            ),
        ]
    )
    return 0


async def _config(args: argparse.Namespace, ctx: CommandContext) -> int:
    from .service import cautions, refusals

    config = ctx.config()
    # What `run` refuses before connecting, said here (the service's environment may
    # differ: its env file, its user's rights to the files named).
    for problem in refusals(config):
        _note(f"`coordinator run` with these settings would refuse: {problem}")
    for caution in cautions(config):
        _note(f"`coordinator run` would start, but: {caution}")
    rows = config.describe()
    if getattr(args, "json", False):
        values = config.redacted()
        units = {s.name: "s" for s in config_mod.SETTINGS if s.unit == "duration"}
        _print_json(
            {
                name.replace(" ", "_"): {
                    "value": values.get(name, shown),
                    "unit": units.get(name),
                    "source": source.layer,
                    "origin": source.origin or None,
                }
                for name, shown, source in rows
            }
        )
        return 0
    if config.worker_socket is None:  # the computed default, not a description of it
        from .executors.worker import default_socket_path

        rows = [
            (n, str(default_socket_path()) if n == "worker_socket" else v, src)
            for n, v, src in rows
        ]
    file = config.file if config.file is not None else config_mod.config_file()
    exists = "" if config.file is not None else " (absent: defaults, environment and flags only)"
    print(f"configuration file: {file}{exists}")
    _table(("SETTING", "VALUE", "SET BY"), [(n, v, str(s)) for n, v, s in rows])
    return 0


async def _migrate(args: argparse.Namespace, ctx: CommandContext) -> int:
    async with ctx.connection() as conn:
        with client.translate_errors():
            applied = await migrations.migrate(conn)
    for name in applied:
        print(f"applied {name}")
    if not applied:
        print("schema is up to date")
    return 0


def _policies_from(args: argparse.Namespace) -> dict[str, Any]:
    """The retry and misfire policies of ``jobs define``, checked, flags named."""
    backoff = _duration_arg(args.retry_backoff, "--retry-backoff") or DEFAULT_RETRY_BACKOFF
    max_delay = _duration_arg(args.retry_max_delay, "--retry-max-delay")
    grace = _duration_arg(args.misfire_grace, "--misfire-grace")
    if args.misfire == "skip" and grace is None:
        raise InvalidInput("--misfire-grace", "required with --misfire skip (e.g. 5m)")
    if args.misfire != "skip" and grace is not None:
        raise InvalidInput("--misfire-grace", "only applies with --misfire skip")
    for flag, value in (("--retry-backoff", backoff), ("--retry-max-delay", max_delay)):
        if value is not None and value <= timedelta(0):
            raise InvalidInput(flag, "must be greater than zero")
    for flag, given in (
        ("--retry-backoff", args.retry_backoff),
        ("--retry-max-delay", args.retry_max_delay),
    ):
        if given is not None and not args.retries:
            raise InvalidInput(flag, "only applies with --retries N")

    if grace is not None and grace < MIN_MISFIRE_GRACE:
        raise InvalidInput("--misfire-grace", "must be at least 1s")
    return {
        "retries": args.retries,
        "retry_backoff": backoff,
        "retry_max_delay": max_delay or DEFAULT_RETRY_MAX_DELAY,
        "misfire": args.misfire,
        "misfire_grace": grace,
    }


async def _jobs_define(args: argparse.Namespace, ctx: CommandContext) -> int:
    check_namespace(args.namespace, "--namespace")
    check_job_name(args.name)
    schedule = _schedule_from(args)
    target = _target_from(args)
    timeout = _duration_arg(args.timeout, "--timeout")
    retention = _duration_arg(args.retention, "--retention")
    params = _key_values(args.param, "--param", as_json=True)
    policies = _policies_from(args)
    async with ctx.connection() as conn:
        try:  # (as it was: whether the define leaves its schedule, so its saved deadline)
            before: client.JobView | None = await db.aio(client.get_job)(
                conn, args.name, namespace=args.namespace
            )
        except JobNotFound:
            before = None
        job_id = await db.aio(client.define_job)(
            conn,
            name=args.name,
            namespace=args.namespace,
            schedule=schedule,
            target=target,
            params=params,
            timeout=timeout,
            priority=args.priority,
            idempotent=args.idempotent,
            paused=args.paused,  # None (neither flag): the job keeps its paused state
            recoverable=args.recoverable,
            alert=args.alert,
            keep_last=args.keep_last,
            retention=retention,
            **policies,
        )
        job = await db.aio(client.get_job)(conn, args.name, namespace=args.namespace)
        paused = job.paused if args.paused is None else args.paused
        facts = await probe.gather(conn, ctx.config(), api=target.kind == "worker" and not paused)
    _say(f"defined {args.namespace}/{args.name} (job {job_id})")
    _note_redacted(params, "--param")
    if before is not None and before.outstanding_status == "paused":
        _note_paused_redefined(before, job)
    if paused and args.paused is None:
        _note(f"{args.namespace}/{args.name} was paused and stays paused (--no-paused resumes it)")
    _say(
        why.after_define(
            schedule,
            target,
            namespace=args.namespace,
            name=args.name,
            paused=paused,
            facts=facts,
            now=datetime.now(UTC),
            done=why.one_shot_done(job),
            saved=job.next_run_at if _same_schedule(before, job) else None,
            retry=(
                (job.outstanding_run, job.outstanding_due_at)
                if job.outstanding_run is not None
                and job.outstanding_due_at is not None
                and job.outstanding_status == "queued"
                else None
            ),
        )
    )
    return 0


def _same_schedule(before: client.JobView | None, after: client.JobView) -> bool:
    """The job existed with this very schedule and a saved deadline that the define kept
    (a new job's, or one the define cleared, may have been saved by a daemon meanwhile,
    which is no "unchanged")."""
    if before is None or before.next_run_at is None:
        return False
    same = (before.schedule_kind, before.schedule, before.timezone)
    return same == (after.schedule_kind, after.schedule, after.timezone) and (
        before.next_run_at == after.next_run_at
    )


def _has_worker_jobs(jobs: Sequence[client.JobView]) -> bool:
    return any(why.worker_type(job.target) is not None for job in jobs)


def _unknown_workers_note(jobs: Sequence[client.JobView], facts: probe.Facts) -> None:
    """Say so when worker jobs are listed and only the daemon could tell if anything
    serves them."""
    kinds = sorted({k for job in jobs if (k := why.worker_type(job.target)) is not None})
    if kinds and facts.served is None and facts.api is not None:
        _note(
            f"whether a worker serves {', '.join(kinds)} only the daemon knows, and "
            f"{facts.api.label}"
        )


async def _jobs_list(args: argparse.Namespace, ctx: CommandContext) -> int:
    async with ctx.connection() as conn:
        jobs = await db.aio(client.list_jobs)(conn, namespace=args.namespace)
        if args.json:
            _print_json([job.to_json() for job in jobs])
            return 0
        facts = await probe.gather(conn, ctx.config(), api=_has_worker_jobs(jobs))
    if not jobs:
        print("no jobs")
        return 0
    _table(
        ("NAMESPACE", "NAME", "SCHEDULE", "TARGET", "NEXT RUN", "LAST", "STATE"),
        [
            (
                job.namespace,
                # (A 200-character name made the column that wide; `jobs show` and
                # --json have it whole. Cut, not _clip: a legacy name's control
                # characters are shown escaped, not folded into spaces.)
                job.name if len(job.name) <= 48 else job.name[:47] + "…",
                _describe_schedule(job),
                _clip(_describe_target(job.target), 40),
                why.next_run(job, facts),
                job.last_status or "-",
                _job_state(job, facts),
            )
            for job in jobs
        ],
    )
    sys.stdout.flush()
    _unknown_workers_note(jobs, facts)
    if (note := why.no_daemon(facts)) is not None:
        _note(note)
    return 0


def _retention_setting(ctx: CommandContext) -> str:
    """The ``retention`` setting as the configuration read here says it (the daemon's,
    when they share it): ``30d (the retention setting)``; it said only "retention
    (setting)"."""
    seconds = ctx.config().retention
    return f"{_duration(timedelta(seconds=seconds))} (the retention setting, as read here)"


async def _jobs_show(args: argparse.Namespace, ctx: CommandContext) -> int:
    async with ctx.connection() as conn:
        job = await db.aio(client.get_job)(conn, args.name, namespace=args.namespace)
        if args.json:
            _print_json(job.to_json())
            return 0
        facts = await probe.gather(conn, ctx.config(), api=_has_worker_jobs([job]))
    target = job.target
    pairs = [
        ("job", job.key),
        ("id", str(job.id)),
        ("state", _job_state(job, facts)),
        ("schedule", _describe_schedule(job)),
        ("target", _describe_target(target)),
    ]
    if target.get("env"):
        pairs.append(("env", " ".join(f"{k}={v}" for k, v in target["env"].items())))
    if target.get("cwd"):
        pairs.append(("cwd", str(target["cwd"])))
    pairs += [
        ("params", json.dumps(job.params, ensure_ascii=False)),
        ("timeout", _duration(job.timeout)),
        ("priority", job.priority),
        ("idempotent", _yes(job.idempotent)),
        ("retries", _describe_retries(job)),
        ("misfire", _describe_misfire(job)),
        ("recoverable", _yes(job.recoverable)),
        ("paused", _yes(job.paused)),
        ("alerts", "yes" if job.alert else "no (--no-alert)"),
        (
            "retention",
            f"at most the newest {job.keep_last or DEFAULT_KEEP_LAST} runs, none finished more "
            f"than {_duration(job.retention) if job.retention else _retention_setting(ctx)} ago",
        ),
        ("invalid", job.invalid_reason or "-"),
        ("next run", why.next_run(job, facts)),
        ("last run", f"{job.last_run} ({job.last_status})" if job.last_run else "-"),
        ("outstanding", _describe_outstanding(job)),
    ]
    if job.blocked_by is not None:
        pairs.append(("blocked by", f"run {job.blocked_by}: {why.resolve_hint(job.blocked_by)}"))
    pairs += [
        ("schedule version", str(job.schedule_version)),
        ("created", _when(job.created_at)),
        ("updated", _when(job.updated_at)),
    ]
    _fields(pairs)
    sys.stdout.flush()
    _unknown_workers_note([job], facts)
    if (note := why.no_daemon(facts)) is not None:
        _note(note)
    return 0


class NotWaiting(CoordinatorError):
    """``jobs trigger --wait`` (no ``--wait-timeout``) of a run that cannot start until
    someone acts: exit 1 at once, as a wait that timed out."""


async def _jobs_trigger(args: argparse.Namespace, ctx: CommandContext) -> int:
    run_args = _key_values(args.arg, "--arg", as_json=True)
    if args.force:
        run_args["force"] = True
    wait = args.wait or args.wait_timeout is not None
    wait_timeout = _duration_arg(args.wait_timeout, "--wait-timeout")
    async with ctx.connection() as conn, contextlib.AsyncExitStack() as reconnected:
        try:
            job = await db.aio(client.get_job)(conn, args.name, namespace=args.namespace)
        except JobNotFound:
            # A job the role cannot see: refused as trigger() refuses it, for a
            # namespace the role may not operate (not "unknown job", as the read said).
            await db.aio(client.require_operate)(conn, args.namespace)
            raise
        triggered = await db.aio(client.trigger_answer)(
            conn, args.name, namespace=args.namespace, args=run_args
        )
        run_id = triggered.run_id
        if not args.json:
            print(run_id, flush=True)
        facts = await probe.gather(conn, ctx.config(), api=False)
        created = triggered.created
        if not triggered.changed and run_id != job.outstanding_run:
            # Another caller's run, made between the read above and this trigger.
            _note(f"{job.key} already has run {run_id} outstanding ({triggered.status})")
        if created:
            _note_redacted(run_args, "--arg")
        if not created and run_args:
            # trigger() answers with the outstanding run as it is: its args stand.
            given = ", ".join(f"--arg {k}" if k != "force" else "--force" for k in run_args)
            _note(f"{given} not applied: run {run_id} keeps the args it was triggered with")
        if run_id == job.outstanding_run:
            if job.outstanding_status == "unresolved":
                _note(why.blocked(job, run_id))
            elif job.outstanding_due_at is not None and job.outstanding_status == "queued":
                _note(
                    f"{job.key} already has retry run {run_id}, due "
                    f"{_when(job.outstanding_due_at)}: it runs then (`coordinator runs "
                    f"cancel {run_id}` ends the chain of attempts)"
                )
            elif job.outstanding_status == "paused" and not job.recoverable:
                # Redefined without --recoverable since it paused: no cursor is handed
                # back (the note said it resumed from its cursor; it started over).
                _note(
                    f"resuming paused run {run_id} of {job.key} from the start: the job "
                    "is no longer recoverable, so its saved cursor is not handed back"
                )
            elif job.outstanding_status == "paused":
                due_at = job.outstanding_due_at
                later = (
                    f" once due, {_when(due_at)}"
                    if due_at is not None and due_at > datetime.now(UTC)
                    else ""
                )
                _note(f"resuming paused run {run_id} of {job.key} from its saved cursor{later}")
            else:
                _note(f"{job.key} already has run {run_id} outstanding ({job.outstanding_status})")
        if job.invalid_reason is not None:
            _note(
                f"{job.key} is invalid ({job.invalid_reason}); run {run_id} stays queued "
                "until its definition is fixed"
            )
        elif job.paused:
            _note(
                f"{job.key} is paused; run {run_id} stays queued until "
                f"`{why.command('resume', job.namespace, job.name)}`"
            )
        if (note := why.no_daemon(facts)) is not None:
            _note(note)
        if not wait:
            if args.json:
                _print_json((await db.aio(client.get_run)(conn, run_id)).to_json())
            return 0
        if (
            wait_timeout is None
            and triggered.status == "queued"
            and (job.paused or job.invalid_reason is not None)
        ):
            # It cannot start until someone acts: waiting without a bound waited forever.
            run = await db.aio(client.get_run)(conn, run_id)
            if args.json:
                _print_json(run.to_json())
            what = "paused" if job.paused else "invalid"
            raise NotWaiting(
                f"not waiting for run {run_id}: {job.key} is {what}, so the run cannot start "
                f"(the note above says what lets it); --wait-timeout DURATION waits anyway"
            )
        timeout = wait_timeout.total_seconds() if wait_timeout is not None else None
        # (The connection in use at the end: a new one if the first was lost meanwhile.)
        waited, conn = await _wait_through_restarts(ctx, conn, run_id, timeout, reconnected)
        if isinstance(waited, client.WaitTimeout):
            if args.json:  # a script still gets the run as it stands (and exit 1)
                _print_json(waited.run.to_json())
            job = await db.aio(client.get_job)(conn, args.name, namespace=args.namespace)
            facts = await probe.gather(
                conn, ctx.config(), api=why.worker_type(job.target) is not None
            )
            raise client.WaitTimeout(
                waited.run,
                timeout or 0.0,
                why=why.still_waiting(job, waited.run, facts, now=datetime.now(UTC)),
            )
        run = waited
        retry = await _retry_of(conn, run)
    if args.json:
        _print_json(run.to_json())
    else:
        print(run.status)
    if run.status == "succeeded":
        return 0
    detail = f" ({run.error_cause})" if run.error_cause else ""
    message = f": {run.error_message}" if run.error_message else ""
    blocked = ""
    if run.status == "unresolved":
        blocked = f"; it blocks {job.key}: {why.resolve_hint(run.id)}"
    elif run.status == "paused":
        blocked = f"; `{why.command('trigger', job.namespace, job.name)}` resumes it"
    elif retry is not None:
        # Not the end of it: the job's policy queued the next attempt with the result.
        due = f", due {_when(retry.due_at)}" if retry.due_at is not None else ""
        blocked = f"; retry run {retry.id} (attempt {retry.attempt}) follows{due}"
    elif run.exhausted:
        blocked = f"; it was attempt {run.attempt}, the last its job allows"
    _error(f"run {run.id} {run.status}{detail}{message}{blocked}")
    return 1


#: Longest pause between tries to connect again while ``--wait`` lost its connection.
RECONNECT_PAUSE_MAX: Final = 5.0


async def _wait_through_restarts(
    ctx: CommandContext,
    conn: Connection,
    run_id: int,
    max_wait: float | None,
    later: contextlib.AsyncExitStack,
) -> tuple[client.RunView | client.WaitTimeout, Connection]:
    """``--wait``: the run's end, read on a new connection if PostgreSQL restarts or the
    connection drops meanwhile (the run goes on: the daemon rides a restart out; a
    tester's run succeeded while the command exited 1, "connection lost"). Returns the
    run's end (or the :class:`~coordinator.client.WaitTimeout` that ``max_wait``, still
    the bound of the whole wait, ended it with) and the connection in use at the end (a
    new one is closed by ``later``)."""
    deadline = None if max_wait is None else trio.current_time() + max_wait
    while True:
        remaining = None if deadline is None else max(deadline - trio.current_time(), 0.0)
        try:
            run = await db.aio(client.wait_for_run)(conn, run_id, max_wait=remaining)
            return run, conn
        except client.WaitTimeout as timed_out:
            return timed_out, conn
        except DatabaseUnavailable as exc:
            _note(
                f"lost the connection while waiting for run {run_id} ({exc}); connecting "
                "again (the run goes on meanwhile)"
            )
        pause = 0.5
        while True:
            if deadline is not None and trio.current_time() >= deadline:
                raise DatabaseUnavailable(
                    f"no connection to PostgreSQL again before --wait-timeout ran out; run "
                    f"{run_id} may still be going on (`coordinator runs show {run_id}`)"
                )
            left = math.inf if deadline is None else deadline - trio.current_time()
            await trio.sleep(min(pause, left))
            try:
                conn = await later.enter_async_context(ctx.connection())
                break
            except (DatabaseUnavailable, embedded.ClusterError):
                # (An embedded server being started again by its daemon meanwhile: a
                # second pg_ctl start fails. Tried again, as a server still away.)
                pause = min(pause * 2, RECONNECT_PAUSE_MAX)


async def _retry_of(conn: Connection, run: client.RunView) -> client.RunView | None:
    """The retry a failed run's settlement queued (saved with its result), if any."""
    if run.status not in ("failed", "timed_out") or run.exhausted or run.retried_by is None:
        return None
    return await db.aio(client.get_run)(conn, run.retried_by)


async def _jobs_pause(args: argparse.Namespace, ctx: CommandContext) -> int:
    async with ctx.connection() as conn:
        job = await db.aio(client.get_job)(conn, args.name, namespace=args.namespace)
        await db.aio(client.pause)(conn, args.name, namespace=args.namespace)
    _say(f"paused {args.namespace}/{args.name}" + (" (it was already)" if job.paused else ""))
    return 0


async def _jobs_resume(args: argparse.Namespace, ctx: CommandContext) -> int:
    async with ctx.connection() as conn:
        job = await db.aio(client.get_job)(conn, args.name, namespace=args.namespace)
        await db.aio(client.resume)(conn, args.name, namespace=args.namespace)
    _say(f"resumed {args.namespace}/{args.name}" + ("" if job.paused else " (it was not paused)"))
    return 0


async def _jobs_remove(args: argparse.Namespace, ctx: CommandContext) -> int:
    async with ctx.connection() as conn:
        running = []
        job: client.JobView | None = None
        with contextlib.suppress(JobNotFound):  # (remove says so, in its words)
            job = await db.aio(client.get_job)(conn, args.name, namespace=args.namespace)
            if not args.keep_history:  # (then the job's row stays, and so does a result)
                running = await db.aio(client.list_runs)(
                    conn, namespace=args.namespace, job=args.name, status="running", limit=10
                )
        await db.aio(client.remove)(
            conn, args.name, namespace=args.namespace, keep_history=args.keep_history
        )
    if job is not None and job.outstanding_status in ("queued", "paused"):
        # (A paused recoverable run went with no word: its place in the scan is lost.)
        fate = "is cancelled" if args.keep_history else "is deleted with the job's history"
        cursor = (
            ", its saved cursor with it"
            if job.outstanding_status == "paused" and job.recoverable
            else ""
        )
        _note(
            f"its {job.outstanding_status} run {job.outstanding_run} {fate}{cursor}: it will "
            "not run"
        )
    for run in running:
        # (It was silent: the result was then dropped, said only in the daemon's log.)
        _note(
            f"run {run.id} was running: its command or call goes on to its end, and its "
            "result is not saved (the job is gone)"
        )
    if args.keep_history:
        where = "" if args.namespace == "default" else f" -n {shlex.quote(args.namespace)}"
        _say(
            f"removed {args.namespace}/{args.name}; its runs are kept until retention "
            f"takes them (`coordinator runs list --job={shlex.quote(args.name)}{where}` "
            "still lists them)"
        )
    else:
        _say(f"removed {args.namespace}/{args.name}")
    return 0


async def _prune(args: argparse.Namespace, ctx: CommandContext) -> int:
    try:
        return await _prune_as_allowed(args, ctx)
    except PermissionDenied as exc:
        raise PermissionDenied(
            None,
            exc.detail,
            message=f"{exc}: pruning takes the schema's owner or a member of coordinator_admin "
            "(the daemon prunes on its own deadline)",
        ) from None


async def _prune_as_allowed(args: argparse.Namespace, ctx: CommandContext) -> int:
    config = ctx.config()
    retention = timedelta(seconds=config.retention)
    async with ctx.connection() as conn:
        if not args.dry_run:
            report = await db.aio(client.prune)(conn, retention=retention)
            if args.json:
                _print_json(report.to_json())
            else:
                _say(
                    f"pruned {report.runs} run(s) in {report.batches} batch(es)"
                    + (
                        f"; {report.jobs_removed} removed job(s) gone"
                        if report.jobs_removed
                        else ""
                    )
                )
            return 0
        views = await db.aio(client.prune_preview)(conn, retention=retention)
    if args.json:
        _print_json([view.to_json() for view in views])
        return 0
    going = [v for v in views if v.prunable]
    if not going:
        print("nothing to prune")
        return 0
    _table(
        ("JOB", "RUNS", "WOULD DELETE", "KEEPS", "RULE"),
        [
            (
                v.key + (" (removed)" if v.removed else ""),
                str(v.runs),
                str(v.prunable),
                str(v.runs - v.prunable),
                f"at most {v.keep_last}, younger than {_duration(v.retention)}"
                if not v.removed
                else f"younger than {_duration(v.retention)}",
            )
            for v in going
        ],
    )
    print(f"{sum(v.prunable for v in going)} run(s) would be deleted (dry run: nothing was)")
    return 0


async def _runs_list(args: argparse.Namespace, ctx: CommandContext) -> int:
    async with ctx.connection() as conn:
        runs = await db.aio(client.list_runs)(
            conn,
            namespace=args.namespace,
            job=args.job,
            status=args.status,
            limit=args.limit,
            category=args.category,
        )
    if args.json:
        _print_json([run.to_json() for run in runs])
        return 0
    if not runs:
        print("no runs")
        return 0
    _table(
        (
            "ID",
            "JOB",
            "TRIGGER",
            "STATUS",
            "ATTEMPT",
            "SCHEDULED",
            "STARTED",
            "FINISHED",
            "COUNT",
            "ERROR",
        ),
        [
            (
                str(run.id),
                # (A removed job's kept runs beside those of a new job of the same name
                # were told apart only by --json's job_id.)
                f"{run.job_key} (removed)" if run.job_removed else run.job_key,
                run.trigger,
                _run_status(run),
                str(run.attempt),
                _when(run.scheduled_for),
                _when(run.started_at),
                _when(run.finished_at),
                str(run.count) if run.count is not None else "-",
                _clip(": ".join(filter(None, (run.category, run.standing_error))), 40) or "-",
            )
            for run in runs
        ],
    )
    return 0


def _run_status(run: client.RunView) -> str:
    """The STATUS column: the status, and what comes of a failure (retried, exhausted)."""
    if run.status == "queued" and run.due_at is not None:
        return f"queued (due {_when(run.due_at)})"
    if run.exhausted:
        return f"{run.status} (exhausted)"
    if run.retried_by is not None:
        return f"{run.status} (retried: {run.retried_by})"
    return run.status


async def _runs_show(args: argparse.Namespace, ctx: CommandContext) -> int:
    async with ctx.connection() as conn:
        run = await db.aio(client.get_run)(conn, args.run_id)
        chain = await db.aio(client.run_chain)(conn, args.run_id)
    if args.json:
        _print_json(client.run_json(run, chain))
        return 0
    pairs = [
        ("run", str(run.id)),
        ("job", run.job_key),
        ("status", _run_status(run)),
        ("trigger", run.trigger),
        ("attempt", str(run.attempt)),
        ("args", json.dumps(run.args, ensure_ascii=False)),
        ("scheduled for", _when(run.scheduled_for)),
        ("created", _when(run.created_at)),
    ]
    if run.due_at is not None:
        pairs.append(("due", _when(run.due_at)))
    pairs += [
        ("claimed", _when(run.claimed_at)),
        ("started", _when(run.started_at)),
        ("finished", _when(run.finished_at)),
        ("instance", run.instance or "-"),
    ]
    progress = _progress_line(run.progress)
    if progress is not None:  # (a running call's; a finished one's is in extra)
        pairs.append(("progress", progress))
    # A command's output is shown as lines below, not escaped inside extra's JSON.
    tails = {
        key: text
        for key in OUTPUT_TAILS
        if isinstance(text := (run.extra or {}).get(key), str) and text
    }
    extra = {k: v for k, v in (run.extra or {}).items() if k not in tails}
    pairs += [
        ("count", str(run.count) if run.count is not None else "-"),
        ("extra", json.dumps(extra, ensure_ascii=False) if extra else "-"),
        ("error cause", run.error_cause or "-"),
        ("category", run.category or "-"),
        ("error" if run.status != "paused" else "paused", run.standing_error or "-"),
    ]
    pairs += _recoverable_fields(run)
    if run.retryable is not None:
        pairs.append(("retryable", _yes(run.retryable)))
    if len(chain) > 1:
        pairs.append(("attempts", "; ".join(_describe_attempt(r, run.id) for r in chain)))
    _fields(pairs)
    for key, text in tails.items():
        print(f"{OUTPUT_TAILS[key]}:")
        for line in text.splitlines():
            print(f"  | {printable(line)}")
    return 0


def _progress_line(progress: Any) -> str | None:
    """A running call's latest progress as one line: ``37% sales: row 11 (at 12:00:03Z)``;
    ``None`` when it reported none."""
    if not isinstance(progress, dict) or not progress:
        return None
    parts = []
    percent = progress.get("percent")
    if isinstance(percent, int | float) and not isinstance(percent, bool):
        parts.append(f"{percent:.0f}%")
    label, message = progress.get("label"), progress.get("message")
    if label and message:
        parts.append(f"{label}: {message}")
    elif label or message:
        parts.append(str(label or message))
    if not parts:
        parts.append("busy")  # indeterminate: it says it is working, not how far
    if progress.get("regressed"):
        parts.append("(went back at least once)")
    at = progress.get("at")
    if isinstance(at, str):
        with contextlib.suppress(ValueError):
            parts.append(f"(at {_when(datetime.fromisoformat(at))})")
    return " ".join(parts)


def _describe_attempt(run: client.RunView, current: int) -> str:
    """One attempt of a chain: ``2: run 42 failed (timeout) at 12:00:03Z``."""
    mark = " (this one)" if run.id == current else ""
    what = run.status if run.category is None else f"{run.status} ({run.category})"
    if run.exhausted:
        what += ", exhausted"
    if run.status == "queued" and run.due_at is not None:
        when = f"due {_when(run.due_at)}"
    else:
        when = f"started {_when(run.started_at)}"
    return f"{run.attempt}: run {run.id}{mark} {what}, {when}"


def _recoverable_fields(run: client.RunView) -> list[tuple[str, str]]:
    """``runs show``'s lines about a cursor, pauses and findings (when there are any)."""
    pairs: list[tuple[str, str]] = []
    if run.cursor is not None:
        pairs.append(("cursor", _clip(json.dumps(run.cursor, ensure_ascii=False), 200)))
    if run.last_progress_at is not None:
        pairs.append(("last checkpoint", _when(run.last_progress_at)))
    if run.paused_at is not None:
        pairs.append(("paused at", _when(run.paused_at)))
    if run.resumes:
        pairs.append(("resumed", f"{run.resumes} time{'s' if run.resumes != 1 else ''}"))
    if run.finding_counts:
        counts = ", ".join(
            f"{run.finding_counts[s]} {s}" for s in SEVERITIES if run.finding_counts.get(s)
        )
        pairs.append(("findings", f"{counts} (coordinator runs findings {run.id})"))
    return pairs


async def _runs_pause(args: argparse.Namespace, ctx: CommandContext) -> int:
    async with ctx.connection() as conn:
        try:
            status = await db.aio(client.pause_run)(conn, args.run_id)
        except Conflict as exc:
            # The SQL function's words are for SQL (`recoverable => true`); here, the flag.
            said = str(exc).replace("(define it with recoverable)", "")
            if said == str(exc):
                raise
            raise Conflict(
                f"{said.rstrip()}: define it with --recoverable (coordinator jobs define) to "
                "make its runs pausable"
            ) from exc
    if status == "paused":
        print(f"run {args.run_id} is paused (a trigger of its job resumes it)")
    else:
        print(
            f"run {args.run_id}: pause requested; the worker stops at its next checkpoint "
            "(`coordinator runs show` says when it is paused)"
        )
    return 0


async def _runs_cancel(args: argparse.Namespace, ctx: CommandContext) -> int:
    async with ctx.connection() as conn:
        try:
            await db.aio(client.cancel_run)(conn, args.run_id)
        except Conflict as exc:
            if " is running," not in str(exc):
                raise
            # (The refusal offered no way out.)
            raise Conflict(
                f"{exc}; a running run ends with its call (or its job's timeout, if it has "
                "one); a run of a recoverable job can be paused instead: coordinator runs "
                f"pause {args.run_id}"
            ) from exc
    print(f"run {args.run_id} cancelled")
    return 0


async def _runs_findings(args: argparse.Namespace, ctx: CommandContext) -> int:
    async with ctx.connection() as conn:
        page = await db.aio(client.list_findings)(
            conn, args.run_id, after=args.after, limit=args.limit, severity=args.severity
        )
    if args.json:
        _print_json(page.to_json())
        return 0
    if not page.findings:
        print("no findings")
        return 0
    _table(
        ("ID", "SEVERITY", "KIND", "RESOURCE", "DETAIL"),
        [
            (
                str(f.id),
                f.severity,
                f.kind,
                _clip(f.resource_id, 40),
                _clip(json.dumps(f.detail, ensure_ascii=False), 60) if f.detail else "-",
            )
            for f in page.findings
        ],
    )
    if page.next_after is not None:
        sys.stdout.flush()
        # The next page of the same query: its filters too (they were left out).
        same = (f" --severity {args.severity}" if args.severity else "") + (
            f" --limit {args.limit}" if args.limit != FINDINGS_PAGE else ""
        )
        _note(f"more: coordinator runs findings {args.run_id} --after {page.next_after}{same}")
    return 0


async def _runs_resolve(args: argparse.Namespace, ctx: CommandContext) -> int:
    async with ctx.connection() as conn:
        result = await db.aio(client.resolve)(conn, args.run_id, args.outcome)
    if args.outcome == "retry":
        print(f"run {args.run_id} resolved as failed; queued retry run {result}")
    else:
        print(f"run {args.run_id} resolved as {args.outcome}")
    return 0


async def _sync(args: argparse.Namespace, ctx: CommandContext) -> int:
    manifest = manifests.load(args.manifest)
    problems = [
        {"job": p.job, "field": p.field, "reason": p.reason, "line": p.line}
        for p in manifest.problems
    ]
    if manifest.problems and not args.allow_invalid:
        if args.json:
            _print_json({"namespace": manifest.namespace, "applied": False, "problems": problems})
        else:
            for problem in manifest.problems:
                print(printable(problem.located(manifest.source)), file=sys.stderr)
        raise manifests.ManifestRejected(manifest)
    if getattr(args, "dry_run", False):
        return await _sync_plan(args, ctx, manifest, problems)
    async with ctx.connection() as conn:
        result = await db.aio(client.sync_manifest)(conn, manifest)
    if args.json:
        _print_json(
            {
                **result.to_json(),
                "applied": True,
                "invalid": list(manifest.invalid),
                "problems": problems,
            }
        )
        return 0
    _say(
        f"synced namespace {result.namespace}: {result.created} created, "
        f"{result.updated} updated, {result.paused} paused"
    )
    _say_inert(manifest, "are")
    return 0


def _say_inert(manifest: manifests.Manifest, verb: str) -> None:
    """The entries ``--allow-invalid`` stores inert (``verb``: are, or would be)."""
    if manifest.problems:
        count = len(manifest.problems)
        print(f"{count} problem{'s' if count != 1 else ''} (those jobs {verb} stored inert):")
        for problem in manifest.problems:
            _say(f"  {problem.located(manifest.source)}")


async def _sync_plan(
    args: argparse.Namespace,
    ctx: CommandContext,
    manifest: manifests.Manifest,
    problems: list[dict[str, Any]],
) -> int:
    """``sync --dry-run``: what the sync would do, nothing applied."""
    async with ctx.connection() as conn:
        plan = await db.aio(client.plan_sync)(conn, manifest.namespace, manifest.entries)
    if args.json:
        _print_json(
            {
                **plan.to_json(),
                "applied": False,
                "dry_run": True,
                "invalid": list(manifest.invalid),
                "problems": problems,
            }
        )
        return 0
    _say(
        f"would sync namespace {plan.namespace}: {len(plan.create)} created, "
        f"{len(plan.change)} changed, {len(plan.unchanged)} unchanged, {len(plan.pause)} "
        "paused (dry run: nothing applied)"
    )
    for word, names in (("create", plan.create), ("change", plan.change), ("pause", plan.pause)):
        for name in names:
            _say(f"  {word:<7} {name}")
    _say_inert(manifest, "would be")
    return 0


# --------------------------------------------------------------------------- namespaces


def _add_grants(groups: _Subparsers) -> None:
    grant = _command(
        groups,
        "grant",
        _grant,
        "let a PostgreSQL role read or operate a namespace (row-level security)",
    )
    grant.add_argument("role", metavar="ROLE", help="a login role, or a group role")
    grant.add_argument("namespace", metavar="NAMESPACE")
    grant.add_argument(
        "--read-only", action="store_true", help="see the namespace's jobs and runs, change none"
    )
    revoke = _command(groups, "revoke", _revoke, "withdraw a role's grant of a namespace")
    revoke.add_argument("role", metavar="ROLE")
    revoke.add_argument("namespace", metavar="NAMESPACE")
    grants = _command(groups, "grants", _grants, "list the namespace grants", reads=True)
    grants.add_argument("--role", metavar="ROLE", help="only this role's")
    _namespace(grants, default=None)


async def _grant(args: argparse.Namespace, ctx: CommandContext) -> int:
    check_namespace(args.namespace)
    async with ctx.connection() as conn:
        result = await db.aio(client.grant)(
            conn, args.role, args.namespace, read_only=args.read_only
        )
        (view,) = await db.aio(client.list_grants)(conn, role=args.role, namespace=args.namespace)
    access = "read" if args.read_only else "operate"
    said = {"granted": "may now", "changed": "may now", "unchanged": "already may"}[result]
    _say(f"{args.role} {said} {access} namespace {args.namespace}")
    if not view.confined:
        _note(
            f"{args.role} is not confined by the grants (a superuser, BYPASSRLS, the schema's "
            "owner, or a member of coordinator_admin or coordinator_daemon): it sees every "
            "namespace"
        )
    return 0


async def _revoke(args: argparse.Namespace, ctx: CommandContext) -> int:
    async with ctx.connection() as conn:
        found = await db.aio(client.revoke)(conn, args.role, args.namespace)
    if found:
        _say(f"{args.role} may no longer see namespace {args.namespace}")
    else:
        _say(f"{args.role} had no grant of namespace {args.namespace}: nothing to revoke")
    return 0


async def _grants(args: argparse.Namespace, ctx: CommandContext) -> int:
    async with ctx.connection() as conn:
        views = await db.aio(client.list_grants)(conn, role=args.role, namespace=args.namespace)
    if args.json:
        _print_json({"grants": [v.to_json() for v in views]})
        return 0
    if not views:
        print("no grants (roles other than the owner and coordinator_admin see nothing)")
        return 0
    _table(
        ("ROLE", "NAMESPACE", "ACCESS", "CONFINED", "GRANTED"),
        [
            (
                v.role if v.exists else f"{v.role} (dropped)",
                v.namespace,
                v.access,
                "yes" if v.confined else "no: sees every namespace",
                why.when(v.granted_at),
            )
            for v in views
        ],
    )
    return 0


def _add_token(groups: _Subparsers) -> None:
    token = groups.add_parser("token", help="tokens for the admin API and workers")
    sub = token.add_subparsers(dest="action", metavar="ACTION", required=True)
    hashed = sub.add_parser(
        "hash",
        help="print the hash of a token (read from stdin) for admin_tokens/worker_tokens",
        description="Read a token on stdin (never on the command line: it would be seen in "
        "ps and the shell history) and print the hash the configuration keeps.",
    )
    hashed.add_argument(
        "--new", action="store_true", help="make a new random token; print it, then its hash"
    )
    hashed.set_defaults(handler=_token_hash)


async def _token_hash(args: argparse.Namespace, _ctx: CommandContext) -> int:
    if args.new:
        token = tokens.new_token()
        print(f"token: {token}")
        print(f"hash:  {tokens.hash_token(token)}")
        return 0
    if sys.stdin.isatty():
        print("token (not echoed): ", end="", file=sys.stderr, flush=True)
        import getpass

        text = getpass.getpass(prompt="")
    else:
        text = sys.stdin.readline()
    token = tokens.check_token(text, "token")
    print(tokens.hash_token(token))
    return 0


if __name__ == "__main__":
    sys.exit(main())
