"""Configuration layers: defaults < file < environment < flags; bad input named."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.config import Config, load, refuse_another_embedded, service_database
from coordinator.errors import ConfigError


def test_defaults(tmp_path: Path) -> None:
    config = load(file=None, environ={"STATE_DIRECTORY": str(tmp_path)}, flags={})
    assert config.refresh_spacing == 30.0
    assert config.concurrency == 16
    assert config.state_dir == tmp_path
    assert config.spool_path == tmp_path / "spool.jsonl"


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text(
        'refresh_spacing = "10s"\nconcurrency = 4\nstop_timeout = "5s"\nlog_level = "debug"\n'
    )
    env = {"COORDINATOR_CONCURRENCY": "8", "COORDINATOR_STOP_TIMEOUT": "2m"}
    config = load(file=file, environ=env, flags={"stop_timeout": "7s"})
    assert config.refresh_spacing == 10.0  # file
    assert config.log_level == "debug"  # file
    assert config.concurrency == 8  # env over file
    assert config.stop_timeout == 7.0  # flag over env
    assert str(config.source("refresh_spacing")) == f"file {file}"
    assert str(config.source("concurrency")) == "env COORDINATOR_CONCURRENCY"
    assert str(config.source("stop_timeout")) == "flag --stop-timeout"
    assert str(config.source("pool_size")) == "default"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("refresh_spacing_typo = 3\n", "refresh_spacing_typo"),
        ('concurrency = "many"\n', "concurrency"),
        ("concurrency = 0\n", "concurrency"),
        ('refresh_spacing = "5 parsecs"\n', "refresh_spacing"),
        ("stop_timeout = 60\n", "stop_timeout: '60': a unit is required: 60s or 60m?"),
        ('refresh_spacing = "30"\n', "refresh_spacing: '30': a unit is required"),
        ('log_format = "xml"\n', "log_format"),
        ("not toml at all [\n", "c.toml"),
    ],
)
def test_bad_file_values_are_named(tmp_path: Path, text: str, named: str) -> None:
    file = tmp_path / "c.toml"
    file.write_text(text)
    with pytest.raises(ConfigError, match=named):
        load(file=file, environ={}, flags={})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('stop_timeout = "3651d"\n', "stop_timeout: at most 3650d, not 3651d"),
        ('refresh_spacing = "3000000d"\n', "refresh_spacing: at most 3650d, not 3000000d"),
        ("stop_timeout = 1e300\n", "stop_timeout: '1e+300': unknown unit 'e'"),
        ("stop_timeout = inf\n", "stop_timeout: 'inf': unexpected 'i'"),
        ("stop_timeout = nan\n", "stop_timeout: 'nan': unexpected 'n'"),
    ],
)
def test_durations_are_bounded(tmp_path: Path, text: str, message: str) -> None:
    file = tmp_path / "c.toml"
    file.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(file=file, environ={}, flags={})
    # (Which file said it comes first, as for an unknown key.)
    assert str(info.value).startswith(f"config file {file}: {message}")
    file.write_text('stop_timeout = "3650d"\n')  # the bound itself is fine
    assert load(file=file, environ={}, flags={}).stop_timeout == 315360000.0
    with pytest.raises(ConfigError, match=r"^--refresh-spacing: at most 3650d, not 3000000d$"):
        load(file=None, environ={}, flags={"refresh_spacing": "3000000d"})


def test_command_namespaces_are_every_one_unless_named(tmp_path: Path) -> None:
    assert load(file=None, environ={}, flags={}).command_namespaces == ("*",)
    env = {"COORDINATOR_COMMAND_NAMESPACES": "ops, default"}
    assert load(file=None, environ=env, flags={}).command_namespaces == ("ops", "default")
    file = tmp_path / "c.toml"
    file.write_text("command_namespaces = []\n")
    assert load(file=file, environ={}, flags={}).command_namespaces == ()
    file.write_text('command_namespaces = ["ops", "bad ns"]\n')
    with pytest.raises(ConfigError, match=r"c.toml: command_namespaces: 'bad ns': use letters"):
        load(file=file, environ={}, flags={})
    file.write_text('command_namespaces = "ops"\n')  # (one, as text: as in the environment)
    assert load(file=file, environ={}, flags={}).command_namespaces == ("ops",)
    file.write_text("command_namespaces = 3\n")
    with pytest.raises(
        ConfigError, match=r"c.toml: command_namespaces: expected a list of namespaces"
    ):
        load(file=file, environ={}, flags={})


def test_claim_ahead_is_a_count_from_zero(tmp_path: Path) -> None:
    assert load(file=None, environ={}, flags={}).claim_ahead == 0
    config = load(file=None, environ={"COORDINATOR_CLAIM_AHEAD": "16"}, flags={})
    assert (config.claim_ahead, str(config.source("claim_ahead"))) == (
        16,
        "env COORDINATOR_CLAIM_AHEAD",
    )
    file = tmp_path / "c.toml"
    file.write_text("claim_ahead = -1\n")
    with pytest.raises(ConfigError, match=r"claim_ahead: must be at least 0$"):
        load(file=file, environ={}, flags={})
    with pytest.raises(ConfigError, match="COORDINATOR_CLAIM_AHEAD: expected a whole number"):
        load(file=None, environ={"COORDINATOR_CLAIM_AHEAD": "lots"}, flags={})


def test_a_fraction_is_not_a_whole_number(tmp_path: Path) -> None:
    """A TOML float was truncated: ``concurrency = 1.9`` gave one call at once."""
    file = tmp_path / "c.toml"
    for text in ("concurrency = 1.9\n", "pool_size = 2.7\n", "concurrency = 2.0\n"):
        file.write_text(text)
        name, value = text.strip().split(" = ")
        with pytest.raises(ConfigError, match=f"{name}: expected a whole number, got {value}"):
            load(file=file, environ={}, flags={})


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        (
            'concurrency = "16"\n',
            "concurrency: expected a whole number, not the text '16' (in TOML without quotes: 16)",
        ),
        ('alert_smtp_port = "x"\n', "alert_smtp_port: expected a whole number, not the text 'x'"),
        (
            'metrics_public = "true"\n',
            "metrics_public: expected true or false, not the text 'true'"
            " (in TOML without quotes: true)",
        ),
        ("admin_allow_remote = 1\n", "admin_allow_remote: expected true or false, got 1"),
        ("pool_size = true\n", "pool_size: expected a whole number, got true"),
    ],
)
def test_a_file_number_or_boolean_written_as_text_is_refused(
    tmp_path: Path, text: str, refusal: str
) -> None:
    """``concurrency = "16"`` was read as 16: the converter took any text, not knowing
    it came from a typed file. The environment's values are text and stay read."""
    file = tmp_path / "c.toml"
    file.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(file=file, environ={}, flags={})
    assert str(info.value) == f"config file {file}: {refusal}"
    assert "\n" not in str(info.value)
    environ = {
        "COORDINATOR_CONCURRENCY": "16",
        "COORDINATOR_ALERT_SMTP_PORT": "2525",
        "COORDINATOR_METRICS_PUBLIC": "yes",
        "COORDINATOR_ADMIN_ALLOW_REMOTE": "1",
        "COORDINATOR_POOL_SIZE": " 3 ",
        "COORDINATOR_METRICS_MAX_JOBS": "10",
        "COORDINATOR_CLAIM_AHEAD": "0",
        "COORDINATOR_ALERT_SMTP_TLS": "off",
        "COORDINATOR_ALERT_SMTP_STARTTLS": "TRUE",
    }
    config = load(file=None, environ=environ, flags={"concurrency": "4"})
    assert (config.concurrency, config.alert_smtp_port, config.pool_size) == (4, 2525, 3)
    assert (config.metrics_max_jobs, config.claim_ahead) == (10, 0)
    assert (config.metrics_public, config.admin_allow_remote) == (True, True)
    assert (config.alert_smtp_tls, config.alert_smtp_starttls) == (False, True)
    file.write_text("concurrency = 16\nmetrics_public = true\n")
    config = load(file=file, environ={}, flags={})
    assert (config.concurrency, config.metrics_public) == (16, True)


def test_a_relative_state_dir_is_made_absolute_where_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded cluster's socket is a libpq host: ``demo`` (relative) was taken for a
    host name, and every command given ``--state-dir demo`` failed to connect."""
    monkeypatch.chdir(tmp_path)
    config = load(file=None, environ={}, flags={"state_dir": "demo"})
    assert config.state_dir == tmp_path / "demo"
    assert str(config.embedded_root).startswith("/")


def test_unknown_environment_setting_is_named() -> None:
    with pytest.raises(ConfigError, match="COORDINATOR_CONCURENCY"):
        load(file=None, environ={"COORDINATOR_CONCURENCY": "3"}, flags={})


def test_bad_environment_value_is_named() -> None:
    with pytest.raises(ConfigError, match="COORDINATOR_STOP_TIMEOUT"):
        load(file=None, environ={"COORDINATOR_STOP_TIMEOUT": "-1"}, flags={})


def test_bad_flag_is_named() -> None:
    with pytest.raises(ConfigError, match="--concurrency"):
        load(file=None, environ={}, flags={"concurrency": "x"})


def test_missing_named_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load(file=tmp_path / "absent.toml", environ={}, flags={})


def test_redaction_hides_the_password() -> None:
    config = Config(dsn="postgresql://app:s3cret@db/app")
    assert config.redacted()["dsn"] == "postgresql://app:***@db/app"
    assert "s3cret" not in str(config.redacted())


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:hookpw@hooks.example/x?token=abc", "https://***@hooks.example/***"),
        ("https://hooks.slack.com/services/T0/B0/XXSECRET", "https://hooks.slack.com/***"),
        ("https://hooks.example:8443/", "https://hooks.example:8443"),
        ("http://127.0.0.1:9999", "http://127.0.0.1:9999"),
        ("http://[::1]:9999/hook", "http://[::1]:9999/***"),
        ("https://u@hooks.example#frag", "https://***@hooks.example/***"),
    ],
)
def test_the_webhook_is_shown_without_what_may_hold_its_secret(url: str, shown: str) -> None:
    """A webhook's secret is often its path (or credentials, or a query token): the
    configuration shows scheme and host only, in its table and its JSON."""
    config = load(file=None, environ={"COORDINATOR_ALERT_WEBHOOK": url}, flags={})
    assert config.redacted()["alert_webhook"] == shown
    assert [v for name, v, _source in config.describe() if name == "alert_webhook"] == [shown]


def test_admin_token_is_redacted_and_read_from_a_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("a-long-enough-admin-token\n")
    config = load(
        file=None,
        environ={"COORDINATOR_ADMIN_TOKEN_FILE": str(token), "COORDINATOR_METRICS_PUBLIC": "yes"},
        flags={},
    )
    assert config.admin_token_value() == "a-long-enough-admin-token"
    assert config.metrics_public is True
    assert (
        load(file=None, environ={"COORDINATOR_ADMIN_TOKEN": "x" * 20}, flags={}).redacted()[
            "admin_token"
        ]
        == "***"
    )
    with pytest.raises(ConfigError, match="COORDINATOR_METRICS_PUBLIC"):
        load(file=None, environ={"COORDINATOR_METRICS_PUBLIC": "maybe"}, flags={})


def test_readme_lists_every_setting() -> None:
    from pathlib import Path

    import coordinator.config as config_mod

    readme = (Path(config_mod.__file__).parent.parent / "README.md").read_text()
    missing = [
        s.name
        for s in config_mod.SETTINGS
        if f"`{s.name}`" not in readme or f"`{s.env.removeprefix('COORDINATOR_')}`" not in readme
    ]
    assert missing == []


def test_bare_numbers_in_environment_and_flags_need_a_unit() -> None:
    with pytest.raises(ConfigError, match="COORDINATOR_STOP_TIMEOUT: '90': a unit is required"):
        load(file=None, environ={"COORDINATOR_STOP_TIMEOUT": "90"}, flags={})
    with pytest.raises(ConfigError, match="--refresh-spacing: '5': a unit is required"):
        load(file=None, environ={}, flags={"refresh_spacing": "5"})


def test_config_file_from_the_environment(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text('log_level = "debug"\n')
    config = load(environ={"COORDINATOR_CONFIG": str(file)}, flags={})
    assert (config.log_level, config.file) == ("debug", file)
    with pytest.raises(ConfigError, match="not found"):
        load(environ={"COORDINATOR_CONFIG": str(tmp_path / "absent.toml")}, flags={})


def test_describe_shows_units_and_layers(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text('stop_timeout = "90s"\n')
    config = load(file=file, environ={"COORDINATOR_CONCURRENCY": "3"}, flags={})
    rows = {name: (value, str(source)) for name, value, source in config.describe()}
    assert rows["stop_timeout"] == ("1m30s", f"file {file}")
    assert rows["refresh_spacing"] == ("30s", "default")
    assert rows["concurrency"] == ("3 calls", "env COORDINATOR_CONCURRENCY")
    assert rows["dsn"] == ("(unset: the embedded database under state_dir)", "default")


def test_job_environment_is_not_an_unknown_setting() -> None:
    """A command job may run `coordinator ...` with the COORDINATOR_* it was given."""
    config = load(
        file=None, environ={"COORDINATOR_RUN_ID": "7", "COORDINATOR_PARAMS": "{}"}, flags={}
    )
    assert config.concurrency == 16


def test_credentials_directory_supplies_the_secrets(tmp_path: Path) -> None:
    """Under systemd the unprivileged service reads LoadCredential= copies of root-only
    files; root's CLI reads the files themselves (named in the same TOML)."""
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "admin-token").write_text("token-from-the-credential\n")
    (credentials / "dsn-password").write_text("p@ss/word\n")
    root_only = tmp_path / "admin-token"
    root_only.write_text("token-from-the-file\n")
    file = tmp_path / "c.toml"
    file.write_text(
        'dsn = "postgresql://app@db.example/app"\n'
        f'admin_token_file = "{root_only}"\n'
        f'dsn_password_file = "{tmp_path / "absent"}"\n'
    )
    service = load(file=file, environ={"CREDENTIALS_DIRECTORY": str(credentials)}, flags={})
    assert service.admin_token_value() == "token-from-the-credential"
    assert service.database_dsn() == "postgresql://app:p%40ss%2Fword@db.example/app"
    rows = {name: (value, source.layer) for name, value, source in service.describe()}
    assert rows["dsn password"] == ("***", "credential")
    cli = load(file=file, environ={}, flags={})
    assert cli.admin_token_value() == "token-from-the-file"
    with pytest.raises(ConfigError, match=r"dsn_password_file: .*absent"):
        cli.database_dsn()


def test_a_password_in_both_places_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("x")
    config = Config(dsn="postgresql://app:old@db/app", dsn_password_file=secret)
    with pytest.raises(ConfigError, match="already holds a password"):
        config.database_dsn()


def _service_files(tmp_path: Path, toml: str | None, env: str | None) -> dict[str, str]:
    if toml is not None:
        (tmp_path / "coordinator.toml").write_text(toml)
    if env is not None:
        (tmp_path / "coordinator.env").write_text(env)
    return {"COORDINATOR_CONFIG": str(tmp_path / "coordinator.toml")}


def test_service_database_from_the_toml_and_the_env_file(tmp_path: Path) -> None:
    environ = _service_files(tmp_path, 'dsn = "postgresql://a@h/x"\n', None)
    found = service_database(environ)
    assert found is not None
    assert (found.dsn, found.source) == ("postgresql://a@h/x", tmp_path / "coordinator.toml")
    # The environment file is what systemd gives the service last: it wins.
    (tmp_path / "coordinator.env").write_text(
        '# comment\nCOORDINATOR_DSN="postgresql://b@h/y"\nCOORDINATOR_STATE_DIR=/srv/c\n'
    )
    found = service_database(environ)
    assert found is not None
    assert (found.dsn, found.source) == ("postgresql://b@h/y", tmp_path / "coordinator.env")
    assert found.embedded_root == Path("/srv/c/postgres")


def test_no_service_configuration(tmp_path: Path) -> None:
    assert service_database({"COORDINATOR_CONFIG": str(tmp_path / "none.toml")}) is None


def test_embedded_database_beside_a_service_with_a_dsn_is_refused(tmp_path: Path) -> None:
    environ = _service_files(tmp_path, None, "COORDINATOR_DSN=postgresql://svc@db/jobs\n")
    config = Config(state_dir=tmp_path / "cli")
    with pytest.raises(ConfigError, match=r"coordinator\.env gives the service the database"):
        refuse_another_embedded(config, environ=environ)
    # The service itself (systemd sets STATE_DIRECTORY) is not refused.
    refuse_another_embedded(config, environ={**environ, "STATE_DIRECTORY": "/var/lib/x"})


def test_another_embedded_database_is_refused_unless_chosen(tmp_path: Path) -> None:
    environ = _service_files(tmp_path, f'state_dir = "{tmp_path / "svc"}"\n', None)
    refuse_another_embedded(Config(state_dir=tmp_path / "svc"), environ=environ)
    with pytest.raises(ConfigError, match=f"pass --state-dir {tmp_path / 'svc'}"):
        refuse_another_embedded(Config(state_dir=tmp_path / "other"), environ=environ)
    refuse_another_embedded(
        Config(state_dir=tmp_path / "other"), environ=environ, state_dir_chosen=True
    )


# -- alerts and retention -------------------------------------------------------------------


def test_alert_and_retention_settings_from_every_layer(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text(
        'alert_smtp_host = "smtp.example.net"\n'
        "alert_smtp_starttls = true\n"
        'alert_email_to = ["ops@example.net", "oncall@example.net"]\n'
        'alert_webhook = "https://hooks.example.net/x"\n'
        'retention = "90d"\n'
        'prune_at = "04:30"\n'
    )
    config = load(
        file=file,
        environ={
            "COORDINATOR_ALERT_WINDOW": "2h",
            "COORDINATOR_ALERT_EMAIL_TO": "a@x.org, b@y.org",
        },
        flags={},
    )
    assert config.alert_email_to == ("a@x.org", "b@y.org")  # the environment wins
    assert config.alert_window == 7200
    assert config.retention == 90 * 86400
    assert config.prune_at == "04:30"
    assert config.smtp_port() == 587
    config.check_alerts()
    assert load(file=None, environ={}, flags={}).prune_at == "03:17"


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"COORDINATOR_ALERT_WEBHOOK": "http://hooks.example.net/x"}, "loopback"),
        ({"COORDINATOR_ALERT_WEBHOOK": "ftp://x"}, "https"),
        ({"COORDINATOR_ALERT_EMAIL_TO": "ops at example"}, "not an email address"),
        ({"COORDINATOR_ALERT_SMTP_PORT": "70000"}, "out of range"),
        ({"COORDINATOR_PRUNE_AT": "25:00"}, "COORDINATOR_PRUNE_AT: '25:00' is not a time"),
        ({"COORDINATOR_RETENTION": "30"}, "COORDINATOR_RETENTION"),
    ],
)
def test_bad_alert_settings_are_named(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(file=None, environ=environ, flags={})


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"COORDINATOR_ALERT_SMTP_HOST": "smtp.example.net"}, "names no recipient"),
        ({"COORDINATOR_ALERT_EMAIL_TO": "a@x.org"}, "alert_smtp_host is not"),
        (
            {
                "COORDINATOR_ALERT_SMTP_HOST": "smtp.example.net",
                "COORDINATOR_ALERT_EMAIL_TO": "a@x.org",
                "COORDINATOR_ALERT_SMTP_USER": "me",
                "COORDINATOR_ALERT_SMTP_PASSWORD": "pw",
            },
            "clear text",
        ),
        (
            {
                "COORDINATOR_ALERT_SMTP_HOST": "127.0.0.1",
                "COORDINATOR_ALERT_EMAIL_TO": "a@x.org",
                "COORDINATOR_ALERT_SMTP_USER": "me",
            },
            "no alert_smtp_password",
        ),
        (
            {
                "COORDINATOR_ALERT_SMTP_HOST": "smtp.example.net",
                "COORDINATOR_ALERT_EMAIL_TO": "a@x.org",
                "COORDINATOR_ALERT_SMTP_TLS": "yes",
                "COORDINATOR_ALERT_SMTP_STARTTLS": "yes",
            },
            "choose one",
        ),
    ],
)
def test_alert_settings_that_cannot_work_together(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(file=None, environ=environ, flags={}).check_alerts()


def test_alert_secrets_from_files_and_credentials_and_redacted(tmp_path: Path) -> None:
    password = tmp_path / "smtp"
    password.write_text("hunter2\n")
    secret_dir = tmp_path / "creds"
    secret_dir.mkdir()
    (secret_dir / "alert-webhook-secret").write_text("s3cret\n")
    config = load(
        file=None,
        environ={
            "COORDINATOR_ALERT_SMTP_PASSWORD_FILE": str(password),
            "COORDINATOR_ALERT_WEBHOOK_SECRET": "",
            "CREDENTIALS_DIRECTORY": str(secret_dir),
        },
        flags={},
    )
    assert config.smtp_password() == "hunter2"
    assert config.webhook_secret() == "s3cret"
    shown = {name: (value, str(source)) for name, value, source in config.describe()}
    assert shown["alert_webhook_secret"][0] == "***"
    assert shown["alert_webhook_secret"][1].startswith("credential")
    direct = load(file=None, environ={"COORDINATOR_ALERT_SMTP_PASSWORD": "pw"}, flags={})
    assert direct.redacted()["alert_smtp_password"] == "***"


def test_local_timezone_from_tz_or_utc() -> None:
    from coordinator.config import local_timezone

    assert local_timezone({"TZ": "Europe/Berlin"}) == "Europe/Berlin"
    assert local_timezone({"TZ": ":America/New_York"}) == "America/New_York"
    # An unknown name falls through to the host's zone files, else UTC: always a zone.
    from zoneinfo import ZoneInfo

    ZoneInfo(local_timezone({"TZ": "Not/AZone"}))


@pytest.mark.parametrize(
    ("url", "refusal"),
    [
        ("https://h.example:99999/x",
         "COORDINATOR_ALERT_WEBHOOK: 'https://h.example:***/***' has no valid port"),
        ("htps://hooks.slack.com/services/T/B/SECRET",
         "COORDINATOR_ALERT_WEBHOOK: expected an https:// URL, not 'htps://hooks.slack.com/***'"),
        ("https://hooks.example/services/SECRET tok",
         "COORDINATOR_ALERT_WEBHOOK: a URL has no spaces or control characters"),
        ("https://", "COORDINATOR_ALERT_WEBHOOK: 'https://' has no host (https://HOST/PATH)"),
        ("https:///SECRET",
         "COORDINATOR_ALERT_WEBHOOK: 'https:///***' has no host (https://HOST/PATH)"),
    ],
)  # fmt: skip
def test_a_bad_webhook_is_refused_without_showing_its_secret(url: str, refusal: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load(file=None, environ={"COORDINATOR_ALERT_WEBHOOK": url}, flags={})
    assert str(refused.value) == refusal
    assert "SECRET" not in str(refused.value)


def test_admin_listen_is_loaded_as_given_and_named_in_runs_refusal() -> None:
    """Loading does not refuse it (a service's own env file may allow what the CLI's
    environment does not); `run` does, naming the setting that allows it, and
    `coordinator config` says so (tests/unit/test_cli_usage.py)."""
    from coordinator.config import parse_listen

    loaded = load(file=None, environ={"COORDINATOR_ADMIN_LISTEN": "0.0.0.0:8787"}, flags={})
    assert loaded.admin_listen == "0.0.0.0:8787"
    with pytest.raises(ConfigError) as refused:
        parse_listen("0.0.0.0:8787", setting="admin_listen", allowed_by="admin_allow_remote")
    assert str(refused.value) == (
        "admin_listen: 0.0.0.0 is not a loopback address; it listens on loopback only "
        "(admin_allow_remote = true allows it)"
    )


@pytest.mark.parametrize(
    ("dsn", "words"),
    [
        ("mysql://x@y/z", "the scheme must be postgresql:// (or postgres://), not mysql://"),
        ("postgresql://x@y:notaport/z", "port 'notaport' of host 'y' is not a number"),
        ("postgresql://x@a:5432,b:0/z", "port '0' of host 'b' is not a number from 1 to 65535"),
        ("postgresql://x@y/z?port=5432,x", "port 'x' is not a number"),
        ("postgresql://x@y:\u00b2/z", "port '\u00b2' of host 'y' is not a number"),
        (
            "postgresql://x@y/z?target_session_attrs=bogus",
            "target_session_attrs must be one of any, primary, standby, prefer-standby, "
            "read-write, read-only, not 'bogus'",
        ),
        ("host=db dbname=app", "use the URI form, postgresql://USER@HOST:PORT/DATABASE"),
        ("postgresql://x@y/z?sslmode=bogus", "sslmode must be one of disable, allow, prefer"),
    ],
)
def test_a_dsn_no_connection_can_use_is_said_in_words(dsn: str, words: str) -> None:
    """asyncpg said ``expected to be one of <built-in method values of mappingproxy
    object at 0x...>`` or ``invalid literal for int() with base 10``; ``coordinator
    config`` said nothing, though ``run`` refused."""
    from coordinator.db import dsn_problem
    from coordinator.service import refusals

    problem = dsn_problem(dsn)
    assert problem is not None
    assert problem.startswith(f"invalid DSN: {words}"), problem
    assert f"--dsn: {problem}" in refusals(Config(dsn=dsn))


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://app:pw@db:5432/app",
        "postgres://db/app?sslmode=require",
        "postgresql://u@a:5432,b:5433/app?target_session_attrs=read-write",
        "postgresql://u@[::1]:5432/app",
        "postgresql:///app?host=/var/run/postgresql&port=5433",
    ],
)
def test_a_usable_dsn_is_not_refused(dsn: str) -> None:
    from coordinator.db import dsn_problem

    assert dsn_problem(dsn) is None


def test_a_file_value_of_the_wrong_toml_type_is_said_as_written(tmp_path: Path) -> None:
    """``log_level = true`` read "not 'True'", a value nobody wrote."""
    file = tmp_path / "c.toml"
    file.write_text("log_level = true\n")
    with pytest.raises(ConfigError) as info:
        load(file=file, environ={}, flags={})
    assert str(info.value) == (
        f"config file {file}: log_level: must be one of debug, info, warning, error, "
        "as text, not true"
    )


def test_an_empty_path_is_refused_naming_where_it_came_from(tmp_path: Path) -> None:
    """Path("") is ".": an empty COORDINATOR_STATE_DIR put the state wherever the command
    ran, and an empty TLS file setting said "cannot load .: Is a directory"."""
    for variable in ("COORDINATOR_STATE_DIR", "COORDINATOR_WORKER_TLS_CA"):
        with pytest.raises(ConfigError, match=f"^{variable}: empty; give a path"):
            load(file=None, environ={variable: ""}, flags={})
    file = tmp_path / "c.toml"
    file.write_text('state_dir = ""\n')
    with pytest.raises(ConfigError, match=r"c.toml: state_dir: empty; give a path"):
        load(file=file, environ={}, flags={})


def test_a_worker_certificate_past_or_near_its_end_is_a_caution(tmp_path: Path) -> None:
    """An expired certificate loads, so nothing refused it; then every worker's handshake
    failed and the daemon's log blamed the handshake. `run` and `config` now say it."""
    from datetime import UTC, datetime, timedelta

    import trustme

    from coordinator.service import cautions

    now = datetime(2026, 12, 3, tzinfo=UTC)
    ca = trustme.CA()
    paths = {}
    for name, end in (("old", now - timedelta(days=1)), ("soon", now + timedelta(days=3)),
                      ("fine", now + timedelta(days=300))):  # fmt: skip
        leaf = ca.issue_cert("localhost", not_before=now - timedelta(days=30), not_after=end)
        paths[name] = tmp_path / f"{name}.crt"
        leaf.cert_chain_pems[0].write_to_path(str(paths[name]))
    assert cautions(Config(worker_tls_cert=paths["old"]), now=now) == [
        f"worker_tls_cert: {paths['old']} expired on 2026-12-02 00:00 UTC: every worker's "
        "TLS handshake fails until it is renewed"
    ]
    assert cautions(Config(worker_tls_cert=paths["soon"]), now=now) == [
        f"worker_tls_cert: {paths['soon']} expires on 2026-12-06 00:00 UTC: renew it before then"
    ]
    assert cautions(Config(worker_tls_cert=paths["fine"]), now=now) == []
    assert cautions(Config(worker_tls_cert=tmp_path / "missing.crt"), now=now) == []
    assert cautions(Config(), now=now) == []


def test_worker_tokens_as_text_in_a_file_and_a_bad_listen_from_the_environment(
    tmp_path: Path,
) -> None:
    """A TOML string was answered in JSON's terms ("Expecting value: line 1 column 1");
    a bad COORDINATOR_WORKER_LISTEN was named worker_listen, where every other variable
    is named as set."""
    from coordinator.service import refusals

    file = tmp_path / "c.toml"
    file.write_text('worker_tokens = "x"\n')
    with pytest.raises(ConfigError) as refused:
        load(file=file, environ={}, flags={})
    assert str(refused.value) == (
        f"config file {file}: worker_tokens: expected a table of named tokens, got a string"
    )
    config = load(file=None, environ={"COORDINATOR_WORKER_LISTEN": "garbage"}, flags={})
    assert [r for r in refusals(config) if "garbage" in r] == [
        "COORDINATOR_WORKER_LISTEN: expected HOST:PORT, not 'garbage'"
    ]
