"""The ``exec`` executor: a run's command as a subprocess (docs/design.md, "Executors").

The command gets the run's identity in its environment (``COORDINATOR_*``), the job's
``params`` as JSON in ``COORDINATOR_PARAMS``, and the dispatch args as JSON on stdin.
Exit status 0 is success; a last stdout line holding a JSON object reports ``count``
and ``extra``. Only a bounded tail of stdout and of stderr is kept.

Process-group policy (the run owns its group; nothing in it outlives the run):

* The command starts in a new session, so it leads a process group of its own.
* Timeout, abandon and cancellation of the calling task stop the whole group: SIGTERM,
  then SIGKILL if the main process is still alive ``kill_grace`` seconds later.
* Once the main process has exited (by itself or because it was stopped), stdout and
  stderr get at most :data:`PIPE_GRACE` seconds more to reach end of file: a background
  child may still be finishing its output. Then whatever is left in the group is killed
  with SIGKILL, and reading stops after at most :data:`DRAIN_AFTER_KILL` seconds more (a
  process that left the group with ``setsid`` may hold the pipes open forever; we close
  our ends and return).
* The main process is seen exiting *without being reaped* (a pidfd, or ``waitid`` with
  ``WNOWAIT``) and is reaped last, so its pid, which is the group's id, cannot be reused
  by another process while the group is still being signalled.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs
import trio

from ..clock import WallClock
from ..events import EventBus
from ..model import ENV_STRING_MAX, EXIT_TEMPFAIL, Outcome, params_env, params_env_size
from ..text import TRUNCATED, clip, storable
from .base import AT_ONCE, ExecutorHooks, Turn
from .ledger import CommandLedger
from .outcomes import CANCELLED_MESSAGE, cancelled, ended, not_sent, timed_out_message

if TYPE_CHECKING:
    from datetime import datetime, timedelta

    from ..core.admission import Coverage
    from ..model import Claim, ErrorCause, OutcomeStatus, Target
    from ..protocol import Category
    from ..status import WorkerView


def _spawning() -> None:
    """The step that starts a command: nothing to queue, its spawn follows at once."""


#: Seconds stdout/stderr may stay open after the main process has exited.
PIPE_GRACE: Final = 1.0
#: Seconds to keep reading after the leftover group was killed with SIGKILL.
DRAIN_AFTER_KILL: Final = 0.25

_READ_SIZE: Final = 64 * 1024
#: Bound on waiting for the reaped process after cancellation (beyond ``kill_grace``).
_CANCEL_SLACK: Final = 1.0
_BIGINT_MIN, _BIGINT_MAX = -(2**63), 2**63 - 1

_Ending = Literal["exited", "timeout", "abandon"]


def _too_big(claim: Claim) -> str:
    """E2BIG in words: the kernel's message names the program ("Argument list too long:
    'true'"), not what was too long -- here, mostly, params stored before definitions
    were checked against the limit of one environment string."""
    size = params_env_size(claim.job.params)
    if size > ENV_STRING_MAX:
        return (
            f"the job's params are {size - len('COORDINATOR_PARAMS=') - 1:,} bytes as JSON "
            "in COORDINATOR_PARAMS, over the "
            f"{ENV_STRING_MAX // 1024} KiB one environment variable may hold: pass large "
            "input as a run's args (its stdin), or a reference to it"
        )
    return (
        "the command's arguments and environment are over the kernel's limit (E2BIG): "
        "shorten its argv or env, or pass large input as a run's args (its stdin)"
    )


__all__ = ["CANCELLED_MESSAGE", "DRAIN_AFTER_KILL", "PIPE_GRACE", "TRUNCATED", "ExecExecutor"]


@attrs.define(eq=False)
class ExecExecutor:
    """Runs ``exec`` targets as subprocesses under trio."""

    #: Where ``started_at`` and ``finished_at`` come from.
    clock: WallClock
    #: Bytes kept from the end of stdout, and from the end of stderr.
    output_limit: int = 16 * 1024
    #: Seconds between SIGTERM and SIGKILL to the process group.
    kill_grace: float = 5.0
    #: Environment the command's is built on; ``None`` means ``os.environ``.
    base_env: Mapping[str, str] | None = None
    #: The namespaces whose jobs may run commands (``command_namespaces``); ``None``:
    #: every one. A command runs as the daemon's user, so a role that may operate a
    #: namespace may run anything that user may, unless its namespace is left out.
    namespaces: frozenset[str] | None = None
    #: The groups of the commands running, kept in the state directory, so that the next
    #: start stops those a killed daemon left (``None``: not kept).
    ledger: CommandLedger | None = None
    #: Where the orphans stopped at start, and a ledger that cannot be written, are said.
    events: EventBus | None = None
    #: The last command could not be recorded (said once until one is again).
    _ledger_failing: bool = False
    #: run id -> set to stop its command (:meth:`cancel`).
    _stops: dict[int, trio.Event] = attrs.field(factory=dict)
    #: The daemon's hooks (:meth:`attach`): ``may_send`` before a command is spawned.
    _hooks: ExecutorHooks | None = attrs.field(default=None, init=False)

    # -- lifecycle: a command needs nothing opened, has no pools, nothing connects --------

    def attach(self, hooks: ExecutorHooks) -> None:
        """Keep the hooks for ``may_send`` (commands have no pools to report)."""
        self._hooks = hooks

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Nothing to open; but first stop the commands a daemon killed outright left
        running (the lock is ours, no run has started yet: :mod:`.ledger`)."""
        if self.ledger is not None:
            await self.ledger.stop_orphans(grace=self.kill_grace, events=self.events)
        task_status.started()

    async def detach(self) -> None:
        """Nothing accepts work from outside; calls in flight finish or are abandoned."""

    def capacities(self) -> Mapping[str, int]:
        return {}

    def coverage(self) -> Mapping[str, Coverage]:
        return {}

    def connections(self) -> Sequence[WorkerView]:
        return ()

    def available(self, target: Target) -> bool:
        """Commands can always be started."""
        return target.kind == "exec"

    def _note_ledger(self, problem: str | None, run_id: int) -> None:
        """Say when commands start going unrecorded (once, until one is recorded again):
        a daemon killed outright would leave them running, unseen by the next start."""
        if problem is None:
            self._ledger_failing = False
            return
        if self._ledger_failing or self.events is None:
            return
        self._ledger_failing = True
        self.events.log.warning(
            "commands.unrecorded",
            run=run_id,
            error=problem,
            consequence="if this daemon is killed outright, the next start will not stop "
            "this command (nor the next ones, until the state directory can be written)",
        )

    def cancel(self, run_id: int, reason: str) -> bool:
        """Stop the command of ``run_id`` (its group: SIGTERM, then SIGKILL after the
        grace; the run ends ``cancelled``) when the daemon is ``stopping`` (a stepped-down
        leader stops the calls the new leader runs again). Commands cannot be recoverable
        (a command has no way to hand back a cursor), so there is never one to pause:
        ``False`` for ``pause``, and when no command of that run runs here."""
        stop = self._stops.get(run_id)
        if stop is None or reason != "stopping":
            return False
        stop.set()
        return True

    async def call(self, claim: Claim, *, abandon: trio.Event, turn: Turn = AT_ONCE) -> Outcome:
        """Run the claim's command and report how it ended; never raises for the command.

        Only ``trio.Cancelled`` propagates, after the process group has been stopped.
        """
        since = trio.current_time()
        # Spawning yields: the calls granted before this one spawn first.
        await turn.reached()
        started_at = self.clock.now()
        if abandon.is_set():
            return cancelled(self.clock, started_at, _io_extra(None, "", ""))
        if self._hooks is not None and not self._hooks.may_send(since):
            # The lead was lost since the claim: another daemon may have swept this run
            # and be running it again. Nothing started here, so it is given back, as the
            # worker executor does with a call it may no longer send.
            return not_sent(self.clock, claim, "not sent: this daemon lost its leadership")
        namespace = claim.job.namespace
        if self.namespaces is not None and namespace not in self.namespaces:
            allowed = ", ".join(sorted(self.namespaces)) or "none"
            return ended(
                self.clock,
                started_at,
                "failed",
                "handler",
                f"commands may not run in namespace {namespace!r} (command_namespaces: "
                f"{allowed}); give the job a worker target",
                _io_extra(None, "", ""),
                category="invalid-input",
                retryable=False,
            )
        turn.take(_spawning)  # (run.started: the spawn follows, before anything yields)
        target = claim.job.target
        try:
            if not target.argv:
                raise ValueError("empty argv")
            stdin_data = json.dumps(claim.args, default=str).encode()
            proc = await trio.lowlevel.open_process(
                list(target.argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=target.cwd,
                env=self._env(claim),
                start_new_session=True,
            )
        except (OSError, ValueError, TypeError, subprocess.SubprocessError) as exc:
            # Params or args too large for the kernel's limit on a command's arguments and
            # environment fail every attempt alike: the run's input, not worth a retry.
            too_big = isinstance(exc, OSError) and exc.errno == errno.E2BIG
            return ended(
                self.clock,
                started_at,
                "failed",
                "handler",
                f"cannot start: {_too_big(claim) if too_big else exc}",
                _io_extra(None, "", ""),
                category="invalid-input" if too_big else None,
                retryable=False if too_big else None,
            )

        out, err = _Tail(self.output_limit), _Tail(self.output_limit)
        timeout = claim.job.timeout
        if self.ledger is not None:
            self._note_ledger(self.ledger.record(proc.pid, claim.run_id), claim.run_id)
        try:
            try:
                stop = self._stops[claim.run_id] = trio.Event()
                try:
                    ending = await self._supervise(
                        proc, stdin_data, timeout, abandon, out, err, stop
                    )
                finally:
                    self._stops.pop(claim.run_id, None)
            except BaseException:
                with trio.CancelScope(shield=True):
                    await self._stop_after_cancel(proc)
                raise
            # The main process has exited and is not reaped yet: reap it now (immediate).
            with trio.CancelScope(shield=True):
                returncode = await proc.wait()
        finally:
            if self.ledger is not None:
                self.ledger.forget(proc.pid)
        finished_at = self.clock.now()
        return self._settle(started_at, finished_at, ending, timeout, returncode, out, err)

    def _env(self, claim: Claim) -> dict[str, str]:
        job = claim.job
        env = dict(os.environ if self.base_env is None else self.base_env)
        env.update(job.target.env)
        env.update(
            COORDINATOR_RUN_ID=str(claim.run_id),
            COORDINATOR_JOB=job.name,
            COORDINATOR_NAMESPACE=job.namespace,
            COORDINATOR_FORCE="1" if claim.args.get("force") else "0",
            COORDINATOR_ATTEMPT=str(claim.attempt),
            COORDINATOR_TRIGGER=claim.trigger,
            COORDINATOR_SCHEDULED_FOR=(
                claim.scheduled_for.isoformat() if claim.scheduled_for is not None else ""
            ),
            COORDINATOR_PARAMS=params_env(job.params),
        )
        return env

    async def _supervise(
        self,
        proc: trio.Process,
        stdin_data: bytes,
        time_limit: timedelta | None,
        abandon: trio.Event,
        out: _Tail,
        err: _Tail,
        stop: trio.Event | None = None,
    ) -> _Ending:
        """Feed stdin and read output while the command runs; stop it if it must stop
        (``abandon``: every call; ``stop``: this one).

        Returns with the main process exited but not reaped, the group killed, and our
        pipe ends closed.
        """
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        drained = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_feed, proc.stdin, stdin_data)
                nursery.start_soon(_drain_both, proc.stdout, out, proc.stderr, err, drained)

                ending = await self._wait_main(proc, time_limit, abandon, stop)
                if ending != "exited":
                    await self._terminate(proc)

                # The main process is gone; its children may still hold the pipes.
                with trio.move_on_after(PIPE_GRACE):
                    await drained.wait()
                _signal_group(proc, signal.SIGKILL)
                with trio.move_on_after(DRAIN_AFTER_KILL):
                    await drained.wait()
                nursery.cancel_scope.cancel()
        finally:
            await _close_pipes(proc)
        return ending

    async def _wait_main(
        self,
        proc: trio.Process,
        time_limit: timedelta | None,
        abandon: trio.Event,
        stop: trio.Event | None = None,
    ) -> _Ending:
        """Wait until the main process exits, the timeout passes or ``abandon`` (or
        ``stop``) is set."""
        limit = math.inf if time_limit is None else max(time_limit.total_seconds(), 0.0)
        with trio.move_on_after(limit) as timer:
            async with trio.open_nursery() as race:
                race.start_soon(_cancel_when_set, abandon, race.cancel_scope)
                if stop is not None:
                    race.start_soon(_cancel_when_set, stop, race.cancel_scope)
                await _wait_exited(proc)
                race.cancel_scope.cancel()
        if _has_exited(proc):
            return "exited"
        return "timeout" if timer.cancelled_caught else "abandon"

    async def _terminate(self, proc: trio.Process) -> None:
        """SIGTERM the group; SIGKILL it if the main process outlives ``kill_grace``."""
        _signal_group(proc, signal.SIGTERM)
        with trio.move_on_after(self.kill_grace):
            await _wait_exited(proc)
            return
        _signal_group(proc, signal.SIGKILL)
        await _wait_exited(proc)

    async def _stop_after_cancel(self, proc: trio.Process) -> None:
        """Stop the group and reap the process, bounded; run shielded."""
        with trio.move_on_after(self.kill_grace + _CANCEL_SLACK):
            if not _has_exited(proc):
                await self._terminate(proc)
        _signal_group(proc, signal.SIGKILL)
        await _close_pipes(proc)
        with trio.move_on_after(_CANCEL_SLACK):
            await proc.wait()

    def _settle(
        self,
        started_at: datetime,
        finished_at: datetime,
        ending: _Ending,
        timeout: timedelta | None,
        returncode: int,
        out: _Tail,
        err: _Tail,
    ) -> Outcome:
        stdout, stderr = out.text(), err.text()
        extra: dict[str, Any] = {}
        count: int | None = None
        if ending == "exited" and returncode == 0:
            count, extra = _report(stdout)
        extra.update(_io_extra(returncode, stdout, stderr))

        status: OutcomeStatus
        cause: ErrorCause | None
        category: Category | None = None
        retryable: bool | None = None
        if ending == "timeout":
            assert timeout is not None
            status, cause, message = "timed_out", "timeout", timed_out_message(timeout)
        elif ending == "abandon":
            status, cause, message = "cancelled", None, CANCELLED_MESSAGE
        elif returncode == 0:
            return Outcome(
                status="succeeded",
                started_at=started_at,
                finished_at=finished_at,
                count=count,
                extra=extra,
            )
        else:
            status, cause = "failed", "handler"
            if returncode < 0:
                message = f"killed by signal {_signal_name(-returncode)}"
                category = "provider-failure"  # it crashed, or something killed it
            else:
                message = f"exit status {returncode}"
            if returncode == EXIT_TEMPFAIL:
                # "Temporary failure, retry" (sysexits): a dependency was not there.
                category, retryable = "external-dependency", True
            line = _last_line(stderr)
            if line:
                message = f"{message}: {line}"
        return ended(
            self.clock,
            started_at,
            status,
            cause,
            message,
            extra,
            finished_at=finished_at,
            category=category,
            retryable=retryable,
        )


@attrs.define(eq=False)
class _Tail:
    """The last ``limit`` bytes of a stream; memory stays bounded whatever arrives."""

    limit: int
    _buf: bytearray = attrs.field(factory=bytearray)
    truncated: bool = False

    def add(self, chunk: bytes | bytearray) -> None:
        if len(chunk) >= self.limit:
            self.truncated = self.truncated or bool(self._buf) or len(chunk) > self.limit
            self._buf = bytearray(chunk[len(chunk) - self.limit :])
            return
        self._buf += chunk
        excess = len(self._buf) - self.limit
        if excess > 0:
            del self._buf[:excess]
            self.truncated = True

    def text(self) -> str:
        """Decoded (UTF-8, replacing errors), marked with :data:`TRUNCATED` when cut."""
        data = bytes(self._buf)
        if not self.truncated:
            text: str = storable(data.decode("utf-8", "replace"))
            return text
        # Skip the continuation bytes of a character the cut went through.
        start = 0
        while start < min(3, len(data)) and data[start] & 0xC0 == 0x80:
            start += 1
        return TRUNCATED + str(storable(data[start:].decode("utf-8", "replace")))


async def _feed(stream: trio.abc.SendStream, data: bytes) -> None:
    """Write the args to stdin and close it; a command that does not read is fine."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        async with stream:
            await stream.send_all(data)


async def _drain(stream: trio.abc.ReceiveStream, tail: _Tail) -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        while chunk := await stream.receive_some(_READ_SIZE):
            tail.add(chunk)


async def _drain_both(
    stdout: trio.abc.ReceiveStream,
    out: _Tail,
    stderr: trio.abc.ReceiveStream,
    err: _Tail,
    drained: trio.Event,
) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_drain, stdout, out)
        nursery.start_soon(_drain, stderr, err)
    drained.set()


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _close_pipes(proc: trio.Process) -> None:
    with trio.CancelScope(shield=True):
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                await stream.aclose()


def _signal_group(proc: trio.Process, signum: signal.Signals) -> None:
    """Signal the process group the command leads (gone already is fine)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


async def _wait_exited(proc: trio.Process) -> None:
    """Return once the main process has exited, leaving it unreaped (a zombie)."""
    if sys.platform == "linux":
        try:
            fd = os.pidfd_open(proc.pid)
        except OSError:
            pass  # an old kernel: fall back to waitid in a thread
        else:
            try:
                await trio.lowlevel.wait_readable(fd)
            finally:
                trio.lowlevel.notify_closing(fd)
                os.close(fd)
            return
    await trio.to_thread.run_sync(_block_until_exited, proc.pid, abandon_on_cancel=True)


def _block_until_exited(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


def _has_exited(proc: trio.Process) -> bool:
    """Whether the main process has exited (reaped or not); does not reap it."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _io_extra(returncode: int | None, stdout: str, stderr: str) -> dict[str, Any]:
    """The keys every outcome's ``extra`` carries."""
    extra: dict[str, Any] = {
        "exit_code": returncode if returncode is None or returncode >= 0 else None,
        "stdout_tail": stdout,
        "stderr_tail": stderr,
    }
    if returncode is not None and returncode < 0:
        extra["signal"] = _signal_name(-returncode)
    return extra


def _report(stdout: str) -> tuple[int | None, dict[str, Any]]:
    """``count`` and ``extra`` from a last stdout line that is a JSON object."""
    line = _last_line(stdout)
    if not line.startswith("{"):
        return None, {}
    try:
        obj = json.loads(line, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None, {}
    if not isinstance(obj, dict):
        return None, {}
    obj = storable(obj)
    extra: dict[str, Any] = {}
    count: int | None = None
    value = obj.pop("count", None)
    if isinstance(value, int) and not isinstance(value, bool) and _in_bigint(value):
        count = value
    elif value is not None:
        shown = clip(repr(value), 100)
        extra["count_error"] = f"count must be an integer (64-bit), not {shown}"
    nested = obj.pop("extra", None)
    extra.update(obj)
    if isinstance(nested, dict):
        extra.update(nested)
    elif nested is not None:
        extra["extra"] = nested
    return count, extra


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _in_bigint(value: int) -> bool:
    return _BIGINT_MIN <= value <= _BIGINT_MAX


def _last_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()
    return ""


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
