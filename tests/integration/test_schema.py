"""The schema, the wake triggers and the SQL API, against a real PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
import trio

from coordinator import migrate as migrate_mod
from coordinator.db import aio, transaction

EXEC = json.dumps({"kind": "exec", "argv": ["true"]})


async def _connect(dsn: str, app: str = "tests-app") -> asyncpg.Connection:
    return await aio(asyncpg.connect)(dsn, server_settings={"application_name": app})


class Notifications:
    """Collects notifications on channel ``coordinator`` from a dedicated connection."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.send, self.receive = trio.open_memory_channel[dict[str, Any]](1000)

    async def __aenter__(self) -> Notifications:
        await aio(self.conn.add_listener)("coordinator", self._on)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await aio(self.conn.close)()

    def _on(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self.send.send_nowait(json.loads(payload))

    async def collect(self, settle: float = 0.3) -> list[dict[str, Any]]:
        """Everything delivered within ``settle`` seconds of the last one."""
        out: list[dict[str, Any]] = []
        while True:
            with trio.move_on_after(settle) as scope:
                out.append(await self.receive.receive())
            if scope.cancelled_caught:
                return out


async def _define(conn: asyncpg.Connection, name: str, **kw: Any) -> int:
    args = {"schedule_kind": "manual", "target": EXEC, **kw}
    named = ", ".join(f"{k} => ${i + 2}" for i, k in enumerate(args))
    return await aio(conn.fetchval)(
        f"SELECT coordinator.define_job(name => $1, {named})", name, *args.values()
    )


async def test_migrate_twice_changes_nothing(conn: asyncpg.Connection) -> None:
    # The template was migrated already: a second run applies nothing.
    assert await migrate_mod.migrate(conn) == []
    assert await migrate_mod.migrate(conn) == []
    names = await aio(conn.fetch)("SELECT name FROM coordinator.schema_migrations")
    assert [r["name"] for r in names] == [m.name for m in migrate_mod.load_migrations()]


async def test_a_migration_applied_from_another_version_is_refused_in_words(
    conn: asyncpg.Connection,
) -> None:
    """A database migrated by another build (whose file differed) is left as it is, and
    the operator is told what happened and what to do ("applied with different content;
    schema changes need a new numbered file" spoke to a developer)."""
    from coordinator.errors import DatabaseError

    last = migrate_mod.load_migrations()[-1]
    await aio(conn.execute)(
        "UPDATE coordinator.schema_migrations SET checksum = 'f00' || checksum WHERE name = $1",
        last.name,
    )
    with pytest.raises(DatabaseError) as info:
        await migrate_mod.migrate(conn)
    message = str(info.value)
    assert message.startswith(f"migration {last.name} was applied from another version")
    assert f"recorded checksum f00{last.checksum[:9]}" in message
    assert "nothing was changed" in message
    assert "\n" not in message


async def test_concurrent_migrates_on_empty_database(pg_server: Any, aio_loop: Any) -> None:
    name = pg_server.new_database_name()
    admin = await _connect(pg_server.admin_dsn)
    await aio(admin.execute)(f"CREATE DATABASE {name}")
    try:
        results: list[list[str]] = []

        async def one() -> None:
            c = await _connect(pg_server.dsn(name))
            try:
                results.append(await migrate_mod.migrate(c))
            finally:
                await aio(c.close)()

        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(one)
        all_names = [m.name for m in migrate_mod.load_migrations()]
        assert sorted(results, key=len) == [[], all_names]
        c = await _connect(pg_server.dsn(name))
        count = await aio(c.fetchval)("SELECT count(*) FROM coordinator.schema_migrations")
        await aio(c.close)()
        assert count == len(all_names)
    finally:
        await aio(admin.execute)(f"DROP DATABASE {name} WITH (FORCE)")
        await aio(admin.close)()


async def test_committed_change_wakes_once(conn: asyncpg.Connection, database: str) -> None:
    async with Notifications(await _connect(database)) as n:
        job_id = await _define(conn, "a")
        assert await n.collect() == [{"job": job_id}]
        async with transaction(conn):
            await aio(conn.execute)("SELECT coordinator.pause('default', 'a')")
            await aio(conn.execute)("UPDATE coordinator.jobs SET priority = 'interactive'")
        # Both statements raised the same payload; PostgreSQL folded them at commit.
        assert await n.collect() == [{"job": job_id}]


async def test_rolled_back_change_wakes_nothing(conn: asyncpg.Connection, database: str) -> None:
    async with Notifications(await _connect(database)) as n:
        tx = conn.transaction()
        await aio(tx.start)()
        await _define(conn, "a")
        await aio(tx.rollback)()
        assert await n.collect() == []


async def test_rolled_back_savepoint_wakes_nothing(conn: asyncpg.Connection, database: str) -> None:
    async with Notifications(await _connect(database)) as n:
        async with transaction(conn):
            kept = await _define(conn, "kept")
            sp = conn.transaction()
            await aio(sp.start)()
            await _define(conn, "dropped")
            await aio(sp.rollback)()
        assert await n.collect() == [{"job": kept}]


async def test_many_row_update_is_one_wake(conn: asyncpg.Connection, database: str) -> None:
    await aio(conn.execute)(
        "INSERT INTO coordinator.jobs (name, schedule_kind, target) "
        'SELECT \'j\' || g, \'manual\', \'{"kind": "exec", "argv": ["true"]}\' '
        "FROM generate_series(1, 1000) g"
    )
    async with Notifications(await _connect(database)) as n:
        await aio(conn.execute)("UPDATE coordinator.jobs SET paused = true")
        assert await n.collect() == [{"jobs": "many"}]


async def test_daemon_sessions_raise_no_wake(conn: asyncpg.Connection, database: str) -> None:
    daemon = await aio(asyncpg.connect)(
        database,
        server_settings={"application_name": "coordinator", "coordinator.origin": "daemon"},
    )
    try:
        async with Notifications(await _connect(database)) as n:
            await _define(daemon, "quiet")
            await aio(daemon.execute)("UPDATE coordinator.jobs SET paused = true")
            assert await n.collect() == []
    finally:
        await aio(daemon.close)()


async def test_trigger_is_idempotent_while_outstanding(conn: asyncpg.Connection) -> None:
    await _define(conn, "m")
    first = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'm')")
    second = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'm', '{}')")
    assert first == second
    job_id = await aio(conn.fetchval)("SELECT id FROM coordinator.jobs WHERE name = 'm'")
    with pytest.raises(asyncpg.UniqueViolationError):
        await aio(conn.execute)(
            "INSERT INTO coordinator.runs (job_id, trigger, status) "
            "VALUES ($1, 'manual', 'running')",
            job_id,
        )
    # Once the run is finished a new trigger makes a new run.
    await aio(conn.execute)("UPDATE coordinator.runs SET status = 'succeeded'")
    third = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'm')")
    assert third != first


async def test_trigger_unknown_job_names_it(conn: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.NoDataFoundError, match="unknown job default/nope"):
        await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'nope')")


async def test_twenty_concurrent_triggers_make_one_run(
    conn: asyncpg.Connection, database: str
) -> None:
    await _define(conn, "m")
    ids: list[int] = []

    async def one() -> None:
        c = await _connect(database)
        try:
            ids.append(await aio(c.fetchval)("SELECT coordinator.trigger('default', 'm')"))
        finally:
            await aio(c.close)()

    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(one)
    assert len(set(ids)) == 1
    assert await aio(conn.fetchval)("SELECT count(*) FROM coordinator.runs") == 1


async def test_manual_trigger_notifies_dispatch(conn: asyncpg.Connection, database: str) -> None:
    await _define(conn, "m")
    async with Notifications(await _connect(database)) as n:
        run_id = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'm')")
        job_id = await aio(conn.fetchval)("SELECT id FROM coordinator.jobs WHERE name = 'm'")
        assert await n.collect() == [
            {
                "run": run_id,
                "dispatch": True,
                "job": job_id,
                "priority": "background",
                "worker": None,
                # The run's created_at to the microsecond (0027): the daemon orders it
                # by this, as a refresh orders the runs it reads.
                "at": await _created_us(conn, run_id),
            }
        ]


async def _created_us(conn: asyncpg.Connection, run_id: int) -> int:
    created = await aio(conn.fetchval)(
        "SELECT created_at FROM coordinator.runs WHERE id = $1", run_id
    )
    return int((created - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1))


async def test_trigger_raises_its_own_wake_and_leaves_the_origin(
    conn: asyncpg.Connection, database: str
) -> None:
    # trigger() raises the dispatch wake itself, its INSERT running quiet (0019): the
    # runs trigger's payload (worker type and priority included), the caller's origin as
    # it was (a plain INSERT after it in the same transaction still wakes), and nothing
    # in a session the wakes skip (the daemon's).
    worker = json.dumps({"kind": "worker", "type": "images"})
    job = await _define(conn, "w", target=worker, priority="interactive")
    plain = await _define(conn, "p")
    skipped = await _define(conn, "d")
    async with Notifications(await _connect(database)) as n:
        async with transaction(conn):
            await aio(conn.execute)("SELECT set_config('coordinator.origin', 'app', true)")
            run = await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'w')")
            origin = await aio(conn.fetchval)("SELECT current_setting('coordinator.origin')")
            assert origin == "app"
            other = await aio(conn.fetchval)(
                "INSERT INTO coordinator.runs (job_id, trigger, status) "
                "VALUES ($1, 'manual', 'queued') RETURNING id",
                plain,
            )
        async with transaction(conn):
            await aio(conn.execute)("SELECT set_config('coordinator.origin', 'daemon', true)")
            assert await aio(conn.fetchval)("SELECT coordinator.trigger('default', 'd')")
        assert await n.collect() == [
            {
                "run": run,
                "dispatch": True,
                "job": job,
                "priority": "interactive",
                "worker": "images",
                "at": await _created_us(conn, run),
            },
            {
                "run": other,
                "dispatch": True,
                "job": plain,
                "priority": "background",
                "worker": None,
                "at": await _created_us(conn, other),
            },
        ]
    assert await aio(conn.fetchval)(
        "SELECT count(*) FROM coordinator.runs WHERE job_id = $1 AND status = 'queued'", skipped
    )


async def test_changed_schedule_bumps_version_and_clears_deadline(
    conn: asyncpg.Connection,
) -> None:
    job = await _define(conn, "c", schedule_kind="cron", schedule="0 * * * *")
    await aio(conn.execute)(
        "UPDATE coordinator.jobs SET next_run_at = now() + interval '1 hour' WHERE id = $1", job
    )
    await _define(conn, "c", schedule_kind="cron", schedule="0 * * * *", priority="interactive")
    row = await aio(conn.fetchrow)("SELECT * FROM coordinator.jobs WHERE id = $1", job)
    assert row["schedule_version"] == 1
    assert row["next_run_at"] is not None
    await _define(conn, "c", schedule_kind="cron", schedule="*/5 * * * *")
    row = await aio(conn.fetchrow)("SELECT * FROM coordinator.jobs WHERE id = $1", job)
    assert row["schedule_version"] == 2
    assert row["next_run_at"] is None


async def test_once_job_deadline_is_its_instant(conn: asyncpg.Connection) -> None:
    job = await _define(conn, "o", schedule_kind="once", schedule="2030-01-01T00:00:00Z")
    row = await aio(conn.fetchrow)("SELECT * FROM coordinator.jobs WHERE id = $1", job)
    assert row["next_run_at"].isoformat() == "2030-01-01T00:00:00+00:00"
    bad = await _define(conn, "bad", schedule_kind="once", schedule="not a time")
    row = await aio(conn.fetchrow)("SELECT * FROM coordinator.jobs WHERE id = $1", bad)
    assert row["invalid_reason"].startswith("at:")
    assert row["next_run_at"] is None


async def test_sync_is_one_transaction_one_wake(conn: asyncpg.Connection, database: str) -> None:
    await _define(conn, "old", namespace="svc")
    jobs = [
        {"name": "a", "schedule_kind": "manual", "target": {"kind": "exec", "argv": ["true"]}},
        {
            "name": "b",
            "schedule_kind": "interval",
            "schedule": "5m",
            "target": {"kind": "worker", "type": "t"},
        },
    ]
    async with Notifications(await _connect(database)) as n:
        row = await aio(conn.fetchrow)(
            "SELECT * FROM coordinator.sync('svc', $1::jsonb)", json.dumps(jobs)
        )
        assert (row["created"], row["updated"], row["paused"]) == (2, 0, 1)
        assert await n.collect() == [{"sync": "svc"}]
    paused = await aio(conn.fetchval)(
        "SELECT paused FROM coordinator.jobs WHERE namespace = 'svc' AND name = 'old'"
    )
    assert paused is True
    # An application's own later change in the same transaction still wakes.
    origin = await aio(conn.fetchval)("SELECT current_setting('coordinator.origin', true)")
    assert origin in (None, "")


async def test_resolve_only_unresolved(conn: asyncpg.Connection) -> None:
    job = await _define(conn, "r")
    run_id = await aio(conn.fetchval)(
        "INSERT INTO coordinator.runs (job_id, trigger, status) "
        "VALUES ($1, 'schedule', 'unresolved') RETURNING id",
        job,
    )
    retry = await aio(conn.fetchval)("SELECT coordinator.resolve($1, 'retry')", run_id)
    assert retry != run_id
    rows = await aio(conn.fetch)(
        "SELECT id, status, trigger, attempt FROM coordinator.runs ORDER BY id"
    )
    assert [(r["status"], r["trigger"], r["attempt"]) for r in rows] == [
        ("failed", "schedule", 1),
        ("queued", "retry", 2),
    ]
    with pytest.raises(asyncpg.ObjectNotInPrerequisiteStateError):
        await aio(conn.fetchval)("SELECT coordinator.resolve($1, 'failed')", retry)


async def test_migrate_by_a_role_that_may_not_change_the_schema(
    conn: asyncpg.Connection, database: str, database_name: str
) -> None:
    """On an up-to-date schema it said "permission denied for database" (the bootstrap's
    CREATE ... IF NOT EXISTS needs CREATE on the database): now "up to date" for a role
    that may read the record, and one line naming who may migrate otherwise."""
    from coordinator.errors import DatabaseError

    role = f"stranger_{database_name}"
    await aio(conn.execute)(f'CREATE ROLE "{role}" LOGIN')
    other = await aio(asyncpg.connect)(database.replace("postgres@", f"{role}@", 1))
    try:
        with pytest.raises(DatabaseError) as info:
            await migrate_mod.migrate(other)
        assert str(info.value) == (
            f"permission denied for database {database_name}: migrations are applied by the "
            f"schema's owner (postgres) or a superuser, as `coordinator migrate --dsn ...`; "
            f"{role} may not"
        )
        await aio(conn.execute)(f'GRANT USAGE ON SCHEMA coordinator TO "{role}"')
        await aio(conn.execute)(f'GRANT SELECT ON coordinator.schema_migrations TO "{role}"')
        assert await migrate_mod.migrate(other) == []  # up to date: nothing to create
        last = migrate_mod.load_migrations()[-1]
        await aio(conn.execute)(
            "DELETE FROM coordinator.schema_migrations WHERE name = $1", last.name
        )
        with pytest.raises(DatabaseError, match=r"migrations are applied by the schema's owner"):
            await migrate_mod.migrate(other)
    finally:
        await aio(other.close)()
        await aio(conn.execute)(f'DROP OWNED BY "{role}"')
        await aio(conn.execute)(f'DROP ROLE "{role}"')


async def test_a_migrate_whose_connection_is_lost_says_which_file_and_what_to_do(
    pg_server: Any, aio_loop: Any
) -> None:
    """A tester's migrate cut off mid-way said only "connection lost: cannot call
    Transaction.__aexit__(): the underlying connection is closed": not which file was
    being applied, nor that running it again is safe."""
    from coordinator.errors import DatabaseUnavailable

    name = pg_server.new_database_name()
    admin = await _connect(pg_server.admin_dsn)
    await aio(admin.execute)(f"CREATE DATABASE {name}")
    try:
        files = [
            migrate_mod.Migration(name="0001_quick.sql", sql="CREATE TABLE quick (a int)"),
            migrate_mod.Migration(name="0002_slow.sql", sql="SELECT pg_sleep(60)"),
        ]
        c = await _connect(pg_server.dsn(name), app="tests-migrate")
        failure: list[BaseException] = []

        async def migrate() -> None:
            try:
                await migrate_mod.migrate(c, files)
            except DatabaseUnavailable as exc:
                failure.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(migrate)
            with trio.fail_after(30):
                while not await aio(admin.fetchval)(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = 'tests-migrate' AND query LIKE '%pg_sleep%'"
                ):
                    await trio.sleep(0.05)
        assert len(failure) == 1
        message = str(failure[0])
        assert message.startswith("connection lost while applying 0002_slow.sql ("), message
        assert message.endswith(
            "nothing of this migrate was kept (the pending files go in one transaction): "
            "run it again"
        ), message
        assert "\n" not in message
        # And so it was: the quick file's table went with the transaction.
        again = await _connect(pg_server.dsn(name))
        assert await aio(again.fetchval)("SELECT to_regclass('public.quick')") is None
        await aio(again.close)()
    finally:
        await aio(admin.execute)(f"DROP DATABASE {name} WITH (FORCE)")
        await aio(admin.close)()


async def test_a_migrate_cut_by_statement_timeout_is_not_called_a_lost_connection(
    pg_server: Any, aio_loop: Any
) -> None:
    """A statement_timeout (57014) leaves the connection alive, and running the migrate
    again would meet it again: it is not "connection lost ... run it again"."""
    name = pg_server.new_database_name()
    admin = await _connect(pg_server.admin_dsn)
    await aio(admin.execute)(f"CREATE DATABASE {name}")
    try:
        c = await aio(asyncpg.connect)(
            pg_server.dsn(name), server_settings={"statement_timeout": "200ms"}
        )
        files = [migrate_mod.Migration(name="0001_slow.sql", sql="SELECT pg_sleep(2)")]
        with pytest.raises(asyncpg.QueryCanceledError):
            await migrate_mod.migrate(c, files)
        assert await aio(c.fetchval)("SELECT 1") == 1
        await aio(c.close)()
    finally:
        await aio(admin.execute)(f"DROP DATABASE {name} WITH (FORCE)")
        await aio(admin.close)()


async def test_two_syncs_of_one_namespace_go_one_after_the_other(
    conn: asyncpg.Connection, database: str
) -> None:
    """The second sync waits for the first to commit and applies its whole set over it:
    overlapping syncs each missed the other's rows (the namespace ended with both sets
    active)."""
    target = json.loads(EXEC)
    first = json.dumps([{"name": "a", "schedule_kind": "manual", "target": target}])
    second = json.dumps([{"name": "b", "schedule_kind": "manual", "target": target}])
    other = await _connect(database, app="tests-second-sync")
    done = trio.Event()

    async def later() -> None:
        await aio(other.fetch)("SELECT * FROM coordinator.sync('both', $1::jsonb)", second)
        done.set()

    try:
        async with trio.open_nursery() as nursery:
            async with transaction(conn):
                await aio(conn.fetch)("SELECT * FROM coordinator.sync('both', $1::jsonb)", first)
                nursery.start_soon(later)
                with trio.fail_after(10):
                    while not await aio(conn.fetchval)(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE application_name = 'tests-second-sync'"
                        " AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
                    ):
                        await trio.sleep(0.02)
                assert not done.is_set()
            # The first committed: the second goes now.
            with trio.fail_after(10):
                await done.wait()
    finally:
        await aio(other.close)()
    rows = await aio(conn.fetch)(
        "SELECT name, paused FROM coordinator.jobs WHERE namespace = 'both' ORDER BY name"
    )
    assert [(r["name"], r["paused"]) for r in rows] == [("a", True), ("b", False)]
