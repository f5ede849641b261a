"""Failure alerts against real parts: a real PostgreSQL and daemon, a real SMTP server
(aiosmtpd) and a real HTTP receiver. Windows are wall time: the daemon gets a wall clock
the test moves forward instead of waiting six hours."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
import trio

from coordinator.alerts import SIGNATURE_HEADER, Alerter, EmailSink, WebhookSink, signature
from coordinator.db import aio

from .alerting import HttpReceiver, OffsetClock, SmtpServer
from .conftest import Harness, StartDaemon, define

if TYPE_CHECKING:
    from collections.abc import Iterator

    import asyncpg

    from coordinator.embedded import StatementLog

FAIL = {"kind": "exec", "argv": ["sh", "-c", "echo 'disk full' >&2; exit 3"]}
SECRET = "webhook-secret-for-tests"
WINDOW = 3600.0


@pytest.fixture
def smtp() -> Iterator[SmtpServer]:
    server = SmtpServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    server = HttpReceiver()
    server.start()
    yield server
    server.stop()


def sinks(smtp: SmtpServer, receiver: HttpReceiver) -> list[Any]:
    return [
        EmailSink(
            host="127.0.0.1",
            port=smtp.port,
            sender="coordinator@test.invalid",
            recipients=("ops@test.invalid", "oncall@test.invalid"),
        ),
        WebhookSink(url=receiver.url, secret=SECRET),
    ]


def alerter(harness: Harness) -> Alerter:
    found = [c for c in harness.daemon.companions if isinstance(c, Alerter)]
    assert len(found) == 1
    return found[0]


async def settled(harness: Harness) -> None:
    """Every alert decided and delivered (or given up)."""
    with trio.fail_after(20):
        while alerter(harness).pending:
            await trio.sleep(0.02)


async def fail_once(conn: asyncpg.Connection, harness: Harness, name: str = "flaky") -> int:
    run_id: int = await aio(conn.fetchval)("SELECT coordinator.trigger('default', $1)", name)
    await harness.wait_event("job.run", run=run_id)
    return run_id


async def test_five_failures_one_email_one_webhook_then_a_summary(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    smtp: SmtpServer,
    receiver: HttpReceiver,
) -> None:
    await define(conn, "flaky", target=FAIL)
    clock = OffsetClock()
    harness = await start_daemon(
        clock=clock, alert_sinks=sinks(smtp, receiver), alert_window=WINDOW
    )
    alerter(harness).run_url = lambda run: f"http://127.0.0.1:8787/runs/{run}"
    runs = [await fail_once(conn, harness) for _ in range(5)]
    await settled(harness)

    assert len(smtp.messages) == 1
    assert len(receiver.requests) == 1
    assert len(harness.named("alert.sent")) == 2
    assert len(harness.named("alert.suppressed")) == 4

    mail = smtp.messages[0]
    assert mail["Subject"] == "[coordinator] default/flaky failed (handler, unknown)"
    assert mail["To"] == "ops@test.invalid, oncall@test.invalid"
    assert mail["X-Coordinator-Run"] == str(runs[0])
    body = mail.get_content()
    for expected in (
        "job:",
        "default/flaky",
        "cause:",
        "handler",
        f"run:       {runs[0]}",
        "attempt:   1",
        "elapsed:",
        "logged at:",
        f"event=job.run run={runs[0]}",
        f"http://127.0.0.1:8787/runs/{runs[0]}",
        "disk full",
        "at most once per 1h",
    ):
        assert expected in body, (expected, body)

    hook = receiver.requests[0]
    assert hook.headers[SIGNATURE_HEADER] == signature(SECRET, hook.body)
    assert hook.headers["Content-Type"] == "application/json"
    payload = json.loads(hook.body)
    assert payload["kind"] == "failed"
    assert payload["job"]["name"] == "flaky"
    assert payload["run"]["id"] == runs[0]
    assert payload["run"]["cause"] == "handler"
    assert payload["suppressed"] == {"count": 0, "since": None}
    print("\nexample email:\n" + mail.as_string())
    print("example webhook body:\n" + json.dumps(payload, indent=2))

    # The next window: the next failure is alerted, and says what was suppressed.
    clock.offset = timedelta(seconds=WINDOW + 1)
    last = await fail_once(conn, harness)
    await settled(harness)
    assert len(smtp.messages) == 2
    assert len(receiver.requests) == 2
    summary = smtp.messages[1].get_content()
    assert "And 4 more since" in summary
    payload = json.loads(receiver.requests[1].body)
    assert payload["run"]["id"] == last
    assert payload["suppressed"]["count"] == 4
    assert payload["suppressed"]["since"] is not None
    assert receiver.requests[1].headers[SIGNATURE_HEADER] == signature(
        SECRET, receiver.requests[1].body
    )


async def test_delivery_failing_leaves_runs_alone_and_is_retried(
    start_daemon: StartDaemon, conn: asyncpg.Connection, receiver: HttpReceiver
) -> None:
    await define(conn, "flaky", target=FAIL)
    await define(conn, "fine")
    smtp = SmtpServer()  # its port is known, nothing listens yet
    receiver.status = 503
    harness = await start_daemon(alert_sinks=sinks(smtp, receiver), alert_window=WINDOW)
    alerting = alerter(harness)
    alerting.retry_first, alerting.retry_cap = 0.2, 0.5
    try:
        failed = await fail_once(conn, harness)
        await harness.wait_event("alert.failed", sink="email", count=2)
        await harness.wait_event("alert.failed", sink="webhook", count=2)
        # Runs and settlements go on while every delivery fails.
        for _ in range(5):
            run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'fine')")
            await harness.wait_event("job.run", run=run_id, outcome="succeeded")
        statuses = await aio(conn.fetch)(
            "SELECT status, count(*) AS n FROM coordinator.runs GROUP BY status"
        )
        assert {r["status"]: r["n"] for r in statuses} == {"succeeded": 5, "failed": 1}
        assert harness.named("alert.sent") == []
        assert harness.daemon.state == "ready"

        smtp.start()
        receiver.status = 200
        await harness.wait_event("alert.sent", sink="email", run=failed)
        await harness.wait_event("alert.sent", sink="webhook", run=failed)
        assert len(smtp.messages) == 1
        assert len(receiver.accepted) == 1
        sent = harness.named("alert.sent", sink="webhook")[0]
        assert sent["attempts"] >= 3
    finally:
        smtp.stop()


async def test_a_restart_inside_the_window_sends_no_second_alert(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    smtp: SmtpServer,
    receiver: HttpReceiver,
    sql_log: StatementLog,
    database_name: str,
) -> None:
    await define(conn, "flaky", target=FAIL)
    first = await start_daemon(alert_sinks=sinks(smtp, receiver), alert_window=WINDOW)
    await fail_once(conn, first)
    await settled(first)
    assert (len(smtp.messages), len(receiver.requests)) == (1, 1)
    await first.stop()

    second = await start_daemon(alert_sinks=sinks(smtp, receiver), alert_window=WINDOW)
    sql_log.mark()
    for _ in range(3):
        await fail_once(conn, second)
    await settled(second)
    assert (len(smtp.messages), len(receiver.requests)) == (1, 1)
    assert len(second.named("alert.suppressed")) == 3
    # The window was read once (it is known open afterwards) and nothing was written.
    windows = [
        s for s in sql_log.statements(app="coordinator", db=database_name) if "_alert_open" in s.sql
    ]
    assert len(windows) == 1
    sent_at = await aio(conn.fetchval)("SELECT count(*) FROM coordinator.alert_windows")
    assert sent_at == 1


async def test_a_run_left_unresolved_by_a_crash_is_alerted(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    smtp: SmtpServer,
    receiver: HttpReceiver,
) -> None:
    job_id = await define(conn, "nightly", schedule_kind="cron", schedule="0 3 * * *")
    lost: int = await aio(conn.fetchval)(
        "INSERT INTO coordinator.runs (job_id, trigger, status, claimed_at, started_at, instance,"
        " attempt) VALUES ($1, 'schedule', 'running', now(), now(), 'dead:1:x', 2) RETURNING id",
        job_id,
    )
    harness = await start_daemon(alert_sinks=sinks(smtp, receiver), alert_window=WINDOW)
    await harness.wait_event("alert.sent", sink="email", run=lost)
    await settled(harness)
    mail = smtp.messages[0]
    assert mail["Subject"] == f"[coordinator] default/nightly run {lost} left unresolved by a crash"
    payload = json.loads(receiver.requests[0].body)
    assert (payload["kind"], payload["run"]["outcome"]) == ("unresolved", "unresolved")
    assert payload["event"] == "startup.lost_run"
    # Which attempt it was, as a failed run's alert says (the sweep does not return it).
    assert payload["run"]["attempt"] == 2
    assert "\nattempt:   2\r\n" in mail.get_content()


async def test_a_job_that_opted_out_is_never_alerted(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    smtp: SmtpServer,
    receiver: HttpReceiver,
    sql_log: StatementLog,
    database_name: str,
) -> None:
    await define(conn, "quiet", target=FAIL, alert=False)
    await define(conn, "loud", target=FAIL)
    harness = await start_daemon(alert_sinks=sinks(smtp, receiver), alert_window=WINDOW)
    sql_log.mark()
    for _ in range(3):
        await fail_once(conn, harness, "quiet")
    await fail_once(conn, harness, "loud")
    await settled(harness)
    assert [m["X-Coordinator-Job"] for m in smtp.messages] == ["default/loud"]
    assert [json.loads(r.body)["job"]["name"] for r in receiver.requests] == ["loud"]
    # The opt-out was read once, then remembered.
    windows = [
        s for s in sql_log.statements(app="coordinator", db=database_name) if "_alert_open" in s.sql
    ]
    assert len(windows) == 2


@pytest.mark.slow
async def test_idle_silence_with_alerts_and_retention_armed(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    smtp: SmtpServer,
    receiver: HttpReceiver,
    sql_log: StatementLog,
    database_name: str,
) -> None:
    """Alerts configured, a failure alerted, the prune armed (for New Year): then the
    daemon is silent. The alerter and the pruner send nothing while nothing happens."""
    await define(conn, "flaky", target=FAIL)
    harness = await start_daemon(
        alert_sinks=sinks(smtp, receiver),
        alert_window=WINDOW,
        prune_at="0 0 1 1 *",
    )
    assert harness.daemon.status().next_prune is not None
    await fail_once(conn, harness)
    await settled(harness)
    assert len(smtp.messages) == 1
    await trio.sleep(0.5)
    sql_log.mark()
    await trio.sleep(21.0)
    assert sql_log.statements(app="coordinator", db=database_name) == []


async def test_retries_alert_once_when_exhausted(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    smtp: SmtpServer,
    receiver: HttpReceiver,
) -> None:
    """A job with two retries fails three times: one alert, about the last attempt."""
    await define(conn, "flaky", target=FAIL, retries=2, retry_backoff=timedelta(seconds=1))
    harness = await start_daemon(alert_sinks=sinks(smtp, receiver), alert_window=WINDOW)
    first: int = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'flaky')")
    await harness.wait_event("job.run", attempt=3, timeout=30)
    await settled(harness)
    attempts = await aio(conn.fetch)(
        "SELECT id, attempt, exhausted FROM coordinator.runs ORDER BY id"
    )
    assert [(r["attempt"], r["exhausted"]) for r in attempts] == [(1, False), (2, False), (3, True)]
    assert attempts[0]["id"] == first
    assert len(smtp.messages) == 1
    (request,) = receiver.requests
    payload = json.loads(request.body)
    assert payload["run"]["id"] == attempts[2]["id"]
    assert (payload["run"]["attempt"], payload["run"]["exhausted"]) == (3, True)
    assert payload["run"]["category"] == "unknown"
    assert "the last one the job's retries allowed" in smtp.messages[0].get_content()


async def test_a_recoverable_run_reporting_data_loss_findings_is_alerted(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    smtp: SmtpServer,
    receiver: HttpReceiver,
    nursery: trio.Nursery,
) -> None:
    from coordinator.worker import Context, Worker

    await define(conn, "check", target={"kind": "worker", "type": "check"}, recoverable=True)
    harness = await start_daemon(alert_sinks=sinks(smtp, receiver), alert_window=WINDOW)
    worker = Worker(worker_id="checker")

    @worker.job("check")
    async def check(ctx: Context) -> None:
        for i in range(6):
            severity = ("info", "warning", "error", "data_loss")[i % 4]
            await ctx.finding("blob", f"b{i}", severity=severity)
        await ctx.checkpoint(6, count=6)

    socket_path = harness.daemon.executors["worker"].socket_path  # type: ignore[attr-defined]
    await nursery.start(lambda task_status: worker.run(socket_path, task_status=task_status))
    run_id: int = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'check')")
    await harness.wait_event("job.run", run=run_id, outcome="succeeded")
    await harness.wait_event("alert.sent", sink="webhook", run=run_id)
    await settled(harness)
    payload = json.loads(receiver.requests[0].body)
    assert payload["kind"] == "findings"
    assert payload["findings"] == [
        {"kind": "blob", "severity": "data_loss", "count": 1},
        {"kind": "blob", "severity": "error", "count": 1},
    ]
    assert payload["example"] == {"kind": "blob", "severity": "data_loss", "resource_id": "b3"}
    assert smtp.messages[0]["Subject"].strip() == (  # (folded: a long header)
        f"[coordinator] default/check run {run_id} found 1 data_loss and 1 error finding(s)"
    )


async def test_an_alert_a_stop_abandons_is_sent_by_the_next_start(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    smtp: SmtpServer,
    receiver: HttpReceiver,
    tmp_path: Any,
) -> None:
    """The mail server is down when a run fails: the webhook gets the alert, the email
    retries until the daemon stops. The stop keeps that delivery in the outbox; the next
    start sends it (the window was opened for it: before, the mail was lost and the
    window then suppressed the next failure's alert too)."""
    await define(conn, "flaky", target=FAIL)
    outbox = tmp_path / "state" / "alerts-outbox.jsonl"
    smtp.stop()
    first = await start_daemon(
        alert_sinks=sinks(smtp, receiver),
        alert_window=WINDOW,
        stop_timeout=1.0,
        build={"alert_outbox": outbox},
    )
    # (The email's retry waits when the stop comes, rather than being under way in a
    # thread a stop abandons: such an attempt may still deliver, and its mail would
    # come twice, which is allowed -- at least once -- but not what this test counts.)
    alerter(first).retry_first = 60.0
    run_id = await fail_once(conn, first)
    await first.wait_event("alert.sent", sink="webhook", run=run_id)
    await first.wait_event("alert.failed", sink="email", run=run_id)
    await first.stop()
    abandoned = first.named("alert.abandoned")
    assert len(abandoned) == 1
    assert abandoned[0]["kept"] == 1
    assert f"default/flaky run {run_id} failed (email)" in abandoned[0]["alerts"]
    assert outbox.exists()
    assert outbox.stat().st_mode & 0o077 == 0  # (the error text may be sensitive)

    kept = outbox.read_text()
    smtp.start()
    second = await start_daemon(
        alert_sinks=sinks(smtp, receiver),
        alert_window=WINDOW,
        build={"alert_outbox": outbox},
    )
    await second.wait_event("alert.sent", sink="email", run=run_id)
    assert second.named("alert.outbox")[0]["resumed"] == 1
    assert not outbox.exists()
    (mail,) = smtp.messages
    assert mail["Subject"] == "[coordinator] default/flaky failed (handler, unknown)"
    assert mail["X-Coordinator-Run"] == str(run_id)
    assert len(receiver.requests) == 1  # the webhook had it already: not sent twice

    # An outbox delivery the next start cannot send is named, as the stop named it (it
    # was only counted: "expired=2").
    await second.stop()
    outbox.write_text(kept)
    outbox.chmod(0o600)
    third = await start_daemon(
        alert_sinks=sinks(smtp, receiver)[1:],  # the webhook only
        alert_window=WINDOW,
        build={"alert_outbox": outbox},
    )
    [said] = await third.wait_event("alert.outbox")
    assert (said["resumed"], said["expired"]) == (0, 1)
    assert said["dropped"] == (
        f"default/flaky run {run_id} failed (email: its sink is no longer configured)"
    )

    # With every sink removed no alerter runs: the outbox was left for good. It is named
    # dropped the same way and removed.
    await third.stop()
    outbox.write_text(kept)
    outbox.chmod(0o600)
    fourth = await start_daemon(alert_window=WINDOW, build={"alert_outbox": outbox})
    [said] = fourth.named("alert.outbox")
    assert (said["resumed"], said["expired"]) == (0, 1)
    assert said["dropped"] == (
        f"default/flaky run {run_id} failed (email: its sink is no longer configured)"
    )
    assert not outbox.exists()


async def test_a_standby_sends_what_its_outbox_kept(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    database: str,
    smtp: SmtpServer,
    receiver: HttpReceiver,
    tmp_path: Any,
) -> None:
    """At a failover the new leader keeps its own outbox: an email still retrying when
    the old leader stopped was sent only once that daemon led again (and the open window
    kept the job's next alerts quiet meanwhile; a tester's finding). The old one, back
    as a standby, sends it."""
    import asyncpg

    from coordinator.store import LOCK_CLASS, LOCK_OBJECT

    await define(conn, "flaky", target=FAIL)
    outbox = tmp_path / "state" / "alerts-outbox.jsonl"
    smtp.stop()
    first = await start_daemon(
        alert_sinks=sinks(smtp, receiver),
        alert_window=WINDOW,
        stop_timeout=1.0,
        build={"alert_outbox": outbox},
    )
    alerter(first).retry_first = 60.0
    run_id = await fail_once(conn, first)
    await first.wait_event("alert.failed", sink="email", run=run_id)
    await first.stop()
    assert outbox.exists()
    smtp.start()
    holder = await aio(asyncpg.connect)(database)  # another daemon leads
    try:
        await aio(holder.fetchval)("SELECT pg_advisory_lock($1, $2)", LOCK_CLASS, LOCK_OBJECT)
        standby = await start_daemon(
            alert_sinks=sinks(smtp, receiver),
            alert_window=WINDOW,
            build={"alert_outbox": outbox},
            wait_ready=False,
        )
        await standby.wait_event("standby")
        await standby.wait_event("alert.sent", sink="email", run=run_id)
        assert not outbox.exists()
        assert not standby.daemon.ready.is_set()
        (mail,) = smtp.messages
        assert mail["X-Coordinator-Run"] == str(run_id)
        await standby.stop()
    finally:
        await aio(holder.close)()
