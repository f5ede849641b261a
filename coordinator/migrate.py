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

import attrs

from .db import aio
from .errors import DatabaseError

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

    async def run() -> None:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATE_LOCK_KEY)
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
                await conn.execute(m.sql)
                await conn.execute(
                    "INSERT INTO coordinator.schema_migrations (name, checksum) VALUES ($1, $2)",
                    m.name,
                    m.checksum,
                )
                applied_now.append(m.name)

    await aio(run)()
    return applied_now


async def pending(conn: Connection, migrations: list[Migration] | None = None) -> list[str]:
    """Names of migrations not yet applied (all of them on an empty database)."""
    migrations = migrations if migrations is not None else load_migrations()
    exists = await aio(conn.fetchval)("SELECT to_regclass('coordinator.schema_migrations')")
    if exists is None:
        return [m.name for m in migrations]
    rows = await aio(conn.fetch)("SELECT name FROM coordinator.schema_migrations")
    done = {r["name"] for r in rows}
    return [m.name for m in migrations if m.name not in done]
