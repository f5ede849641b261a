"""The web page's pure parts: cadences in words, ages, sparklines, signed sessions and
CSRF tokens, and what the live stream says for each daemon event."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio
import trio.testing

from coordinator import buckets
from coordinator.admin import live, present
from coordinator.admin.session import (
    KEY_FILE,
    SIGNOUTS_FILE,
    Sessions,
    bound_to,
    token_matches,
)
from coordinator.client import JobView, RunStats
from coordinator.events import (
    DispatchWake,
    EventBus,
    LifecycleWake,
    Missed,
    NotificationWake,
    Refreshed,
    RunFinished,
    RunProgress,
    RunStarted,
    StateChanged,
    WorkerConnected,
)
from coordinator.log import EventLog
from coordinator.status import DaemonStatus, WorkerView
from coordinator.tokens import TokenScope, TokenSet, hash_token

if TYPE_CHECKING:
    from pathlib import Path

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def job(**kw: Any) -> JobView:
    fields: dict[str, Any] = {
        "id": 1,
        "namespace": "default",
        "name": "j",
        "schedule_kind": "manual",
        "schedule": None,
        "timezone": "UTC",
        "target": {"kind": "exec", "argv": ["true"]},
        "params": {},
        "timeout": None,
        "priority": "background",
        "idempotent": False,
        "paused": False,
        "invalid_reason": None,
        "next_run_at": None,
        "schedule_version": 1,
        "created_at": NOW,
        "updated_at": NOW,
    }
    fields.update(kw)
    return JobView(**fields)


def status(**kw: Any) -> DaemonStatus:
    fields: dict[str, Any] = {
        "state": "ready",
        "instance": "h:1:x",
        "uptime_s": 5.0,
        "leading": True,
        "jobs": 0,
        "armed_deadlines": 0,
    }
    fields.update(kw)
    return DaemonStatus(**fields)


@pytest.mark.parametrize(
    ("kind", "expression", "zone", "words"),
    [
        ("manual", None, "UTC", "manual"),
        ("interval", "10m", "UTC", "every 10 min"),
        ("interval", "1h30m", "UTC", "every 1 h 30 min"),
        ("interval", "1d", "UTC", "every day"),
        ("interval", "45s", "UTC", "every 45 s"),
        ("cron", "30 2 * * *", "Europe/Berlin", "at 02:30 Europe/Berlin"),
        ("cron", "*/5 * * * *", "UTC", "every 5 min"),
        ("cron", "* * * * *", "UTC", "every minute"),
        ("cron", "15 * * * *", "UTC", "hourly at :15"),
        ("cron", "0 9 * * 1", "UTC", "Mondays at 09:00 UTC"),
        ("cron", "0 9 * * 1-5", "UTC", "weekdays at 09:00 UTC"),
        ("cron", "0 3 1 * *", "UTC", "monthly on day 1 at 03:00 UTC"),
        ("cron", "0 0 1 1 *", "UTC", "yearly on 1 January at 00:00 UTC"),
        ("cron", "0 */6 * * *", "UTC", "every 6 h at :00"),
        ("cron", "@daily", "UTC", "daily at 00:00 UTC"),
        ("cron", "5,35 1-3 * * *", "UTC", "cron 5,35 1-3 * * * UTC"),
        ("once", "2026-05-01T12:00:00+00:00", "UTC", "once at 2026-05-01T12:00:00+00:00"),
    ],
)
def test_cadence_in_words(kind: str, expression: str | None, zone: str, words: str) -> None:
    assert present.cadence(job(schedule_kind=kind, schedule=expression, timezone=zone)) == words


@pytest.mark.parametrize(
    ("delta", "words"),
    [
        (timedelta(0), "just now"),
        (timedelta(seconds=-42), "42 s ago"),
        (timedelta(minutes=4, seconds=10), "in 4 min"),
        (timedelta(hours=-30), "30 h ago"),
        (timedelta(days=3), "in 3 days"),
    ],
)
def test_relative_times(delta: timedelta, words: str) -> None:
    assert present.relative(NOW + delta, NOW) == words


def test_worker_jobs_nobody_serves_say_so() -> None:
    images = job(target={"kind": "worker", "type": "images"}, schedule_kind="interval",
                 schedule="1h")  # fmt: skip
    assert present.job_state(images, status()) == "waiting for a worker serving images"
    assert present.next_run(images, status()) == "when a worker connects"
    served = status(
        workers=(
            WorkerView(id="w", types=("images",), capacity=1, busy=0, draining=False,
                       transport="unix", peer="-", connected_at=NOW),
        )
    )  # fmt: skip
    assert present.job_state(images, served) == "active"
    assert present.next_run(images, served) == "at the next refresh"
    assert present.matches(images, "waiting", status())
    assert not present.matches(images, "waiting", served)
    assert present.job_state(job(paused=True), status()) == "paused"
    # A paused job's saved deadline is not served; a served one-shot is done.
    assert present.next_run(job(paused=True, next_run_at=NOW), served) == "paused"
    assert present.next_run(job(schedule_kind="once", schedule="2020-01-01T00:00:00Z"),
                            status()) == "done"  # fmt: skip


def test_worker_jobs_no_worker_may_run_for_their_namespace_say_so() -> None:
    images = job(target={"kind": "worker", "type": "images"}, namespace="billing",
                 schedule_kind="interval", schedule="1h")  # fmt: skip
    confined = WorkerView(id="w", types=("images",), capacity=1, busy=0, draining=False,
                          transport="tls", peer="-", connected_at=NOW,
                          namespaces=("reports",))  # fmt: skip
    waiting = "waiting for a worker serving images that may run namespace billing"
    assert present.job_state(images, status(workers=(confined,))) == waiting
    assert present.matches(images, "waiting", status(workers=(confined,)))
    reaching = attrs.evolve(confined, namespaces=("billing", "reports"))
    assert present.job_state(images, status(workers=(confined, reaching))) == "active"
    # A draining worker takes no new call: it counts for nothing.
    gone = attrs.evolve(reaching, draining=True)
    assert present.job_state(images, status(workers=(confined, gone))) == waiting


def stats_for(counts: list[dict[str, int]]) -> RunStats:
    chosen = buckets.choose(NOW - timedelta(hours=len(counts) - 1), NOW)
    assert chosen.count == len(counts)
    return RunStats(job="default/j", job_id=1, buckets=chosen, counts=tuple(counts))


def test_a_sparkline_has_one_bar_per_bucket_stacked_by_outcome() -> None:
    counts = [{}] * 6 + [{"succeeded": 3, "failed": 1}, {"timed_out": 2}]
    svg = str(present.sparkline(stats_for(counts)))
    assert svg.count('class="bucket') == 8
    assert svg.count('<g class="bucket"') == 2
    assert 'data-count="8"' in svg
    assert svg.count('class="bucket empty"') == 6
    assert svg.count('class="s-succeeded"') == 1
    assert svg.count('class="s-failed"') == 1
    assert svg.count('class="s-timed_out"') == 1
    assert "3 succeeded, 1 failed" in svg
    assert "style=" not in svg  # the CSP allows no inline style
    # The busiest bucket fills the height.
    assert 'y="0.0" width="6" height="5.5"' in svg


def test_a_sparkline_with_no_runs_is_small() -> None:
    """A job with no runs had 29 empty bars: 2 KB of each row of the jobs view (a
    tester's finding). Now one dashed line, whatever the number of buckets."""
    few, many = (str(present.sparkline(stats_for([{}] * n))) for n in (8, 30))
    assert len(many) < 500, len(many)
    assert len(many) - len(few) < 10  # (only the numbers' digits differ)
    assert "bucket" not in many
    assert 'aria-label="runs per hour since' in many
    assert ': no runs" data-unit="hour"' in many
    line = '<line class="empty" x1="0" y1="21.5" x2="238" y2="21.5" stroke-dasharray="6 2"/>'
    assert line in many
    assert "style=" not in many
    big = str(present.sparkline(stats_for([{}] * 8), bar=10, height=48))
    assert 'x2="94" y2="47.5" stroke-dasharray="10 2"' in big


def test_a_sparkline_escapes_unknown_outcomes() -> None:
    svg = str(present.sparkline(stats_for([{'<b x="1">': 1}] * 8)))
    assert "<b" not in svg
    assert "&lt;b x=&#34;1&#34;&gt;" in svg


def test_spans_are_named() -> None:
    assert present.span(None) == ("7d", timedelta(days=7))
    assert present.span("6mo")[1] == timedelta(days=183)
    with pytest.raises(ValueError, match="span"):
        present.span("forever")


# -- sessions ----------------------------------------------------------------------------------


def test_sessions_are_signed_expire_and_can_be_revoked() -> None:
    sessions = Sessions.for_token("a-token-of-sixteen+")
    value = sessions.issue(1000.0)
    nonce = sessions.nonce(value, 1001.0)
    assert nonce is not None
    assert "a-token" not in value
    assert sessions.nonce(value, 1000.0 + 12 * 3600) is None  # expired
    assert sessions.nonce(value[:-1] + ("0" if value[-1] != "0" else "1"), 1001.0) is None
    assert sessions.nonce(value.replace("v1s", "v1p"), 1001.0) is None  # another kind
    assert Sessions.for_token("another-token-of-16").nonce(value, 1001.0) is None
    assert sessions.nonce(value, 1001.0, kind="p") is None
    sessions.revoke(value, 1002.0)
    assert sessions.nonce(value, 1003.0) is None


def test_kept_sessions_outlive_the_process_and_end_with_their_tokens_scope(
    tmp_path: Path,
) -> None:
    """Keys from a secret kept in the state directory; a session is bound to its token's
    hash and scope as configured, and a sign-out is kept there too."""
    admin = TokenScope(name="ops", digest=hash_token("o" * 20))
    tokens = TokenSet((admin,))
    first = Sessions.kept_in(tmp_path, bound_to(tokens))
    value = first.issue(1000.0, holder="ops")
    other = first.issue(1000.0, holder="ops")
    form = first.issue(1000.0, kind="p", lifetime=3600)
    assert (tmp_path / KEY_FILE).stat().st_mode & 0o777 == 0o600
    again = Sessions.kept_in(tmp_path, bound_to(tokens))  # a restart
    assert again.nonce(value, 1001.0) is not None
    assert again.nonce(form, 1001.0, kind="p") is not None
    assert again.csrf(str(again.nonce(value, 1001.0))) == first.csrf(str(first.nonce(value, 1.0)))
    again.revoke(value, 1002.0)
    assert (tmp_path / SIGNOUTS_FILE).stat().st_mode & 0o777 == 0o600
    third = Sessions.kept_in(tmp_path, bound_to(tokens))
    assert third.nonce(value, 1003.0) is None  # signed out, before the restart
    assert third.nonce(other, 1003.0) is not None
    # Another token under that name, another scope, or no such token: no session.
    for changed in (
        TokenSet((TokenScope(name="ops", digest=hash_token("n" * 20)),)),
        TokenSet((attrs.evolve(admin, access="read"),)),
        TokenSet((attrs.evolve(admin, namespaces=frozenset({"billing"})),)),
        TokenSet((TokenScope(name="dev", digest=hash_token("d" * 20)),)),
    ):
        assert Sessions.kept_in(tmp_path, bound_to(changed)).nonce(other, 1003.0) is None
    # Another directory's secret signs nothing of this one.
    elsewhere = tmp_path / "elsewhere"
    assert Sessions.kept_in(elsewhere, bound_to(tokens)).nonce(other, 1003.0) is None


def test_kept_sign_outs_are_compacted_to_those_not_expired(tmp_path: Path) -> None:
    tokens = TokenSet((TokenScope(name="ops", digest=hash_token("o" * 20)),))
    sessions = Sessions.kept_in(tmp_path, bound_to(tokens))
    revoked = []
    for n in range(400):  # each expires at 1000 + n + 60: about 60 live at a time
        revoked.append(sessions.issue(1000.0 + n, holder="ops", lifetime=60))
        sessions.revoke(revoked[-1], 1000.0 + n)
    lines = (tmp_path / SIGNOUTS_FILE).read_text().splitlines()
    # Rewritten once it held more than twice the live ones (+100): only those kept.
    assert len(lines) < 400 - 150
    assert min(json.loads(line)["until"] for line in lines) > 1060  # the first ones went
    live = Sessions.kept_in(tmp_path, bound_to(tokens))
    last = sessions.issue(1399.0, holder="ops", lifetime=60)
    assert live.nonce(last, 1400.0) is not None
    assert [live.nonce(value, 1400.0) for value in revoked[-59:]] == [None] * 59


def test_kept_sessions_survive_garbage_and_refuse_a_shared_key(tmp_path: Path) -> None:
    """A sign-outs file with garbage (bytes that are not UTF-8, a number JSON cannot make
    an int of, a torn last line) never stops the page: that line is skipped, and the next
    sign-out starts on a line of its own. A key another user could read is replaced."""
    tokens = TokenSet((TokenScope(name="ops", digest=hash_token("o" * 20)),))
    (tmp_path / SIGNOUTS_FILE).write_bytes(
        b'\xff\xfe\n{"nonce": "a", "until": 1e999}\n[[[\n{"nonce": "b", "unt'
    )
    sessions = Sessions.kept_in(tmp_path, bound_to(tokens))
    value = sessions.issue(1000.0, holder="ops")
    nonce = sessions.nonce(value, 1000.5)
    sessions.revoke(value, 1001.0)
    last = (tmp_path / SIGNOUTS_FILE).read_text(errors="replace").splitlines()[-1]
    assert json.loads(last) == {"nonce": nonce, "until": 1000 + 12 * 3600}
    assert Sessions.kept_in(tmp_path, bound_to(tokens)).nonce(value, 1002.0) is None
    # A sign-out the directory cannot take: it holds here, and the daemon is told.
    told: list[str] = []
    unkept = Sessions.kept_in(tmp_path / "unkept", bound_to(tokens), warn=told.append)
    (tmp_path / "unkept" / SIGNOUTS_FILE).mkdir()
    gone = unkept.issue(1000.0, holder="ops")
    unkept.revoke(gone, 1001.0)
    assert unkept.nonce(gone, 1002.0) is None
    assert len(told) == 1
    assert told[0].startswith("a sign-out is kept in memory only, until a restart: ")
    # A long token name (300 characters) still makes a session that verifies.
    long = TokenSet((TokenScope(name="n" * 300, digest=hash_token("l" * 20)),))
    wide = Sessions.kept_in(tmp_path / "long", bound_to(long))
    assert wide.nonce(wide.issue(1000.0, holder="n" * 300), 1001.0) is not None
    # Not bound to a token there is: no session is issued for it, none verifies.
    with pytest.raises(ValueError, match="no token named 'dev'"):
        sessions.issue(1000.0, holder="dev")
    # A nonce with the separator of body and binding, or a holder that does not decode,
    # is never signed (none is issued so: they could only be forged).
    assert sessions._sign("v1s.2000.a|b~b3Bz", "a|b~b3Bz") is None
    assert sessions._sign("v1s.2000.a~%%", "a~%%") is None
    assert sessions._sign("v1s.2000.a~b3Bz", "a~b3Bz") is not None
    # A key file others may read is no secret: a new one is made, the old sessions end.
    other = Sessions.kept_in(tmp_path, bound_to(tokens)).issue(1000.0, holder="ops")
    (tmp_path / KEY_FILE).chmod(0o644)
    renewed = Sessions.kept_in(tmp_path, bound_to(tokens))
    assert renewed.nonce(other, 1001.0) is None
    assert (tmp_path / KEY_FILE).stat().st_mode & 0o777 == 0o600


def test_csrf_tokens_are_bound_to_the_session() -> None:
    sessions = Sessions.for_token("a-token-of-sixteen+")
    one = sessions.nonce(sessions.issue(0.0), 1.0)
    two = sessions.nonce(sessions.issue(0.0), 1.0)
    assert one is not None
    assert two is not None
    assert sessions.csrf_ok(one, sessions.csrf(one))
    assert not sessions.csrf_ok(two, sessions.csrf(one))
    assert not sessions.csrf_ok(one, None)
    assert not sessions.csrf_ok(None, sessions.csrf(one))
    assert token_matches(" a-token-of-sixteen+\n", "a-token-of-sixteen+")
    assert not token_matches("a-token-of-sixteen", "a-token-of-sixteen+")


# -- the live stream ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "kind", "data"),
    [
        (DispatchWake(dispatch=5, job_id=2), "run", {"job_id": 2, "run": 5, "status": "queued"}),
        (
            RunStarted(job="d/j", job_id=2, run=5, trigger="manual", attempt=1),
            "run",
            {
                "job_id": 2,
                "job": "d/j",
                "run": 5,
                "status": "running",
                "trigger": "manual",
                "attempt": 1,
            },
        ),
        (
            RunProgress(run=5, percent=40.0, label="copy"),
            "progress",
            {"run": 5, "percent": 40.0, "label": "copy", "message": None},
        ),
        (NotificationWake(payload={"job": 3}), "job", {"job_id": 3}),
        (
            NotificationWake(payload={"job": 3, "run": 9}),
            "run",
            {"job_id": 3, "run": 9, "status": "queued"},
        ),
        (NotificationWake(payload={"changed": "many"}), "jobs", {}),
        (
            NotificationWake(payload={"pause": 9}),
            "run",
            {"run": 9, "status": "cancel_requested"},
        ),
        (Refreshed(jobs=3, armed=1, initialised=1, elapsed_ms=1.0), "jobs", {}),
        (
            WorkerConnected(worker="w", types=("a",), capacity=1, transport="unix", peer="-"),
            "worker",
            {"worker": "w", "connected": True, "types": ["a"]},
        ),
        (
            StateChanged(state="degraded", reasons=("x",)),
            "status",
            {"state": "degraded", "reasons": ["x"]},
        ),
        (Missed(count=3), "missed", {"count": 3}),
    ],
)
def test_each_event_says_what_changed(event: Any, kind: str, data: dict[str, Any]) -> None:
    assert live.message(event) == (kind, data)
    text = live.encode(kind, data).decode()
    assert text.startswith(f"event: {kind}\ndata: ")
    assert text.endswith("\n\n")
    assert json.loads(text.split("data: ", 1)[1]) == data


def test_events_that_change_nothing_shown_say_nothing() -> None:
    assert live.message(Refreshed(jobs=3, armed=1, elapsed_ms=1.0)) is None
    assert live.message(LifecycleWake(reason="x")) is None


def test_a_finished_runs_error_is_cut() -> None:
    event = RunFinished(
        job="d/j", job_id=1, run=2, trigger="schedule", outcome="failed", elapsed_ms=1.0,
        error="x" * 5000,
    )  # fmt: skip
    found = live.message(event)
    assert found is not None
    assert len(found[1]["error"]) == live.MAX_ERROR


def test_a_paused_or_retried_run_says_so_in_its_message() -> None:
    paused = live.message(
        RunFinished(
            job="d/j", job_id=1, run=2, trigger="manual", outcome="paused", elapsed_ms=1.0,
            error="paused by operator", cursor_bytes=12, resumes=1,
        )
    )  # fmt: skip
    assert paused is not None
    assert (paused[1]["status"], paused[1]["resumes"], paused[1]["retry"]) == ("paused", 1, None)
    failed = live.message(
        RunFinished(
            job="d/j", job_id=1, run=2, trigger="manual", outcome="failed", elapsed_ms=1.0,
            attempt=1, category="timeout", retry=3, retry_at=NOW, exhausted=False,
        )
    )  # fmt: skip
    assert failed is not None
    assert {k: failed[1][k] for k in ("attempt", "category", "retry", "retry_at")} == {
        "attempt": 1,
        "category": "timeout",
        "retry": 3,
        "retry_at": "2026-03-02T12:00:00+00:00",
    }
    json.loads(live.encode(*failed).decode().split("data: ", 1)[1])  # JSON all through


async def test_a_silent_stream_sends_a_keep_alive_comment(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An idle stream carried no byte for minutes: a proxy's 60 s idle timeout dropped
    it, and the page then read everything it shows again (a tester's finding). Now a
    comment every KEEP_ALIVE seconds of silence, counted from the last thing sent."""
    bus = EventBus(log=EventLog(stream=io.StringIO()))
    sent: list[tuple[float, bytes]] = []
    leave = trio.Event()

    async def receive() -> dict[str, Any]:
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append((trio.current_time(), message["body"]))

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(live.EventSourceResponse(bus), {"type": "http"}, receive, send)
        await trio.sleep(live.KEEP_ALIVE * 2 + 10)
        bus.emit(StateChanged(state="degraded", reasons=("x",)))
        await trio.sleep(live.KEEP_ALIVE + 5)
        leave.set()
    moments = [(round(t - start, 3), body) for t, body in sent]
    event = live.encode("status", {"state": "degraded", "reasons": ["x"]})
    assert moments == [
        (0, b"retry: 3000\n: live\n\n"),
        (live.KEEP_ALIVE, b": keep-alive\n\n"),
        (live.KEEP_ALIVE * 2, b": keep-alive\n\n"),
        (live.KEEP_ALIVE * 2 + 10, event),
        (live.KEEP_ALIVE * 3 + 10, b": keep-alive\n\n"),
    ]
    assert not bus._streams  # closed when the client went


def test_policies_and_waiting_retries_in_words() -> None:
    assert present.retry_policy(job()) == "none"
    assert present.retry_policy(job(retries=1, retry_backoff=timedelta(seconds=30))) == (
        "1 retry, after 30 s"
    )
    assert (
        present.retry_policy(
            job(retries=4, retry_backoff=timedelta(minutes=1), retry_max_delay=timedelta(hours=2))
        )
        == "4 retries, after 1 min doubling to at most 2 h"
    )
    assert present.retry_policy(job(retries=2, retry_backoff=timedelta(hours=2))) == (
        "2 retries, 1 h apart"  # the cap (1 h by default) wins over the first delay
    )
    assert present.misfire_policy(job()) == "run once, however late"
    assert present.history_kept(job()) == "the defaults (the retention setting)"
    assert present.history_kept(job(keep_last=30, retention=timedelta(days=90))) == (
        "the newest 30 runs, none older than 90 days"
    )
    assert present.history_kept(job(keep_last=5)) == (
        "the newest 5 runs, none older than the default age"
    )
    assert present.history_kept(job(retention=timedelta(hours=12))) == (
        "the default number of newest runs, none older than 12 h"
    )
    skip = job(misfire="skip", misfire_grace=timedelta(minutes=5))
    assert present.misfire_policy(skip).startswith("skip if more than 5 min late")
    waiting = job(
        retries=4, outstanding_run=7, outstanding_status="queued", outstanding_attempt=3,
        outstanding_due_at=NOW,
    )  # fmt: skip
    assert present.retry_of_total(waiting) == "retry 2 of 4"
    assert present.matches(waiting, "retrying", status())
    queued = job(outstanding_run=7, outstanding_status="queued", outstanding_attempt=1)
    assert present.retry_of_total(queued) is None
    assert not present.matches(queued, "retrying", status())
    paused = job(outstanding_run=7, outstanding_status="paused", recoverable=True)
    assert present.matches(paused, "run-paused", status())
    assert not present.matches(waiting, "run-paused", status())


def test_a_cursor_is_shown_bounded() -> None:
    small = present.json_text({"after": 40}, 100)
    assert small == ('{\n "after": 40\n}', len('{"after":40}'), False)
    text, size, cut = present.json_text({"pad": "x" * 5000}, 100)
    assert cut
    assert len(text) == 101  # the limit and the mark that says it was cut
    assert text.endswith("…")
    assert size == len('{"pad":""}') + 5000
    assert present.json_text({"b": 1, "a": "é"}, 100, indent=None)[0] == '{"a": "é", "b": 1}'


def test_short_times_leave_out_todays_date() -> None:
    assert present.short_time(NOW - timedelta(hours=3), NOW) == "09:00 UTC"
    assert present.short_time(NOW - timedelta(days=1), NOW) == "2026-03-01 12:00 UTC"
    assert present.short_time(None, NOW) == "-"


def test_a_job_named_dots_keeps_its_own_path_and_the_state_filters_say_what_they_show() -> None:
    """A job named ``..`` linked to ``/jobs/default/..``, which a browser resolves to
    ``/jobs/``; "running" listed jobs whose run was only queued."""
    from coordinator.admin.web import job_path

    assert job_path("default", "..", "run") == "/jobs/default/%2E%2E/run"
    assert job_path("default", ".") == "/jobs/default/%2E"
    assert job_path("default", "a/b.c") == "/jobs/default/a%2Fb.c"
    queued, running = job(outstanding_status="queued"), job(outstanding_status="running")
    assert [present.matches(j, "running", status()) for j in (queued, running)] == [False, True]
    assert [present.matches(j, "queued", status()) for j in (queued, running)] == [True, False]


def test_a_run_s_output_keeps_its_lines_and_escapes_the_rest() -> None:
    """The page's <pre> held raw ESC and BEL bytes: invisible there, and the colour codes
    a terminal would have obeyed hidden."""
    text = "ctrl\x1b[31mred\x07bell\nsecond\ttab\n"
    assert present.output_text(text) == "ctrl\\x1b[31mred\\x07bell\nsecond\\ttab\n"
    assert present.output_text(None) == ""
