"""The configuration of the daemon and of every CLI command: defaults, then a TOML file,
then ``COORDINATOR_*`` environment variables, then command-line flags; each layer
overrides the one before.

One file, ``/etc/coordinator/coordinator.toml`` (or the file ``$COORDINATOR_CONFIG``
names), is read by the service and by the CLI alike, so ``coordinator jobs define`` run
by an operator and the daemon systemd runs agree on the database. Secrets stay out of
it: ``admin_token_file`` and ``dsn_password_file`` name root-only files that root's CLI
reads, and the systemd unit hands the same secrets to the service as credentials
(``LoadCredential=admin-token:...``, ``dsn-password``), which are read from
``$CREDENTIALS_DIRECTORY`` first (the service's unprivileged user cannot read the files).

Every setting is declared once, in :data:`SETTINGS`, with its type, default, unit and
meaning; README's table lists the same settings (``tests/unit/test_config.py`` keeps
the two in step). An unknown key or a bad value
stops startup with a message naming it. The file's values are typed (TOML): a number
or a boolean written as text is refused there; the environment's values are text, read
as their setting's type first (:attr:`Setting.from_text`). :func:`load` records which
layer set each value (``coordinator config`` shows it).

:func:`service_database` reads what the *service's* files say about its database, for
the CLI's refusal to create an embedded cluster beside a service that uses another one.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import tomllib
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote, urlsplit

import attrs

from .errors import ConfigError, InvalidInput
from .redact import Redactor
from .text import check_namespace
from .tokens import TokenSet, check_token, parse_tokens, single

DEFAULT_CONFIG_FILE: Final = Path("/etc/coordinator/coordinator.toml")
#: The environment file the unit reads (``EnvironmentFile=``), beside the config file.
ENV_FILE_NAME: Final = "coordinator.env"
#: Where the shipped unit keeps its state (``StateDirectory=coordinator``).
SERVICE_STATE_DIR: Final = Path("/var/lib/coordinator")
#: Credential names (files in ``$CREDENTIALS_DIRECTORY``) and the secret each holds.
CREDENTIAL_ADMIN_TOKEN: Final = "admin-token"
CREDENTIAL_DSN_PASSWORD: Final = "dsn-password"
CREDENTIAL_SMTP_PASSWORD: Final = "alert-smtp-password"
CREDENTIAL_WEBHOOK_SECRET: Final = "alert-webhook-secret"


def local_timezone(environ: Mapping[str, str] | None = None) -> str:
    """This host's IANA timezone name (for ``prune_at``'s local time): ``$TZ``, else what
    ``/etc/localtime`` links to, else ``/etc/timezone``, else ``UTC``."""
    environ = os.environ if environ is None else environ
    from zoneinfo import ZoneInfo

    candidates = [environ.get("TZ", "").lstrip(":")]
    try:
        target = os.path.realpath("/etc/localtime")
        if "zoneinfo/" in target:
            candidates.append(target.split("zoneinfo/", 1)[1])
    except OSError:
        pass
    with contextlib.suppress(OSError):
        candidates.append(Path("/etc/timezone").read_text().strip())
    for name in candidates:
        if not name:
            continue
        try:
            ZoneInfo(name)
        except (KeyError, ValueError, OSError):  # ZoneInfoNotFoundError is a KeyError
            continue
        return name
    return "UTC"


CREDENTIAL_WORKER_TLS_KEY: Final = "worker-tls-key"


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$STATE_DIRECTORY`` under systemd, else ``/var/lib/coordinator`` for root, else
    ``$XDG_STATE_HOME/coordinator`` or ``~/.local/state/coordinator``."""
    environ = os.environ if environ is None else environ
    env = environ.get("STATE_DIRECTORY")
    if env:
        return Path(env.split(":", 1)[0])
    if os.geteuid() == 0:
        # Not under /root: the embedded server runs as an unprivileged user that must
        # be able to reach its data directory.
        return SERVICE_STATE_DIR
    xdg = environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "coordinator"


def _seconds(value: Any, name: str) -> float:
    """A duration with its unit (``30s``, ``5m``): a bare number is refused, since
    ``stop_timeout = 5`` is as likely to mean minutes as seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a duration such as 30s or 5m, got {value!r}")
    try:
        from .schedule import parse_duration  # not at import: the worker SDK reads this module

        return parse_duration(str(value), field=name, unit_required=True).total_seconds()
    except InvalidInput as exc:
        raise ConfigError(f"{name}: {exc.reason}") from exc


def _whole_number(value: Any, name: str, least: int) -> int:
    """A whole number as the file gives it: a TOML integer. Text is refused
    (``concurrency = "16"``); the environment's is read by :func:`_number_text` first."""
    if isinstance(value, str):
        raise ConfigError(
            f"{name}: expected a whole number, not the text {value!r}{_unquote(value)}"
        )
    if isinstance(value, bool) or not isinstance(value, int):  # (1.9 is not 1: refused)
        raise ConfigError(f"{name}: expected a whole number, got {_toml(value)}")
    if value < least:
        raise ConfigError(f"{name}: must be at least {least}")
    return value


def _number_text(text: str, name: str) -> int:
    """A whole number written as text (the environment, a flag): ``16``."""
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{name}: expected a whole number, got {text!r}") from None


def _unquote(text: str) -> str:
    """The hint for a file's number or boolean written in quotes: TOML has them bare."""
    try:
        bare: Any = int(text)
    except ValueError:
        bare = {"true": "true", "false": "false"}.get(text.strip().lower())
    return "" if bare is None else f" (in TOML without quotes: {bare})"


def _positive_int(value: Any, name: str) -> int:
    return _whole_number(value, name, 1)


def _count(value: Any, name: str) -> int:
    """A whole number, 0 or more."""
    return _whole_number(value, name, 0)


def _choice(*options: str) -> Callable[[Any, str], str]:
    def check(value: Any, name: str) -> str:
        if not isinstance(value, str):  # (a TOML true read 'True', as if typed so)
            raise ConfigError(
                f"{name}: must be one of {', '.join(options)}, as text, not {_toml(value)}"
            )
        if value not in options:
            raise ConfigError(f"{name}: must be one of {', '.join(options)}, not {value!r}")
        return value

    return check


def _toml(value: Any) -> str:
    """A value as TOML writes it (``true``, ``60``), for a refusal of a file's value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _bool(value: Any, name: str) -> bool:
    """A boolean as the file gives it: TOML's ``true`` or ``false``, not text
    (``metrics_public = "true"``); the environment's is read by :func:`_bool_text` first."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        raise ConfigError(
            f"{name}: expected true or false, not the text {value!r}{_unquote(value)}"
        )
    raise ConfigError(f"{name}: expected true or false, got {_toml(value)}")


def _bool_text(text: str, name: str) -> bool:
    """A boolean written as text (the environment, a flag): ``true``/``false``,
    ``yes``/``no``, ``on``/``off``, ``1``/``0``, any case; empty is false."""
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name}: expected true or false, got {text!r}")


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{name}: expected text, got {value!r}")
    return value


def _optional_text(value: Any, name: str) -> str | None:
    return _text(value, name) or None


def _path(value: Any, name: str) -> Path:
    text = _text(value, name)
    if not text.strip():
        # Path("") is ".": an `EnvironmentFile` line `COORDINATOR_STATE_DIR=` put the
        # spool and the embedded cluster wherever the command ran (a tester's finding).
        raise ConfigError(f"{name}: empty; give a path, or leave the setting out")
    return Path(text).expanduser()


def _directory(value: Any, name: str) -> Path:
    """A path made absolute as it is read: what is built on it (the embedded cluster's
    socket, the worker socket) must not depend on where a command later runs."""
    return _path(value, name).absolute()


def _port(value: Any, name: str) -> int:
    port = _positive_int(value, name)
    if port > 65535:
        raise ConfigError(f"{name}: port {port} is out of range")
    return port


def _prune_at(value: Any, name: str) -> str:
    from .schedule import parse_prune_at

    text = _text(value, name)
    try:
        parse_prune_at(text)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    return text


def _addresses(value: Any, name: str) -> tuple[str, ...]:
    """A list of email addresses: a TOML array, or one text with commas (environment,
    flags)."""
    items: list[Any]
    if isinstance(value, str):
        items = [part for part in value.split(",") if part.strip()]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise ConfigError(f"{name}: expected a list of email addresses, got {value!r}")
    out = []
    for item in items:
        address = _address(item, name)
        if address is not None:
            out.append(address)
    return tuple(out)


def _address(value: Any, name: str) -> str | None:
    text = _text(value, name).strip()
    if not text:
        return None
    local, at, domain = text.rpartition("@")
    if not at or not local or not domain or any(c.isspace() or c in "<>,;" for c in text):
        raise ConfigError(f"{name}: {text!r} is not an email address (user@example.com)")
    return text


def _webhook(value: Any, name: str) -> str | None:
    """An HTTPS URL, or a loopback HTTP one (an alert carries job output: plain HTTP only
    where nobody else can read it)."""
    from urllib.parse import urlsplit

    text = _text(value, name).strip()
    if not text:
        return None
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        # (urllib would refuse it at the first alert, its error quoting the URL's path.)
        raise ConfigError(f"{name}: a URL has no spaces or control characters")
    url = urlsplit(text)
    if url.scheme not in ("https", "http"):
        raise ConfigError(f"{name}: expected an https:// URL, not {_redact_url(text)!r}")
    if not url.hostname:
        # ("expected an https:// URL, not 'https://'" read as a contradiction.)
        raise ConfigError(f"{name}: {_redact_url(text)!r} has no host (https://HOST/PATH)")
    try:
        url.port  # noqa: B018 - reading it checks it
    except ValueError:
        raise ConfigError(f"{name}: {_redact_url(text)!r} has no valid port") from None
    if url.scheme == "http" and not _loopback(url.hostname):
        raise ConfigError(
            f"{name}: plain http only to a loopback address (alerts carry job output); use https://"
        )
    return text


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _admin_tokens(value: Any, name: str) -> TokenSet:
    return parse_tokens(value, name, kind="admin")


def _worker_tokens(value: Any, name: str) -> TokenSet:
    return parse_tokens(value, name, kind="worker")


def _listed(value: Any, name: str, what: str) -> list[str]:
    """A TOML array of non-empty strings, or comma-separated text (the environment)."""
    if isinstance(value, str):
        items = [w.strip() for w in value.split(",") if w.strip()]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise ConfigError(f"{name}: expected a list of {what}, got {value!r}")
    if not all(isinstance(w, str) and w.strip() for w in items):
        raise ConfigError(f"{name}: expected a list of {what}, got {value!r}")
    return items


def _words(value: Any, name: str) -> tuple[str, ...]:
    """A list of words: a TOML array, or comma-separated text (the environment)."""
    items = _listed(value, name, "words")
    Redactor(keys=tuple(items))  # refuses a word without letters or digits
    return tuple(items)


def _command_namespaces(value: Any, name: str) -> tuple[str, ...]:
    """Namespaces (``*``: every one): a TOML array, or comma-separated text."""
    items = _listed(value, name, "namespaces ('*': every one)")
    for item in items:
        if item == "*":
            continue
        try:
            check_namespace(item)
        except InvalidInput as exc:
            raise ConfigError(f"{name}: {exc.reason}") from None
    return tuple(items)


def _patterns(value: Any, name: str) -> tuple[str, ...]:
    """Regular expressions: a TOML array, or a JSON array (the environment)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except ValueError:
            raise ConfigError(
                f"{name}: expected a JSON array of regular expressions, got {value!r}"
            ) from None
    if not isinstance(value, list | tuple) or not all(isinstance(p, str) and p for p in value):
        raise ConfigError(f"{name}: expected a list of regular expressions, got {value!r}")
    Redactor(patterns=tuple(value))  # compiles each: a bad one is named
    return tuple(value)


def parse_listen(
    listen: str, *, setting: str, allow_remote: bool = False, allowed_by: str | None = None
) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) -> (host, port); a non-loopback host is
    refused unless ``allow_remote`` (the setting ``allowed_by``, named in the refusal).
    Port 0 picks a free port. Errors name ``setting``."""
    host, sep, port_text = listen.strip().rpartition(":")
    if not sep or not host or not port_text.isascii() or not port_text.isdigit():
        raise ConfigError(f"{setting}: expected HOST:PORT, not {listen!r}")
    port = int(port_text)
    if port > 65535:
        raise ConfigError(f"{setting}: port {port} is out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost":
        loopback = True
    else:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise ConfigError(f"{setting}: {host!r} is not an IP address (or localhost)") from None
        loopback = address.is_loopback
    if not loopback and not allow_remote:
        allow = (
            f"{allowed_by} = true allows it"
            if allowed_by
            else "unless remote access is allowed explicitly"
        )
        raise ConfigError(
            f"{setting}: {host} is not a loopback address; it listens on loopback only ({allow})"
        )
    return host, port


@attrs.frozen(kw_only=True)
class Setting:
    """One configuration key."""

    #: The key in the TOML file (``COORDINATOR_<NAME>`` in the environment).
    name: str
    #: Checks and converts a value as the TOML file gives it (a number is a TOML integer,
    #: not text); raises :class:`ConfigError` naming the key.
    convert: Callable[[Any, str], Any]
    #: The value when no layer sets it (``None``: unset, or computed at load).
    default: Any
    #: One line for README and ``--help``.
    help: str
    #: ``duration`` (seconds, shown as ``30s``), a noun for counts (``calls``), or empty.
    unit: str = ""
    #: What an unset value means, for ``coordinator config``.
    unset: str = ""
    #: Shown redacted.
    secret: bool = False
    #: Reads text (an environment variable's, a flag's) as the type ``convert`` takes:
    #: numbers and booleans. ``None``: ``convert`` takes the text itself (a duration, a
    #: path, a list written with commas). The file's values are not read so: TOML has
    #: types, and ``concurrency = "16"`` is refused, naming the key and the file.
    from_text: Callable[[str, str], Any] | None = None

    def read(self, value: Any, name: str) -> Any:
        """``value`` from the environment or a flag (as text, or as code gives it)."""
        if self.from_text is not None and isinstance(value, str):
            value = self.from_text(value, name)
        return self.convert(value, name)

    @property
    def env(self) -> str:
        return "COORDINATOR_" + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


SETTINGS: Final[tuple[Setting, ...]] = (
    Setting(
        name="dsn",
        convert=_optional_text,
        default=None,
        secret=True,
        help="PostgreSQL DSN; unset = the embedded private cluster under state_dir",
        unset="the embedded database under state_dir",
    ),
    Setting(
        name="dsn_password_file",
        convert=_path,
        default=None,
        help="file holding the DSN user's password (credential dsn-password under systemd)",
        unset="no password, or the one in the DSN",
    ),
    Setting(
        name="refresh_spacing",
        convert=_seconds,
        default=30.0,
        unit="duration",
        help="minimum time between two inventory refreshes (a bound, not a timer)",
    ),
    Setting(
        name="concurrency",
        convert=_positive_int,
        from_text=_number_text,
        default=16,
        unit="calls",
        help="calls running at once, all jobs together (runs claimed ahead count too)",
    ),
    Setting(
        name="claim_ahead",
        convert=_count,
        from_text=_number_text,
        default=0,
        unit="runs",
        help="runs of a worker type claimed beyond its workers' free slots, each started "
        "as a slot frees; they count against concurrency (0: claimed only for a free slot)",
    ),
    Setting(
        name="command_namespaces",
        convert=_command_namespaces,
        default=("*",),
        help="namespaces whose jobs may run commands, as the daemon's user ('*': every "
        "one; [] none): an operate grant elsewhere allows worker jobs only",
    ),
    Setting(
        name="stop_timeout",
        convert=_seconds,
        default=60.0,
        unit="duration",
        help="longest a stop waits for running calls before cancelling them",
    ),
    Setting(
        name="state_dir",
        convert=_directory,
        default=None,
        help="spool and embedded database ($STATE_DIRECTORY under systemd)",
    ),
    Setting(
        name="pg_bin",
        convert=_path,
        default=None,
        help="initdb/pg_ctl directory for the embedded database "
        "(default: PATH, then /usr/lib/postgresql/*/bin)",
        unset="PATH, then /usr/lib/postgresql/*/bin",
    ),
    Setting(
        name="pool_size",
        convert=_positive_int,
        from_text=_number_text,
        default=4,
        unit="connections",
        help="database connections for claims and settlements",
    ),
    Setting(
        name="log_format",
        convert=_choice("logfmt", "json"),
        default="logfmt",
        help="logfmt or json lines on stderr",
    ),
    Setting(
        name="log_level",
        convert=_choice("debug", "info", "warning", "error"),
        default="info",
        help="least severe event written",
    ),
    Setting(
        name="worker_socket",
        convert=_path,
        default=None,
        help="Unix socket workers connect to (default: $RUNTIME_DIRECTORY/worker.sock, "
        "else /run/coordinator/worker.sock for root, else $XDG_RUNTIME_DIR/coordinator/)",
        unset="$RUNTIME_DIRECTORY/worker.sock, else /run/coordinator/worker.sock (root), "
        "else $XDG_RUNTIME_DIR/coordinator/worker.sock",
    ),
    Setting(
        name="worker_listen",
        convert=_optional_text,
        default=None,
        help="host:port of a TCP listener for workers too; anything but loopback needs "
        "worker_tls_cert/worker_tls_key and worker_tokens",
        unset="Unix socket only",
    ),
    Setting(
        name="worker_token",
        convert=_optional_text,
        default=None,
        secret=True,
        help="shared secret TCP workers send in hello (a loopback worker_listen only)",
    ),
    Setting(
        name="worker_tokens",
        convert=_worker_tokens,
        default=TokenSet(),
        help="named worker tokens: hash, namespaces, types (tables; see docs/worker-protocol.md)",
        unset="none",
    ),
    Setting(
        name="worker_tls_cert",
        convert=_path,
        default=None,
        help="PEM certificate (chain) of the TCP listener: workers connect over TLS",
        unset="plain TCP (loopback only)",
    ),
    Setting(
        name="worker_tls_key",
        convert=_path,
        default=None,
        help="its private key, a root-only file (credential worker-tls-key under systemd)",
        unset="none",
    ),
    Setting(
        name="worker_tls_ca",
        convert=_path,
        default=None,
        help="CA bundle: workers must also present a certificate it signed (mutual TLS)",
        unset="no client certificate asked",
    ),
    Setting(
        name="admin_listen",
        convert=_optional_text,
        default=None,
        help="host:port of the admin HTTP API (loopback); unset = no API",
        unset="no admin API",
    ),
    Setting(
        name="admin_allow_remote",
        convert=_bool,
        from_text=_bool_text,
        default=False,
        help="allow admin_listen on a non-loopback address",
    ),
    Setting(
        name="admin_token",
        convert=_optional_text,
        default=None,
        secret=True,
        help="bearer token of the admin API (at least 16 characters)",
        unset="see admin_token_file",
    ),
    Setting(
        name="admin_token_file",
        convert=_path,
        default=None,
        help="file holding the admin token (credential admin-token under systemd)",
        unset="none",
    ),
    Setting(
        name="admin_tokens",
        convert=_admin_tokens,
        default=TokenSet(),
        help="named admin API tokens: hash, namespaces, access read|operate (tables)",
        unset="none",
    ),
    Setting(
        name="metrics_public",
        convert=_bool,
        from_text=_bool_text,
        default=False,
        help="serve /metrics without the token",
    ),
    Setting(
        name="metrics_max_jobs",
        convert=_positive_int,
        from_text=_number_text,
        default=500,
        unit="jobs",
        help="jobs with per-job metric series; beyond, new jobs get none (one warning)",
    ),
    Setting(
        name="retention",
        convert=_seconds,
        default=30 * 86400.0,
        unit="duration",
        help="finished runs older than this are pruned, and those beyond a job's keep_last "
        "newest (100 by default); a job's own retention wins; its latest run stays",
    ),
    Setting(
        name="prune_at",
        convert=_prune_at,
        default="03:17",
        help="when the retention prune runs: HH:MM daily (local time), a cron expression, or off",
    ),
    Setting(
        name="alert_window",
        convert=_seconds,
        default=6 * 3600.0,
        unit="duration",
        help="at most one alert per job and kind in this window; the next one counts "
        "those suppressed",
    ),
    Setting(
        name="alert_smtp_host",
        convert=_optional_text,
        default=None,
        help="SMTP server for alert emails; unset = no email",
        unset="no email alerts",
    ),
    Setting(
        name="alert_smtp_port",
        convert=_port,
        from_text=_number_text,
        default=None,
        help="SMTP port (default: 465 with alert_smtp_tls, 587 with alert_smtp_starttls, else 25)",
        unset="465 with TLS, 587 with STARTTLS, else 25",
    ),
    Setting(
        name="alert_smtp_starttls",
        convert=_bool,
        from_text=_bool_text,
        default=False,
        help="upgrade the SMTP connection with STARTTLS",
    ),
    Setting(
        name="alert_smtp_tls",
        convert=_bool,
        from_text=_bool_text,
        default=False,
        help="connect to the SMTP server over TLS (SMTPS)",
    ),
    Setting(
        name="alert_smtp_user",
        convert=_optional_text,
        default=None,
        help="SMTP login (needs TLS or STARTTLS unless the server is on loopback)",
        unset="no login",
    ),
    Setting(
        name="alert_smtp_password",
        convert=_optional_text,
        default=None,
        secret=True,
        help="SMTP password",
        unset="see alert_smtp_password_file",
    ),
    Setting(
        name="alert_smtp_password_file",
        convert=_path,
        default=None,
        help="file holding the SMTP password (credential alert-smtp-password under systemd)",
        unset="none",
    ),
    Setting(
        name="alert_email_from",
        convert=_address,
        default=None,
        help="sender of alert emails (default: coordinator@ this host's name)",
        unset="coordinator@<host name>",
    ),
    Setting(
        name="alert_email_to",
        convert=_addresses,
        default=(),
        help="recipients of alert emails (a list; commas in the environment)",
    ),
    Setting(
        name="alert_webhook",
        convert=_webhook,
        default=None,
        help="URL receiving each alert as a JSON POST (https, or http to loopback); "
        "unset = no webhook",
        unset="no webhook",
    ),
    Setting(
        name="alert_webhook_secret",
        convert=_optional_text,
        default=None,
        secret=True,
        help="shared secret: the body's HMAC-SHA256 goes in X-Coordinator-Signature",
        unset="see alert_webhook_secret_file",
    ),
    Setting(
        name="alert_webhook_secret_file",
        convert=_path,
        default=None,
        help="file holding the webhook secret (credential alert-webhook-secret under systemd)",
        unset="none",
    ),
    Setting(
        name="redact_keys",
        convert=_words,
        default=(),
        help="more secret key words, besides password, secret, token, api_key, ...",
        unset="the built-in words only",
    ),
    Setting(
        name="redact_patterns",
        convert=_patterns,
        default=(),
        help="regular expressions whose matches are redacted (a 'secret' group: only it)",
        unset="the built-in rules only",
    ),
)
_BY_NAME: Final = {s.name: s for s in SETTINGS}


@attrs.frozen(kw_only=True)
class Source:
    """Which layer set a value, and where exactly."""

    #: ``default``, ``file``, ``env``, ``flag``, ``credential``, or ``demo`` (the admin
    #: API of a demo running in the ``--state-dir`` given: ``coordinator.demo``).
    layer: str
    #: The file, variable, flag or credential; empty for a default.
    origin: str = ""

    def __str__(self) -> str:
        return f"{self.layer} {self.origin}" if self.origin else self.layer


_DEFAULT_SOURCE: Final = Source(layer="default")


@attrs.frozen(kw_only=True)
class Config:
    """The effective configuration."""

    dsn: str | None = None
    dsn_password_file: Path | None = None
    refresh_spacing: float = 30.0
    concurrency: int = 16
    claim_ahead: int = 0
    command_namespaces: tuple[str, ...] = ("*",)
    stop_timeout: float = 60.0
    state_dir: Path = attrs.field(factory=default_state_dir)
    pg_bin: Path | None = None
    pool_size: int = 4
    log_format: str = "logfmt"
    log_level: str = "info"
    worker_socket: Path | None = None
    worker_listen: str | None = None
    worker_token: str | None = None
    worker_tokens: TokenSet = attrs.field(factory=TokenSet)
    worker_tls_cert: Path | None = None
    worker_tls_key: Path | None = None
    worker_tls_ca: Path | None = None
    admin_listen: str | None = None
    admin_allow_remote: bool = False
    admin_token: str | None = None
    admin_token_file: Path | None = None
    admin_tokens: TokenSet = attrs.field(factory=TokenSet)
    metrics_public: bool = False
    metrics_max_jobs: int = 500
    retention: float = 30 * 86400.0
    prune_at: str = "03:17"
    alert_window: float = 6 * 3600.0
    alert_smtp_host: str | None = None
    alert_smtp_port: int | None = None
    alert_smtp_starttls: bool = False
    alert_smtp_tls: bool = False
    alert_smtp_user: str | None = None
    alert_smtp_password: str | None = None
    alert_smtp_password_file: Path | None = None
    alert_email_from: str | None = None
    alert_email_to: tuple[str, ...] = ()
    alert_webhook: str | None = None
    alert_webhook_secret: str | None = None
    alert_webhook_secret_file: Path | None = None
    redact_keys: tuple[str, ...] = ()
    redact_patterns: tuple[str, ...] = ()
    #: ``$CREDENTIALS_DIRECTORY`` (systemd's credentials for the service), if set.
    credentials_dir: Path | None = None
    #: The file the settings were read from, if any.
    file: Path | None = None
    #: Which layer set each setting (absent: the default).
    sources: Mapping[str, Source] = attrs.field(factory=dict, eq=False, repr=False)

    def source(self, name: str) -> Source:
        return self.sources.get(name, _DEFAULT_SOURCE)

    def named(self, name: str) -> str:
        """Setting ``name`` as a refusal names it, where it was set: its flag (``--dsn``,
        also for a value given in code), its variable (``COORDINATOR_DSN``), or
        ``dsn (file PATH)`` -- so that the one line says which of them to mend."""
        source = self.source(name)
        if source.layer == "flag" and source.origin:
            return source.origin
        if source.layer in ("flag", "default"):
            return "--" + name.replace("_", "-")
        if source.layer == "env":
            return source.origin or f"COORDINATOR_{name.upper()}"
        return f"{name} ({source})"

    def _credential(self, name: str) -> Path | None:
        if self.credentials_dir is None:
            return None
        path = self.credentials_dir / name
        return path if path.is_file() else None

    def admin_token_value(self) -> str | None:
        """The admin token: ``admin_token``, else the service's credential
        ``admin-token``, else the content of ``admin_token_file``."""
        if self.admin_token:
            return self.admin_token.strip()
        path = self._credential(CREDENTIAL_ADMIN_TOKEN) or self.admin_token_file
        if path is None:
            return None
        return _read_secret(path, "admin_token_file") or None

    def _secret(
        self, value: str | None, credential: str, file: Path | None, setting: str
    ) -> str | None:
        if value:
            return value.strip()
        path = self._credential(credential) or file
        if path is None:
            return None
        return _read_secret(path, setting) or None

    def smtp_password(self) -> str | None:
        """``alert_smtp_password``, else the credential ``alert-smtp-password``, else the
        content of ``alert_smtp_password_file``."""
        return self._secret(
            self.alert_smtp_password,
            CREDENTIAL_SMTP_PASSWORD,
            self.alert_smtp_password_file,
            "alert_smtp_password_file",
        )

    def webhook_secret(self) -> str | None:
        """``alert_webhook_secret``, else the credential ``alert-webhook-secret``, else
        the content of ``alert_webhook_secret_file``."""
        return self._secret(
            self.alert_webhook_secret,
            CREDENTIAL_WEBHOOK_SECRET,
            self.alert_webhook_secret_file,
            "alert_webhook_secret_file",
        )

    def smtp_port(self) -> int:
        """``alert_smtp_port``, else the usual port for the chosen security."""
        if self.alert_smtp_port is not None:
            return self.alert_smtp_port
        return 465 if self.alert_smtp_tls else 587 if self.alert_smtp_starttls else 25

    def check_alerts(self) -> None:
        """Refuse alert settings that cannot work together (one line naming them)."""
        if self.alert_smtp_host and not self.alert_email_to:
            raise ConfigError("alert_smtp_host is set but alert_email_to names no recipient")
        if self.alert_email_to and not self.alert_smtp_host:
            raise ConfigError("alert_email_to is set but alert_smtp_host is not")
        if self.alert_smtp_tls and self.alert_smtp_starttls:
            raise ConfigError(
                "alert_smtp_tls and alert_smtp_starttls: choose one (TLS from the start, "
                "or STARTTLS after connecting)"
            )
        secure = self.alert_smtp_tls or self.alert_smtp_starttls
        if (
            self.alert_smtp_host
            and self.alert_smtp_user
            and not secure
            and not _loopback(self.alert_smtp_host)
        ):
            raise ConfigError(
                "alert_smtp_user: a password is not sent in clear text to "
                f"{self.alert_smtp_host}; set alert_smtp_starttls or alert_smtp_tls"
            )
        if self.alert_smtp_user and not self.smtp_password():
            raise ConfigError(
                "alert_smtp_user is set but no alert_smtp_password or alert_smtp_password_file"
            )

    def redactor(self) -> Redactor:
        """The redaction rules these settings ask for (:mod:`coordinator.redact`)."""
        return Redactor(keys=self.redact_keys, patterns=self.redact_patterns)

    def worker_tls_key_path(self) -> Path | None:
        """The TCP listener's private key: the service's credential ``worker-tls-key``,
        else ``worker_tls_key``."""
        return self._credential(CREDENTIAL_WORKER_TLS_KEY) or self.worker_tls_key

    def admin_scopes(self) -> TokenSet:
        """Every admin API token: ``admin_tokens``, plus the single ``admin_token`` (or
        its file or credential) as ``admin``, which reaches every namespace."""
        token = self.admin_token_value()
        if not token:
            return self.admin_tokens
        if self.admin_tokens.named("admin") is not None:
            raise ConfigError(
                "admin_tokens: the name 'admin' belongs to admin_token; choose another"
            )
        try:
            token = check_token(token, "admin token")
        except InvalidInput as exc:
            raise ConfigError(str(exc)) from None
        return self.admin_tokens.with_scope(single(token, name="admin"))

    def database_dsn(self) -> str | None:
        """``dsn`` with the password from the credential ``dsn-password`` or from
        ``dsn_password_file`` put in (the one place a password joins the DSN)."""
        if self.dsn is None:
            return None
        path = self._credential(CREDENTIAL_DSN_PASSWORD) or self.dsn_password_file
        if path is None:
            return self.dsn
        password = _read_secret(path, "dsn_password_file")
        scheme, sep, rest = self.dsn.partition("://")
        creds, at, host = rest.rpartition("@")
        if not sep or not at:
            raise ConfigError(
                "dsn_password_file: the DSN must be a URL naming its user "
                "(postgresql://USER@HOST/DB) for a password to be added"
            )
        if ":" in creds:
            raise ConfigError(
                "dsn_password_file: the DSN already holds a password; keep one of the two"
            )
        return f"{scheme}://{creds}:{quote(password, safe='')}@{host}"

    @property
    def spool_path(self) -> Path:
        return self.state_dir / "spool.jsonl"

    @property
    def command_ledger_path(self) -> Path:
        """The process groups of the running commands (coordinator.executors.ledger)."""
        return self.state_dir / "commands"

    @property
    def alert_outbox_path(self) -> Path:
        """Alert deliveries a stop abandoned, sent again at the next start."""
        return self.state_dir / "alerts-outbox.jsonl"

    @property
    def embedded_root(self) -> Path:
        """Where the embedded PostgreSQL lives when no DSN is configured."""
        return self.state_dir / "postgres"

    def redacted(self) -> dict[str, Any]:
        """Every setting's value, secrets replaced (``coordinator config --json``)."""
        out: dict[str, Any] = {}
        for s in SETTINGS:
            value = getattr(self, s.name)
            if s.secret and value:
                value = _redact_dsn(str(value)) if s.name == "dsn" else "***"
            elif s.name == "alert_webhook" and value:
                value = _redact_url(str(value))
            if isinstance(value, TokenSet):
                value = {
                    scope.name: {
                        "namespaces": sorted(scope.namespaces or ["*"]),
                        **({"access": scope.access} if s.name == "admin_tokens" else {}),
                        **(
                            {"types": sorted(scope.types or ["*"])}
                            if s.name == "worker_tokens"
                            else {}
                        ),
                    }
                    for scope in value.scopes
                }
            elif isinstance(value, tuple):
                value = list(value)
            out[s.name] = str(value) if isinstance(value, Path) else value
        return out

    def describe(self) -> list[tuple[str, str, Source]]:
        """``(setting, value with its unit, source)`` rows for ``coordinator config``."""
        values = self.redacted()
        rows = []
        for s in SETTINGS:
            value, source = values[s.name], self.source(s.name)
            for secret, name in (
                ("admin_token", CREDENTIAL_ADMIN_TOKEN),
                ("alert_smtp_password", CREDENTIAL_SMTP_PASSWORD),
                ("alert_webhook_secret", CREDENTIAL_WEBHOOK_SECRET),
            ):
                if s.name == secret and value is None:
                    credential = self._credential(name)
                    if credential is not None:
                        value, source = "***", Source(layer="credential", origin=str(credential))
            rows.append((s.name, _shown(s, value), source))
        if self.dsn is not None and self._credential(CREDENTIAL_DSN_PASSWORD) is not None:
            path = str(self._credential(CREDENTIAL_DSN_PASSWORD))
            rows.append(("dsn password", "***", Source(layer="credential", origin=path)))
        return rows


def _shown(setting: Setting, value: Any) -> str:
    if value is None or (isinstance(value, dict | list) and not value):
        return f"(unset: {setting.unset})" if setting.unset else "(unset)"
    if isinstance(value, dict):  # named tokens (their hashes are not shown)
        return "; ".join(
            f"{name}: {', '.join(v['namespaces'])}"
            + (f" ({v['access']})" if "access" in v else "")
            + (f" types {', '.join(v['types'])}" if "types" in v else "")
            for name, v in value.items()
        )
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if setting.unit == "duration":
        from .schedule import format_duration

        return format_duration(timedelta(seconds=value))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ", ".join(value) if value else "(none)"
    if setting.unit:
        return f"{value} {setting.unit}"
    return str(value)


def _read_secret(path: Path, setting: str) -> str:
    try:
        return path.read_text().strip()
    except PermissionError:
        raise ConfigError(
            f"{setting}: cannot read {path} (permission denied): run as root, or as the "
            "user the secret is for"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{setting}: {path}: {exc.strerror or exc}") from None


def _redact_url(url: str) -> str:
    """A URL with whatever may hold its secret hidden: credentials, path and query
    (a webhook's token is often its path), the scheme and host kept to recognise it."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    shown = f"{parts.scheme}://{'***@' if parts.username or parts.password else ''}{host}"
    try:
        if parts.port is not None:
            shown += f":{parts.port}"
    except ValueError:
        shown += ":***"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        shown += "/***"
    return shown


def _redact_dsn(dsn: str) -> str:
    scheme, sep, rest = dsn.partition("://")
    if not sep or "@" not in rest:
        return dsn
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else dsn


def config_file(environ: Mapping[str, str] | None = None) -> Path:
    """The configuration file of the service and of the CLI: ``$COORDINATOR_CONFIG``,
    else :data:`DEFAULT_CONFIG_FILE` (which may not exist)."""
    environ = os.environ if environ is None else environ
    named = environ.get("COORDINATOR_CONFIG")
    return Path(named) if named else DEFAULT_CONFIG_FILE


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except PermissionError:
        raise ConfigError(
            f"config file {path}: permission denied (it holds no secrets: make it "
            f"readable, chmod 0644 {path}, or name another with --config)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: {exc}") from None


def load(
    *,
    file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Config:
    """Build the configuration from its four layers.

    ``file`` None means ``$COORDINATOR_CONFIG`` (which must exist), else the default file
    if it exists; an explicitly named file must exist.
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    path = file
    if path is None and environ.get("COORDINATOR_CONFIG"):
        path = Path(environ["COORDINATOR_CONFIG"])
    if path is None and DEFAULT_CONFIG_FILE.exists():
        path = DEFAULT_CONFIG_FILE
    if path is not None:
        for key, value in _read_toml(Path(path)).items():
            if key not in _BY_NAME:
                raise ConfigError(f"config file {path}: unknown setting {key!r}")
            try:
                values[key] = _BY_NAME[key].convert(value, key)
            except ConfigError as exc:  # (which file said it, as for an unknown key)
                raise ConfigError(f"config file {path}: {exc}") from exc
            sources[key] = Source(layer="file", origin=str(path))
    known_env = {s.env for s in SETTINGS}
    for key in environ:
        if key.startswith("COORDINATOR_") and key not in known_env and key not in _OTHER_ENV:
            raise ConfigError(f"environment: unknown setting {key}")
    for s in SETTINGS:
        if s.env in environ:
            values[s.name] = s.read(environ[s.env], s.env)
            sources[s.name] = Source(layer="env", origin=s.env)
    for key, value in (flags or {}).items():
        if value is None:
            continue
        if key not in _BY_NAME:
            raise ConfigError(f"unknown setting {key!r}")
        setting = _BY_NAME[key]
        values[key] = setting.read(value, setting.flag)
        sources[key] = Source(layer="flag", origin=setting.flag)
    if values.get("state_dir") is None:
        values["state_dir"] = default_state_dir(environ)
    credentials = environ.get("CREDENTIALS_DIRECTORY")
    return Config(
        **values,
        credentials_dir=Path(credentials) if credentials else None,
        file=Path(path) if path is not None else None,
        sources=sources,
    )


#: COORDINATOR_* variables that are not settings: the tests', the config file's, a TCP
#: worker's token, and those a command job finds in its environment (so that a job may
#: itself run ``coordinator jobs trigger ...``).
_OTHER_ENV: Final = frozenset(
    {
        "COORDINATOR_TEST_DSN",
        "COORDINATOR_CONFIG",
        "COORDINATOR_WORKER_TOKEN",
        "COORDINATOR_RUN_ID",
        "COORDINATOR_JOB",
        "COORDINATOR_NAMESPACE",
        "COORDINATOR_FORCE",
        "COORDINATOR_ATTEMPT",
        "COORDINATOR_TRIGGER",
        "COORDINATOR_SCHEDULED_FOR",
        "COORDINATOR_PARAMS",
    }
)


def file_setting(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """One setting as the configuration file (alone) gives it, or ``None``: for programs
    that share the file but not the daemon's other layers (``coordinator worker`` reads
    ``worker_socket``)."""
    path = config_file(environ)
    if not path.is_file():
        return None
    value = _read_toml(path).get(name)
    return None if value is None else _BY_NAME[name].convert(value, name)


# --------------------------------------------------------------------------- the service's


@attrs.frozen(kw_only=True)
class ServiceDatabase:
    """Where the service keeps its jobs, as the service's own files say."""

    #: The file that decided it: the TOML file, or the environment file beside it.
    source: Path
    #: The DSN the service uses, or ``None`` for its embedded database.
    dsn: str | None
    #: The service's embedded database (``<state dir>/postgres``) when ``dsn`` is None,
    #: if known: named by ``state_dir``, or the shipped unit's for the default file.
    embedded_root: Path | None


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines as systemd's ``EnvironmentFile=`` reads them (the subset the
    shipped example uses: ``#``/``;`` comments, optional surrounding quotes)."""
    out: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def service_database(environ: Mapping[str, str] | None = None) -> ServiceDatabase | None:
    """What the service's configuration says about its database, or ``None`` when there is
    no service configuration (neither the config file nor ``coordinator.env`` beside it).

    The service reads the config file and, through systemd's ``EnvironmentFile=``, the
    environment file, whose values win. Its state directory is the one they set, else,
    for the default file, the shipped unit's (``/var/lib/coordinator``); a file named by
    ``$COORDINATOR_CONFIG`` that sets none leaves it unknown.
    """
    environ = os.environ if environ is None else environ
    toml_path = config_file(environ)
    env_path = toml_path.parent / ENV_FILE_NAME
    has_toml, has_env = toml_path.is_file(), env_path.is_file()
    if not has_toml and not has_env:
        return None
    source = toml_path
    dsn: str | None = None
    state_dir = SERVICE_STATE_DIR if toml_path == DEFAULT_CONFIG_FILE else None
    if has_toml:
        data = _read_toml(toml_path)
        if isinstance(data.get("dsn"), str) and data["dsn"]:
            dsn = data["dsn"]
        if isinstance(data.get("state_dir"), str) and data["state_dir"]:
            state_dir = Path(data["state_dir"]).expanduser()
    if has_env:
        try:
            env = read_env_file(env_path)
        except PermissionError:
            raise ConfigError(
                f"the service's environment file {env_path} cannot be read, so this command "
                "cannot tell which database the service uses: run it as root, or pass --dsn"
            ) from None
        if "COORDINATOR_DSN" in env:
            dsn, source = env["COORDINATOR_DSN"] or None, env_path
        if env.get("COORDINATOR_STATE_DIR"):
            state_dir = Path(env["COORDINATOR_STATE_DIR"])
    root = state_dir / "postgres" if state_dir is not None else None
    return ServiceDatabase(source=source, dsn=dsn, embedded_root=root)


def refuse_another_embedded(
    config: Config, *, environ: Mapping[str, str] | None = None, state_dir_chosen: bool = False
) -> None:
    """Raise :class:`ConfigError` if this command, about to use the embedded database in
    ``config.embedded_root``, would use one the service does not: its jobs would never run.

    Skipped under systemd (``$STATE_DIRECTORY`` set: the service itself, or a job it runs)
    and, for the embedded-versus-embedded case, when ``--state-dir`` chose the directory
    on the command line.
    """
    environ = os.environ if environ is None else environ
    if environ.get("STATE_DIRECTORY"):
        return
    service = service_database(environ)
    if service is None:
        return
    here = config.embedded_root
    if service.dsn is not None:
        if service.source.name == ENV_FILE_NAME:
            fix = (
                f'move it to {config_file(environ)} (dsn = "..."), which the service and '
                "the CLI both read, or pass --dsn"
            )
        else:
            fix = "use that file (no --config, no empty COORDINATOR_DSN) or pass --dsn"
        raise ConfigError(
            f"{service.source} gives the service the database {_redact_dsn(service.dsn)}, but "
            f"this command has no DSN and would use a separate embedded database in {here} "
            f"whose jobs the service never runs: {fix}"
        )
    if service.embedded_root is None or state_dir_chosen:
        return
    if _same_path(service.embedded_root, here):
        return
    who = "run it as root, or " if os.geteuid() != 0 else ""
    raise ConfigError(
        f"the service ({service.source}) keeps its jobs in the embedded database in "
        f"{service.embedded_root}, but this command would use another one in {here}: {who}"
        f"pass --state-dir {service.embedded_root.parent} (the service's) or --dsn"
    )


def _same_path(a: Path, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)
