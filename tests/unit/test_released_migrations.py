"""A migration that has landed never changes.

`coordinator migrate` records each applied file's checksum and refuses a database whose
recorded file differs from this build's (`coordinator/migrate.py`): a database migrated
by one build could otherwise never be upgraded by the next. Two files were edited after
their first commit once (0029 and 0030, 2026-12-02), and a database migrated in between
is still refused (that is not mended here). `migrations/released.sha256` (the output of
``sha256sum`` in `migrations/`, so ``sha256sum -c`` checks it too) pins every file: an
edit to a released file fails here unless its pinned line is changed too, which then
shows in review as a changed line of the manifest -- to be refused. A new migration
gets its line when it is written; its line may change only until the commit that adds
it lands.
"""

from __future__ import annotations

from coordinator.migrate import load_migrations, migrations_dir

MANIFEST = migrations_dir() / "released.sha256"


def _pinned() -> dict[str, str]:
    pinned: dict[str, str] = {}
    for line in MANIFEST.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        pinned[name.lstrip("*")] = digest
    return pinned


def test_every_migration_file_is_pinned_and_unchanged() -> None:
    pinned = _pinned()
    # (The checksum `migrate` records: a database's schema_migrations rows compare
    # with these lines too.)
    files = {m.name: m.checksum for m in load_migrations()}
    changed = sorted(n for n in files if n in pinned and pinned[n] != files[n])
    assert not changed, f"released migrations edited: {changed}; write a new numbered file instead"
    unpinned = sorted(set(files) - set(pinned))
    assert not unpinned, f"add these to {MANIFEST.name} (sha256sum): {unpinned}"
    missing = sorted(set(pinned) - set(files))
    assert not missing, f"pinned migrations missing from the build: {missing}"
