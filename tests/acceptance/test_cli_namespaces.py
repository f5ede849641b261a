"""``coordinator grant``, ``revoke``, ``grants`` and ``token hash``, as an operator types
them (processes against the test database)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import TYPE_CHECKING

import asyncpg
import pytest
import trio

from coordinator.db import aio
from coordinator.tokens import hash_token

from .test_daemon_process import COORDINATOR, EMPTY_CONFIG, cli

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@pytest.fixture
async def role(aio_loop: object, database: str, database_name: str) -> AsyncIterator[str]:
    name = f"cli_role_{database_name}"
    conn = await aio(asyncpg.connect)(database)
    try:
        await aio(conn.execute)(f'CREATE ROLE "{name}" LOGIN')
        yield name
    finally:
        with trio.CancelScope(shield=True):
            await aio(conn.execute)(f'DROP ROLE IF EXISTS "{name}"')
            await aio(conn.close)()


async def test_grant_grants_and_revoke(database: str, role: str) -> None:
    granted = await trio.to_thread.run_sync(cli, database, "grant", role, "billing")
    assert granted.returncode == 0, granted.stderr
    assert granted.stdout == f"{role} may now operate namespace billing\n"
    again = await trio.to_thread.run_sync(cli, database, "grant", role, "billing")
    assert again.stdout == f"{role} already may operate namespace billing\n"
    ro = await trio.to_thread.run_sync(cli, database, "grant", role, "reports", "--read-only")
    assert ro.stdout == f"{role} may now read namespace reports\n"
    listed = await trio.to_thread.run_sync(cli, database, "grants", "--json", "--role", role)
    grants = json.loads(listed.stdout)["grants"]
    assert [(g["namespace"], g["access"], g["confined"]) for g in grants] == [
        ("billing", "operate", True),
        ("reports", "read", True),
    ]
    table = await trio.to_thread.run_sync(cli, database, "grants")
    assert table.stdout.splitlines()[0].split() == [
        "ROLE", "NAMESPACE", "ACCESS", "CONFINED", "GRANTED"
    ]  # fmt: skip
    gone = await trio.to_thread.run_sync(cli, database, "revoke", role, "reports")
    assert gone.stdout == f"{role} may no longer see namespace reports\n"
    nothing = await trio.to_thread.run_sync(cli, database, "revoke", role, "reports")
    assert "nothing to revoke" in nothing.stdout
    # The superuser running the tests is not confined: the command says so.
    postgres = await trio.to_thread.run_sync(cli, database, "grant", "postgres", "ops")
    assert "is not confined by the grants" in postgres.stderr
    unknown = await trio.to_thread.run_sync(cli, database, "grant", "no_such_role_zz", "ops")
    assert unknown.returncode == 2
    assert unknown.stderr == 'coordinator: role: role "no_such_role_zz" does not exist\n'


def test_token_hash_reads_stdin_and_makes_new_ones() -> None:
    env = {**os.environ, "COORDINATOR_CONFIG": str(EMPTY_CONFIG)}
    token = "an-operator-typed-token-123"
    hashed = subprocess.run(
        [*COORDINATOR, "token", "hash"], input=token + "\n", capture_output=True, text=True,
        env=env, timeout=60,
    )  # fmt: skip
    assert hashed.stdout == hash_token(token) + "\n"
    short = subprocess.run(
        [*COORDINATOR, "token", "hash"], input="short\n", capture_output=True, text=True,
        env=env, timeout=60,
    )  # fmt: skip
    assert short.returncode == 2
    assert short.stderr == "coordinator: token: must be at least 16 characters\n"
    new = subprocess.run(
        [*COORDINATOR, "token", "hash", "--new"], capture_output=True, text=True, env=env,
        timeout=60,
    )  # fmt: skip
    token_line, hash_line = new.stdout.splitlines()
    made = token_line.removeprefix("token: ")
    assert hash_line == "hash:  " + hash_token(made)
    assert len(made) >= 40


async def test_prune_as_an_application_role_says_who_may(database: str, role: str) -> None:
    """Not "permission denied for this namespace": no namespace is involved; the prune
    functions are the owner's and coordinator_admin's."""
    granted = await trio.to_thread.run_sync(cli, database, "grant", role, "billing")
    assert granted.returncode == 0, granted.stderr
    as_role = database.replace("postgresql://postgres@", f"postgresql://{role}@", 1)
    assert as_role != database
    refused = await trio.to_thread.run_sync(cli, as_role, "prune", "--dry-run")
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.splitlines() == [
        "coordinator: permission denied for function _prune_preview: pruning takes the "
        "schema's owner or a member of coordinator_admin (the daemon prunes on its own "
        "deadline)"
    ]


async def test_trigger_of_a_namespace_the_role_may_not_operate_says_so(
    database: str, role: str
) -> None:
    """As ``coordinator.trigger()`` says it, not "unknown job" (the lookup before it sees
    nothing there); an unknown job of its own namespace is still that."""
    conn = await aio(asyncpg.connect)(database)
    try:
        await aio(conn.execute)(
            "SELECT coordinator.define_job('secret', 'manual', "
            '\'{"kind": "exec", "argv": ["true"]}\', namespace => \'reports\')'
        )
    finally:
        await aio(conn.close)()
    for ns, access in (("billing", ()), ("reports", ("--read-only",))):
        granted = await trio.to_thread.run_sync(cli, database, "grant", role, ns, *access)
        assert granted.returncode == 0, granted.stderr
    as_role = database.replace("postgresql://postgres@", f"postgresql://{role}@", 1)
    for ns in ("reports", "ops"):
        refused = await trio.to_thread.run_sync(
            cli, as_role, "jobs", "trigger", "secret", "--namespace", ns
        )
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.startswith(
            f'coordinator: permission denied for namespace "{ns}" ('
        ), refused.stderr
        assert len(refused.stderr.splitlines()) == 1, refused.stderr
    unknown = await trio.to_thread.run_sync(
        cli, as_role, "jobs", "trigger", "nosuch", "--namespace", "billing"
    )
    assert unknown.returncode == 2, unknown.stderr
    assert unknown.stderr == "coordinator: unknown job billing/nosuch\n"
