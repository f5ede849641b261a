"""Alerts without a database: what an alert says (one rendering for every sink), the
webhook signature, and the alerter's decisions under trio's MockClock with a window
store and sinks that record what they are asked. (The window SQL, real SMTP and real
HTTP are in tests/integration/test_alerts.py.)"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from coordinator import redact
from coordinator.alerts import (
    SIGNATURE_HEADER,
    Alert,
    Alerter,
    DeliveryFailed,
    EmailSink,
    Message,
    WebhookSink,
    render,
    signature,
)
from coordinator.clock import SystemWallClock
from coordinator.daemon import DaemonSettings
from coordinator.events import EventBus, NotificationWake, RunFinished, RunLost
from coordinator.log import EventLog
from coordinator.redact import Redactor
from coordinator.service import build_daemon
from coordinator.store import AlertWindow

ORIGIN = datetime(2026, 3, 1, 3, 17, tzinfo=UTC)
WINDOW = timedelta(hours=6)


def alert(**fields: Any) -> Alert:
    base: dict[str, Any] = {
        "kind": "failed",
        "job": "ops/backup",
        "job_id": 7,
        "run": 4217,
        "attempt": 1,
        "outcome": "timed_out",
        "cause": "timeout",
        "error": "timed out after 30s\nlast line: token=abc123",
        "elapsed_s": 30.0,
        "at": ORIGIN,
        "event": "job.run",
        "url": "http://127.0.0.1:8787/runs/4217",
        "instance": "host:1:abcd",
        "window": WINDOW,
    }
    return Alert(**{**base, **fields})


def test_the_message_names_everything_an_operator_needs() -> None:
    message = render(alert(suppressed=14, since=ORIGIN - timedelta(hours=7)))
    assert message.subject == "[coordinator] ops/backup timed out (timeout)"
    for expected in (
        "job:       ops/backup",
        "cause:     timeout",
        "error:     timed out after 30s",
        "           last line: token=abc123",  # continuation lines stay aligned
        "run:       4217",
        "attempt:   1",
        "elapsed:   30.000s",
        "logged at: 2026-03-01T03:17:00.000+00:00 (event=job.run run=4217)",
        "run page:  http://127.0.0.1:8787/runs/4217",
        "And 14 more since 2026-02-28T20:17:00.000+00:00",
        "at most once per 6h",
    ):
        assert expected in message.text, expected
    payload = message.payload
    assert payload["job"] == {"id": 7, "namespace": "ops", "name": "backup"}
    assert payload["run"]["outcome"] == "timed_out"
    assert payload["suppressed"]["count"] == 14
    assert payload["window_s"] == 21600
    json.dumps(payload)


def test_redaction_applies_to_the_output_in_every_sink() -> None:
    message = render(alert(), redact=lambda text: text.replace("abc123", "[redacted]"))
    assert "abc123" not in message.text
    assert "abc123" not in json.dumps(message.payload)
    assert "token=[redacted]" in message.payload["run"]["error"]


def test_control_characters_in_the_output_are_escaped_in_the_text() -> None:
    """A job's stderr with terminal escapes: the mail's text shows them escaped, as the
    CLI and the log do, line by line; the webhook's JSON keeps the error as it was (JSON
    escapes it)."""
    message = render(alert(error="exit status 4: bad \x1b[31mred\x1b[0m\nsecond\tline"))
    assert "\x1b" not in message.text
    assert "error:     exit status 4: bad \\x1b[31mred\\x1b[0m" in message.text
    assert "           second\\tline" in message.text
    assert message.payload["run"]["error"] == "exit status 4: bad \x1b[31mred\x1b[0m\nsecond\tline"


def test_the_webhook_body_is_signed_with_hmac_sha256() -> None:
    sink = WebhookSink(url="https://hooks.example.net/x", secret="s3cret")
    request = sink.request(render(alert()), {"X-Coordinator-Run": "4217"})
    body = request.data
    assert isinstance(body, bytes)
    expected = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert request.get_header(SIGNATURE_HEADER.capitalize()) == expected
    assert signature("s3cret", body) == expected
    assert json.loads(body)["run"]["id"] == 4217
    unsigned = WebhookSink(url="https://hooks.example.net/x").request(render(alert()), {})
    assert unsigned.get_header(SIGNATURE_HEADER.capitalize()) is None


def test_the_email_has_its_headers() -> None:
    sink = EmailSink(
        host="smtp.example.net", port=587, sender="c@example.net", recipients=("a@x", "b@y")
    )
    mail = sink.build(render(alert()), {"X-Coordinator-Job": "ops/backup"})
    assert mail["To"] == "a@x, b@y"
    assert mail["From"] == "c@example.net"
    assert mail["X-Coordinator-Job"] == "ops/backup"
    assert "ops/backup" in mail["Subject"]


# -- the alerter's decisions ---------------------------------------------------------------


@attrs.define(eq=False)
class TrioWallClock:
    def now(self) -> datetime:
        return ORIGIN + timedelta(seconds=trio.current_time())


@attrs.define(eq=False)
class Windows:
    """``coordinator._alert_open`` in memory: same answers, and every call recorded."""

    clock: TrioWallClock
    opted_out: set[int] = attrs.field(factory=set)
    sent: dict[tuple[int, str], datetime] = attrs.field(factory=dict)
    calls: list[tuple[int, str, int]] = attrs.field(factory=list)

    async def alert_open(
        self, *, job_id: int, kind: str, run_id: int, now: datetime, window: timedelta
    ) -> AlertWindow:
        self.calls.append((job_id, kind, run_id))
        await trio.sleep(0.01)  # a round trip
        if job_id in self.opted_out:
            return AlertWindow(outcome="opted_out", namespace="ops", name="backup")
        previous = self.sent.get((job_id, kind))
        if previous is not None and previous > now - window:
            return AlertWindow(
                outcome="inside", namespace="ops", name="backup", until=previous + window
            )
        self.sent[(job_id, kind)] = now
        return AlertWindow(
            outcome="due", namespace="ops", name="backup", until=now + window, previous=previous
        )


@attrs.define(eq=False)
class Recorder:
    name: str = "email"
    failures: int = 0
    got: list[tuple[float, Message]] = attrs.field(factory=list)
    tried: list[float] = attrs.field(factory=list)

    async def send(self, message: Message, *, headers: dict[str, str]) -> None:
        self.tried.append(trio.current_time())
        if self.failures:
            self.failures -= 1
            raise DeliveryFailed("smtp: connection refused (test)")
        self.got.append((trio.current_time(), message))


def make(sinks: list[Any]) -> tuple[Alerter, Windows, list[Any]]:
    events: list[Any] = []
    bus = EventBus(log=EventLog(stream=_Null()))
    bus.subscribe(events.append)
    clock = TrioWallClock()
    windows = Windows(clock)
    alerter = Alerter(
        store=windows,
        events=bus,
        clock=clock,
        sinks=sinks,
        instance="test:1:x",
        window=WINDOW,
    )
    bus.subscribe(alerter.observe)
    return alerter, windows, events


class _Null:
    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass


def failed(run: int, job_id: int = 7, outcome: str = "failed") -> RunFinished:
    return RunFinished(
        job="ops/backup",
        job_id=job_id,
        run=run,
        trigger="schedule",
        outcome=outcome,
        cause="handler",
        elapsed_ms=12.0,
        error="exit status 1",
        attempt=1,
    )


async def test_one_alert_per_window_and_the_rest_suppressed_without_sql(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = Recorder()
    alerter, windows, events = make([sink])
    async with trio.open_nursery() as nursery:
        await nursery.start(alerter.run)
        for run in range(1, 6):
            alerter.events.emit(failed(run))
            await trio.sleep(60)
        assert [m.payload["run"]["id"] for _, m in sink.got] == [1]
        assert windows.calls == [(7, "failed", 1)]  # one read: the window is known open
        assert [e.run for e in events if type(e).__name__ == "AlertSuppressed"] == [2, 3, 4, 5]
        # Succeeded and cancelled runs are no alert at all.
        alerter.events.emit(attrs.evolve(failed(6), outcome="succeeded", cause=None))
        alerter.events.emit(attrs.evolve(failed(7), outcome="cancelled"))
        await trio.sleep(WINDOW.total_seconds())
        alerter.events.emit(failed(8, outcome="timed_out"))
        await trio.sleep(1)
        assert [m.payload["run"]["id"] for _, m in sink.got] == [1, 8]
        assert len(windows.calls) == 2
        nursery.cancel_scope.cancel()


async def test_opted_out_is_remembered_until_the_job_changes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = Recorder()
    alerter, windows, _events = make([sink])
    windows.opted_out.add(7)
    async with trio.open_nursery() as nursery:
        await nursery.start(alerter.run)
        for run in range(1, 4):
            alerter.events.emit(failed(run))
            await trio.sleep(1)
        assert len(windows.calls) == 1
        windows.opted_out.clear()
        alerter.events.emit(NotificationWake(payload={"job": 7}))  # its definition changed
        alerter.events.emit(failed(4))
        await trio.sleep(1)
        assert [m.payload["run"]["id"] for _, m in sink.got] == [4]
        nursery.cancel_scope.cancel()


async def test_a_lost_run_is_an_unresolved_alert_and_a_retried_one_none(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = Recorder()
    alerter, windows, _events = make([sink])
    async with trio.open_nursery() as nursery:
        await nursery.start(alerter.run)
        alerter.events.emit(RunLost(run=9, job_id=7, action="retried"))
        alerter.events.emit(RunLost(run=10, job_id=7, action="unresolved"))
        await trio.sleep(1)
        assert windows.calls == [(7, "unresolved", 10)]
        (message,) = [m for _, m in sink.got]
        assert message.subject == "[coordinator] ops/backup run 10 left unresolved by a crash"
        nursery.cancel_scope.cancel()


async def test_failed_deliveries_back_off_and_give_up_after_the_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    flaky = Recorder(name="webhook", failures=3)
    dead = Recorder(name="email", failures=10**6)
    alerter, _windows, events = make([flaky, dead])
    alerter.retry_first, alerter.retry_cap = 1.0, 600.0
    async with trio.open_nursery() as nursery:
        await nursery.start(alerter.run)
        alerter.events.emit(failed(1))
        await trio.sleep(10)
        # 1 s, 2 s, 4 s between the tries; the fourth one got through.
        start = flaky.tried[0]
        assert [t - start for t in flaky.tried] == [0, 1, 3, 7]
        assert len(flaky.got) == 1
        await trio.sleep(WINDOW.total_seconds())
        assert alerter.pending == 0  # the dead sink was given up
        give_up = [e for e in events if type(e).__name__ == "AlertFailed" and e.retry_s is None]
        assert [e.sink for e in give_up] == ["email"]
        assert dead.tried[-1] - dead.tried[0] <= WINDOW.total_seconds()
        nursery.cancel_scope.cancel()


async def test_finish_waits_for_pending_deliveries_until_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    slow = Recorder(failures=2)
    alerter, _windows, _events = make([slow])
    async with trio.open_nursery() as nursery:
        await nursery.start(alerter.run)
        alerter.events.emit(failed(1))
        await alerter.finish(trio.current_time() + 60)
        assert len(slow.got) == 1
        alerter.retry_first = 100.0
        slow.failures = 5
        alerter.events.emit(failed(2, job_id=8))
        records: list[dict[str, Any]] = []
        alerter.events.log.observers.append(records.append)
        began = trio.current_time()
        await alerter.finish(began + 30)
        assert trio.current_time() == pytest.approx(began + 30)
        assert alerter.pending == 1
        # The line says which alert never arrived (it said only "pending=1").
        [abandoned] = [r for r in records if r["event"] == "alert.abandoned"]
        assert abandoned["alerts"] == "ops/backup run 2 failed (email)"
        nursery.cancel_scope.cancel()


def test_no_sink_means_no_alerter_at_all(tmp_path: Any) -> None:
    daemon = build_daemon(
        dsn="postgresql://nowhere/none",
        settings=DaemonSettings(spool_path=tmp_path / "spool"),
        clock=SystemWallClock(),
        log=EventLog(stream=_Null()),
        worker_socket=tmp_path / "w.sock",
        handle_signals=False,
    )
    assert daemon.companions == []
    assert daemon.events._subscribers == []
    with_sink = build_daemon(
        dsn="postgresql://nowhere/none",
        settings=DaemonSettings(spool_path=tmp_path / "spool"),
        clock=SystemWallClock(),
        log=EventLog(stream=_Null()),
        worker_socket=tmp_path / "w2.sock",
        handle_signals=False,
        alert_sinks=[Recorder()],
    )
    assert [type(c).__name__ for c in with_sink.companions] == ["Alerter"]


def test_the_daemons_alerter_redacts_with_the_rules_in_force(tmp_path: Any) -> None:
    daemon = build_daemon(
        dsn="postgresql://nowhere/none",
        settings=DaemonSettings(spool_path=tmp_path / "spool"),
        clock=SystemWallClock(),
        log=EventLog(stream=_Null()),
        worker_socket=tmp_path / "w.sock",
        handle_signals=False,
        alert_sinks=[Recorder()],
    )
    (alerter,) = daemon.companions
    assert isinstance(alerter, Alerter)
    text = "login failed: password=hunter2 via postgresql://app:pw0rd@db/app; card=4111"
    assert alerter.redact(text) == (
        "login failed: password=[redacted] via postgresql://app:[redacted]@db/app; card=4111"
    )
    # The configured rules (redact_patterns), installed after the daemon was built.
    try:
        redact.install(Redactor(patterns=(r"card=(?P<secret>\d+)",)))
        assert "card=[redacted]" in alerter.redact(text)
    finally:
        redact.install(Redactor())
    message = render(
        Alert(
            kind="failed",
            job="default/leaky",
            job_id=1,
            run=2,
            outcome="failed",
            error="Authorization: Bearer sekr3t-b34rer-t0ken",
            at=datetime(2026, 11, 30, tzinfo=UTC),
            event="job.run",
            instance="i",
            window=timedelta(hours=6),
        ),
        redact=alerter.redact,
    )
    assert "sekr3t" not in json.dumps(message.payload) + message.text + message.subject
    assert "Bearer [redacted]" in message.text


async def test_a_failed_attempt_a_retry_follows_is_no_alert_the_exhausted_one_is(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = Recorder()
    alerter, windows, _events = make([sink])
    async with trio.open_nursery() as nursery:
        await nursery.start(alerter.run)
        alerter.events.emit(attrs.evolve(failed(1), retry=2, category="timeout"))
        alerter.events.emit(attrs.evolve(failed(2), attempt=2, retry=3))
        await trio.sleep(1)
        assert windows.calls == []
        alerter.events.emit(
            attrs.evolve(failed(3), attempt=3, exhausted=True, category="external-dependency")
        )
        await trio.sleep(1)
        (message,) = [m for _, m in sink.got]
        assert message.subject == "[coordinator] ops/backup failed (handler, external-dependency)"
        assert "attempt:   3 (the last one the job's retries allowed)" in message.text
        assert message.payload["run"]["exhausted"] is True
        assert message.payload["run"]["category"] == "external-dependency"
        nursery.cancel_scope.cancel()


async def test_serious_findings_are_alerted_when_the_call_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from coordinator.events import FindingsReported

    sink = Recorder()
    alerter, windows, _events = make([sink])
    async with trio.open_nursery() as nursery:
        await nursery.start(alerter.run)
        bus = alerter.events
        bus.emit(
            FindingsReported(
                run=5, counts=(("orphan", "error", 2),), example=("orphan", "error", "b1")
            )
        )
        bus.emit(
            FindingsReported(
                run=5,
                counts=(("orphan", "error", 1), ("lost-blob", "data_loss", 3)),
                example=("lost-blob", "data_loss", "b9"),
            )
        )
        await trio.sleep(1)
        assert windows.calls == []  # nothing until the call ends
        bus.emit(attrs.evolve(failed(5), outcome="succeeded", cause=None, error=None))
        await trio.sleep(1)
        assert windows.calls == [(7, "findings", 5)]
        (message,) = [m for _, m in sink.got]
        assert (
            message.subject
            == "[coordinator] ops/backup run 5 found 3 data_loss and 3 error finding(s)"
        )
        assert "findings:  lost-blob data_loss x3, orphan error x3" in message.text
        assert "example:   lost-blob data_loss b9" in message.text
        assert message.payload["example"] == {
            "kind": "lost-blob",
            "severity": "data_loss",
            "resource_id": "b9",
        }
        nursery.cancel_scope.cancel()
