"""Workers on other hosts: a real TLS listener on a non-loopback bind (0.0.0.0), with
certificates made here by trustme; workers' own tokens scoped to namespaces and job
types; and schedules declared in a worker's code, synced by a real daemon into a real
PostgreSQL.
"""

from __future__ import annotations

import json
import logging
import ssl
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trustme

from coordinator import client
from coordinator.db import aio
from coordinator.errors import ConfigError
from coordinator.protocol import Declare, DeclaredJob, Hello, encode, parse_from_daemon
from coordinator.tokens import hash_token, parse_tokens
from coordinator.worker import Context, Worker, tls_context

from .conftest import StartDaemon, define

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import asyncpg

    from .conftest import Harness

REPORTS_TOKEN = "reports-host-token-" + "r" * 20
BILLING_TOKEN = "billing-host-token-" + "b" * 20
WORKER_TOKENS = parse_tokens(
    {
        "reports-host": {
            "hash": hash_token(REPORTS_TOKEN),
            "namespaces": ["reports"],
            "types": ["reports.daily", "reports.sweep", "reports.rebuild"],
        },
        "billing-host": {"hash": hash_token(BILLING_TOKEN), "namespaces": ["billing"]},
    },
    "worker_tokens",
    kind="worker",
)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def server_tls(ca: trustme.CA) -> ssl.SSLContext:
    """What service.worker_tls_context builds from files: the daemon's side."""
    cert = ca.issue_cert("localhost", "127.0.0.1")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    return context


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


async def tls_daemon(
    start_daemon: StartDaemon, server_tls: ssl.SSLContext, **build: Any
) -> tuple[Harness, tuple[str, int]]:
    harness = await start_daemon(
        refresh_spacing=0.2,
        build={
            "worker_listen": "0.0.0.0:0",  # every interface: workers on other hosts
            "worker_tokens": WORKER_TOKENS,
            "worker_tls": server_tls,
            **build,
        },
    )
    bound = harness.daemon.executors["worker"].bound_tcp  # type: ignore[attr-defined]
    assert bound is not None
    assert bound[0] == "0.0.0.0"
    return harness, ("127.0.0.1", bound[1])


async def exchange(
    address: tuple[str, int], lines: list[bytes], *, tls: ssl.SSLContext | None
) -> list[Any]:
    """Send raw protocol lines; the daemon's answers until it closes (or 5 s pass)."""
    tcp = await trio.open_tcp_stream(*address)
    stream: trio.abc.Stream = tcp
    if tls is not None:
        stream = trio.SSLStream(tcp, tls, server_hostname="localhost", https_compatible=False)
    answers: list[Any] = []
    buffer = b""
    async with stream:
        for line in lines:
            await stream.send_all(line)
        with trio.move_on_after(5):
            while True:
                try:
                    data = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    break
                if not data:
                    break
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    answers.append(parse_from_daemon(line))
    return answers


async def run_worker(nursery: trio.Nursery, worker: Worker, address: tuple[str, int],
                     **kw: Any) -> None:  # fmt: skip
    await nursery.start(lambda task_status: worker.run(address, task_status=task_status, **kw))


# -- TLS, tokens, scope ------------------------------------------------------------------


async def test_a_tls_worker_connects_and_runs_its_namespaces_jobs(
    start_daemon: StartDaemon,
    server_tls: ssl.SSLContext,
    ca_file: Path,
    conn: asyncpg.Connection,
    nursery: trio.Nursery,
) -> None:
    harness, address = await tls_daemon(start_daemon, server_tls)
    worker = Worker(worker_id="reports-1")
    seen: list[str] = []

    @worker.job("reports.daily")
    async def daily(ctx: Context) -> int:
        seen.append(f"{ctx.namespace}/{ctx.job}")
        return 1

    target = {"kind": "worker", "type": "reports.daily"}
    await define(conn, "daily", namespace="reports", target=target)
    await define(conn, "daily", namespace="billing", target=target)
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    nightly = await define(
        conn, "nightly", namespace="billing", target=target, schedule_kind="once", schedule=later
    )
    await run_worker(
        nursery, worker, address, token=REPORTS_TOKEN, tls=tls_context(ca_file),
        server_hostname="localhost",
    )  # fmt: skip
    [connected] = harness.named("worker.connected", worker="reports-1")
    assert connected["transport"] == "tls"
    reports_run = await aio(client.trigger)(conn, "daily", namespace="reports")
    billing_run = await aio(client.trigger)(conn, "daily", namespace="billing")
    await harness.wait_event("job.run", run=reports_run, outcome="succeeded")
    # The worker's token reaches reports only: billing's call never goes to it. The run
    # was claimed (a manual job's namespace is not in the trigger's wake) and given back:
    # it waits, queued, as when no worker serves its type.
    [back] = await harness.wait_event("run.given_back", run=billing_run)
    assert back["became"] == "queued"
    assert back["reason"] == (
        "not sent: no worker serving 'reports.daily' may run jobs of namespace 'billing' "
        "(their tokens' scope)"
    )
    # A scheduled billing job falls due: admission knows its namespace and keeps it
    # waiting, unclaimed. Reports runs meanwhile, and nothing of billing's is claimed again.
    refreshed = len(harness.named("refresh"))
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET next_run_at = now() - interval '1 second' WHERE id = $1",
        nightly,
    )
    await harness.wait_event("refresh", count=refreshed + 1)
    assert harness.daemon.admission.is_waiting(nightly)
    again = await aio(client.trigger)(conn, "daily", namespace="reports")
    await harness.wait_event("job.run", run=again, outcome="succeeded")
    assert len(harness.named("run.given_back")) == 1
    assert harness.named("job.run", job="billing/daily") == []
    assert (await aio(client.get_run)(conn, billing_run)).status == "queued"
    assert (
        await aio(conn.fetchval)("SELECT count(*) FROM coordinator.runs WHERE job_id = $1", nightly)
        == 0
    )
    assert seen == ["reports/daily", "reports/daily"]
    # A worker whose token reaches billing connects: both of billing's runs go to it.
    billing = Worker(worker_id="billing-1")
    billing.job("reports.daily")(daily)
    await run_worker(
        nursery, billing, address, token=BILLING_TOKEN, tls=tls_context(ca_file),
        server_hostname="localhost",
    )  # fmt: skip
    await harness.wait_event("job.run", run=billing_run, outcome="succeeded")
    await harness.wait_event("job.run", job="billing/nightly", outcome="succeeded")
    assert sorted(seen[2:]) == ["billing/daily", "billing/nightly"]
    assert len(harness.named("run.given_back")) == 1
    worker.stop()
    billing.stop()


async def test_a_tls_connection_the_daemon_ends_is_lost_not_a_tls_failure(
    start_daemon: StartDaemon,
    server_tls: ssl.SSLContext,
    ca_file: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The daemon closes TLS connections without close_notify (a stop, a kill, a
    failover, and after a worker's own `bye`): the SDK logged ERROR "TLS with the
    daemon failed: ... EOF occurred in violation of protocol" for each."""
    harness, address = await tls_daemon(start_daemon, server_tls)
    caplog.set_level(logging.INFO, logger="coordinator.worker")
    for worker_id, end in (("leaves", "worker stops"), ("stays", "daemon stops")):
        worker = Worker(worker_id=worker_id)

        @worker.job("reports.daily")
        async def daily(ctx: Context) -> int:
            return 1

        async with trio.open_nursery() as nursery:
            await run_worker(
                nursery, worker, address, token=REPORTS_TOKEN, tls=tls_context(ca_file),
                server_hostname="localhost",
            )  # fmt: skip
            await harness.wait_event("worker.connected", worker=worker_id)
            caplog.clear()
            if end == "worker stops":
                worker.stop()
            else:
                assert await harness.stop() == 0
                with trio.fail_after(10):
                    while not [r for r in caplog.records if "daemon" in r.getMessage()]:
                        await trio.sleep(0.02)
                worker.stop()
        said = [(r.levelname, r.getMessage()) for r in caplog.records]
        assert [m for level, m in said if level == "ERROR"] == [], said
        if end == "worker stops":
            assert ("INFO", "connection to the daemon closed") in said, said
        else:
            assert ("WARNING", "connection to the daemon lost") in said, said


async def test_plain_tcp_a_wrong_token_and_a_foreign_type_are_refused(
    start_daemon: StartDaemon, server_tls: ssl.SSLContext, ca: trustme.CA
) -> None:
    harness, address = await tls_daemon(start_daemon, server_tls)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    hello = Hello(worker="w", types=("reports.daily",), capacity=1, token=REPORTS_TOKEN)
    # Plain TCP to the TLS listener: no protocol at all, the connection is dropped.
    assert await exchange(address, [encode(hello)], tls=None) == []
    await harness.wait_event("worker.rejected")
    assert "TLS handshake failed" in harness.named("worker.rejected")[0]["error"]
    # TLS, but a wrong token, or none.
    for token in ("wrong-token-" + "x" * 20, None):
        bad = Hello(worker="w", types=("reports.daily",), capacity=1, token=token)
        [answer] = await exchange(address, [encode(bad)], tls=client_tls)
        assert answer.message == "missing or wrong token"
    # A token scoped to job types refuses any other type.
    foreign = Hello(worker="w", types=("billing.invoice",), capacity=1, token=REPORTS_TOKEN)
    [answer] = await exchange(address, [encode(foreign)], tls=client_tls)
    assert answer.message.startswith("token reports-host may not serve job type 'billing.invoice'")
    assert harness.named("worker.connected") == []


async def test_a_worker_id_held_under_another_token_is_not_taken_over(
    start_daemon: StartDaemon,
    server_tls: ssl.SSLContext,
    ca: trustme.CA,
    ca_file: Path,
    conn: asyncpg.Connection,
    nursery: trio.Nursery,
) -> None:
    """A hello with a connected worker's id replaces that connection only under the same
    token (a worker coming back): ids are per token. Before, any token's worker could
    take the id over, failing another namespace's calls (ids are listed to admin tokens);
    then, refused instead, it could hold the id while its owner was away."""
    harness, address = await tls_daemon(start_daemon, server_tls)
    worker = Worker(worker_id="reports-1")
    seen: list[str] = []

    @worker.job("reports.daily")
    async def daily(ctx: Context) -> int:
        seen.append(ctx.namespace)
        return 1

    await define(
        conn, "daily", namespace="reports", target={"kind": "worker", "type": "reports.daily"}
    )
    await run_worker(
        nursery, worker, address, token=REPORTS_TOKEN, tls=tls_context(ca_file),
        server_hostname="localhost",
    )  # fmt: skip
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    other = Hello(worker="reports-1", types=("billing.work",), capacity=1, token=BILLING_TOKEN)
    answers = await exchange(address, [encode(other)], tls=client_tls)
    assert [type(a).__name__ for a in answers] == ["Welcome"]  # another worker, same id
    assert [e.get("replaced") for e in harness.named("worker.connected")] == [None, None]
    assert [e["reason"] for e in harness.named("worker.disconnected")] != ["replaced"]
    # The reports worker was never replaced: its calls still come to it.
    run_id = await aio(client.trigger)(conn, "daily", namespace="reports")
    await harness.wait_event("job.run", run=run_id, outcome="succeeded")
    assert seen == ["reports"]


async def test_an_sdk_worker_refused_without_a_word_says_where_to_look(
    start_daemon: StartDaemon,
    server_tls: ssl.SSLContext,
    nursery: trio.Nursery,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Plain TCP to the TLS listener: the daemon drops the connection (it cannot answer
    in a protocol the worker does not speak). The worker said only "reconnecting in
    0.5s"; it now says what may be wrong and where the daemon says why."""
    harness, address = await tls_daemon(start_daemon, server_tls)
    worker = Worker(worker_id="plain")

    @worker.job("reports.daily")
    async def daily(ctx: Context) -> None:
        return None

    nursery.start_soon(lambda: worker.run(address, token=REPORTS_TOKEN))
    await harness.wait_event("worker.rejected")
    with trio.fail_after(10):
        while "before welcoming this worker" not in caplog.text:
            await trio.sleep(0.01)
    assert "plain TCP to its TLS listener?" in caplog.text
    worker.stop()


async def test_mutual_tls_wants_a_client_certificate(
    start_daemon: StartDaemon, ca: trustme.CA, ca_file: Path, tmp_path: Path,
    nursery: trio.Nursery,
) -> None:  # fmt: skip
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server)
    ca.configure_trust(server)
    server.verify_mode = ssl.CERT_REQUIRED
    harness, address = await tls_daemon(start_daemon, server)
    hello = Hello(worker="anon", types=("reports.daily",), capacity=1, token=REPORTS_TOKEN)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    assert await exchange(address, [encode(hello)], tls=client_tls) == []
    # With a certificate the CA signed, the same worker is let in.
    mine = ca.issue_cert("reports-1.example")
    cert, key = tmp_path / "worker.pem", tmp_path / "worker.key"
    mine.cert_chain_pems[0].write_to_path(str(cert))
    mine.private_key_pem.write_to_path(str(key))
    worker = Worker(worker_id="with-cert")

    @worker.job("reports.daily")
    async def daily(ctx: Context) -> None:
        return None

    await run_worker(
        nursery, worker, address, token=REPORTS_TOKEN,
        tls=tls_context(ca_file, cert=cert, key=key), server_hostname="localhost",
    )  # fmt: skip
    assert harness.named("worker.connected", worker="with-cert")
    worker.stop()


async def test_plain_tcp_on_a_non_loopback_bind_is_refused_at_start(
    start_daemon: StartDaemon,
) -> None:
    with pytest.raises(ConfigError, match=r"worker_listen: 0\.0\.0\.0 is not a loopback .*TLS"):
        await start_daemon(
            wait_ready=False, build={"worker_listen": "0.0.0.0:0", "worker_tokens": WORKER_TOKENS}
        )
    with pytest.raises(ConfigError, match="a token of its own"):
        await start_daemon(
            wait_ready=False,
            build={"worker_listen": "0.0.0.0:0", "worker_tls": ssl.create_default_context()},
        )


# -- schedules declared in code ----------------------------------------------------------


def reports_worker(**declared: dict[str, Any]) -> Worker:
    """A worker of the reports namespace whose handlers carry ``declared`` schedules."""
    worker = Worker(worker_id="reports-code", namespace="reports")

    async def handler(ctx: Context) -> None:
        return None

    for job_type, schedule in declared.items():
        worker.job(job_type, **schedule)(handler)
    return worker


async def jobs_of(conn: asyncpg.Connection, namespace: str) -> dict[str, dict[str, Any]]:
    rows = await aio(conn.fetch)(
        "SELECT name, schedule_kind, schedule, timezone, paused, target::text AS target, "
        "params::text AS params, timeout, updated_at, schedule_version, next_run_at "
        "FROM coordinator.jobs WHERE namespace = $1",
        namespace,
    )
    return {r["name"]: {**dict(r), "target": json.loads(r["target"]),
                        "params": json.loads(r["params"])} for r in rows}  # fmt: skip


async def declare_once(
    nursery: trio.Nursery, worker: Worker, harness: Harness, address: Any = None, **kw: Any
) -> None:
    """Connect ``worker``, wait for the daemon's answer to its declaration, leave."""
    where = address or harness.daemon.executors["worker"].socket_path  # type: ignore[attr-defined]
    before = len(harness.named("worker.declared")) + len(harness.named("worker.declare_refused"))
    await run_worker(nursery, worker, where, **kw)
    with trio.fail_after(15):
        while worker.last_declared is None:
            await trio.sleep(0.01)
    after = len(harness.named("worker.declared")) + len(harness.named("worker.declare_refused"))
    assert after == before + 1 or not worker.last_declared.ok
    worker.stop()
    with trio.fail_after(15):
        while harness.daemon.executors["worker"].connections():
            await trio.sleep(0.01)


async def test_declared_schedules_appear_change_and_pause_as_the_code_changes(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    # A long refresh spacing: the declaration's changes must be read at once all the same
    # (the daemon's own writes raise no wake; it asks for the refresh itself).
    harness = await start_daemon(refresh_spacing=30)
    # A job defined by hand in the namespace: the code owns the namespace, so it pauses.
    await define(conn, "by-hand", namespace="reports")
    v1 = reports_worker(**{
        "reports.daily": {"cron": "0 6 * * *", "timezone": "Europe/Berlin", "timeout": "10m",
                          "params": {"sections": ["sales"], "api_key": "s3cr3t-param"}},
        "reports.sweep": {"every": "15m"},
        "reports.rebuild": {"manual": True},
    })  # fmt: skip
    await declare_once(nursery, v1, harness)
    assert v1.last_declared is not None
    assert v1.last_declared.ok
    assert (v1.last_declared.created, v1.last_declared.paused) == (3, 1)
    jobs = await jobs_of(conn, "reports")
    daily = jobs["reports.daily"]
    assert (daily["schedule_kind"], daily["schedule"], daily["timezone"]) == (
        "cron", "0 6 * * *", "Europe/Berlin"
    )  # fmt: skip
    assert daily["target"] == {"kind": "worker", "type": "reports.daily"}
    assert daily["params"] == {"sections": ["sales"], "api_key": "[redacted]"}
    assert daily["timeout"].total_seconds() == 600
    assert jobs["reports.sweep"]["schedule"] == "15m"
    assert jobs["reports.rebuild"]["schedule_kind"] == "manual"
    assert jobs["by-hand"]["paused"] is True
    assert not any(j["paused"] for name, j in jobs.items() if name != "by-hand")
    # The daemon read the new schedules at once and saved their first deadlines.
    with trio.fail_after(10):
        while any(
            j["next_run_at"] is None
            for n, j in (await jobs_of(conn, "reports")).items()
            if n in ("reports.daily", "reports.sweep")
        ):
            await trio.sleep(0.05)
    jobs = await jobs_of(conn, "reports")

    # Unchanged: a replica (or a reconnect) declaring the same thing writes nothing.
    same = reports_worker(**{
        "reports.daily": {"cron": "0 6 * * *", "timezone": "Europe/Berlin", "timeout": "10m",
                          "params": {"sections": ["sales"], "api_key": "s3cr3t-param"}},
        "reports.sweep": {"every": "15m"},
        "reports.rebuild": {"manual": True},
    })  # fmt: skip
    await declare_once(nursery, same, harness)
    assert same.last_declared is not None
    assert same.last_declared.unchanged
    assert {n: j["updated_at"] for n, j in (await jobs_of(conn, "reports")).items()} == {
        n: j["updated_at"] for n, j in jobs.items()
    }

    # The code changes: daily moves to 07:00, sweep is gone, rebuild stays.
    v2 = reports_worker(**{
        "reports.daily": {"cron": "0 7 * * *", "timezone": "Europe/Berlin", "timeout": "10m",
                          "params": {"sections": ["sales"]}},
        "reports.rebuild": {"manual": True},
    })  # fmt: skip
    await declare_once(nursery, v2, harness)
    assert v2.last_declared is not None
    assert (v2.last_declared.ok, v2.last_declared.updated, v2.last_declared.paused) == (True, 2, 1)
    jobs2 = await jobs_of(conn, "reports")
    assert jobs2["reports.daily"]["schedule"] == "0 7 * * *"
    assert jobs2["reports.daily"]["schedule_version"] == daily["schedule_version"] + 1
    assert jobs2["reports.sweep"]["paused"] is True
    # And back: a declaration that reappears is active again.
    await declare_once(nursery, reports_worker(**{
        "reports.daily": {"cron": "0 7 * * *", "timezone": "Europe/Berlin", "timeout": "10m",
                          "params": {"sections": ["sales"]}},
        "reports.sweep": {"every": "15m"},
        "reports.rebuild": {"manual": True},
    }), harness)  # fmt: skip
    assert (await jobs_of(conn, "reports"))["reports.sweep"]["paused"] is False
    assert len(harness.named("worker.declared")) == 4


async def test_two_programs_declaring_one_namespace_are_told_they_pause_each_other(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    nursery: trio.Nursery,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A declaration is the namespace's whole set: two connected worker programs that
    declare it with different jobs pause each other's at every reconnection. The
    semantics stand (a manifest's); the daemon now says it in a warning, naming both."""
    harness = await start_daemon()
    where = harness.daemon.executors["worker"].socket_path  # type: ignore[attr-defined]

    def program(worker_id: str, *job_types: str) -> Worker:
        worker = Worker(worker_id=worker_id, namespace="reports")

        async def handler(ctx: Context) -> None:
            return None

        for job_type in job_types:
            worker.job(job_type, every="15m")(handler)
        return worker

    async def declared(worker: Worker, *, leave: bool = True) -> None:
        await run_worker(nursery, worker, where)
        with trio.fail_after(15):
            while worker.last_declared is None:
                await trio.sleep(0.01)
        if leave:
            worker.stop()
            with trio.fail_after(15):
                while any(
                    w.id == worker.worker_id
                    for w in harness.daemon.executors["worker"].connections()
                ):
                    await trio.sleep(0.01)

    first = program("billing-reports", "reports.invoices")
    await declared(first, leave=False)
    assert harness.named("worker.declare_conflict") == []
    # The same program again (a replica): the same jobs, nothing paused, nothing said.
    await declared(program("billing-reports-2", "reports.invoices"))
    assert harness.named("worker.declare_conflict") == []
    # Another program, other jobs: it pauses the first's, and is told.
    second = program("sales-reports", "reports.sales")
    await declared(second)
    assert second.last_declared is not None
    assert second.last_declared.paused == 1
    # The worker is told too (its deployer may never read the daemon's log).
    assert second.last_declared.conflict is not None
    assert "workers billing-reports and sales-reports" in second.last_declared.conflict
    assert any(
        r.levelname == "WARNING" and "workers billing-reports and sales-reports" in r.message
        for r in caplog.records
    )
    said = harness.named("worker.declare_conflict")
    assert len(said) == 1, said
    assert (said[0]["worker"], said[0]["other"], said[0]["paused"]) == (
        "sales-reports",
        "billing-reports",
        1,
    )
    assert (await jobs_of(conn, "reports"))["reports.invoices"]["paused"] is True
    first.stop()


async def test_a_worker_with_its_namespace_but_no_schedule_declares_nothing(
    start_daemon: StartDaemon,
    conn: asyncpg.Connection,
    nursery: trio.Nursery,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``Worker(namespace=...)`` whose handlers carry no schedule sent an empty
    declaration, which paused every job of the namespace, a command defined by SQL
    included. It now declares nothing and says so."""
    harness = await start_daemon(refresh_spacing=0.2)
    await define(conn, "nightly", namespace="reports", schedule_kind="cron", schedule="0 3 * * *")
    worker = reports_worker(**{"reports.daily": {}})
    await run_worker(nursery, worker, harness.daemon.executors["worker"].socket_path)  # type: ignore[attr-defined]
    await trio.sleep(0.3)  # (a declaration, were one sent, would be answered by now)
    assert worker.last_declared is None
    assert harness.named("worker.declared") == []
    assert (await jobs_of(conn, "reports"))["nightly"]["paused"] is False
    assert "namespace reports given, but no handler carries a schedule" in caplog.text
    worker.stop()


async def test_a_declaration_with_a_problem_applies_nothing(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    harness = await start_daemon(refresh_spacing=0.2)
    await define(conn, "existing", namespace="reports")
    worker = reports_worker(**{
        "reports.daily": {"cron": "0 6 * * * *"},
        "reports.sweep": {"every": "5"},
    })  # fmt: skip
    await declare_once(nursery, worker, harness)
    answer = worker.last_declared
    assert answer is not None
    assert not answer.ok
    assert answer.problems[0].startswith("reports.daily: cron: ")
    assert answer.problems[1].startswith("reports.sweep: every: '5': a unit is required")
    jobs = await jobs_of(conn, "reports")
    assert list(jobs) == ["existing"]
    assert jobs["existing"]["paused"] is False
    assert harness.named("worker.declare_refused")


POLICY_COLUMNS = ("retries", "retry_backoff", "retry_max_delay", "misfire", "misfire_grace",
                  "recoverable", "alert", "keep_last", "retention")  # fmt: skip


async def policies_of(conn: asyncpg.Connection, name: str) -> dict[str, Any]:
    row = await aio(conn.fetchrow)(
        f"SELECT {', '.join(POLICY_COLUMNS)}, updated_at FROM coordinator.jobs "
        "WHERE namespace = 'reports' AND name = $1",
        name,
    )
    return dict(row)


async def test_a_declared_job_carries_its_policies_and_drops_what_the_code_drops(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    harness = await start_daemon(refresh_spacing=30)
    told = {"every": "15m", "retries": 3, "retry_backoff": "1m",
            "retry_max_delay": timedelta(minutes=10), "misfire": "skip", "misfire_grace": "5m",
            "recoverable": True, "alert": False, "keep_last": 20, "retention": "7d"}  # fmt: skip
    first = reports_worker(**{"reports.sweep": told})
    await declare_once(nursery, first, harness)
    assert first.last_declared is not None
    assert (first.last_declared.ok, first.last_declared.created) == (True, 1)
    saved = await policies_of(conn, "reports.sweep")
    assert {k: saved[k] for k in POLICY_COLUMNS} == {
        "retries": 3, "retry_backoff": timedelta(minutes=1),
        "retry_max_delay": timedelta(minutes=10), "misfire": "skip",
        "misfire_grace": timedelta(minutes=5), "recoverable": True, "alert": False,
        "keep_last": 20, "retention": timedelta(days=7),
    }  # fmt: skip
    # A replica declaring the same policies writes nothing.
    again = reports_worker(**{"reports.sweep": told})
    await declare_once(nursery, again, harness)
    assert again.last_declared is not None
    assert again.last_declared.unchanged
    assert (await policies_of(conn, "reports.sweep"))["updated_at"] == saved["updated_at"]
    # The code drops them: a declaration is the job's whole definition, so the defaults
    # apply again (as for a manifest entry without those keys).
    plain = reports_worker(**{"reports.sweep": {"every": "15m"}})
    await declare_once(nursery, plain, harness)
    assert plain.last_declared is not None
    assert (plain.last_declared.ok, plain.last_declared.updated) == (True, 1)
    dropped = await policies_of(conn, "reports.sweep")
    assert {k: dropped[k] for k in POLICY_COLUMNS} == {
        "retries": 0, "retry_backoff": timedelta(seconds=30),
        "retry_max_delay": timedelta(hours=1), "misfire": "run-once", "misfire_grace": None,
        "recoverable": False, "alert": True, "keep_last": None, "retention": None,
    }  # fmt: skip


async def test_a_declared_policy_the_database_would_refuse_applies_nothing(
    start_daemon: StartDaemon, conn: asyncpg.Connection, nursery: trio.Nursery
) -> None:
    harness = await start_daemon(refresh_spacing=0.2)
    worker = reports_worker(**{
        "reports.daily": {"cron": "0 6 * * *", "retries": 1000},
        "reports.sweep": {"every": "15m", "misfire": "skip"},
        "reports.rebuild": {"manual": True, "retention": "7"},
        "reports.prune": {"manual": True, "keep_last": 0},
    })  # fmt: skip
    await declare_once(nursery, worker, harness)
    answer = worker.last_declared
    assert answer is not None
    assert not answer.ok
    assert list(answer.problems) == [
        "reports.daily: retries: must be 0 to 100, not 1000",
        "reports.sweep: misfire_grace: required with misfire skip (how late a deadline may "
        "still run)",
        "reports.rebuild: retention: '7': a unit is required: 7s or 7m? (use ms, s, m, h, d, w)",
        "reports.prune: keep_last: must be a whole number from 1 to 1000000000",
    ]
    assert await jobs_of(conn, "reports") == {}
    assert harness.named("worker.declare_refused")


async def test_a_declaration_outside_the_tokens_namespaces_is_refused(
    start_daemon: StartDaemon,
    server_tls: ssl.SSLContext,
    ca: trustme.CA,
    conn: asyncpg.Connection,
) -> None:
    _harness, address = await tls_daemon(start_daemon, server_tls)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    hello = Hello(worker="sneaky", types=("reports.daily",), capacity=1, token=REPORTS_TOKEN)
    job = DeclaredJob(name="steal", job_type="reports.daily", schedule="every", expression="1m")
    answers = await exchange(
        address, [encode(hello), encode(Declare(namespace="billing", jobs=(job,)))],
        tls=client_tls,
    )  # fmt: skip
    assert [type(a).__name__ for a in answers] == ["Welcome", "Error"]
    assert answers[1].message.startswith('permission denied for namespace "billing"')
    # Nor may a worker declare a job for a type it does not serve (its target would
    # land on someone else).
    other = DeclaredJob(name="x", job_type="billing.invoice", schedule="manual")
    answers = await exchange(
        address, [encode(hello), encode(Declare(namespace="reports", jobs=(other,)))],
        tls=client_tls,
    )  # fmt: skip
    assert answers[1].message.startswith("declare: job 'x' targets job type 'billing.invoice'")
    assert await jobs_of(conn, "billing") == {}
    assert await jobs_of(conn, "reports") == {}
    # Within its scope, over TLS, it declares.
    answers = await exchange(
        address,
        [encode(hello), encode(Declare(namespace="reports", jobs=(job,)))],
        tls=client_tls,
    )
    assert [type(a).__name__ for a in answers][:2] == ["Welcome", "Declared"]
    assert answers[1].ok
    assert answers[1].created == 1
    assert list(await jobs_of(conn, "reports")) == ["steal"]


def test_the_sdk_checks_what_it_can_before_connecting() -> None:
    worker = Worker()
    with pytest.raises(ValueError, match="one of cron, every, at or manual"):
        worker.job("a", cron="* * * * *", every="1m")
    with pytest.raises(ValueError, match="timezone only applies to cron"):
        worker.job("a", every="1m", timezone="UTC")
    with pytest.raises(ValueError, match=r"a schedule .* is needed"):
        worker.job("a", timeout="1m")
    with pytest.raises(ValueError, match=r"a schedule .* is needed"):
        worker.job("a", alert=False)
    with pytest.raises(ValueError, match="retention: at most millisecond precision"):
        worker.job("a", every="1m", retention=timedelta(microseconds=5))
    with pytest.raises(TypeError, match="'a': alert must be True or False, not 'no'"):
        worker.job("a", every="1m", alert="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'a': recoverable must be True or False, not 1"):
        worker.job("a", alert=False, recoverable=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'a': retries must be an integer, not True"):
        worker.job("a", every="1m", retries=True)
    with pytest.raises(TypeError, match=r"'a': keep_last must be an integer, not 2\.5"):
        worker.job("a", every="1m", keep_last=2.5)  # type: ignore[arg-type]

    @worker.job("a", every="1m")
    async def handler(ctx: Context) -> None:
        return None

    run: Callable[..., Any] = worker.run
    with pytest.raises(ValueError, match=r"Worker\(namespace=\.\.\.\)"):
        trio.run(run, "/nonexistent.sock")


async def test_declarations_in_a_row_are_applied_in_order_the_last_one_whole(
    start_daemon: StartDaemon, conn: asyncpg.Connection
) -> None:
    """A raw worker that declares twice in a row (its configuration reloaded) ends with
    its second set: the two were synced at once, and the namespace ended with the union
    of both or the older set active (a tester's finding, 5 runs of 5)."""
    harness = await start_daemon()
    where = harness.daemon.executors["worker"].socket_path  # type: ignore[attr-defined]
    hello = Hello(worker="reloader", types=("x.a", "x.b"), capacity=1)
    first = tuple(
        DeclaredJob(name=f"a{i}", job_type="x.a", schedule="every", expression="1h")
        for i in range(200)
    )
    second = (DeclaredJob(name="b", job_type="x.b", schedule="manual"),)
    answers: list[Any] = []
    async with await trio.open_unix_socket(str(where)) as stream:
        await stream.send_all(
            encode(hello)
            + encode(Declare(namespace="reload", jobs=first))
            + encode(Declare(namespace="reload", jobs=second))
        )
        buffer = b""
        with trio.fail_after(30):
            while sum(type(a).__name__ == "Declared" for a in answers) < 2:
                data = await stream.receive_some(65536)
                assert data, answers
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    answers.append(parse_from_daemon(line))
    declared = [a for a in answers if type(a).__name__ == "Declared"]
    # Answered in the order they came.
    assert [(d.ok, d.created, d.paused) for d in declared] == [(True, 200, 0), (True, 1, 200)]
    jobs = await jobs_of(conn, "reload")
    assert sorted(n for n, j in jobs.items() if not j["paused"]) == ["b"]
    assert len(jobs) == 201
