"""The real-PostgreSQL test harness.

One server per session, found in this order (docs/design.md, "Tests"):

1. ``COORDINATOR_TEST_DSN`` (an existing server; the role must be allowed to create
   databases; SQL-counting tests are skipped because its log is out of reach);
2. a throwaway cluster made with the machine's ``initdb``/``pg_ctl`` (as root, run as an
   unprivileged user), logging every statement with its application and database;
3. testcontainers' PostgresContainer when a Docker engine answers;
4. otherwise every database test is skipped with a message saying how to provide one.

The schema is migrated once into a template database; each test gets a fresh copy
(``CREATE DATABASE ... TEMPLATE``, a file copy).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import attrs
import pytest
import trio
import trio_asyncio

from coordinator import migrate as migrate_mod
from coordinator.db import trio_asyncio_loop
from coordinator.embedded import Cluster, NoServerBinaries, StatementLog, free_port

TEMPLATE = "coordinator_template"
HOW_TO = (
    "no PostgreSQL for the tests: set COORDINATOR_TEST_DSN, install the server binaries "
    "(apt-get install -y postgresql), or run a Docker engine for testcontainers"
)


@attrs.define(eq=False)
class TestServer:
    """The session's PostgreSQL."""

    __test__ = False

    #: DSN of a maintenance database (``postgres``) with CREATE DATABASE rights.
    admin_dsn: str
    #: The throwaway cluster, when we made one (then its log counts statements).
    cluster: Cluster | None = None
    _counter: Iterator[int] = attrs.field(factory=lambda: itertools.count(1))

    def dsn(self, dbname: str) -> str:
        base, _, query = self.admin_dsn.partition("?")
        base = base.rsplit("/", 1)[0] + "/" + dbname
        return base + ("?" + query if query else "")

    def new_database_name(self) -> str:
        return f"t{os.getpid()}_{next(self._counter)}"

    def statement_log(self) -> StatementLog | None:
        return self.cluster.statement_log() if self.cluster is not None else None


def _admin(dsn: str, *sql: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(dsn, server_settings={"application_name": "tests-admin"})
        try:
            for stmt in sql:
                await conn.execute(stmt)
        finally:
            await conn.close()

    asyncio.run(run())


def _migrate_template(server: TestServer) -> None:
    _admin(server.admin_dsn, f"DROP DATABASE IF EXISTS {TEMPLATE}", f"CREATE DATABASE {TEMPLATE}")

    async def run() -> None:
        async with trio_asyncio.open_loop():
            conn = await trio_asyncio.aio_as_trio(asyncpg.connect)(
                server.dsn(TEMPLATE), server_settings={"application_name": "tests-admin"}
            )
            try:
                await migrate_mod.migrate(conn)
            finally:
                await trio_asyncio.aio_as_trio(conn.close)()

    trio.run(run)


def _local_cluster(tmp_root: Path) -> Cluster | None:
    try:
        cluster = Cluster(root=tmp_root / "pg", port=_free_port(), settings=_test_settings())
    except NoServerBinaries:
        return None
    cluster.init()
    cluster.start()
    return cluster


def _free_port() -> int:
    from coordinator.embedded import free_port

    return free_port()


def _test_settings() -> dict[str, str]:
    settings = {
        "log_statement": "all",
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "max_connections": "300",
        "log_min_messages": "warning",
    }
    return settings


@pytest.fixture(scope="session")
def pg_server() -> Iterator[TestServer]:
    dsn = os.environ.get("COORDINATOR_TEST_DSN")
    if dsn:
        server = TestServer(admin_dsn=dsn)
        _migrate_template(server)
        yield server
        return

    tmp_root = Path(tempfile.mkdtemp(prefix="coordinator-tests-"))
    os.chmod(tmp_root, 0o755)
    cluster = _local_cluster(tmp_root)
    if cluster is not None:
        server = TestServer(admin_dsn=cluster.dsn("postgres"), cluster=cluster)
        try:
            _migrate_template(server)
            yield server
        finally:
            cluster.stop("immediate")
            shutil.rmtree(tmp_root, ignore_errors=True)
        return

    container: Any = None
    try:
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer("postgres:16-alpine", driver=None)
        container.start()
    except Exception as exc:  # DockerException and friends: no engine here
        pytest.skip(f"{HOW_TO} ({type(exc).__name__})")
    try:
        server = TestServer(admin_dsn=container.get_connection_url(driver=None))
        _migrate_template(server)
        yield server
    finally:
        container.stop()


@pytest.fixture
def private_cluster() -> Iterator[Cluster]:
    """A cluster of this test's own, so the test may stop, restart or reconfigure it."""
    root = Path(tempfile.mkdtemp(prefix="coordinator-fault-"))
    root.chmod(0o755)
    try:
        cluster = Cluster(root=root / "pg", port=free_port(), settings={"fsync": "off"})
    except NoServerBinaries:
        pytest.skip("fault tests need PostgreSQL server binaries to stop and start a server")
    cluster.init()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def database(pg_server: TestServer) -> Iterator[str]:
    """A fresh, migrated database for this test; yields its DSN."""
    name = pg_server.new_database_name()
    _admin(pg_server.admin_dsn, f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    try:
        yield pg_server.dsn(name)
    finally:
        _admin(pg_server.admin_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def database_name(database: str) -> str:
    return database.split("?", 1)[0].rsplit("/", 1)[1]


@pytest.fixture
def sql_log(pg_server: TestServer) -> StatementLog:
    """The server's statement log, marked at the start of the test."""
    log = pg_server.statement_log()
    if log is None:
        pytest.skip("counting SQL needs the server log of a cluster made by the tests")
    log.mark()
    return log


@pytest.fixture
async def aio_loop() -> AsyncIterator[Any]:
    """The trio-asyncio loop every asyncpg call from trio needs (opened once per test,
    in a fixture, so fixtures and the test share it), as the product opens it."""
    async with trio_asyncio_loop() as loop:
        yield loop


@pytest.fixture
async def conn(aio_loop: Any, database: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain application connection to the test database (wakes are not suppressed)."""
    c = await trio_asyncio.aio_as_trio(asyncpg.connect)(
        database, server_settings={"application_name": "tests-app"}
    )
    try:
        yield c
    finally:
        with trio.CancelScope(shield=True):
            await trio_asyncio.aio_as_trio(c.close)()
