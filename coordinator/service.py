"""Assembling one daemon process: the daemon, its executors, the admin face, systemd.

:mod:`coordinator.daemon` knows nothing of HTTP or systemd, and the executors know
nothing of the daemon; this module builds the pieces from a
:class:`~coordinator.config.Config` and runs them in one nursery. ``coordinator run`` and
``coordinator demo`` call :func:`serve`. Configuration problems found here (a short
admin token, a port in use, a spool path that is a directory...) are
:class:`~coordinator.errors.ConfigError`: one line and exit status 2.
"""

from __future__ import annotations

import os
import random
import socket
import ssl
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Final, Literal, cast

import trio

from . import redact
from .alerts import Alerter, EmailSink, Sink, WebhookSink, drop_outbox
from .clock import SystemWallClock
from .config import local_timezone, parse_listen
from .daemon import Daemon, DaemonSettings
from .db import dsn_problem, trio_asyncio_loop
from .errors import ConfigError
from .events import EventBus
from .executors import ExecExecutor
from .executors.ledger import CommandLedger
from .executors.worker import WorkerExecutor, default_socket_path
from .files import StateDirInUse, hold_state_dir
from .log import EventLog, Level
from .protocol import is_loopback
from .schedule import parse_prune_at
from .spool import Spool, SpoolError
from .tokens import TokenSet

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from .clock import WallClock
    from .config import Config
    from .executors import Executor


def build_daemon(
    *,
    dsn: str,
    settings: DaemonSettings,
    clock: WallClock,
    log: EventLog,
    worker_socket: Path | None = None,
    worker_listen: str | None = None,
    worker_token: str | None = None,
    worker_tokens: TokenSet | None = None,
    worker_tls: ssl.SSLContext | None = None,
    notify: Callable[[str], None] | None = None,
    handle_signals: bool = True,
    owns_process: bool = False,
    jitter: Callable[[], float] | None = None,
    alert_sinks: Sequence[Sink] = (),
    alert_window: float = 6 * 3600.0,
    command_namespaces: Sequence[str] = ("*",),
    alert_outbox: Path | None = None,
    command_ledger: Path | None = None,
) -> Daemon:
    """A daemon with both executors: commands, and workers on ``worker_socket`` (default
    :func:`~coordinator.executors.worker.default_socket_path`) and, if given, on the TCP
    address ``worker_listen``: on loopback with ``worker_token`` or ``worker_tokens``; on
    any other address (workers on other hosts) only with ``worker_tls`` and
    ``worker_tokens`` -- plain TCP there is refused (:class:`ConfigError`, one line).
    ``jitter`` (default :func:`random.random`) draws the jitter of retry delays. When any
    ``alert_sinks`` are given, an :class:`~coordinator.alerts.Alerter` is subscribed to
    its events (none otherwise: no alert configured costs nothing). ``owns_process``: the
    daemon owns its process (``coordinator run``; see daemon/cyclic_gc.py).
    ``command_namespaces``: the namespaces whose jobs may run commands (``*``: all).
    ``alert_outbox``: where a stop keeps the alert deliveries it abandons, for the next
    start (the alerter's ``outbox``). ``command_ledger``: the directory where running
    commands' process groups are recorded, for the next start to stop those a killed
    daemon left (:mod:`coordinator.executors.ledger`)."""
    events = EventBus(log=log)
    tokens = worker_tokens if worker_tokens is not None else TokenSet()
    tcp = worker_tcp(worker_listen, tls=worker_tls is not None, token=worker_token, tokens=tokens)
    executors: dict[str, Executor] = {
        "exec": ExecExecutor(
            clock=clock,
            namespaces=None if "*" in command_namespaces else frozenset(command_namespaces),
            ledger=None if command_ledger is None else CommandLedger(command_ledger),
            events=events,
        ),
        "worker": WorkerExecutor(
            clock=clock,
            events=events,
            socket_path=worker_socket or default_socket_path(),
            tcp=tcp,
            token=worker_token,
            tokens=tokens,
            tls=worker_tls,
        ),
    }
    daemon = Daemon(
        dsn=dsn,
        settings=settings,
        clock=clock,
        events=events,
        executors=executors,
        notify=notify or (lambda message: None),
        handle_signals=handle_signals,
        owns_process=owns_process,
        jitter=jitter or random.random,
    )
    if alert_sinks:
        alerter = Alerter(
            store=daemon.store,
            events=events,
            clock=clock,
            sinks=list(alert_sinks),
            instance=daemon.instance,
            window=timedelta(seconds=alert_window),
            failed=lambda purpose, exc, attempt: daemon.policy.failed(purpose, exc, attempt),
            recovered=daemon.policy.recovered,
            # The rules in force when the alert is written (the configured ones: serve()
            # installs them first). Outcomes are redacted at the settlement already; this
            # is #16's one place for an alert's text, so nothing reaches a sink unredacted.
            redact=lambda text: redact.default().text(text),
            outbox=alert_outbox,
        )
        events.subscribe(alerter.observe)
        daemon.companions.append(alerter)
    elif alert_outbox is not None:
        drop_outbox(alert_outbox, events)
    return daemon


def worker_tcp(
    worker_listen: str | None,
    *,
    tls: bool,
    token: str | None,
    tokens: TokenSet,
    setting: str = "worker_listen",
) -> tuple[str, int] | None:
    """The TCP address workers connect to (``None``: the Unix socket only), or a
    :class:`ConfigError` for a listener that would be open to the wrong peers: on
    loopback a token is required; on any other address TLS and a token per worker
    (``worker_tokens``), never the shared ``worker_token``. ``tls``: the listener
    has a certificate."""
    if not worker_listen:
        if tls:
            raise ConfigError("worker_tls_cert is set but worker_listen is not")
        return None
    # (``setting``: where it was set, as a refusal names it -- COORDINATOR_WORKER_LISTEN.)
    tcp = parse_listen(worker_listen, setting=setting, allow_remote=True)
    if not is_loopback(tcp[0]):
        if not tls:
            raise ConfigError(
                f"worker_listen: {tcp[0]} is not a loopback address: workers on other "
                "hosts connect over TLS only (set worker_tls_cert and worker_tls_key); "
                "refusing plain TCP"
            )
        if not tokens:
            raise ConfigError(
                f"worker_listen: {tcp[0]} is not a loopback address: each worker on "
                "another host needs a token of its own (worker_tokens)"
            )
        if token:
            raise ConfigError(
                "worker_token: a shared token is for a loopback worker_listen only; "
                "give each worker its own in worker_tokens"
            )
    elif not token and not tokens:
        raise ConfigError(
            "worker_listen is set but neither worker_token nor worker_tokens is: TCP "
            "workers need a token"
        )
    return tcp


def refusals(config: Config, *, probe: bool = False) -> list[str]:
    """Every reason ``coordinator run`` refuses these settings before it connects to
    the database, one line each (none: it starts). :func:`preflight` raises the first;
    ``coordinator config`` lists them all, so that a check before a restart sees what
    the service will say (as far as this process can: files are read with its rights,
    and a port in use shows only when bound)."""
    found: list[str] = []

    def check(step: Callable[[], object]) -> object:
        try:
            return step()
        except (ConfigError, SpoolError) as exc:
            found.append(str(exc))
            return None

    if config.dsn is not None:
        problem = dsn_problem(config.dsn)
        if problem is not None:
            found.append(f"{config.named('dsn')}: {problem}")
    check(partial(Spool(config.spool_path).check, probe=probe))
    check(partial(alert_sinks, config))
    tls = check(partial(worker_tls_context, config))
    check(
        partial(
            worker_tcp,
            config.worker_listen,
            # (A certificate that did not load is refused above: judge the rest as if set.)
            tls=tls is not None or config.worker_tls_cert is not None,
            token=config.worker_token,
            tokens=config.worker_tokens,
            setting=config.named("worker_listen"),
        )
    )
    if config.admin_listen:
        check(
            partial(
                parse_listen,
                config.admin_listen,
                setting="admin_listen",
                allow_remote=config.admin_allow_remote,
                allowed_by="admin_allow_remote",
            )
        )
        scopes = check(config.admin_scopes)  # (None: refused above)
        if scopes is not None and not scopes:
            found.append(_NO_ADMIN_TOKEN)
    return found


#: A worker certificate this close to its end is said at start (and by ``config``).
CERTIFICATE_WARNING: Final = timedelta(days=14)


def cautions(config: Config, *, now: datetime | None = None) -> list[str]:
    """What ``coordinator run`` starts with but says is wrong, one line each: a worker
    certificate past (or near) its end. It loads, so nothing refused it, and then every
    worker's handshake failed with nothing in the daemon's log pointing at its own
    certificate (a tester's finding)."""
    found: list[str] = []
    cert = config.worker_tls_cert
    end = certificate_end(cert) if cert is not None else None
    if end is not None:
        now = now or datetime.now(UTC)
        when = f"{end:%Y-%m-%d %H:%M} UTC"
        if end <= now:
            found.append(
                f"worker_tls_cert: {cert} expired on {when}: every worker's TLS handshake "
                "fails until it is renewed"
            )
        elif end - now <= CERTIFICATE_WARNING:
            found.append(f"worker_tls_cert: {cert} expires on {when}: renew it before then")
    return found


def certificate_end(path: Path) -> datetime | None:
    """The notAfter of the PEM certificate at ``path`` (``None`` if it cannot be read:
    loading it is checked, and said, elsewhere)."""
    try:
        decoded = ssl._ssl._test_decode_cert(os.fspath(path))  # type: ignore[attr-defined]
        return datetime.fromtimestamp(ssl.cert_time_to_seconds(decoded["notAfter"]), UTC)
    except Exception:  # (no such file, not PEM, a Python without the helper)
        return None


def preflight(config: Config) -> None:
    """Raise the first of :func:`refusals` (a :class:`ConfigError`: one line, exit 2),
    the state directory tried by writing in it."""
    found = refusals(config, probe=True)
    if found:
        raise ConfigError(found[0])


#: ``admin_listen`` with no token to check requests against.
_NO_ADMIN_TOKEN = (
    "admin_listen is set, but none of admin_token, admin_token_file and admin_tokens "
    "is: the admin API needs a token"
)


def alert_sinks(config: Config) -> list[Sink]:
    """The sinks ``config`` asks for (none: no alerts). Raises
    :class:`~coordinator.errors.ConfigError` for settings that cannot work together."""
    config.check_alerts()
    sinks: list[Sink] = []
    if config.alert_smtp_host:
        sinks.append(
            EmailSink(
                host=config.alert_smtp_host,
                port=config.smtp_port(),
                sender=config.alert_email_from or f"coordinator@{socket.gethostname()}",
                recipients=config.alert_email_to,
                starttls=config.alert_smtp_starttls,
                tls=config.alert_smtp_tls,
                user=config.alert_smtp_user,
                password=config.smtp_password(),
            )
        )
    if config.alert_webhook:
        sinks.append(WebhookSink(url=config.alert_webhook, secret=config.webhook_secret()))
    return sinks


def _alerter(daemon: Daemon) -> Alerter | None:
    return next((c for c in daemon.companions if isinstance(c, Alerter)), None)


def worker_tls_context(config: Config) -> ssl.SSLContext | None:
    """The worker listener's TLS (``worker_tls_cert``, ``worker_tls_key`` -- the service's
    credential ``worker-tls-key`` first --, ``worker_tls_ca`` for client certificates),
    or ``None``; a file that cannot be loaded is a :class:`ConfigError` naming it."""
    cert, key, ca = config.worker_tls_cert, config.worker_tls_key_path(), config.worker_tls_ca
    if cert is None and key is None:
        if ca is not None:
            raise ConfigError("worker_tls_ca is set but worker_tls_cert is not")
        return None
    if cert is None or key is None:
        missing = "worker_tls_key" if cert is not None else "worker_tls_cert"
        raise ConfigError(
            f"{missing}: required with {'worker_tls_cert' if cert else 'worker_tls_key'}"
        )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"worker_tls_cert/worker_tls_key: cannot load {cert} with {key}: "
            f"{getattr(exc, 'strerror', None) or exc}"
        ) from None
    if ca is not None:
        try:
            context.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"worker_tls_ca: cannot load {ca}: {getattr(exc, 'strerror', None) or exc}"
            ) from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def event_log(config: Config) -> EventLog:
    """The event log ``config`` asks for (stderr, its format and level)."""
    return EventLog(format=_log_format(config.log_format), level=_log_level(config.log_level))


async def serve(
    config: Config,
    *,
    dsn: str,
    notify: Callable[[str], None] | None = None,
    migrate: bool = False,
    log: EventLog | None = None,
) -> int:
    """Run the daemon for ``config`` against ``dsn`` until it stops; the exit status.
    ``log`` (default :func:`event_log`) lets a caller observe the events (the demo)."""
    redact.install(config.redactor())  # before anything is logged, stored or served
    log = log if log is not None else event_log(config)
    preflight(config)
    try:
        held = hold_state_dir(config.state_dir)
    except StateDirInUse as exc:
        raise ConfigError(str(exc)) from None
    try:
        return await _serve_held(config, dsn=dsn, notify=notify, migrate=migrate, log=log)
    finally:
        os.close(held)


async def _serve_held(
    config: Config,
    *,
    dsn: str,
    notify: Callable[[str], None] | None,
    migrate: bool,
    log: EventLog,
) -> int:
    """:func:`serve` once its state directory is held."""
    for caution in cautions(config):
        log.warning("startup.caution", reason=caution)
    daemon = build_daemon(
        dsn=dsn,
        settings=DaemonSettings(
            refresh_spacing=config.refresh_spacing,
            concurrency=config.concurrency,
            claim_ahead=config.claim_ahead,
            stop_timeout=config.stop_timeout,
            spool_path=config.spool_path,
            pool_size=config.pool_size,
            migrate=migrate,
            retention=config.retention,
            prune_at=parse_prune_at(config.prune_at),
            prune_timezone=local_timezone(),
        ),
        clock=SystemWallClock(),
        log=log,
        worker_socket=config.worker_socket,
        worker_listen=config.worker_listen,
        worker_token=config.worker_token,
        worker_tokens=config.worker_tokens,
        worker_tls=worker_tls_context(config),
        notify=notify,
        # `coordinator run`: the process is the daemon's.
        owns_process=True,
        alert_sinks=alert_sinks(config),
        alert_window=config.alert_window,
        command_namespaces=config.command_namespaces,
        alert_outbox=config.alert_outbox_path,
        command_ledger=config.command_ledger_path,
    )
    async with trio_asyncio_loop(), trio.open_nursery() as nursery:
        stopped = trio.Event()
        if config.admin_listen:
            base = await _start_admin(
                nursery, config, dsn=dsn, daemon=daemon, log=log, stopped=stopped
            )
            alerter = _alerter(daemon)
            if alerter is not None:
                # The admin web page's run view (issue #15), on the address actually bound.
                alerter.run_url = lambda run: f"{base}/runs/{run}"
        try:
            return await daemon.run()
        finally:
            stopped.set()


async def _start_admin(
    nursery: trio.Nursery,
    config: Config,
    *,
    dsn: str,
    daemon: Daemon,
    log: EventLog,
    stopped: trio.Event,
) -> str:
    """The admin API, web page and metrics (off unless ``admin_listen`` is set); its base
    URL. It answers reads from the database on request only: an open, unused API or page
    costs no SQL (an open page follows the daemon's events and reads only what they say
    changed)."""
    from .admin import Metrics, audit_to, make_app, serve_admin
    from .admin.session import Sessions, bound_to

    tokens = config.admin_scopes()
    if not tokens:
        raise ConfigError(_NO_ADMIN_TOKEN)  # (preflight said so already)
    assert config.admin_listen is not None
    metrics = Metrics(
        status=partial(daemon.status, deadlines=config.metrics_max_jobs),
        max_jobs=config.metrics_max_jobs,
        log=log,
    )
    daemon.events.subscribe(metrics.observe)
    try:
        # Kept in the state directory: a restart signs nobody out (nor back in).
        sessions: Sessions | None = Sessions.kept_in(
            config.state_dir,
            bound_to(tokens),
            warn=lambda problem: log.warning("admin.sessions", error=problem),
        )
    except OSError as exc:
        log.warning("admin.sessions", error=f"web sessions end with this process: {exc}")
        sessions = None
    app = make_app(
        dsn=dsn,
        tokens=tokens,
        sessions=sessions,
        status=daemon.status,
        metrics=metrics,
        audit=audit_to(log),
        metrics_public=config.metrics_public,
        events=daemon.events,
        clock=SystemWallClock(),
    )
    address = await nursery.start(
        partial(
            serve_admin,
            app,
            config.admin_listen,
            shutdown=stopped,
            allow_remote=config.admin_allow_remote,
        )
    )
    log.info("admin.listening", address=address)
    return str(address)


def _log_format(value: str) -> Literal["logfmt", "json"]:
    return "json" if value == "json" else "logfmt"


def _log_level(value: str) -> Level:
    return cast("Level", value if value in ("debug", "info", "warning", "error") else "info")
