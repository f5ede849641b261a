"""The sentences that say why nothing happens: pure, from a job, a run and the facts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest

from coordinator import why
from coordinator.client import JobView, Leader, RunView
from coordinator.model import Schedule, Target
from coordinator.probe import ApiAnswer, Facts

NOW = datetime(2026, 11, 30, 8, 0, 0, tzinfo=UTC)
LEADER = Leader(pid=4242, application="coordinator", since=None)


def job(**changes: Any) -> JobView:
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
    fields.update(changes)
    return JobView(**fields)


def run(run_id: int = 7, status: str = "queued", started_at: datetime | None = None) -> RunView:
    return RunView(
        id=run_id,
        job_id=1,
        namespace="default",
        job="j",
        trigger="manual",
        status=status,
        scheduled_for=None,
        claimed_at=started_at,
        started_at=started_at,
        finished_at=None,
        created_at=NOW,
        schedule_version=None,
        instance=None,
        args={},
        count=None,
        extra=None,
        error_cause=None,
        error_message=None,
        attempt=1,
    )


def api(workers: list[str]) -> ApiAnswer:
    return ApiAnswer(status={"state": "leader", "workers": workers}, label="the API")


NO_DAEMON = Facts(leader=None, leader_known=True)
LEADING = Facts(leader=LEADER, leader_known=True)
WORKER = {"kind": "worker", "type": "images"}


@pytest.mark.parametrize(
    ("the_job", "facts", "reason"),
    [
        (job(paused=True), NO_DAEMON, "the daemon is not running"),  # first things first
        (job(invalid_reason="cron: bad"), LEADING, "the job is invalid (cron: bad)"),
        (job(paused=True), LEADING, "the job is paused; `coordinator jobs resume j`"),
        (job(blocked_by=3, outstanding_run=3), LEADING, "blocked by unresolved run 3"),
        (
            job(target=WORKER),
            Facts(leader=LEADER, leader_known=True, api=api([])),
            "no worker serves images",
        ),
        (
            job(target=WORKER),
            Facts(
                leader=LEADER,
                leader_known=True,
                api=ApiAnswer(status=None, label="nothing answered"),
            ),
            "perhaps no worker serves images: only the daemon knows, and nothing answered",
        ),
        (
            job(target=WORKER),
            Facts(leader=LEADER, leader_known=True, api=api(["images"])),
            "the daemon has not claimed it yet",
        ),
        (
            # Its only worker's token reaches another namespace: claimed and given back,
            # not "not claimed yet".
            job(target=WORKER),
            Facts(
                leader=LEADER,
                leader_known=True,
                api=ApiAnswer(
                    status={
                        "state": "leader",
                        "workers": ["images"],
                        "worker_connections": [{"types": ["images"], "namespaces": ["ops"]}],
                    },
                    label="the API",
                ),
            ),
            "waiting for a worker serving images that may run namespace default: the "
            "workers serving images have tokens that do not reach namespace default",
        ),
    ],
)
def test_still_waiting(the_job: JobView, facts: Facts, reason: str) -> None:
    assert why.still_waiting(the_job, run(), facts, now=NOW).startswith(reason)


def test_still_waiting_for_a_run_under_way_says_it_started() -> None:
    """Not "not claimed yet": the wait gave up on a run that is running."""
    started = run(status="running", started_at=NOW - timedelta(seconds=90))
    assert why.still_waiting(job(), started, LEADING, now=NOW) == (
        "it started 1m30s ago and has not finished; `coordinator runs show 7`"
    )
    slow = job(timeout=timedelta(minutes=10))
    assert why.still_waiting(slow, started, LEADING, now=NOW) == (
        "it started 1m30s ago and has not finished (its timeout: 10m); `coordinator runs show 7`"
    )
    # To the second ("it started 20s477.873ms ago" before).
    odd = run(status="running", started_at=NOW - timedelta(seconds=20.477873))
    assert why.still_waiting(job(), odd, LEADING, now=NOW).startswith("it started 20s ago")
    # Without a daemon it never will: that comes first.
    assert why.still_waiting(slow, started, NO_DAEMON, now=NOW).startswith(
        "the daemon is not running"
    )


def test_hints_name_the_namespace_and_quote_for_the_shell() -> None:
    assert why.command("resume", "default", "often") == "coordinator jobs resume often"
    assert why.command("resume", "billing", "often") == ("coordinator jobs resume often -n billing")
    assert why.command("trigger", "ops team", "nightly backup") == (
        "coordinator jobs trigger 'nightly backup' -n 'ops team'"
    )
    assert why.command("resume", "ops", "-x") == "coordinator jobs resume -n ops -- -x"
    paused = job(paused=True, namespace="billing", name="often")
    assert why.still_waiting(paused, run(), LEADING, now=NOW) == (
        "the job is paused; `coordinator jobs resume often -n billing` lets it run"
    )
    manual = Schedule(kind="manual")
    assert why.after_define(
        manual, Target(kind="exec", argv=("true",)), namespace="billing", name="often",
        paused=False, facts=LEADING, now=NOW,
    ) == "manual: it runs when triggered (coordinator jobs trigger often -n billing)"  # fmt: skip


def test_the_state_column_names_a_namespace_no_worker_may_run() -> None:
    def connected(*namespaces: str | None) -> Facts:
        workers: list[dict[str, Any]] = []
        for reach in namespaces:
            entry: dict[str, Any] = {"id": "w", "types": ["images"], "draining": False}
            if reach != "old":  # (a daemon before this field: every namespace)
                entry["namespaces"] = None if reach is None else [reach]
            workers.append(entry)
        status = {"state": "leader", "workers": ["images"], "worker_connections": workers}
        return Facts(leader=LEADER, leader_known=True, api=ApiAnswer(status=status, label="x"))

    billing_job = job(target=WORKER, namespace="billing", schedule_kind="interval", schedule="5m")
    assert why.job_state(billing_job, connected("reports")) == (
        "waiting for a worker serving images that may run namespace billing"
    )
    assert why.job_state(billing_job, connected("reports", "billing")) == "active"
    assert why.job_state(billing_job, connected(None)) == "active"
    assert why.job_state(billing_job, connected("old")) == "active"
    no_entries = {"state": "leader", "workers": ["images"]}  # (older still: no entries)
    oldest = Facts(leader=LEADER, leader_known=True, api=ApiAnswer(status=no_entries, label="x"))
    assert why.job_state(billing_job, oldest) == "active"
    assert why.job_state(billing_job, LEADING) == "active"  # unknown: no guess


def test_state_and_next_run_columns() -> None:
    unserved = Facts(leader=LEADER, leader_known=True, api=api(["other"]))
    worker_job = job(target=WORKER, schedule_kind="interval", schedule="5m")
    assert why.job_state(worker_job, unserved) == "waiting for a worker serving images"
    assert why.next_run(worker_job, unserved) == "-"
    # Unknown (no API): the job's own state, no guess.
    assert why.job_state(worker_job, LEADING) == "active"
    interval = job(schedule_kind="interval", schedule="5m")
    assert why.next_run(interval, LEADING) == "next refresh"
    assert why.next_run(interval, NO_DAEMON) == "no daemon"
    assert why.next_run(job(schedule_kind="interval", next_run_at=NOW), NO_DAEMON) == (
        "2026-11-30 08:00:00Z"
    )


def test_a_paused_job_and_a_served_one_shot_have_no_next_run() -> None:
    """A paused job showed its saved deadline, past or not; a one-shot job whose instant
    was served said "next refresh" for ever."""
    paused = job(schedule_kind="interval", schedule="5m", next_run_at=NOW, paused=True)
    assert why.next_run(paused, LEADING) == "-"
    done = job(schedule_kind="once", schedule="2020-01-01T00:00:00Z", last_run=7)
    assert why.next_run(done, LEADING) == why.next_run(done, NO_DAEMON) == "done"
    assert why.one_shot_done(done)
    assert not why.one_shot_done(attrs.evolve(done, next_run_at=NOW))
    assert not why.one_shot_done(attrs.evolve(done, paused=True))
    once = Schedule(kind="once", expression="2020-01-01T00:00:00Z")
    said = why.after_define(
        once, Target(kind="exec", argv=("true",)), namespace="default", name="o",
        paused=False, facts=LEADING, now=NOW, done=True,
    )  # fmt: skip
    assert said == (
        "done: its instant 2020-01-01 00:00:00Z was served (run, or skipped by its misfire "
        "policy); it runs again only if defined with another --at, or triggered "
        "(coordinator jobs trigger o)"
    )


def test_after_define() -> None:
    cron = Schedule(kind="cron", expression="30 2 * * *")
    exec_target = Target(kind="exec", argv=("true",))
    assert why.after_define(
        cron, exec_target, namespace="default", name="b", paused=False, facts=LEADING, now=NOW
    ) == ("next run 2026-12-01 02:30:00Z, armed at the daemon's next refresh (within 30s)")
    assert why.after_define(
        Schedule(kind="interval", expression="5m"),
        Target(kind="worker", worker_type="images"),
        namespace="default",
        name="b",
        paused=False,
        facts=Facts(leader=None, leader_known=True),
        now=NOW,
    ) == (
        "next run about 2026-11-30 08:05:00Z, once a daemon runs and a worker serving "
        "images connects: none does now (`coordinator run`, or `systemctl start coordinator`)"
    )
    assert why.after_define(
        cron, exec_target, namespace="default", name="b", paused=True, facts=LEADING, now=NOW
    ).startswith("paused")
    # Defined again unchanged: the saved deadline stands, not an estimate from now.
    every = Schedule(kind="interval", expression="5m")
    saved = NOW - timedelta(seconds=2)
    assert why.after_define(
        every, exec_target, namespace="default", name="b", paused=False, facts=LEADING,
        now=NOW, saved=saved,
    ) == "next run 2026-11-30 07:59:58Z (unchanged: its saved deadline stands)"  # fmt: skip
    # An interval's first deadline counts from the definition, as the daemon counts it
    # (it said "5m after it is armed at the daemon's next refresh").
    assert why.after_define(
        every, exec_target, namespace="default", name="b", paused=False, facts=LEADING, now=NOW
    ) == ("next run about 2026-11-30 08:05:00Z, armed at the daemon's next refresh (within 30s)")
    # A retry waits: it comes first, whatever the schedule's estimate.
    assert why.after_define(
        every, exec_target, namespace="default", name="r", paused=False, facts=LEADING,
        now=NOW, retry=(41, NOW + timedelta(seconds=90)),
    ) == (
        "next run: retry run 41, due 2026-11-30 08:01:30Z; the schedule goes on after it"
    )  # fmt: skip
    # A manual job's waiting retry too (it said "manual: it runs when triggered").
    assert why.after_define(
        Schedule(kind="manual"), exec_target, namespace="default", name="m", paused=False,
        facts=LEADING, now=NOW, retry=(42, NOW + timedelta(seconds=30)),
    ) == "next run: retry run 42, due 2026-11-30 08:00:30Z"  # fmt: skip
    # A one-shot instant already past says so: it runs once, late.
    past = Schedule(kind="once", expression="2026-11-30T07:00:00Z")
    assert why.after_define(
        past, exec_target, namespace="default", name="p", paused=False, facts=LEADING, now=NOW
    ) == (
        "next run 2026-11-30 07:00:00Z (past: it runs once, late, unless its misfire policy "
        "skips it), armed at the daemon's next refresh (within 30s)"
    )


def test_status_differences() -> None:
    database = {
        "jobs": 5,
        "paused": 1,
        "invalid": 0,
        "manual": 1,
        "loadable": 3,
        "next_deadline": "2026-11-30T08:01:00+00:00",
        "next_job": "default/thumbs",
        "next_worker": "images",
    }
    live = {"jobs": 2, "workers": [], "next_deadline": {"job": "default/daily"}}
    first, second = why.status_differences(live, database, refresh_spacing=30)
    assert first.startswith("the database holds 5 jobs and the daemon has loaded 2")
    assert "(1 paused, 1 manual not loaded); 1 changed since its last refresh" in first
    assert second.endswith("default/thumbs, is not armed: no worker serves images")
    same = {"jobs": 5, "workers": ["images"], "next_deadline": {"job": "default/thumbs"}}
    assert why.status_differences(same, database, refresh_spacing=30) == []
    # More loaded than loadable: manual jobs it ran stay loaded (not "changed", which
    # stood while nothing changed).
    more = {"jobs": 4, "workers": ["images"], "next_deadline": {"job": "default/thumbs"}}
    [text] = why.status_differences(more, database, refresh_spacing=30)
    assert text.endswith(
        "; 1 more: manual jobs it ran since its last full refresh (none yet) stay loaded "
        "until the next, or jobs changed since (read within 30s of a change)"
    )
    # The earliest deadline's job is blocked by an unresolved run: said so (it said "it
    # is running now, or changed after its last refresh").
    blocked = {**database, "next_blocked_by": 19}
    [_, second] = why.status_differences(live, blocked, refresh_spacing=30)
    assert second.endswith(
        "default/thumbs, is not armed: it is blocked by unresolved run 19; resolve it with "
        "`coordinator runs resolve 19 --as failed|succeeded|retry`"
    )


def test_a_waiting_retry_is_what_comes_next() -> None:
    due = datetime(2026, 11, 30, 8, 0, 30, tzinfo=UTC)
    waiting = job(
        schedule_kind="interval",
        schedule="1h",
        next_run_at=NOW,  # the deadline the chain of attempts serves
        outstanding_run=8,
        outstanding_status="queued",
        outstanding_due_at=due,
    )
    facts = Facts(leader=LEADER, leader_known=True)
    assert why.next_run(waiting, facts) == "retry 2026-11-30 08:00:30Z"
    assert why.job_state(waiting, facts) == "retry waiting"


def test_the_demo_prints_a_run_s_output_escaped() -> None:
    """The demo printed a job's output raw: an escape sequence reached the terminal,
    where every other command escapes it."""
    from coordinator.demo import describe_run

    shown = attrs.evolve(
        run(status="failed"),
        extra={"stdout_tail": "\x1b[31mRED\x1b[0m\nplain", "stderr_tail": "bell\x07"},
        error_cause="handler",
        error_message="exit 1\x1b]0;title\x07",
    )
    lines = describe_run(shown)
    assert lines == [
        "demo: run 7 default/j (manual) failed (handler: exit 1\\x1b]0;title\\x07)",
        "  | \\x1b[31mRED\\x1b[0m",
        "  | plain",
        "  ! bell\\x07",
    ]
    assert not any(ch < " " for line in lines for ch in line)


def test_a_standbys_empty_worker_list_is_not_taken_for_the_leaders() -> None:
    """The CLI asked the admin API of a daemon standing by (the configured address,
    after a failover) and said "waiting for a worker serving w.quick ... none does now"
    while the leader elsewhere ran those jobs (a tester's finding): a standby's answer
    says nothing of workers."""
    standby = Facts(
        leader=LEADER,
        leader_known=True,
        api=ApiAnswer(
            status={"state": "standby", "leading": False, "workers": [], "worker_connections": []},
            label="the API",
        ),
    )
    assert standby.served is None
    assert standby.may_run("images", "default") is None
    assert why.job_state(job(target=WORKER), standby) == "active"
    assert not why.still_waiting(job(target=WORKER), run(), standby, now=NOW).startswith(
        "no worker serves images"
    )
