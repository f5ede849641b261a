"""The redaction rules (coordinator/redact.py), one by one, and where they are applied
without a database: the event log, the event bus, outcomes."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator import redact
from coordinator.errors import ConfigError
from coordinator.events import EventBus, RunFinished, RunProgress
from coordinator.log import EventLog
from coordinator.model import Outcome
from coordinator.redact import REDACTED, Redactor

if TYPE_CHECKING:
    from collections.abc import Iterator

R = Redactor()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("password=hunter2", "password=[redacted]"),
        ("export DB_PASSWORD='hunter2'; next", "export DB_PASSWORD='[redacted]'; next"),
        ("dbPassword: s3cret, user: bob", "dbPassword: [redacted], user: bob"),
        ('{"api_key": "abc", "n": 1}', '{"api_key": "[redacted]", "n": 1}'),
        ("x-api-key: k1", "x-api-key: [redacted]"),
        ("run --token abc123 --verbose", "run --token [redacted] --verbose"),
        ("Authorization: Bearer abc.def-ghi", "Authorization: Bearer [redacted]"),
        ("authorization=Token abc", "authorization=Token [redacted]"),
        ("Authorization: sekret", "Authorization: [redacted]"),
        (
            "curl -H 'Authorization: Basic dXNlcjpwYXNz' x",
            "curl -H 'Authorization: Basic [redacted]' x",
        ),
        ("got Bearer eyJhbGciOi.x.y back", "got Bearer [redacted] back"),
        ("postgresql://app:s3cret@db.example/app", "postgresql://app:[redacted]@db.example/app"),
        ("redis://:pw@cache:6379/0", "redis://:[redacted]@cache:6379/0"),
        ("host=db password=x dbname=app", "host=db password=[redacted] dbname=app"),
        ("a=1&client_secret=zz&b=2", "a=1&client_secret=[redacted]&b=2"),
    ],
)
def test_secrets_in_text_are_redacted(text: str, expected: str) -> None:
    assert R.text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "token expired",
        "author=Bob tokenizer=bpe max_tokens=5",
        "postgresql://app@db.example/app",
        "https://example.com/a:b@c",  # a path, not userinfo
        "the password is wrong",
        "no secrets here: 42",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert R.text(text) == text


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("password", True),
        ("DB_PASSWORD", True),
        ("dbPassword", True),
        ("X-Api-Key", True),
        ("apiKey", True),
        ("access_token", True),
        ("Authorization", True),
        ("client.secret", True),
        ("session_id", True),
        ("max_tokens", False),
        ("tokenizer", False),
        ("author", False),
        ("keyword", False),
        ("passage", False),
        # A secret word then a word naming a reference to it, or a fact about it: the
        # value is an input a job needs (a tester's password_file was stored redacted).
        ("password_file", False),
        ("passwordFile", False),
        ("--password-file", False),
        ("token_count", False),
        ("auth_method", False),
        ("cookie_policy", False),
        ("private_key_path", False),
        ("signature_required", False),
        ("api_token_url", False),
        # ... but not when the secret word ends the key, or other words follow it.
        ("next_page_token", True),
        ("access_key_id", True),
        ("password_old", True),
        ("file_password", True),
    ],
)
def test_secret_keys_are_whole_words(key: str, secret: bool) -> None:
    assert R.secret_key(key) is secret


def test_changed_names_what_a_front_door_would_not_keep() -> None:
    value = {
        "page": 1,
        "api_token": "x",
        "password_file": "/run/secrets/db",
        "dsn": "postgresql://app:pw@db/app",
        "nested": {"password": "y", "user": "app"},
        "argv": ["--password", "z"],
        "already": {"secret": REDACTED},
    }
    assert R.changed(value) == ["api_token", "dsn", "nested.password", "argv"]
    assert R.changed(R.value(value)) == []


def test_json_values_lose_their_secrets_at_any_depth() -> None:
    value = {
        "password": {"nested": "anything"},
        "ok": [1, True, None, "Bearer zz", {"apiKey": 7}],
        "note": "token=abc",
        "max_tokens": 100,
    }
    assert R.value(value) == {
        "password": REDACTED,
        "ok": [1, True, None, "Bearer [redacted]", {"apiKey": REDACTED}],
        "note": "token=[redacted]",
        "max_tokens": 100,
    }


def test_configured_keys_and_patterns() -> None:
    rules = Redactor(keys=("pin", "ssn"), patterns=(r"sk_live_[0-9a-z]+", r"card=(?P<secret>\d+)"))
    assert rules.value({"user_pin": 1234, "SSN": "x", "pinned": True}) == {
        "user_pin": REDACTED,
        "SSN": REDACTED,
        "pinned": True,
    }
    assert rules.text("key sk_live_abc123, card=4242 ok") == "key [redacted], card=[redacted] ok"
    with pytest.raises(ConfigError, match="redact_patterns: '\\(': "):
        Redactor(patterns=("(",))
    with pytest.raises(ConfigError, match="redact_keys"):
        Redactor(keys=("--",))


@given(st.text(max_size=200))
def test_redaction_is_idempotent(text: str) -> None:
    once = R.text(text)
    assert R.text(once) == once


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=6, max_size=40))
def test_a_password_never_survives_any_of_the_shapes(secret: str) -> None:
    secret = secret.strip().replace('"', "").replace("'", "")
    for ch in " \t\n\r\x0b\x0c,;&@/?#:\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2028\u2029\u3000":
        secret = secret.replace(ch, "")
    if len(secret) < 6 or not any(c.isalnum() for c in secret):
        return
    for shape in (
        f"password={secret}",
        f'"password": "{secret}"',
        f"postgresql://u:{secret}@h/db",
        f"Authorization: Bearer {secret}",
    ):
        assert secret not in R.text(shape), shape


def test_safe_reason_is_one_bounded_line() -> None:
    reason = R.safe_reason("boom password=hunter2\nsecond line " + "x" * 500)
    assert reason is not None
    assert "hunter2" not in reason
    assert "\n" not in reason
    assert "\\n" in reason
    assert len(reason) == redact.SAFE_REASON_LIMIT
    assert R.safe_reason(None) is None


def test_outcomes_are_redacted_whole() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    outcome = Outcome(
        status="failed",
        started_at=now,
        finished_at=now,
        extra={"stdout": "password=hunter2\n", "token": "t0k3n", "count_of": 1},
        error_cause="handler",
        error_message="exit 1: Authorization: Bearer abc",
    )
    clean = R.outcome(outcome)
    assert clean.extra == {"stdout": "password=[redacted]\n", "token": REDACTED, "count_of": 1}
    assert clean.error_message == "exit 1: Authorization: Bearer [redacted]"
    plain = Outcome(status="succeeded", started_at=now, finished_at=now, extra={"n": 1})
    assert R.outcome(plain) is plain


@pytest.fixture
def rules() -> Iterator[Redactor]:
    installed = Redactor(keys=("pin",))
    previous = redact.default()
    redact.install(installed)
    try:
        yield installed
    finally:
        redact.install(previous)


def test_the_log_and_the_event_bus_redact_what_they_carry(rules: Redactor) -> None:
    out = io.StringIO()
    log = EventLog(format="json", stream=out, journal=False)
    seen: list[object] = []
    bus = EventBus(log=log)
    bus.subscribe(seen.append)
    stream = bus.open_stream()
    log.info("plain", dsn="postgresql://u:pw1234@h/db", pin=42, note="ok")
    bus.emit(
        RunFinished(
            job="ns/a", job_id=1, run=2, trigger="manual", outcome="failed",
            error="password=hunter2", elapsed_ms=1.0,
        )
    )  # fmt: skip
    bus.emit(RunProgress(run=2, percent=None, label=None, message="using token=abc"))
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["dsn"] == "postgresql://u:[redacted]@h/db"
    assert lines[0]["pin"] == REDACTED
    assert lines[0]["note"] == "ok"
    assert lines[1]["error"] == "password=[redacted]"
    text = out.getvalue()
    assert "pw1234" not in text
    assert "hunter2" not in text
    assert "abc" not in text
    finished, progress = seen
    assert isinstance(finished, RunFinished)
    assert finished.error == "password=[redacted]"
    assert isinstance(progress, RunProgress)
    assert progress.message == "using token=[redacted]"
    assert stream.receive.receive_nowait() == finished


def test_findings_lose_their_secrets_in_outcomes_and_alone() -> None:
    from coordinator.model import Finding

    now = datetime(2026, 1, 1, tzinfo=UTC)
    leaky = Finding(kind="bad_row", resource_id="42", severity="error",
                    detail={"dsn": "postgresql://u:pw1234@h/db", "api_key": "k"})  # fmt: skip
    clean = Finding(kind="ok_row", resource_id="43", severity="info", detail={"n": 1})
    outcome = Outcome(status="succeeded", started_at=now, finished_at=now, findings=(leaky, clean))
    redacted = R.outcome(outcome)
    assert redacted.findings[0].detail == {
        "dsn": "postgresql://u:[redacted]@h/db",
        "api_key": REDACTED,
    }
    assert redacted.findings[1] is clean
    assert R.findings((clean,))[0] is clean


def test_an_option_naming_a_secret_takes_the_next_item_of_a_list() -> None:
    """A command's argv: ``jobs show`` served ``--password hunter2`` as it was."""
    rules = redact.default()
    argv = ["sh", "-c", "x", "--password", "hunter2", "--verbose", "on", "-api-key", "k"]
    assert rules.value(argv) == [
        "sh", "-c", "x", "--password", "[redacted]", "--verbose", "on", "-api-key", "[redacted]",
    ]  # fmt: skip
    assert rules.value(["--token=abc", "next"]) == ["--token=[redacted]", "next"]
    assert rules.value({"argv": ["--secret", 7]}) == {"argv": ["--secret", 7]}  # (not a string)


def test_redacting_an_authorization_header_twice_keeps_its_scheme() -> None:
    rules = redact.default()
    once = rules.text("Authorization: Bearer abc.def.ghi")
    assert once == "Authorization: Bearer [redacted]"
    assert redact.Redactor().text(once) == once  # (a fresh memo: really applied again)
