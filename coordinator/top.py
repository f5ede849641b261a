"""``coordinator top``: one screen of what the daemon is doing, live, in a terminal.

For operators on a server without a browser: running calls with their progress, the
next deadlines, connected workers and recent outcomes. It follows the daemon's event
stream over the admin API (``GET /api/events``, server-sent events, the same stream the
web page follows) and asks the API again only for what an event says changed:
``/api/status`` (the daemon's memory, no SQL) after runs, workers and state changes;
``/api/jobs`` (SQL) when jobs changed or a scheduled run settled (its next deadline
moved); progress and outcomes come in the events themselves. While nothing happens it
sends nothing at all, and the database sees no statement.

On a terminal the screen is redrawn in place (ages tick locally, once a second, without
asking anything); piped, a frame is printed whenever something changed (``--once``:
one frame, then exit). The address and token are the configuration's ``admin_listen``
and ``admin_token``/``admin_token_file``, as for ``coordinator status``.

Every text that comes from a job or a run is printed with control characters escaped
(:func:`coordinator.text.printable`): a job name cannot drive the terminal.
"""

from __future__ import annotations

import collections
import http.client
import json
import re
import shutil
import signal
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TextIO

import attrs
import trio

from .errors import ConfigError, CoordinatorError
from .probe import api_url
from .text import pad, printable, width

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from .config import Config

#: Seconds to wait for an answer of the API (it answers from memory or one statement).
API_TIMEOUT: Final = 5.0
#: Rows of each section at most.
DEADLINES: Final = 8
RECENT: Final = 8
#: Seconds between two reads of the same address after events (a burst costs one).
SPACING: Final = 0.3
#: Longest wait before reconnecting a dropped stream (doubling from 0.5 s).
RECONNECT_CAP: Final = 10.0

_COLOURS: Final = {
    "succeeded": "32", "leader": "32", "ready": "32",
    "failed": "31", "timed_out": "31", "degraded": "31",
    "running": "34", "queued": "34", "pending": "34",
    "unresolved": "33", "standby": "33", "cancelled": "90",
}  # fmt: skip


class TopError(CoordinatorError):
    """The admin API cannot be reached or refused us."""


# --------------------------------------------------------------------------- the model


@attrs.define(eq=False)
class Screen:
    """What is shown, updated from the API's answers and the stream's messages."""

    address: str
    status: dict[str, Any] = attrs.field(factory=dict)
    #: When ``status`` was read (to age ``running_s`` locally).
    status_at: datetime | None = None
    jobs: list[dict[str, Any]] = attrs.field(factory=list)
    recent: collections.deque[dict[str, Any]] = attrs.field(
        factory=lambda: collections.deque(maxlen=RECENT)
    )
    progress: dict[int, dict[str, Any]] = attrs.field(factory=dict)
    #: The event stream: followed (``True``), lost (``False``), not yet opened (``None``).
    live: bool | None = None
    #: A single screen (``--once``): no stream is followed.
    snapshot: bool = False
    problem: str | None = None

    def take(self, kind: str, data: dict[str, Any]) -> set[str]:
        """Apply one stream message; the addresses to read again (``status``, ``jobs``,
        ``runs``)."""
        if kind == "progress":
            run = data.get("run")
            if isinstance(run, int):
                self.progress[run] = data
            return set()
        if kind == "run":
            status = data.get("status")
            if status in ("succeeded", "failed", "timed_out", "cancelled"):
                self.progress.pop(data.get("run", 0), None)
                self.recent.appendleft({**data, "at": _now().isoformat()})
                again = {"status"}
                if data.get("trigger") in ("schedule", "retry"):
                    again.add("jobs")
                return again
            if status in ("paused", "cancel_requested"):
                return {"status", "jobs"}  # the job's state names its pausing run
            return {"status"}
        if kind in ("job", "jobs"):
            return {"jobs", "status"}
        if kind == "worker":
            return {"status"}
        if kind == "status":
            return {"status"}
        if kind == "missed":
            return {"status", "jobs", "runs"}
        return set()

    def runs_read(self, runs: list[dict[str, Any]]) -> None:
        self.recent.clear()
        for run in runs[:RECENT]:
            self.recent.append(
                {
                    "run": run.get("id"),
                    "job": f"{run.get('namespace')}/{run.get('job')}",
                    "status": run.get("status"),
                    "trigger": run.get("trigger"),
                    "error": run.get("error_message"),
                    "at": run.get("finished_at") or run.get("started_at") or run.get("created_at"),
                    "elapsed_ms": _elapsed_ms(run),
                }
            )

    # -- drawing ------------------------------------------------------------------------

    def render(self, now: datetime, *, width: int = 100, colour: bool = False) -> list[str]:
        """The screen as lines (pure: tests read it)."""

        def paint(word: str) -> str:
            code = _COLOURS.get(word)
            return f"\x1b[{code}m{word}\x1b[0m" if colour and code else word

        s = self.status
        state = str(s.get("state") or "?")
        if self.snapshot:
            link = "snapshot"
        else:
            link = {True: "live", False: "reconnecting", None: "connecting"}[self.live]
        lines = [
            f"coordinator top · {self.address} · {link} · {now.strftime('%H:%M:%SZ')}",
            f"daemon {paint(state)} {printable(str(s.get('instance') or ''))} · "
            f"{s.get('jobs', 0)} jobs loaded, {s.get('armed_deadlines', 0)} armed · "
            f"{len(s.get('running') or ())} running · {len(s.get('retained') or ())} held",
        ]
        if self.problem:
            lines.append(f"! {printable(self.problem)}")
        for reason in s.get("degraded") or ():
            lines.append(f"! degraded: {printable(str(reason))}")
        lines += ["", "RUNNING"]
        running = s.get("running") or []
        if not running:
            lines.append("  none")
        aged = (now - self.status_at).total_seconds() if self.status_at else 0.0
        for call in running:
            run = call.get("run")
            bar = _bar(self.progress.get(run) if isinstance(run, int) else None)
            seconds = float(call.get("running_s") or 0) + aged
            lines.append(
                f"  run {run:<7} {_cell(str(call.get('job')), 32)} {_duration(seconds):>7}  {bar}"
            )
        lines += ["", "NEXT DEADLINES"]
        upcoming = _upcoming(self.jobs)
        if not upcoming:
            lines.append("  none armed")
        served = set(s.get("workers") or ())
        for job, at in upcoming[:DEADLINES]:
            when = _relative(at, now)
            waits = _unserved(job, served)
            if waits is not None:  # (saved, not armed: "3m33s ago" read as overdue)
                when = "unarmed"
            line = f"  {when:<12} {_cell(_key(job), 32)} {printable(_schedule(job))}"
            if waits is not None:
                line += f"  (waiting for a worker serving {printable(waits)})"
            lines.append(line)
        lines += ["", "WORKERS"]
        workers = s.get("worker_connections") or []
        if not workers:
            lines.append("  none connected")
        for w in workers:
            draining = " (draining)" if w.get("draining") else ""
            lines.append(
                f"  {printable(str(w.get('id'))):<24} "
                f"{printable(','.join(str(t) for t in w.get('types') or ())):<24} "
                f"{w.get('busy', 0)}/{w.get('capacity', 0)} busy{draining}"
            )
        lines += ["", "RECENT OUTCOMES"]
        if not self.recent:
            lines.append("  none yet")
        for run in self.recent:
            finished = _parse(run.get("at"))
            ago = _relative(finished, now) if finished else "-"
            took = run.get("elapsed_ms")
            took_text = _duration(float(took) / 1000) if isinstance(took, int | float) else "-"
            error = f"  {printable(str(run['error']))}" if run.get("error") else ""
            status = str(run.get("status"))
            lines.append(
                f"  run {run.get('run')!s:<7} {_cell(str(run.get('job')), 32)} "
                f"{paint(status)}{' ' * max(0, 10 - len(status))} {took_text:>7} {ago:>12}"
                f"{error}"
            )
        return [_fit(line, width) for line in lines]


def _now() -> datetime:
    return datetime.now(UTC)


def _parse(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _elapsed_ms(run: dict[str, Any]) -> float | None:
    start, end = _parse(run.get("started_at")), _parse(run.get("finished_at"))
    return (end - start).total_seconds() * 1000 if start and end else None


def _key(job: dict[str, Any]) -> str:
    return f"{job.get('namespace')}/{job.get('name')}"


def _schedule(job: dict[str, Any]) -> str:
    kind, expression = job.get("schedule_kind"), job.get("schedule")
    zone = job.get("timezone") or "UTC"
    if kind == "interval":
        return f"every {expression}"
    if kind == "cron":
        return f"cron {expression}" + ("" if zone == "UTC" else f" {zone}")
    if kind == "once":
        return f"once at {expression}"
    return str(kind)


def _unserved(job: dict[str, Any], served: set[str]) -> str | None:
    """The worker type of a worker job that no connected worker serves (its saved
    deadline is not armed until one connects), else ``None``."""
    target = job.get("target")
    if not isinstance(target, dict) or target.get("kind") != "worker":
        return None
    kind = target.get("type")
    return str(kind) if kind is not None and kind not in served else None


def _upcoming(jobs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], datetime]]:
    found = []
    for job in jobs:
        at = _parse(job.get("next_run_at"))
        if at is not None and not job.get("paused") and not job.get("invalid_reason"):
            found.append((job, at))
    return sorted(found, key=lambda pair: pair[1])


def _duration(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{int(seconds)}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def _relative(moment: datetime, now: datetime) -> str:
    seconds = (moment - now).total_seconds()
    words = _duration(abs(seconds))
    return f"in {words}" if seconds > 0 else f"{words} ago"


def _bar(progress: dict[str, Any] | None, size: int = 20) -> str:
    if not progress:
        return ""
    percent = progress.get("percent")
    text = " ".join(printable(str(progress[k])) for k in ("label", "message") if progress.get(k))
    if isinstance(percent, int | float):
        filled = round(size * max(0.0, min(100.0, float(percent))) / 100)
        return f"[{'#' * filled}{'.' * (size - filled)}] {float(percent):3.0f}% {text}".rstrip()
    return f"[{'~' * size}] {text}".rstrip()


def _cell(text: str, columns: int) -> str:
    """``text`` (printable) in exactly ``columns`` terminal columns: cut with ``…`` when
    longer. A name past its column pushed the line's later columns (a run's outcome)
    out of line, or off the screen (a tester's finding)."""
    text = printable(text)
    if width(text) > columns:
        while width(text) > columns - 1:
            text = text[:-1]
        text += "…"
    return pad(text, columns)


#: A colour code in a rendered line (it takes no room on the screen).
_SGR: Final = re.compile(r"\x1b\[[0-9;]*m")


def _fit(line: str, columns: int) -> str:
    """``line`` cut to ``columns`` columns, with "…" where it was cut. Colour codes take no
    room and are kept (a coloured line was left whole: it wrapped on an 80-column
    terminal, and the redraw in place scrolled); wide characters take two."""
    if width(_SGR.sub("", line)) <= columns:
        return line
    room = max(columns - 1, 1)
    out: list[str] = []
    used = 0
    position = 0
    for match in [*_SGR.finditer(line), None]:
        end = match.start() if match is not None else len(line)
        for char in line[position:end]:
            size = width(char)
            if used + size > room:
                codes = [piece for piece in out if _SGR.fullmatch(piece)]
                open_colour = bool(codes) and codes[-1] != "\x1b[0m"
                return "".join(out) + "…" + ("\x1b[0m" if open_colour else "")
            out.append(char)
            used += size
        if match is not None:
            out.append(match.group())
            position = match.end()
    return "".join(out)


def _fit_height(lines: list[str], rows: int) -> list[str]:
    """``lines`` cut to ``rows`` terminal lines, the last saying how many are left out
    (a 24-row terminal got 29 lines, and the redraw in place scrolled the title off)."""
    if len(lines) <= rows or rows < 2:
        return lines
    kept = lines[: rows - 1]
    return [*kept, f"… {len(lines) - len(kept)} more line(s): a taller terminal shows them"]


# --------------------------------------------------------------------------- the API


@attrs.frozen
class Api:
    """The admin API at ``listen`` with ``token`` (blocking calls: run them in threads)."""

    listen: str
    token: str

    def _request(self, path: str) -> urllib.request.Request:
        return urllib.request.Request(
            api_url(self.listen, path), headers={"Authorization": f"Bearer {self.token}"}
        )

    def get(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(self._request(path), timeout=API_TIMEOUT) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            raise TopError(f"the admin API answered {exc.code} to {path}{_said(exc)}") from None
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise TopError(
                f"nothing answered at {api_url(self.listen, path)} ({reason}): is the daemon "
                "running? (`coordinator status` says what it finds)"
            ) from None

    def events(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """The event stream's messages as they come (blocks between them); first
        ``("_open", {})`` once the stream is open."""
        try:
            answer = urllib.request.urlopen(self._request("/api/events"), timeout=None)
        except urllib.error.HTTPError as exc:
            raise TopError(f"the admin API answered {exc.code} to /api/events") from None
        except OSError as exc:
            reason = getattr(exc, "reason", None) or exc
            raise TopError(f"the event stream cannot be opened ({reason})") from None
        with answer:
            yield "_open", {}
            kind = "message"
            for raw in answer:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    try:
                        data = json.loads(line[6:])
                    except ValueError:
                        continue
                    if isinstance(data, dict):
                        yield kind, data
                    kind = "message"


def api_for(config: Config) -> Api:
    """The admin API the configuration names, or a one-line :class:`ConfigError`."""
    where = f"in {config.file}" if config.file is not None else "in the configuration"
    if not config.admin_listen and config.source("admin_listen").layer == "demo":
        raise ConfigError(
            f"coordinator top follows the daemon's admin API, and no demo runs in "
            f"{config.state_dir} now (start one: coordinator demo --state-dir "
            f"{config.state_dir})"
        )
    if not config.admin_listen:
        raise ConfigError(
            f"coordinator top follows the daemon's admin API, and none is configured "
            f"(set admin_listen and admin_token {where})"
        )
    token = config.admin_token_value()
    if not token:
        raise ConfigError(f"no admin token is configured {where} (admin_token or admin_token_file)")
    return Api(listen=config.admin_listen, token=token)


# --------------------------------------------------------------------------- the loop


@attrs.define(eq=False)
class Top:
    """Follows the stream and draws the screen."""

    api: Api
    out: TextIO = sys.stdout
    tty: bool = False
    once: bool = False
    screen: Screen = attrs.field(init=False)
    _last_frame: list[str] = attrs.field(factory=list)
    _linked: bool = False

    def __attrs_post_init__(self) -> None:
        self.screen = Screen(address=api_url(self.api.listen, "/"))

    async def _read(self, what: set[str]) -> None:
        if "status" in what:
            self.screen.status = await trio.to_thread.run_sync(self.api.get, "/api/status")
            self.screen.status_at = _now()
        if "jobs" in what:
            # (The soonest only: it read every job, 2.4 MB at 2,920, after each run.)
            answer = await trio.to_thread.run_sync(self.api.get, f"/api/jobs?due={DEADLINES}")
            self.screen.jobs = list(answer.get("jobs") or [])
        if "runs" in what:
            answer = await trio.to_thread.run_sync(self.api.get, f"/api/runs?limit={RECENT}")
            self.screen.runs_read(list(answer.get("runs") or []))

    def draw(self, *, force: bool = False) -> None:
        size = shutil.get_terminal_size((100, 40))
        width = size.columns if self.tty else 120
        lines = self.screen.render(_now(), width=width, colour=self.tty)
        if self.tty:
            lines = _fit_height(lines, size.lines - 1)  # (the cursor's line stays free)
            self.out.write("\x1b[H" + "".join(f"{line}\x1b[K\n" for line in lines) + "\x1b[J")
        else:
            # The clock (the header's last part) changes every second: compare the rest.
            body = [lines[0].rsplit(" · ", 1)[0], *lines[1:]]
            if body == self._last_frame and not force:
                return
            self._last_frame = body
            self.out.write("\n".join(lines) + "\n\n")
        self.out.flush()

    async def run(self) -> int:
        # Ctrl-C (or SIGTERM) is how top ends, quietly, from the start on.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_until_signal, signals, nursery.cancel_scope)
                # The status comes from the daemon's memory; jobs and runs from the
                # database. With the database down the screen still shows the daemon's
                # side (running calls, held results, why it is degraded), and says what
                # it could not read: it gave up on the first answer, exactly when an
                # operator needs it.
                await self._read({"status"})
                complete = True
                try:
                    await self._read({"jobs", "runs"})
                except TopError as exc:
                    self.screen.problem = str(exc)
                    complete = False
                if self.once:
                    self.screen.snapshot = True
                    self.draw(force=True)
                    nursery.cancel_scope.cancel()
                    return 0 if complete else 1
                await self._live(nursery)
        return 0

    async def _live(self, nursery: trio.Nursery) -> None:
        if self.tty:
            self.out.write("\x1b[?1049h\x1b[?25l")  # the alternate screen, no cursor
        try:
            wanted: trio.MemorySendChannel[tuple[str, dict[str, Any]]]
            wanted, incoming = trio.open_memory_channel[tuple[str, dict[str, Any]]](1024)
            nursery.start_soon(self._follow, wanted)
            if self.tty:
                nursery.start_soon(self._tick)
            self.draw(force=True)
            await self._apply(incoming)
        finally:
            if self.tty:
                self.out.write("\x1b[?25h\x1b[?1049l")
                self.out.flush()

    async def _apply(self, incoming: trio.MemoryReceiveChannel[tuple[str, dict[str, Any]]]) -> None:
        """Take messages; after a burst, read what they named once, then draw."""
        async for kind, data in incoming:
            again = self._take(kind, data)
            with trio.move_on_after(SPACING):
                while True:  # the rest of the burst
                    kind, data = await incoming.receive()
                    again |= self._take(kind, data)
            try:
                await self._read(again)
                self.screen.problem = None
            except TopError as exc:
                self.screen.problem = str(exc)
            self.draw()

    def _take(self, kind: str, data: dict[str, Any]) -> set[str]:
        if kind == "_link":
            self.screen.live = bool(data.get("up"))
            self.screen.problem = data.get("problem")
            if not self.screen.live:
                return set()
            # Read everything again after a reconnection (events may have been missed),
            # not after the first connection: run() has just read it.
            first, self._linked = not self._linked, True
            return set() if first else {"status", "jobs", "runs"}
        return self.screen.take(kind, data)

    async def _follow(self, wanted: trio.MemorySendChannel[tuple[str, dict[str, Any]]]) -> None:
        """The stream, reconnected with backoff; each (re)connection reads everything."""
        pause = 0.5
        while True:
            token = trio.lowlevel.current_trio_token()

            def pump(token: trio.lowlevel.TrioToken = token) -> None:
                for kind, data in self.api.events():
                    message = ("_link", {"up": True}) if kind == "_open" else (kind, data)
                    trio.from_thread.run_sync(wanted.send_nowait, message, trio_token=token)

            try:
                await trio.to_thread.run_sync(pump, abandon_on_cancel=True)
                problem = "the daemon closed the event stream"
                pause = 0.5
            except TopError as exc:
                problem = str(exc)
            except trio.WouldBlock:
                problem = "fell behind the event stream"
            await wanted.send(("_link", {"up": False, "problem": problem}))
            await trio.sleep(pause)
            pause = min(pause * 2, RECONNECT_CAP)

    async def _tick(self) -> None:
        """Ages and running times move on screen (no request)."""
        while True:
            await trio.sleep(1.0)
            self.draw()


def _said(exc: urllib.error.HTTPError) -> str:
    """``: MESSAGE`` of an error answer's JSON body (``{"error", "message"}``), if any."""
    try:
        message = json.loads(exc.read()).get("message")
    except (OSError, ValueError, AttributeError, http.client.HTTPException):
        return ""
    return f": {message}" if isinstance(message, str) and message else ""


async def _until_signal(signals: AsyncIterator[int], scope: trio.CancelScope) -> None:
    """Ctrl-C (or SIGTERM) is how top ends: quietly, exit status 0."""
    async for _ in signals:
        scope.cancel()
        return


async def run(config: Config, *, once: bool = False, out: TextIO | None = None) -> int:
    """``coordinator top`` (and ``coordinator status --watch``) until interrupted."""
    api = api_for(config)
    stream = out if out is not None else sys.stdout
    tty = stream.isatty() and not once
    top = Top(api=api, out=stream, tty=tty, once=once)
    return await top.run()


__all__ = ["Api", "Screen", "Top", "TopError", "api_for", "run"]
