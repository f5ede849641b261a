"""Alerts as an operator configures them: `coordinator run` as a process, the alert
settings in its TOML file, a real SMTP server and a real HTTP receiver; the run URL points
at the admin server the daemon actually bound."""

from __future__ import annotations

import json
import signal
from typing import TYPE_CHECKING, Any

from coordinator.alerts import SIGNATURE_HEADER, signature
from tests.integration.alerting import HttpReceiver, SmtpServer

from .test_daemon_process import cli, daemons

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["daemons"]  # the fixture, shared with test_daemon_process


def test_configured_alerts_reach_both_sinks_with_the_run_page(
    daemons: Any, database: str, tmp_path: Path
) -> None:
    smtp, hook = SmtpServer(), HttpReceiver()
    smtp.start()
    hook.start()
    try:
        config = tmp_path / "coordinator.toml"
        (tmp_path / "secret").write_text("hook-secret\n")
        config.write_text(
            'admin_listen = "127.0.0.1:0"\n'
            'admin_token = "an-admin-token-of-16+"\n'
            'alert_smtp_host = "127.0.0.1"\n'
            f"alert_smtp_port = {smtp.port}\n"
            'alert_email_from = "coordinator@test.invalid"\n'
            'alert_email_to = ["ops@test.invalid"]\n'
            f'alert_webhook = "{hook.url}"\n'
            f'alert_webhook_secret_file = "{tmp_path / "secret"}"\n'
            'alert_window = "1h"\n'
        )
        made = cli(database, "jobs", "define", "broken", "--manual", "--", "sh", "-c", "exit 4")
        assert made.returncode == 0, made.stderr
        d = daemons("d1", "--config", str(config))
        d.wait_event("ready")
        base = d.wait_event("admin.listening")["address"]  # the URL actually bound
        assert base.startswith("http://127.0.0.1:")
        run = cli(database, "jobs", "trigger", "broken")
        run_id = int(run.stdout.strip())
        d.wait_event("alert.sent", sink="email", run=run_id)
        d.wait_event("alert.sent", sink="webhook", run=run_id)
        (mail,) = smtp.messages
        assert f"run page:  {base}/runs/{run_id}" in mail.get_content()
        (request,) = hook.requests
        assert request.headers[SIGNATURE_HEADER] == signature("hook-secret", request.body)
        assert json.loads(request.body)["run"]["url"] == f"{base}/runs/{run_id}"
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(30) == 0
    finally:
        smtp.stop()
        hook.stop()


def test_alert_settings_that_cannot_work_stop_the_daemon_with_exit_2(
    daemons: Any, tmp_path: Path
) -> None:
    config = tmp_path / "coordinator.toml"
    config.write_text('alert_smtp_host = "smtp.example.net"\n')
    d = daemons("d1", "--config", str(config))
    assert d.proc.wait(60) == 2
    assert "alert_email_to" in d.log_path.read_text()


def test_an_alert_a_crash_cut_short_is_sent_by_the_next_start(
    daemons: Any, database: str, tmp_path: Path
) -> None:
    """The outbox was written only by a clean stop: a `kill -9` while a sink was failing
    lost the alert, and the window opened for it silenced the job's next one for hours.
    It is now written as each delivery starts and ends."""
    hook = HttpReceiver(status=500)
    hook.start()
    try:
        config = tmp_path / "coordinator.toml"
        config.write_text(f'alert_webhook = "{hook.url}"\nalert_window = "1h"\n')
        made = cli(database, "jobs", "define", "k9", "--manual", "--", "sh", "-c", "exit 4")
        assert made.returncode == 0, made.stderr
        d = daemons("d1", "--config", str(config))
        d.wait_event("ready")
        run_id = int(cli(database, "jobs", "trigger", "k9").stdout.strip())
        d.wait_event("alert.failed", sink="webhook", run=run_id)
        d.kill()
        assert hook.accepted == []
        hook.status = 200
        again = daemons("d1", "--config", str(config))  # the same state directory
        assert again.wait_event("alert.outbox")["resumed"] == 1
        again.wait_event("alert.sent", sink="webhook", run=run_id)
        (request,) = hook.accepted
        assert json.loads(request.body)["run"]["id"] == run_id
        again.proc.send_signal(signal.SIGTERM)
        assert again.proc.wait(30) == 0
        assert not (tmp_path / "state-d1" / "alerts-outbox.jsonl").exists()
    finally:
        hook.stop()
