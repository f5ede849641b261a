"""What a CLI command can learn about the running daemon, to say why nothing happens.

Two sources, each labelled: PostgreSQL says whether a daemon leads at all (the session
holding its advisory lock, :func:`coordinator.client.daemon_leader`: no admin API
needed); the daemon's admin API (``GET /api/status``, address and token from the same
configuration as the CLI's) says what it has loaded, armed and which worker types are
served. The API is asked only when a command needs what only the daemon knows.
"""

from __future__ import annotations

import json
import shlex
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from . import client, db
from .errors import ConfigError
from .why import START_HINT

if TYPE_CHECKING:
    from asyncpg import Connection

    from .config import Config

#: Seconds to wait for the admin API: it answers from memory, so a slow answer is no answer.
API_TIMEOUT: Final = 2.0


@attrs.frozen(kw_only=True)
class ApiAnswer:
    """``GET /api/status`` from the daemon, or why there is none."""

    #: The body, or ``None``.
    status: Mapping[str, Any] | None
    #: Where it came from (``the daemon's admin API at http://...``) or why none answered.
    label: str


@attrs.frozen(kw_only=True)
class Facts:
    """What a command knows about the daemon."""

    #: The daemon leading on the command's database (from PostgreSQL), if known.
    leader: client.Leader | None = None
    #: Whether ``leader`` was read (False when the database was not asked).
    leader_known: bool = False
    #: The admin API's answer, if it was asked.
    api: ApiAnswer | None = None
    #: The configured refresh spacing (seconds), for "within 30s".
    refresh_spacing: float = 30.0
    #: How to start the daemon these facts are about (:func:`start_hint`).
    start_hint: str = START_HINT

    @property
    def status(self) -> Mapping[str, Any] | None:
        return self.api.status if self.api is not None else None

    @property
    def daemon_running(self) -> bool | None:
        """True if a daemon leads, False if none does, None if unknown."""
        if self.status is not None and self.status.get("state") == "leader":
            return True
        if self.leader_known:
            return self.leader is not None
        return None

    @property
    def _workers_known(self) -> bool:
        """The API's answer says which workers serve the database: it came from a daemon
        that leads (``leading``), not one standing by, starting or degraded before it
        ever led, whose empty list a
        command took for the leader's ("none does now", while the leader on another host
        ran those jobs; a tester's finding)."""
        return self.status is not None and self.status.get("leading") is not False

    @property
    def served(self) -> frozenset[str] | None:
        """Worker types the daemon serves, or ``None`` when only the API could tell and
        it did not answer (or answered standing by)."""
        if self._workers_known:
            assert self.status is not None
            return frozenset(str(t) for t in self.status.get("workers") or ())
        if self.daemon_running is False:
            return frozenset()  # no daemon: no worker is connected to anything
        return None

    def may_run(self, kind: str, namespace: str) -> bool | None:
        """Whether some connected (not draining) worker serving ``kind`` may run jobs of
        ``namespace`` (its token's scope); ``None`` when only the API could tell and it
        did not answer, or answered without its workers' entries. (A daemon older than
        the ``namespaces`` of those entries: every namespace.)"""
        if self.status is None or not self._workers_known:
            return False if self.daemon_running is False else None
        workers = self.status.get("worker_connections")
        if workers is None:
            return None
        for worker in workers:
            if not isinstance(worker, Mapping) or worker.get("draining"):
                continue
            reach = worker.get("namespaces")
            if kind in (worker.get("types") or ()) and (reach is None or namespace in reach):
                return True
        return False


async def gather(
    conn: Connection | None, config: Config, *, api: bool, leader: bool = True
) -> Facts:
    """Read the facts: the leader from ``conn`` (if given and ``leader``), the daemon's
    status from its admin API (if ``api``)."""
    found: client.Leader | None = None
    known = False
    if conn is not None and leader:
        found = await db.aio(client.daemon_leader)(conn)
        known = True
    answer = await trio.to_thread.run_sync(fetch_status, config) if api else None
    if answer is not None and known:
        answer = of_this_database(answer, found)
    return Facts(
        leader=found,
        leader_known=known,
        api=answer,
        refresh_spacing=config.refresh_spacing,
        start_hint=start_hint(config),
    )


def of_this_database(answer: ApiAnswer, leader: client.Leader | None) -> ApiAnswer:
    """``answer`` if the daemon that gave it leads the database asked (``leader``, from
    its ``pg_locks``), else no answer, saying whose daemon it was. The admin address
    comes from the shared configuration and the DSN may come from a flag or the
    environment: the daemon of another database was taken for this one's (its workers
    for this database's, its "leader" for this database's daemon). Told apart by the
    backend of the daemon's lock session (``lock_pid``); a daemon that does not lead, or
    one from before it was reported, cannot be told apart: kept."""
    status = answer.status
    lock_pid = status.get("lock_pid") if status is not None else None
    if not isinstance(lock_pid, int) or (leader is not None and leader.pid == lock_pid):
        return answer
    here = "none" if leader is None else f"backend {leader.pid}"
    return ApiAnswer(
        status=None,
        label=f"{answer.label} answers for the daemon of another database (its lock "
        f"session is backend {lock_pid}, this database's lock holder: {here})",
    )


def start_hint(config: Config) -> str:
    """How to start the daemon of ``config``'s database: the service's, or, given a
    demo's directory, that demo again (which keeps what it had)."""
    from .demo import MARKER  # (the CLI's module, not the SDK's: imported when asked)

    if (config.state_dir / MARKER).exists():
        return f"`coordinator demo --state-dir {shlex.quote(str(config.state_dir))} --keep`"
    return START_HINT


def api_url(listen: str, path: str) -> str:
    """``http://host:port/path`` for an ``admin_listen`` value (a wildcard means here)."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}{path}"


def fetch_status(config: Config) -> ApiAnswer:
    """``GET /api/status`` with the configured address and token (blocking)."""
    where = f"in {config.file}" if config.file is not None else "in the configuration"
    if not config.admin_listen and config.source("admin_listen").layer == "demo":
        return ApiAnswer(status=None, label=f"no demo runs in {config.state_dir} now")
    if not config.admin_listen:
        return ApiAnswer(status=None, label=f"no admin API is configured (admin_listen {where})")
    try:
        token = config.admin_token_value()
    except ConfigError as exc:
        return ApiAnswer(status=None, label=f"the admin token cannot be read ({exc})")
    if not token:
        return ApiAnswer(status=None, label=f"no admin token is configured {where}")
    url = api_url(config.admin_listen, "/api/status")
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=API_TIMEOUT) as response:
            data = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return ApiAnswer(status=None, label=f"the admin API at {url} answered {exc.code}")
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return ApiAnswer(status=None, label=f"nothing answered at {url} ({reason})")
    if not isinstance(data, dict):
        return ApiAnswer(status=None, label=f"the admin API at {url} answered {data!r}")
    return ApiAnswer(status=data, label=f"the daemon's admin API at {url}")
