"""The event log's line text: the fast timestamp and encoder write what the plain
library calls wrote (scripts parse these lines)."""

from __future__ import annotations

import io
import json
import random
from datetime import UTC, datetime

import pytest

from coordinator.events import EventBus, RunStarted
from coordinator.log import EventLog, _timestamp

# Half a microsecond and half a millisecond either way, whole seconds, the epoch, and
# instants before it: where rounding the fraction could go wrong.
EDGES = [
    0.0,
    1.0,
    -1.5,
    649285923.7949995,
    1764547200.0005,
    1764547200.9999995,
    1764547200.9995,
    1764547199.999999,
    4102444800.123456,
]


@pytest.mark.parametrize("now", EDGES)
def test_timestamp_matches_isoformat_at_edges(now: float) -> None:
    expected = datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")
    assert _timestamp(now) == expected


def test_timestamp_matches_isoformat_on_random_instants() -> None:
    rng = random.Random(14)
    for _ in range(20_000):
        now = rng.uniform(0, 4e9)
        if rng.random() < 0.3:
            now = round(now, 4) + 0.0005  # on a half millisecond
        expected = datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")
        assert _timestamp(now) == expected, now


def test_json_line_is_the_plain_encoders_line() -> None:
    stream = io.StringIO()
    log = EventLog(format="json", stream=stream, journal=False)
    when = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
    log.write("x.y", "info", {"a": 1, "b": None, "at": when, "s": "é\x7f"}, redacted=True)
    line = stream.getvalue().rstrip("\n")
    record = json.loads(line)
    assert record == {"ts": record["ts"], "level": "info", "event": "x.y", "a": 1,
                      "at": str(when), "s": "é\x7f"}  # fmt: skip
    assert "\x7f" not in line  # DEL escaped, as before


def test_an_event_nobody_sees_is_not_built_into_a_line() -> None:
    stream = io.StringIO()
    bus = EventBus(log=EventLog(stream=stream, level="warning", journal=False))
    bus.emit(RunStarted(job="a/b", job_id=1, run=2, trigger="manual", attempt=1))
    assert stream.getvalue() == ""
    seen: list[object] = []
    bus.subscribe(seen.append)  # a subscriber sees every event, whatever the level
    bus.emit(RunStarted(job="a/b", job_id=1, run=3, trigger="manual", attempt=1))
    assert len(seen) == 1
    assert stream.getvalue() == ""
    assert RunStarted(job="a/b", job_id=1, run=2, trigger="manual", attempt=1).fields() == {
        "job": "a/b", "job_id": 1, "run": 2, "trigger": "manual", "attempt": 1}  # fmt: skip


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_the_audit_line_names_the_token_and_redacts_the_rest(fmt: str) -> None:
    """README: ``audit ... token=billing-ops``. A field called token is hidden by the log's
    rules; the audit record's token is a name, so it is shown (its text still redacted
    like any value), while a secret field beside it stays hidden."""
    from coordinator.admin import audit_to

    stream = io.StringIO()
    log = EventLog(stream=stream, journal=False, format=fmt)  # type: ignore[arg-type]
    audit_to(log)(
        {"method": "POST", "path": "/api/jobs/billing/x/trigger", "status": 200,
         "remote": "127.0.0.1", "token": "billing-ops", "api_key": "s3cr3t"}
    )  # fmt: skip
    line = stream.getvalue()
    if fmt == "json":
        record = json.loads(line)
        assert (record["event"], record["token"], record["api_key"]) == (
            "audit", "billing-ops", "[redacted]"
        )  # fmt: skip
    else:
        assert "event=audit" in line
        assert "token=billing-ops" in line
        assert "api_key=[redacted]" in line
    assert "s3cr3t" not in line
