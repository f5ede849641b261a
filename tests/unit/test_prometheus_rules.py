"""The shipped example alert rules (docs/prometheus-rules.yml), run by Prometheus's own
``promtool test rules`` on synthetic series: a stale job and a never-succeeding job fire,
a fresh one does not; no leader and unresolved runs fire. Skipped where promtool is not
installed (Debian: ``apt-get install prometheus``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

RULES = Path(__file__).resolve().parents[2] / "docs" / "prometheus-rules.yml"


def _stale(job: str) -> dict[str, object]:
    return {
        "exp_labels": {"severity": "warning", "namespace": "ops", "job": job},
        "exp_annotations": {
            "summary": f"ops/{job} has not succeeded for twice its interval",
            "description": f"Look at `coordinator runs list --namespace ops --job {job}`.",
        },
    }


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        # .ci/run installs it: under CI a missing promtool is a failure, not a skip.
        if os.environ.get("CI"):
            pytest.fail("promtool is not installed (apt-get install prometheus)")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return promtool


def _promtool_test(promtool: str, tmp_path: Path, spec: dict[str, object]) -> None:
    path = tmp_path / "rules.test.yml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    result = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_example_rules_fire_when_they_should(tmp_path: Path) -> None:
    promtool = _promtool()
    check = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    series = {
        'coordinator_job_last_success_timestamp_seconds{namespace="ops",job="stale"}': "0x300",
        'coordinator_job_interval_seconds{namespace="ops",job="stale"}': "3600x300",
        'coordinator_job_last_success_timestamp_seconds{namespace="ops",job="fresh"}': "0+60x300",
        'coordinator_job_interval_seconds{namespace="ops",job="fresh"}': "3600x300",
        'coordinator_job_last_failure_timestamp_seconds{namespace="ops",job="never"}': "0+60x300",
        'coordinator_leading{instance="a"}': "1x60 0x240",
        'coordinator_unresolved_jobs{instance="a"}': "0x100 2x200",
    }
    spec = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "alert_rule_test": [
                    {
                        "eval_time": "3h",
                        "alertname": "CoordinatorJobNoRecentSuccess",
                        "exp_alerts": [_stale("stale"), _stale("never")],
                    },
                    {"eval_time": "30m", "alertname": "CoordinatorNoLeader", "exp_alerts": []},
                    {
                        "eval_time": "3h",
                        "alertname": "CoordinatorNoLeader",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "critical"},
                                "exp_annotations": {
                                    "summary": "no coordinator daemon leads: nothing is scheduled"
                                },
                            }
                        ],
                    },
                    {
                        "eval_time": "3h",
                        "alertname": "CoordinatorUnresolvedRuns",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning"},
                                "exp_annotations": {
                                    "summary": "2 job(s) blocked by an unresolved run",
                                    "description": "`coordinator runs list --status "
                                    "unresolved`, then `coordinator runs resolve ID --as "
                                    "failed|succeeded|retry`.",
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    _promtool_test(promtool, tmp_path, spec)


def test_a_failover_fires_nothing_for_healthy_jobs_and_still_catches_a_stale_one(
    tmp_path: Path,
) -> None:
    """The README says to scrape the leader and its standby. Per-job series come from
    whichever daemon leads, so after a failover the old leader's last values stay frozen
    under its own ``instance`` within the lookback; the rule must not compare them with
    each other per instance (that paged for every job for a day after each failover)."""
    promtool = _promtool()
    a, b = 'instance="a:8787",', 'instance="b:8787",'
    # A leads for 30 minutes, then B does (a rolling restart); A then stands by, which
    # exports no per-job series. `tick` keeps succeeding every minute on whichever leads;
    # `stuck` succeeded on A at minute 10 and never since (on B it only fails).
    series = {
        f'coordinator_job_last_success_timestamp_seconds{{{a}namespace="ops",job="tick"}}': (
            "0+60x30 _x150"
        ),
        f'coordinator_job_interval_seconds{{{a}namespace="ops",job="tick"}}': "300x30 _x150",
        f'coordinator_job_last_success_timestamp_seconds{{{b}namespace="ops",job="tick"}}': (
            "_x31 1860+60x149"
        ),
        f'coordinator_job_interval_seconds{{{b}namespace="ops",job="tick"}}': "_x31 300x149",
        f'coordinator_job_last_success_timestamp_seconds{{{a}namespace="ops",job="stuck"}}': (
            "_x10 600x20 _x150"
        ),
        f'coordinator_job_interval_seconds{{{a}namespace="ops",job="stuck"}}': "600x30 _x150",
        f'coordinator_job_last_failure_timestamp_seconds{{{b}namespace="ops",job="stuck"}}': (
            "_x31 1860+60x149"
        ),
        f'coordinator_job_interval_seconds{{{b}namespace="ops",job="stuck"}}': "_x31 600x149",
        f"coordinator_leading{{{a[:-1]}}}": "1x30 0x150",
        f"coordinator_leading{{{b[:-1]}}}": "0x30 1x150",
    }
    spec = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "alert_rule_test": [
                    {"eval_time": "25m", "alertname": "CoordinatorJobNoRecentSuccess",
                     "exp_alerts": []},
                    # `stuck` is overdue from minute 30 (twice 600 s after 600 s), firing
                    # 10 minutes later; `tick` is fine on B and fires on no instance.
                    {"eval_time": "1h", "alertname": "CoordinatorJobNoRecentSuccess",
                     "exp_alerts": [_stale("stuck")]},
                    {"eval_time": "3h", "alertname": "CoordinatorJobNoRecentSuccess",
                     "exp_alerts": [_stale("stuck")]},
                    {"eval_time": "1h", "alertname": "CoordinatorNoLeader", "exp_alerts": []},
                ],
            }
        ],
    }  # fmt: skip
    _promtool_test(promtool, tmp_path, spec)
