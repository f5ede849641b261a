"""Configuration layers: defaults < file < environment < flags; bad input named."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from coordinator.config import Config, load
from coordinator.errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path


def test_defaults(tmp_path: Path) -> None:
    config = load(file=None, environ={"STATE_DIRECTORY": str(tmp_path)}, flags={})
    assert config.refresh_spacing == 30.0
    assert config.concurrency == 16
    assert config.state_dir == tmp_path
    assert config.spool_path == tmp_path / "spool.jsonl"


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text(
        'refresh_spacing = "10s"\nconcurrency = 4\nstop_timeout = 5\nlog_level = "debug"\n'
    )
    env = {"COORDINATOR_CONCURRENCY": "8", "COORDINATOR_STOP_TIMEOUT": "2m"}
    config = load(file=file, environ=env, flags={"stop_timeout": "7s"})
    assert config.refresh_spacing == 10.0  # file
    assert config.log_level == "debug"  # file
    assert config.concurrency == 8  # env over file
    assert config.stop_timeout == 7.0  # flag over env


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("refresh_spacing_typo = 3\n", "refresh_spacing_typo"),
        ('concurrency = "many"\n', "concurrency"),
        ("concurrency = 0\n", "concurrency"),
        ('refresh_spacing = "5 parsecs"\n', "refresh_spacing"),
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
        ("stop_timeout = 1e300\n", "stop_timeout: at most 3650d, not 1e+300 seconds"),
        ("stop_timeout = 315360001\n", "stop_timeout: at most 3650d, not 315360001 seconds"),
        ("stop_timeout = inf\n", "stop_timeout: must be a finite number of seconds, not inf"),
        ("stop_timeout = nan\n", "stop_timeout: must be a finite number of seconds, not nan"),
        ('refresh_spacing = "3000000d"\n', "refresh_spacing: at most 3650d, not 3000000d"),
    ],
)
def test_durations_are_bounded(tmp_path: Path, text: str, message: str) -> None:
    file = tmp_path / "c.toml"
    file.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(file=file, environ={}, flags={})
    assert str(info.value) == message
    file.write_text("stop_timeout = 315360000\n")  # the bound itself is fine
    assert load(file=file, environ={}, flags={}).stop_timeout == 315360000.0
    with pytest.raises(ConfigError, match=r"^--refresh-spacing: at most 3650d, not 3000000d$"):
        load(file=None, environ={}, flags={"refresh_spacing": "3000000d"})


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
