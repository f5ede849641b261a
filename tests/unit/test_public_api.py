"""The package's public surface is deliberate: this list changes only on purpose."""

from __future__ import annotations

import ast
from pathlib import Path

import coordinator

EXPECTED = {
    "ConfigError",
    "Conflict",
    "Context",
    "CoordinatorError",
    "DatabaseError",
    "DatabaseUnavailable",
    "InvalidInput",
    "InvalidSchedule",
    "Job",
    "JobNotFound",
    "Outcome",
    "RunNotFound",
    "Schedule",
    "Target",
    "Worker",
    "__version__",
    "client",
}


def test_public_names() -> None:
    assert set(coordinator.__all__) == EXPECTED
    for name in EXPECTED:
        assert hasattr(coordinator, name), name


def test_pure_core_imports_nothing_from_the_shell() -> None:
    """core/ may import its own siblings (``from .x``) but nothing else of the package."""
    core = Path(coordinator.__file__).parent / "core"
    for path in core.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.level <= 1, (path.name, node.module)
                assert node.level == 1 or not (node.module or "").startswith("coordinator"), (
                    path.name,
                    node.module,
                )
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("coordinator"), (path.name, alias.name)
