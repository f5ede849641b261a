"""Applying ``migrations/NNNN_*.sql`` in order, once each.

All pending files run in one transaction under a transaction-level advisory lock, so two
concurrent ``coordinator migrate`` calls are safe: the second waits, then finds nothing
left to do. Applied files are recorded (name and checksum) in
``coordinator.schema_migrations``; a recorded file whose content changed is reported
rather than silently re-applied.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import attrs

from .db import aio, one_line
from .errors import DatabaseError, DatabaseUnavailable

if TYPE_CHECKING:
    from asyncpg import Connection

#: pg_advisory_xact_lock key: the bytes of "coordmig" as a signed 64-bit integer.
MIGRATE_LOCK_KEY = int.from_bytes(b"coordmig", "big", signed=True)

_BOOTSTRAP = """
CREATE SCHEMA IF NOT EXISTS coordinator;
CREATE TABLE IF NOT EXISTS coordinator.schema_migrations (
    name       text PRIMARY KEY,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""


@attrs.frozen(kw_only=True)
class Migration:
    """One numbered SQL file."""

    #: File name, e.g. ``0001_initial.sql``; the order is the name's order.
    name: str
    #: The SQL text.
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def migrations_dir() -> Path:
    """Where the numbered files live: ``migrations/`` beside the package (source tree)
    or ``coordinator/_migrations`` (installed wheel)."""
    packaged = Path(str(resources.files("coordinator"))) / "_migrations"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "migrations"


def load_migrations(directory: Path | None = None) -> list[Migration]:
    directory = directory or migrations_dir()
    files = sorted(p for p in directory.glob("[0-9][0-9][0-9][0-9]_*.sql") if p.is_file())
    if not files:
        raise DatabaseError(f"no migration files found in {directory}")
    return [Migration(name=p.name, sql=p.read_text()) for p in files]


async def migrate(conn: Connection, migrations: list[Migration] | None = None) -> list[str]:
    """Apply pending migrations; return the names applied (empty when up to date)."""
    migrations = migrations if migrations is not None else load_migrations()
    applied_now: list[str] = []
    #: What the migrate was doing, for the words of a connection lost mid-way.
    doing = "waiting for another migrate to finish"

    async def run() -> None:
        nonlocal doing
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATE_LOCK_KEY)
            doing = "reading which migrations are applied"
            if await _up_to_date(conn, migrations):
                # Nothing to do, said as such to a role that may read the record but not
                # create in the database (the bootstrap's CREATE ... IF NOT EXISTS needs
                # that right even when everything exists: "permission denied for
                # database", a tester's finding).
                return
            await conn.execute(_BOOTSTRAP)
            rows = await conn.fetch("SELECT name, checksum FROM coordinator.schema_migrations")
            done = {r["name"]: r["checksum"] for r in rows}
            for m in migrations:
                if m.name in done:
                    if done[m.name] != m.checksum:
                        raise DatabaseError(
                            f"migration {m.name} was applied from another version of that "
                            f"file (recorded checksum {done[m.name][:12]}, this build's "
                            f"{m.checksum[:12]}): this database was migrated by another "
                            "build of coordinator; nothing was changed. Run the build that "
                            "migrated it, or restore the database from before that migrate"
                        )
                    continue
                doing = f"applying {m.name}"
                await conn.execute(m.sql)
                await conn.execute(
                    "INSERT INTO coordinator.schema_migrations (name, checksum) VALUES ($1, $2)",
                    m.name,
                    m.checksum,
                )
                applied_now.append(m.name)
            doing = "committing"

    try:
        await aio(run)()
    except asyncpg.InsufficientPrivilegeError as exc:
        # (Asked once the failed transaction has rolled back.)
        raise DatabaseError(await aio(_not_owner)(conn, exc)) from None
    except Exception as exc:
        if not _lost(conn, exc):
            raise
        # (asyncpg's own words were "cannot call Transaction.__aexit__(): the underlying
        # connection is closed", a tester's finding: not which file, nor what to do.)
        kept = (
            "whether it committed is unknown: run it again (it applies only what is missing)"
            if doing == "committing"
            else "nothing of this migrate was kept (the pending files go in one "
            "transaction): run it again"
        )
        raise DatabaseUnavailable(
            f"connection lost while {doing} ({one_line(exc)}); {kept}"
        ) from exc
    return applied_now


def _lost(conn: Connection, exc: BaseException) -> bool:
    """``exc`` is the connection going away (not a statement's error): the connection
    broken (SQLSTATE class 08), the server shutting down or the session terminated
    (57P01-57P03, e.g. ``pg_terminate_backend``), the socket broken, or asyncpg's
    refusal to go on with a closed connection. Not a statement cancelled (57014: a
    ``statement_timeout``, which running it again would meet again)."""
    if isinstance(exc, asyncpg.PostgresError):
        state = str(exc.sqlstate or "")
        return state[:2] == "08" or state in ("57P01", "57P02", "57P03") or conn.is_closed()
    if isinstance(exc, (OSError, asyncpg.ConnectionDoesNotExistError)):
        return True
    return isinstance(exc, asyncpg.InterfaceError) and conn.is_closed()


async def _up_to_date(conn: Connection, migrations: list[Migration]) -> bool:
    """Every migration recorded, each with this build's checksum, as far as the current
    role may read the record (``False`` when it may not, or there is none)."""
    readable = await conn.fetchval(
        "SELECT has_schema_privilege(n.oid, 'USAGE') AND has_table_privilege(c.oid, 'SELECT')"
        "  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'coordinator' AND c.relname = 'schema_migrations'"
    )
    if not readable:
        return False
    rows = await conn.fetch("SELECT name, checksum FROM coordinator.schema_migrations")
    done = {r["name"]: r["checksum"] for r in rows}
    return all(done.get(m.name) == m.checksum for m in migrations)


async def _not_owner(conn: Connection, exc: Exception) -> str:
    """The refusal of a role that may not change the schema, with who may."""
    owner = await conn.fetchval(
        "SELECT pg_catalog.pg_get_userbyid(nspowner) FROM pg_catalog.pg_namespace"
        " WHERE nspname = 'coordinator'"
    )
    who = f"the schema's owner ({owner}) or a superuser" if owner else "the database's owner"
    return (
        f"{exc}: migrations are applied by {who}, as `coordinator migrate --dsn ...`; "
        f"{await conn.fetchval('SELECT current_user')} may not"
    )


async def pending(conn: Connection, migrations: list[Migration] | None = None) -> list[str]:
    """Names of migrations not yet applied (all of them on an empty database)."""
    migrations = migrations if migrations is not None else load_migrations()
    exists = await aio(conn.fetchval)("SELECT to_regclass('coordinator.schema_migrations')")
    if exists is None:
        return [m.name for m in migrations]
    rows = await aio(conn.fetch)("SELECT name FROM coordinator.schema_migrations")
    done = {r["name"] for r in rows}
    return [m.name for m in migrations if m.name not in done]
