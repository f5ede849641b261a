"""``coordinator top``'s screen, drawn from the API's answers and the stream's messages
(pure: no daemon)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from coordinator.text import width
from coordinator.top import _SGR, Screen, _fit, _fit_height, _relative

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def screen() -> Screen:
    s = Screen(address="http://127.0.0.1:8787/")
    s.live = True
    s.status = {
        "state": "leader",
        "instance": "h:1:x",
        "jobs": 2,
        "armed_deadlines": 1,
        "running": [{"job": "default/copy", "job_id": 1, "run": 7, "running_s": 3.0}],
        "retained": [],
        "worker_connections": [
            {"id": "w1", "types": ["images"], "busy": 1, "capacity": 4, "draining": False}
        ],
    }
    s.status_at = NOW - timedelta(seconds=2)
    s.jobs = [
        {"namespace": "default", "name": "later", "schedule_kind": "cron",
         "schedule": "0 3 * * *", "timezone": "UTC",
         "next_run_at": (NOW + timedelta(hours=3)).isoformat()},
        {"namespace": "default", "name": "paused", "schedule_kind": "interval",
         "schedule": "5m", "paused": True, "next_run_at": NOW.isoformat()},
        {"namespace": "default", "name": "thumbs", "schedule_kind": "interval",
         "schedule": "1m", "target": {"kind": "worker", "type": "video"},
         "next_run_at": (NOW - timedelta(minutes=3)).isoformat()},
    ]  # fmt: skip
    return s


def test_the_screen_shows_each_section() -> None:
    s = screen()
    assert s.take("progress", {"run": 7, "percent": 50.0, "label": "copying"}) == set()
    text = "\n".join(s.render(NOW))
    assert "daemon leader h:1:x" in text
    assert "run 7" in text
    assert "5.0s" in text  # 3 s when read, 2 s ago
    assert "[##########..........]  50% copying" in text
    assert "in 3h00m     default/later" in text
    # Saved but not armed while no worker serves its type (it read "3m00s ago").
    assert "unarmed      default/thumbs" in text
    assert "(waiting for a worker serving video)" in text
    assert "paused" not in text.split("NEXT DEADLINES")[1].split("WORKERS")[0]
    assert "w1" in text
    assert "1/4 busy" in text
    assert "RECENT OUTCOMES\n  none yet" in text


def test_a_finished_run_is_an_outcome_and_names_what_to_read_again() -> None:
    s = screen()
    again = s.take(
        "run",
        {"job_id": 1, "job": "default/copy", "run": 7, "status": "failed",
         "trigger": "schedule", "elapsed_ms": 1500.0, "error": "boom\x1b[2J"},
    )  # fmt: skip
    assert again == {"status", "jobs"}
    text = "\n".join(s.render(NOW))
    assert "run 7" in text.split("RECENT OUTCOMES")[1]
    assert "failed" in text
    assert "\x1b" not in text  # a message cannot drive the terminal
    assert s.take("run", {"job_id": 1, "run": 8, "status": "running"}) == {"status"}
    assert s.take("missed", {"count": 3}) == {"status", "jobs", "runs"}


def test_the_header_says_what_it_follows_and_ages_read_plainly() -> None:
    """`--once` is a snapshot, not "reconnecting"; before the stream opens it is
    connecting; 12 s is "12s", not "0m12s"."""
    s = screen()
    assert " · live · " in s.render(NOW)[0]
    s.live = None
    assert " · connecting · " in s.render(NOW)[0]
    s.live = False
    assert " · reconnecting · " in s.render(NOW)[0]
    s.snapshot = True
    assert " · snapshot · " in s.render(NOW)[0]
    assert _relative(NOW - timedelta(seconds=12), NOW) == "12s ago"
    assert _relative(NOW - timedelta(seconds=75), NOW) == "1m15s ago"
    assert _relative(NOW + timedelta(seconds=9.5), NOW) == "in 9.5s"


def test_once_shows_the_daemons_side_when_the_database_is_down() -> None:
    """The API answers /api/status from the daemon's memory but 503 for /api/jobs and
    /api/runs while the database is down: `top --once` still prints the screen, says what
    it could not read, and exits 1 (it printed only the error, exit 1)."""
    import io
    from typing import Any

    import trio

    from coordinator.top import Top, TopError

    class DatabaseDown:
        listen = "127.0.0.1:8787"

        def get(self, path: str) -> Any:
            if path == "/api/status":
                return {
                    "state": "degraded",
                    "instance": "h:1:x",
                    "degraded": ["settle: cannot connect to PostgreSQL"],
                    "running": [{"job": "default/copy", "job_id": 1, "run": 7, "running_s": 3.0}],
                    "retained": [],
                    "worker_connections": [],
                }
            raise TopError(f"the admin API answered 503 to {path}: database unavailable")

    out = io.StringIO()
    top = Top(api=DatabaseDown(), out=out, once=True)  # type: ignore[arg-type]
    assert trio.run(top.run) == 1
    frame = out.getvalue()
    assert "default/copy" in frame  # the running call, from the daemon's memory
    assert "! the admin API answered 503 to /api/jobs?due=8: database unavailable" in frame


def test_a_long_name_is_cut_to_its_column_and_the_outcome_stays_in_line() -> None:
    """A name past the 32-column job column pushed the run's outcome out of line (or
    off a 100-column screen): cut with an ellipsis, wide characters counted as two."""
    s = screen()
    from coordinator.text import width

    names = ("default/" + "L" * 200, "default/" + "日本語" * 10, "default/a")
    for run, job in enumerate(names, start=8):
        s.take("run", {"job_id": run, "job": job, "run": run, "status": "succeeded",
                       "trigger": "manual", "elapsed_ms": 1000.0})  # fmt: skip
    outcomes = "\n".join(s.render(NOW, width=100)).split("RECENT OUTCOMES\n")[1].splitlines()
    columns = {width(line[: line.index("succeeded")]) for line in outcomes}
    assert len(columns) == 1, outcomes  # the same column on every line
    assert "default/LLL" in outcomes[0] or "default/LLL" in outcomes[-1]
    assert any("…" in line for line in outcomes)


def test_coloured_lines_are_cut_to_the_terminal_and_the_screen_to_its_height() -> None:
    """A coloured line was left whole (it wrapped at 80 columns) and the screen had more
    lines than the terminal: the redraw in place scrolled the title off (a tester)."""
    s = screen()
    for columns in (50, 80):
        lines = s.render(NOW, width=columns, colour=True)
        assert any("\x1b[" in line for line in lines)
        for line in lines:
            assert width(_SGR.sub("", line)) <= columns, line
            if "\x1b[" in line and line.endswith("…\x1b[0m"):
                assert line.count("\x1b[") >= 2  # (a cut inside a colour is closed)
    assert _fit("\x1b[32mleader\x1b[0m " + "界" * 30, 20) == "\x1b[32mleader\x1b[0m 界界界界界界…"
    assert _fit("\x1b[32m" + "x" * 30 + "\x1b[0m", 10) == "\x1b[32m" + "x" * 9 + "…\x1b[0m"
    assert _fit("short", 20) == "short"
    many = [f"line {i}" for i in range(29)]
    assert _fit_height(many, 12) == [*many[:11], "… 18 more line(s): a taller terminal shows them"]
    assert _fit_height(many, 40) == many
