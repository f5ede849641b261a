"""Namespaces confined by PostgreSQL (migrations/0014_namespaces.sql): real login roles,
real row-level security, plain SQL and the SQL API, and a real daemon under its own role.

alice operates ``billing`` and may only read ``reports``; bob operates ``reports``; the
daemon's login role is a member of ``coordinator_daemon``. Roles are cluster-wide, so
their names carry the test database's name.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
import attrs
import pytest
import trio

from coordinator import client
from coordinator.db import aio
from coordinator.errors import InvalidInput, JobNotFound, PermissionDenied, RunNotFound
from coordinator.store import LOCK_CLASS, LOCK_OBJECT
from tests.integration.conftest import StartDaemon, define

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

DENIED_BILLING = 'permission denied for namespace "billing"'
INSERT_RUN = (
    "INSERT INTO coordinator.runs (job_id, trigger, status) VALUES ($1, 'manual', 'queued')"
)
DENIED_REPORTS = 'permission denied for namespace "reports"'


@attrs.frozen
class Roles:
    alice: str
    bob: str
    daemon: str
    nobody: str

    def dsn(self, database: str, role: str) -> str:
        return database.replace("postgresql://postgres@", f"postgresql://{role}@", 1)


async def _execute(dsn: str, *sql: str) -> None:
    conn = await aio(asyncpg.connect)(dsn)
    try:
        for statement in sql:
            await aio(conn.execute)(statement)
    finally:
        await aio(conn.close)()


@pytest.fixture
async def roles(
    conn: asyncpg.Connection, database: str, database_name: str
) -> AsyncIterator[Roles]:
    names = Roles(*(f"{who}_{database_name}" for who in ("alice", "bob", "daemon", "nobody")))
    for name in attrs.astuple(names):
        await aio(conn.execute)(f'CREATE ROLE "{name}" LOGIN')
    await aio(conn.execute)(f'GRANT coordinator_daemon TO "{names.daemon}"')
    assert await client_grant(conn, names.alice, "billing") == "granted"
    assert await client_grant(conn, names.alice, "reports", read_only=True) == "granted"
    assert await client_grant(conn, names.bob, "reports") == "granted"
    # nobody: a login role with table privileges (through coordinator_app) but no grant.
    await aio(conn.execute)(f'GRANT coordinator_app TO "{names.nobody}"')
    try:
        yield names
    finally:
        with trio.CancelScope(shield=True):
            for name in attrs.astuple(names):
                await aio(conn.execute)(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
                    name,
                )
                await aio(conn.execute)(f'DROP ROLE IF EXISTS "{name}"')


async def client_grant(conn: asyncpg.Connection, role: str, ns: str, **kw: Any) -> str:
    return await aio(client.grant)(conn, role, ns, **kw)


@pytest.fixture
async def jobs(conn: asyncpg.Connection, roles: Roles) -> dict[str, int]:
    """Two jobs per namespace, each with one finished run, plus a queued run in each.
    (After ``roles``: pytest-trio sets fixtures up concurrently, and they share ``conn``.)"""
    ids: dict[str, int] = {}
    for ns in ("billing", "reports", "ops"):
        for name in ("a", "b"):
            ids[f"{ns}/{name}"] = await define(conn, name, namespace=ns)
            await aio(conn.execute)(
                "INSERT INTO coordinator.runs (job_id, trigger, status, finished_at) "
                "VALUES ($1, 'manual', 'failed', now())",
                ids[f"{ns}/{name}"],
            )
        await aio(conn.fetchval)("SELECT coordinator.trigger($1, 'a')", ns)
    return ids


@pytest.fixture
async def as_role(
    aio_loop: Any, database: str, roles: Roles
) -> AsyncIterator[dict[str, asyncpg.Connection]]:
    conns = {}
    for who in ("alice", "bob", "daemon", "nobody"):
        conns[who] = await aio(asyncpg.connect)(
            roles.dsn(database, getattr(roles, who)),
            server_settings={"application_name": f"tests-{who}"},
        )
    try:
        yield conns
    finally:
        with trio.CancelScope(shield=True):
            for c in conns.values():
                await aio(c.close)()


async def namespaces_of(conn: asyncpg.Connection, sql: str) -> list[str]:
    rows = await aio(conn.fetch)(sql)
    return sorted({r["namespace"] for r in rows})


RUNS_WITH_NS = (
    "SELECT j.namespace FROM coordinator.runs r JOIN coordinator.jobs j ON j.id = r.job_id"
)


async def test_plain_select_sees_only_the_granted_namespaces(
    as_role: dict[str, asyncpg.Connection], jobs: dict[str, int]
) -> None:
    alice, bob = as_role["alice"], as_role["bob"]
    assert await namespaces_of(alice, "SELECT namespace FROM coordinator.jobs") == [
        "billing",
        "reports",
    ]
    assert await namespaces_of(bob, "SELECT namespace FROM coordinator.jobs") == ["reports"]
    assert await namespaces_of(alice, RUNS_WITH_NS) == ["billing", "reports"]
    assert await namespaces_of(bob, RUNS_WITH_NS) == ["reports"]
    # Runs alone (no join): bob sees 3 runs of reports (2 finished, 1 queued), not the 9.
    assert await aio(bob.fetchval)("SELECT count(*) FROM coordinator.runs") == 3
    # A role of coordinator_app without any grant sees nothing at all.
    nobody = as_role["nobody"]
    assert await aio(nobody.fetchval)("SELECT count(*) FROM coordinator.jobs") == 0
    assert await aio(nobody.fetchval)("SELECT count(*) FROM coordinator.runs") == 0
    # Each sees its own grants only.
    grants = await aio(client.list_grants)(bob)
    assert [(g.namespace, g.access, g.confined) for g in grants] == [("reports", "operate", True)]


async def test_plain_update_and_delete_touch_only_their_own(
    as_role: dict[str, asyncpg.Connection], conn: asyncpg.Connection, jobs: dict[str, int]
) -> None:
    bob = as_role["bob"]
    assert await aio(bob.execute)("UPDATE coordinator.jobs SET paused = true") == "UPDATE 2"
    assert (
        await aio(bob.execute)(
            "UPDATE coordinator.runs SET error_message = 'bob was here' WHERE status = 'failed'"
        )
        == "UPDATE 2"
    )
    paused = await aio(conn.fetch)("SELECT namespace FROM coordinator.jobs WHERE paused")
    assert sorted({r["namespace"] for r in paused}) == ["reports"]
    touched = await aio(conn.fetch)(RUNS_WITH_NS + " WHERE r.error_message = 'bob was here'")
    assert sorted({r["namespace"] for r in touched}) == ["reports"]
    assert await aio(bob.execute)("DELETE FROM coordinator.runs WHERE status = 'failed'") == (
        "DELETE 2"
    )
    assert await aio(bob.execute)("DELETE FROM coordinator.jobs") == "DELETE 2"
    left = await aio(conn.fetch)("SELECT namespace, count(*) AS n FROM coordinator.jobs GROUP BY 1")
    assert {r["namespace"]: r["n"] for r in left} == {"billing": 2, "ops": 2}
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.runs") == 6


async def test_read_only_grants_refuse_writes(
    as_role: dict[str, asyncpg.Connection], conn: asyncpg.Connection, jobs: dict[str, int]
) -> None:
    alice = as_role["alice"]
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=DENIED_REPORTS) as info:
        await aio(alice.execute)("UPDATE coordinator.jobs SET paused = true WHERE name = 'a'")
    assert "may only read" in (info.value.detail or "")
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=DENIED_REPORTS):
        await aio(alice.execute)("UPDATE coordinator.runs SET error_message = 'x'")
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=DENIED_REPORTS):
        await aio(alice.execute)(
            INSERT_RUN,
            jobs["reports/b"],
        )
    # A DELETE has no second check: the read-only rows are not its to see, so it deletes
    # nothing there (billing's, alice's own, go).
    assert await aio(alice.execute)("DELETE FROM coordinator.runs WHERE status = 'failed'") == (
        "DELETE 2"
    )
    assert (
        await aio(conn.fetchval)(
            RUNS_WITH_NS + " WHERE j.namespace = 'reports' AND r.status = 'failed'"
        )
        == "reports"
    )
    # A forged daemon origin changes nothing (migrations/0031): the guard is part of the
    # enforcement, since the UPDATE policies admit readable rows and check only the new
    # row. With the guard skipped, alice moved reports' jobs and runs into billing, which
    # she operates, and could then delete them.
    reports_runs = (
        "SELECT count(*) FROM coordinator.runs r JOIN coordinator.jobs j ON j.id = r.job_id "
        "WHERE j.namespace = 'reports'"
    )
    before = await aio(conn.fetchval)(reports_runs)
    await aio(alice.execute)("SET coordinator.origin = 'daemon'")
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=DENIED_REPORTS):
        await aio(alice.execute)("UPDATE coordinator.jobs SET paused = true WHERE name = 'a'")
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=DENIED_REPORTS):
        await aio(alice.execute)(
            "UPDATE coordinator.jobs SET namespace = 'billing', name = 'stolen' "
            "WHERE namespace = 'reports'"
        )
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=DENIED_REPORTS):
        await aio(alice.execute)(
            "UPDATE coordinator.runs SET job_id = $1 WHERE job_id = ANY ($2::bigint[])",
            jobs["billing/a"],
            [jobs["reports/a"], jobs["reports/b"]],
        )
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match='namespace "ops"'):
        await aio(alice.execute)(
            "INSERT INTO coordinator.jobs (namespace, name, schedule_kind, target) "
            "VALUES ('ops', 'x', 'manual', '{}')"
        )
    assert await aio(conn.fetchval)(reports_runs) == before > 0
    assert (
        await aio(conn.fetchval)(
            "SELECT count(*) FROM coordinator.jobs WHERE namespace = 'reports'"
        )
        == 2
    )
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.jobs WHERE paused") == 0


async def test_plain_insert_into_another_namespace_is_refused(
    as_role: dict[str, asyncpg.Connection], conn: asyncpg.Connection, jobs: dict[str, int]
) -> None:
    bob = as_role["bob"]
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=DENIED_BILLING) as info:
        await aio(bob.execute)(
            "INSERT INTO coordinator.jobs (namespace, name, schedule_kind, target) "
            "VALUES ('billing', 'x', 'manual', '{}')"
        )
    assert "no grant" in (info.value.detail or "")
    # Moving a job of its own into another namespace is refused too.
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=DENIED_BILLING):
        await aio(bob.execute)("UPDATE coordinator.jobs SET namespace = 'billing'")
    # And the job ids of other namespaces lead nowhere.
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
        await aio(bob.execute)(
            INSERT_RUN,
            jobs["billing/b"],
        )


async def test_every_sql_api_function_keeps_to_the_grants(
    as_role: dict[str, asyncpg.Connection], conn: asyncpg.Connection, jobs: dict[str, int]
) -> None:
    alice, bob = as_role["alice"], as_role["bob"]
    target = json.dumps({"kind": "exec", "argv": ["true"]})
    entries = json.dumps(
        [{"name": "c", "schedule_kind": "manual", "target": {"kind": "exec", "argv": ["true"]}}]
    )
    calls = {
        "define_job": (
            "SELECT coordinator.define_job('c', 'manual', $1::jsonb, namespace => $2)",
            target,
        ),
        "sync": ("SELECT * FROM coordinator.sync($2, $1::jsonb)", entries),
        "trigger": ("SELECT coordinator.trigger($1, 'b')",),
        "pause": ("SELECT coordinator.pause($1, 'a')",),
        "resume": ("SELECT coordinator.resume($1, 'a')",),
        "remove": ("SELECT coordinator.remove($1, 'b')",),
    }
    for fn, (sql, *extra) in calls.items():
        params = [*extra, "billing"] if "$2" in sql else ["billing"]
        # bob has no grant on billing; alice may only read reports.
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match=DENIED_BILLING) as info:
            await aio(bob.execute)(sql, *params)
        # A short refusal: define_job's CONTEXT quoted its whole internal INSERT (0028).
        assert "INSERT INTO" not in (info.value.context or ""), fn
        params = [*extra, "reports"] if "$2" in sql else ["reports"]
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match=DENIED_REPORTS):
            await aio(alice.execute)(sql, *params)
        # ... and each works where the grant allows.
        params = [*extra, "reports"] if "$2" in sql else ["reports"]
        await aio(bob.execute)(sql, *params)
        assert fn  # (for the failure message)
    # An empty list would pause nothing bob can see: still refused, not answered 0, 0, 0.
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=DENIED_BILLING):
        await aio(bob.execute)("SELECT * FROM coordinator.sync('billing', '[]')")
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=DENIED_REPORTS):
        await aio(alice.execute)("SELECT * FROM coordinator.sync('reports', '[]')")
    # A namespace no job could have is that, for anyone: not a grant to ask for.
    with pytest.raises(asyncpg.InvalidParameterValueError, match=r"^namespace: use letters"):
        await aio(bob.execute)("SELECT * FROM coordinator.sync('my app', '[]')")

    # cancel and resolve: a run of another namespace is unknown; a read-only one refused.
    billing_queued = await aio(conn.fetchval)(
        "SELECT id FROM coordinator.runs WHERE job_id = $1 AND status = 'queued'",
        jobs["billing/a"],
    )
    with pytest.raises(asyncpg.NoDataFoundError, match=f"unknown run {billing_queued}"):
        await aio(bob.execute)("SELECT coordinator.cancel($1)", billing_queued)
    reports_queued = await aio(conn.fetchval)(
        "SELECT id FROM coordinator.runs WHERE job_id = $1 AND status = 'queued'",
        jobs["reports/a"],
    )
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=DENIED_REPORTS):
        await aio(alice.execute)("SELECT coordinator.cancel($1)", reports_queued)
    await aio(conn.execute)(
        "UPDATE coordinator.runs SET status = 'unresolved' WHERE id = $1", billing_queued
    )
    with pytest.raises(asyncpg.NoDataFoundError):
        await aio(bob.execute)("SELECT coordinator.resolve($1, 'failed')", billing_queued)
    await aio(alice.execute)("SELECT coordinator.resolve($1, 'failed')", billing_queued)

    # Nothing bob or alice was refused changed billing.
    billing = await aio(conn.fetch)(
        "SELECT name, paused FROM coordinator.jobs WHERE namespace = 'billing' ORDER BY name"
    )
    assert [(r["name"], r["paused"]) for r in billing] == [("a", False), ("b", False)]

    # The daemon's own functions are not the applications'.
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied for function"):
        await aio(bob.fetch)("SELECT * FROM coordinator._claim_many('[]', 'x', '{}', NULL, 0, 0)")


async def test_a_namespace_no_grant_can_name_is_said_to_be_invalid(
    as_role: dict[str, asyncpg.Connection], conn: asyncpg.Connection, jobs: dict[str, int]
) -> None:
    """(0036) A confined role naming a namespace no job can have was told `permission
    denied`, with DETAIL suggesting `coordinator grant ROLE Bad NS!`, which grant
    refuses. It is told what is wrong with the name, as define_job and sync say it."""
    bob = as_role["bob"]
    for sql in (
        "SELECT coordinator.trigger('Bad NS!', 'x')",
        "SELECT coordinator.pause('Bad NS!', 'x')",
        "SELECT coordinator.remove('Bad NS!', 'x')",
    ):
        with pytest.raises(asyncpg.InvalidParameterValueError) as info:
            await aio(bob.execute)(sql)
        assert info.value.message.startswith("namespace: use letters, digits"), sql
        assert info.value.column_name == "namespace", sql
        assert "grant" not in (info.value.detail or ""), sql
    with pytest.raises(InvalidInput, match=r"^namespace: use letters"):
        await aio(client.trigger)(bob, "x", namespace="Bad NS!")
    # A valid name without a grant is still a refusal with the grant to ask for.
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=DENIED_BILLING) as denied:
        await aio(bob.execute)("SELECT coordinator.trigger('billing', 'a')")
    assert "coordinator grant" in (denied.value.detail or "")


async def test_a_read_only_role_is_refused_before_the_runs_state_is_asked(
    as_role: dict[str, asyncpg.Connection], conn: asyncpg.Connection, jobs: dict[str, int]
) -> None:
    """(0036) alice may only read reports: cancel of a finished run there answered with
    the run's state (`run N is failed, only queued or paused runs can be cancelled`), as
    resolve of a run not unresolved and pause_run of a paused one (answered 'paused').
    Each is refused on permission first, as a write to a queued run was."""
    alice = as_role["alice"]
    failed = await aio(conn.fetchval)(
        "SELECT id FROM coordinator.runs WHERE job_id = $1 AND status = 'failed'",
        jobs["reports/a"],
    )
    rec = await define(
        conn, "scan", namespace="reports", target={"kind": "worker", "type": "t"},
        recoverable=True,
    )  # fmt: skip
    paused = await aio(conn.fetchval)(
        "INSERT INTO coordinator.runs (job_id, trigger, status, started_at, paused_at) "
        "VALUES ($1, 'manual', 'paused', now(), now()) RETURNING id",
        rec,
    )
    before = await aio(conn.fetch)("SELECT id, status FROM coordinator.runs ORDER BY id")
    for sql, run_id in (
        ("SELECT coordinator.cancel($1)", failed),
        ("SELECT coordinator.resolve($1, 'failed')", failed),
        ("SELECT coordinator.pause_run($1)", paused),
        ("SELECT coordinator.cancel($1)", paused),
    ):
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match=DENIED_REPORTS) as info:
            await aio(alice.execute)(sql, run_id)
        assert "may only read" in (info.value.detail or ""), sql
    with pytest.raises(PermissionDenied):
        await aio(client.cancel_run)(alice, failed)
    assert await aio(conn.fetch)("SELECT id, status FROM coordinator.runs ORDER BY id") == before
    # Where alice may write, the run's state still decides.
    billing_failed = await aio(conn.fetchval)(
        "SELECT id FROM coordinator.runs WHERE job_id = $1 AND status = 'failed'",
        jobs["billing/a"],
    )
    with pytest.raises(asyncpg.ObjectNotInPrerequisiteStateError, match="only queued or paused"):
        await aio(alice.execute)("SELECT coordinator.cancel($1)", billing_failed)
    # And a run alice cannot read is unknown, not refused.
    ops_failed = await aio(conn.fetchval)(
        "SELECT id FROM coordinator.runs WHERE job_id = $1 AND status = 'failed'",
        jobs["ops/a"],
    )
    with pytest.raises(asyncpg.NoDataFoundError, match=f"unknown run {ops_failed}"):
        await aio(alice.execute)("SELECT coordinator.cancel($1)", ops_failed)


async def test_the_python_client_says_permission_denied(
    as_role: dict[str, asyncpg.Connection], jobs: dict[str, int]
) -> None:
    bob, alice = as_role["bob"], as_role["alice"]
    with pytest.raises(PermissionDenied, match=DENIED_BILLING) as info:
        await aio(client.trigger)(bob, "a", namespace="billing")
    assert info.value.namespace == "billing"
    with pytest.raises(PermissionDenied, match=DENIED_REPORTS):
        await aio(client.pause)(alice, "a", namespace="reports")
    # Reads are confined silently: another namespace's job is simply not there.
    with pytest.raises(JobNotFound):
        await aio(client.get_job)(bob, "a", namespace="billing")
    assert {j.namespace for j in await aio(client.list_jobs)(bob)} == {"reports"}
    assert {r.namespace for r in await aio(client.list_runs)(alice, limit=100)} == {
        "billing",
        "reports",
    }
    billing_run = next(r for r in await aio(client.list_runs)(alice, namespace="billing"))
    with pytest.raises(RunNotFound):
        await aio(client.get_run)(bob, billing_run.id)
    # Granting is the admin's.
    with pytest.raises(PermissionDenied, match="grant_namespace"):
        await aio(client.grant)(bob, "bob", "billing")


async def test_the_daemon_role_sees_everything(
    as_role: dict[str, asyncpg.Connection], jobs: dict[str, int]
) -> None:
    daemon = as_role["daemon"]
    assert await namespaces_of(daemon, "SELECT namespace FROM coordinator.jobs") == [
        "billing",
        "ops",
        "reports",
    ]
    assert await aio(daemon.fetchval)("SELECT count(*) FROM coordinator.runs") == 9
    swept = await aio(daemon.fetchval)(
        "SELECT count(*) FROM coordinator._sweep_lost('tests', $1, $2)", LOCK_CLASS, LOCK_OBJECT
    )
    assert swept == 0


async def test_a_daemon_under_its_own_role_runs_every_namespace(
    as_role: dict[str, asyncpg.Connection],
    roles: Roles,
    database: str,
    conn: asyncpg.Connection,
    start_daemon: StartDaemon,
) -> None:
    for ns in ("billing", "reports", "ops"):
        await define(conn, "echo", namespace=ns, target={"kind": "exec", "argv": ["echo", ns]})
    harness = await start_daemon(dsn=roles.dsn(database, roles.daemon))
    run_ids = [
        await aio(client.trigger)(as_role["alice"], "echo", namespace="billing"),
        await aio(client.trigger)(as_role["bob"], "echo", namespace="reports"),
        await aio(client.trigger)(conn, "echo", namespace="ops"),
    ]
    await harness.wait_event("job.run", count=3, outcome="succeeded")
    statuses = await aio(conn.fetch)(
        "SELECT status, instance FROM coordinator.runs WHERE id = ANY($1::bigint[])", run_ids
    )
    assert [r["status"] for r in statuses] == ["succeeded"] * 3
    assert (
        await aio(conn.fetchval)(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND application_name = "
            "'coordinator'",
            roles.daemon,
        )
        >= 1
    )
    await harness.stop()


async def test_grants_listed_changed_and_revoked(
    conn: asyncpg.Connection, roles: Roles, as_role: dict[str, asyncpg.Connection]
) -> None:
    grants = await aio(client.list_grants)(conn)
    assert [(g.role, g.namespace, g.access) for g in grants if g.role == roles.alice] == [
        (roles.alice, "billing", "operate"),
        (roles.alice, "reports", "read"),
    ]
    assert all(g.confined for g in grants if g.role in (roles.alice, roles.bob))
    assert await client_grant(conn, roles.alice, "reports") == "changed"
    assert await client_grant(conn, roles.alice, "reports") == "unchanged"
    assert await aio(client.revoke)(conn, roles.alice, "reports") is True
    assert await aio(client.revoke)(conn, roles.alice, "reports") is False
    # The role's next statement sees the change (no reconnect: the policies read the
    # grants at each statement).
    await define(conn, "x", namespace="reports")
    assert (
        await aio(as_role["alice"].fetchval)(
            "SELECT count(*) FROM coordinator.jobs WHERE namespace = 'reports'"
        )
        == 0
    )
    # A daemon-role member is listed, but not confined.
    await client_grant(conn, roles.daemon, "ops")
    (daemon_grant,) = await aio(client.list_grants)(conn, role=roles.daemon)
    assert daemon_grant.confined is False
    with pytest.raises(InvalidInput, match='role "no_such_role_x" does not exist'):
        await client_grant(conn, "no_such_role_x", "ops")
    with pytest.raises(InvalidInput, match="namespace"):
        await client_grant(conn, roles.bob, "bad namespace")
    # Granting is the owner's or an admin's: not a refusal about the namespace named.
    with pytest.raises(PermissionDenied) as refused:
        await client_grant(as_role["alice"], roles.bob, "other")
    assert str(refused.value) == (
        "permission denied for function grant_namespace: grants are made by the schema's "
        "owner or a coordinator_admin member"
    )


async def test_a_role_in_none_of_the_schemas_roles_is_told_what_to_do(
    conn: asyncpg.Connection, database: str, database_name: str
) -> None:
    """It got PostgreSQL's bare "permission denied for schema coordinator"."""
    role = f"stranger_{database_name}"
    await aio(conn.execute)(f'CREATE ROLE "{role}" LOGIN')
    stranger = await aio(asyncpg.connect)(database.replace("postgres@", f"{role}@", 1))
    try:
        with pytest.raises(PermissionDenied) as refused:
            await aio(client.list_jobs)(stranger)
        assert str(refused.value) == (
            "permission denied for schema coordinator: this role is in none of "
            "coordinator_app, coordinator_admin and coordinator_daemon; `coordinator grant "
            "ROLE NAMESPACE` (run by the schema's owner or a coordinator_admin member) lets "
            "it use a namespace"
        )
    finally:
        await aio(stranger.close)()
        await aio(conn.execute)(f'DROP ROLE "{role}"')


async def test_the_daemons_plans_carry_no_policy(
    as_role: dict[str, asyncpg.Connection], conn: asyncpg.Connection, jobs: dict[str, int]
) -> None:
    """Why RLS does not slow the daemon, shown by the planner: for the schema's owner
    (the test's superuser) and for a coordinator_daemon member the plans of the daemon's
    lookups and writes are the same and carry no policy; a confined role's carry one."""
    statements = [
        "SELECT * FROM coordinator.jobs WHERE id = 1",
        "UPDATE coordinator.jobs SET next_run_at = now() WHERE id = 1",
        "SELECT * FROM coordinator.runs WHERE job_id = 1 AND status = 'running'",
    ]
    for sql in statements:
        owner = [r[0] for r in await aio(conn.fetch)("EXPLAIN (COSTS OFF) " + sql)]
        daemon = [r[0] for r in await aio(as_role["daemon"].fetch)("EXPLAIN (COSTS OFF) " + sql)]
        confined = [r[0] for r in await aio(as_role["bob"].fetch)("EXPLAIN (COSTS OFF) " + sql)]
        assert daemon == owner, sql
        policy = ("InitPlan", "SubPlan", "namespace", "_namespaces")
        assert not any(word in line for line in owner for word in policy), owner
        assert any("InitPlan" in line for line in confined), confined


async def test_alerts_and_retention_keep_to_the_roles(
    as_role: dict[str, asyncpg.Connection],
    conn: asyncpg.Connection,
    jobs: dict[str, int],
    database: str,
    database_name: str,
) -> None:
    """0013's alert windows and retention under 0014's roles: the windows and the prune
    are the daemon's and the admin's; an application removes (history kept or not) only
    in the namespaces it operates, and a job it removed is unknown to it."""
    bob, alice, daemon = as_role["bob"], as_role["alice"], as_role["daemon"]
    # An application reads no alert window and runs no prune.
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="alert_windows"):
        await aio(bob.fetch)("SELECT * FROM coordinator.alert_windows")
    for sql in (
        "SELECT * FROM coordinator._prune(0, 0, 100, 500, now(), '1 day', 1)",
        "SELECT * FROM coordinator._prune_preview(now(), '1 day', 1)",
        "SELECT * FROM coordinator._alert_open(1, 'failed', 1, now(), '1 hour')",
    ):
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied for"):
            await aio(bob.fetch)(sql)
    with pytest.raises(PermissionDenied, match="_prune"):
        await aio(client.prune)(bob, retention=timedelta(days=1), keep_last=1)

    # The daemon's role opens a window (and writes it).
    failed = await aio(conn.fetchval)(
        "SELECT id FROM coordinator.runs WHERE job_id = $1 AND status = 'failed'",
        jobs["billing/a"],
    )
    window = await aio(daemon.fetchrow)(
        "SELECT * FROM coordinator._alert_open($1, 'failed', $2, now(), '1 hour')",
        jobs["billing/a"],
        failed,
    )
    assert (window["outcome"], window["namespace"]) == ("due", "billing")
    # ... and may run the prune (the daemon's at prune_at): here one that keeps everything.
    batch = await aio(daemon.fetchrow)(
        "SELECT * FROM coordinator._prune(0, 0, 100, 500, now(), '3650 days', 1000)"
    )
    assert (batch["deleted"], batch["jobs_seen"]) == (0, 6)

    # remove with its history kept: only where the role operates; then the job is unknown.
    removed = "SELECT coordinator.remove($1, $2, keep_history => true)"
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=DENIED_REPORTS):
        await aio(alice.execute)(removed, "reports", "b")
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=DENIED_BILLING):
        await aio(bob.execute)(removed, "billing", "b")
    await aio(bob.execute)(removed, "reports", "b")
    with pytest.raises(asyncpg.NoDataFoundError, match="unknown job reports/b"):
        await aio(bob.execute)("SELECT coordinator.trigger('reports', 'b')")
    # A job removed with its runs takes its alert windows along (the cascade is the
    # owner's, not the application's).
    await aio(alice.execute)("SELECT coordinator.remove('billing', 'a')")
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.alert_windows") == 0

    # An operator's login role (coordinator_admin) prunes every namespace under RLS.
    await aio(conn.execute)(
        "UPDATE coordinator.runs SET finished_at = now() - interval '2 days' WHERE job_id = $1",
        jobs["reports/b"],
    )
    admin = f"admin_{database_name}"
    await aio(conn.execute)(f'CREATE ROLE "{admin}" LOGIN IN ROLE coordinator_admin')
    try:
        operator = await aio(asyncpg.connect)(
            database.replace("postgresql://postgres@", f"postgresql://{admin}@", 1)
        )
        try:
            preview = await aio(client.prune_preview)(
                operator, retention=timedelta(days=1), keep_last=1
            )
            assert {(p.namespace, p.name, p.removed) for p in preview} >= {
                ("ops", "b", False),
                ("reports", "b", True),
            }
            report = await aio(client.prune)(operator, retention=timedelta(days=1), keep_last=1)
        finally:
            await aio(operator.close)()
    finally:
        with trio.CancelScope(shield=True):
            await aio(conn.execute)(f'DROP ROLE IF EXISTS "{admin}"')
    # reports/b (removed, its one run beyond retention) went with its history.
    assert report.jobs_removed == 1
    assert report.runs >= 1
    assert (
        await aio(conn.fetchval)(
            "SELECT count(*) FROM coordinator.jobs WHERE namespace = 'reports' AND name = 'b'"
        )
        == 0
    )


async def test_commands_run_only_in_the_namespaces_command_namespaces_names(
    start_daemon: StartDaemon, conn: asyncpg.Connection
) -> None:
    """A command runs as the daemon's user: a role that may operate a namespace could run
    anything that user may (a helper read the admin token's file from a billing job).
    ``command_namespaces`` names the namespaces whose jobs may; another's command job
    fails without starting, as bad input, not retried."""
    harness = await start_daemon(build={"command_namespaces": ("ops",)})
    target = {"kind": "exec", "argv": ["sh", "-c", "echo ran"]}
    await define(conn, "cmd", namespace="ops", target=target)
    await define(conn, "cmd", namespace="billing", target=target, retries=3)
    allowed = await aio(client.trigger)(conn, "cmd", namespace="ops")
    refused = await aio(client.trigger)(conn, "cmd", namespace="billing")
    await harness.wait_event("job.run", run=allowed, outcome="succeeded")
    await harness.wait_event("job.run", run=refused, outcome="failed")
    run = await aio(client.get_run)(conn, refused)
    assert run.error_message == (
        "commands may not run in namespace 'billing' (command_namespaces: ops); "
        "give the job a worker target"
    )
    assert (run.category, run.retryable, run.retried_by) == ("invalid-input", False, None)
    assert "ran" not in json.dumps(run.extra)


async def test_a_confined_roles_statements_are_not_jit_compiled(
    roles: Roles, database: str, jobs: dict[str, int]
) -> None:
    """On PostgreSQL's default ``jit = on``, the policies' call of ``_namespaces()``
    (run with enable_seqscan = off, its grants table read whole at disable_cost) was
    compiled by LLVM at every statement of a confined role: ~100 ms each (0035). The
    plans inside the functions are read from auto_explain, sent to this session as
    notices; the session is the superuser's (LOAD needs it) acting as alice."""
    app = await aio(asyncpg.connect)(database)
    notices: list[str] = []
    app.add_log_listener(lambda _conn, message: notices.append(message.message))
    try:
        for statement in (
            "LOAD 'auto_explain'",
            "SET auto_explain.log_min_duration = 0",
            "SET auto_explain.log_nested_statements = on",
            "SET auto_explain.log_level = notice",
            "SET jit = on",
        ):
            await aio(app.execute)(statement)
        if not await aio(app.fetchval)("SELECT pg_jit_available()"):
            pytest.skip("this PostgreSQL has no JIT provider (llvmjit) to misuse")
        await aio(app.execute)(f'SET ROLE "{roles.alice}"')
        assert await aio(app.fetchval)("SELECT count(*) FROM coordinator.jobs") > 0
        assert await aio(app.fetchval)("SELECT coordinator.trigger('billing', 'b')") is not None
    finally:
        await aio(app.close)()
    plans = [n for n in notices if "namespace_grants" in n]
    assert plans, notices  # the policies' reading of the grants was explained
    assert not [n for n in notices if "JIT:" in n], notices


async def test_every_function_that_avoids_sequential_scans_also_avoids_jit(
    conn: asyncpg.Connection,
) -> None:
    """0035's rule, for the functions later migrations redefine: CREATE OR REPLACE
    replaces a function's settings, so each must repeat ``SET jit = off`` beside
    ``SET enable_seqscan = off``."""
    rows = await aio(conn.fetch)(
        """
        SELECT p.oid::regprocedure::text AS name
          FROM pg_proc p
         WHERE p.pronamespace = 'coordinator'::regnamespace
           AND 'enable_seqscan=off' = ANY (p.proconfig)
           AND NOT 'jit=off' = ANY (p.proconfig)
        """
    )
    assert [r["name"] for r in rows] == []
    assert (
        await aio(conn.fetchval)(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'coordinator'::regnamespace"
            " AND 'jit=off' = ANY (proconfig)"
        )
        > 20
    )
