"""The daemon's configuration: defaults, then a TOML file, then ``COORDINATOR_*``
environment variables, then command-line flags; each layer overrides the one before.

Every setting is declared once, in :data:`SETTINGS`, with its type, default and meaning;
README's table lists the same settings (``tests/unit/test_config.py`` keeps the two in
step). An unknown key or a bad value stops
startup with a message naming it.
"""

from __future__ import annotations

import ipaddress
import math
import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from .errors import ConfigError
from .schedule import MAX_DURATION, format_duration, parse_duration

DEFAULT_CONFIG_FILE: Final = Path("/etc/coordinator/coordinator.toml")


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
        return Path("/var/lib/coordinator")
    xdg = environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "coordinator"


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a duration, got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ConfigError(f"{name}: must be a finite number of seconds, not {value}")
        if value < 0:
            raise ConfigError(f"{name}: must not be negative")
        if value > MAX_DURATION.total_seconds():
            raise ConfigError(
                f"{name}: at most {format_duration(MAX_DURATION)}, not {value} seconds"
            )
        return float(value)
    try:
        return parse_duration(str(value), field=name).total_seconds()
    except Exception as exc:
        raise ConfigError(f"{name}: {getattr(exc, 'reason', exc)}") from exc


def _positive_int(value: Any, name: str) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected a whole number, got {value!r}") from None
    if number < 1:
        raise ConfigError(f"{name}: must be at least 1")
    return number


def _choice(*options: str) -> Callable[[Any, str], str]:
    def check(value: Any, name: str) -> str:
        text = str(value)
        if text not in options:
            raise ConfigError(f"{name}: must be one of {', '.join(options)}, not {text!r}")
        return text

    return check


def _bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name}: expected true or false, got {value!r}")


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{name}: expected text, got {value!r}")
    return value


def _optional_text(value: Any, name: str) -> str | None:
    return _text(value, name) or None


def _path(value: Any, name: str) -> Path:
    return Path(_text(value, name)).expanduser()


def parse_listen(listen: str, *, setting: str, allow_remote: bool = False) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) -> (host, port); a non-loopback host is
    refused unless ``allow_remote``. Port 0 picks a free port. Errors name ``setting``."""
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
        raise ConfigError(
            f"{setting}: {host} is not a loopback address; it listens on loopback only "
            "unless remote access is allowed explicitly"
        )
    return host, port


@attrs.frozen(kw_only=True)
class Setting:
    """One configuration key."""

    name: str
    convert: Callable[[Any, str], Any]
    default: Any
    help: str
    secret: bool = False

    @property
    def env(self) -> str:
        return "COORDINATOR_" + self.name.upper()


SETTINGS: Final[tuple[Setting, ...]] = (
    Setting(
        name="dsn",
        convert=_optional_text,
        default=None,
        secret=True,
        help="PostgreSQL DSN; unset = the embedded private cluster under state_dir",
    ),
    Setting(
        name="refresh_spacing",
        convert=_seconds,
        default=30.0,
        help="minimum time between two inventory refreshes (a bound, not a timer)",
    ),
    Setting(
        name="concurrency",
        convert=_positive_int,
        default=16,
        help="calls running at once, all jobs together",
    ),
    Setting(
        name="stop_timeout",
        convert=_seconds,
        default=60.0,
        help="longest a stop waits for running calls before cancelling them",
    ),
    Setting(
        name="state_dir",
        convert=_path,
        default=None,
        help="spool and embedded database ($STATE_DIRECTORY under systemd)",
    ),
    Setting(
        name="pg_bin",
        convert=_path,
        default=None,
        help="initdb/pg_ctl directory for the embedded database "
        "(default: PATH, then /usr/lib/postgresql/*/bin)",
    ),
    Setting(
        name="pool_size",
        convert=_positive_int,
        default=4,
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
    ),
    Setting(
        name="worker_listen",
        convert=_optional_text,
        default=None,
        help="host:port of a TCP listener for workers too (loopback only; needs worker_token)",
    ),
    Setting(
        name="worker_token",
        convert=_optional_text,
        default=None,
        secret=True,
        help="shared secret TCP workers send in hello (required with worker_listen)",
    ),
    Setting(
        name="admin_listen",
        convert=_optional_text,
        default=None,
        help="host:port of the admin HTTP API (loopback); unset = no API",
    ),
    Setting(
        name="admin_allow_remote",
        convert=_bool,
        default=False,
        help="allow admin_listen on a non-loopback address",
    ),
    Setting(
        name="admin_token",
        convert=_optional_text,
        default=None,
        secret=True,
        help="bearer token of the admin API (at least 16 characters)",
    ),
    Setting(
        name="admin_token_file",
        convert=_path,
        default=None,
        help="file holding the admin token (instead of admin_token)",
    ),
    Setting(
        name="metrics_public",
        convert=_bool,
        default=False,
        help="serve /metrics without the token",
    ),
)
_BY_NAME: Final = {s.name: s for s in SETTINGS}


@attrs.frozen(kw_only=True)
class Config:
    """The effective configuration."""

    dsn: str | None = None
    refresh_spacing: float = 30.0
    concurrency: int = 16
    stop_timeout: float = 60.0
    state_dir: Path = attrs.field(factory=default_state_dir)
    pg_bin: Path | None = None
    pool_size: int = 4
    log_format: str = "logfmt"
    log_level: str = "info"
    worker_socket: Path | None = None
    worker_listen: str | None = None
    worker_token: str | None = None
    admin_listen: str | None = None
    admin_allow_remote: bool = False
    admin_token: str | None = None
    admin_token_file: Path | None = None
    metrics_public: bool = False

    def admin_token_value(self) -> str | None:
        """The admin token: ``admin_token``, else the content of ``admin_token_file``."""
        if self.admin_token:
            return self.admin_token.strip()
        if self.admin_token_file is not None:
            try:
                return self.admin_token_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(f"admin_token_file: {exc}") from exc
        return None

    @property
    def spool_path(self) -> Path:
        return self.state_dir / "spool.jsonl"

    @property
    def embedded_root(self) -> Path:
        """Where the embedded PostgreSQL lives when no DSN is configured."""
        return self.state_dir / "postgres"

    def redacted(self) -> dict[str, Any]:
        """For ``coordinator config``: secrets replaced."""
        out: dict[str, Any] = {}
        for s in SETTINGS:
            value = getattr(self, s.name)
            if s.secret and value:
                value = _redact_dsn(str(value)) if s.name == "dsn" else "***"
            out[s.name] = str(value) if isinstance(value, Path) else value
        return out


def _redact_dsn(dsn: str) -> str:
    scheme, sep, rest = dsn.partition("://")
    if not sep or "@" not in rest:
        return dsn
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else dsn


def load(
    *,
    file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Config:
    """Build the configuration from its four layers. ``file`` None means the default
    file if it exists; an explicitly named file must exist."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    path = file
    if path is None and DEFAULT_CONFIG_FILE.exists():
        path = DEFAULT_CONFIG_FILE
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path}: not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
        for key, value in data.items():
            if key not in _BY_NAME:
                raise ConfigError(f"config file {path}: unknown setting {key!r}")
            values[key] = _BY_NAME[key].convert(value, key)
    known_env = {s.env for s in SETTINGS}
    for key in environ:
        if key.startswith("COORDINATOR_") and key not in known_env and key not in _OTHER_ENV:
            raise ConfigError(f"environment: unknown setting {key}")
    for s in SETTINGS:
        if s.env in environ:
            values[s.name] = s.convert(environ[s.env], s.env)
    for key, value in (flags or {}).items():
        if value is None:
            continue
        if key not in _BY_NAME:
            raise ConfigError(f"unknown setting {key!r}")
        values[key] = _BY_NAME[key].convert(value, "--" + key.replace("_", "-"))
    if values.get("state_dir") is None:
        values["state_dir"] = default_state_dir(environ)
    return Config(**values)


#: COORDINATOR_* variables that are not daemon settings (tests, clients).
_OTHER_ENV: Final = frozenset({"COORDINATOR_TEST_DSN", "COORDINATOR_CONFIG"})
