"""The layering of docs/design.md ("Layers"), enforced on the source: who may import whom.

Every import statement of every module is read (``TYPE_CHECKING`` ones included),
relative imports are resolved, and each package module's imports of the package are
checked against the rules below. A process-level check pins that the worker SDK loads
without the database stack.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import coordinator

PACKAGE = Path(coordinator.__file__).parent

#: Modules that hold values and pure logic: no I/O of their own, no shell.
VALUES = {
    "coordinator",
    "coordinator.backoff",
    "coordinator.buckets",
    "coordinator.clock",
    "coordinator.errors",
    "coordinator.events",
    "coordinator.log",
    "coordinator.model",
    "coordinator.policies",
    "coordinator.protocol",
    "coordinator.redact",
    "coordinator.schedule",
    "coordinator.status",
    "coordinator.text",
    "coordinator.tokens",
}
#: The worker SDK and what it may load (it runs in other people's processes).
SDK = {"coordinator.worker", "coordinator.protocol", "coordinator.errors", "coordinator.text",
       "coordinator.backoff", "coordinator.config", "coordinator.redact",
       "coordinator.tokens"}  # fmt: skip


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, *, at_import: bool = False) -> set[str]:
    """Every ``coordinator...`` module ``path`` imports (the module, or module.name);
    ``at_import``: only those loaded when the module is imported (not inside functions)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    nodes = _module_level(tree) if at_import else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("coordinator")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.startswith("coordinator"):
                found.add(target)
                found |= {f"{target}.{a.name}" for a in node.names}
    return found


def _module_level(tree: ast.Module) -> list[ast.AST]:
    """Statements run at import: the body, and the bodies of its ``if``/``try`` blocks."""
    out: list[ast.AST] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If | ast.Try):
            todo.extend(node.body)
            todo.extend(node.orelse)
    return out


def modules(*, at_import: bool = False) -> dict[str, set[str]]:
    return {module_name(p): imports_of(p, at_import=at_import) for p in PACKAGE.rglob("*.py")}


def under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def violations(rule: str, owners: set[str], forbidden: set[str]) -> list[str]:
    out = []
    for owner, imported in modules().items():
        if owner not in owners:
            continue
        for target in sorted(imported):
            if any(under(target, f) for f in forbidden):
                out.append(f"{rule}: {owner} imports {target}")
    return out


def owners(prefix: str) -> set[str]:
    return {m for m in modules() if under(m, prefix)}


def test_core_imports_nothing_of_the_package_but_itself() -> None:
    bad = [
        f"{owner} imports {target}"
        for owner, imported in modules().items()
        if under(owner, "coordinator.core")
        for target in imported
        if not under(target, "coordinator.core")
    ]
    assert bad == []


def test_value_modules_import_no_shell() -> None:
    allowed = VALUES | {"coordinator.core"}
    bad = [
        f"{owner} imports {target}"
        for owner, imported in modules().items()
        if owner in VALUES - {"coordinator"}  # the package's lazy exports are checked below
        for target in imported
        if not any(under(target, a) for a in allowed) and target not in VALUES
    ]
    assert bad == []


def test_admin_imports_no_daemon_internals() -> None:
    forbidden = {"coordinator.daemon", "coordinator.store", "coordinator.listener",
                 "coordinator.executors", "coordinator.service", "coordinator.cli"}  # fmt: skip
    assert violations("admin", owners("coordinator.admin"), forbidden) == []


def test_executors_import_no_daemon_or_store() -> None:
    forbidden = {"coordinator.daemon", "coordinator.store", "coordinator.db",
                 "coordinator.listener", "coordinator.admin", "coordinator.service",
                 "coordinator.cli", "coordinator.client", "coordinator.spool"}  # fmt: skip
    assert violations("executors", owners("coordinator.executors"), forbidden) == []


def test_alerts_import_no_daemon_or_face() -> None:
    """Alerts are a subscriber of the daemon's events: the service attaches them; they
    send their one statement through the store's method handed to them."""
    forbidden = {"coordinator.daemon", "coordinator.admin", "coordinator.service",
                 "coordinator.cli", "coordinator.client", "coordinator.executors",
                 "coordinator.listener", "coordinator.db"}  # fmt: skip
    assert violations("alerts", owners("coordinator.alerts"), forbidden) == []


def test_the_daemon_imports_no_face() -> None:
    forbidden = {"coordinator.admin", "coordinator.service", "coordinator.cli",
                 "coordinator.client", "coordinator.alerts"}  # fmt: skip
    assert violations("daemon", owners("coordinator.daemon"), forbidden) == []


def test_only_the_service_imports_the_daemon() -> None:
    users = {
        owner
        for owner, imported in modules().items()
        if not under(owner, "coordinator.daemon")
        and any(under(t, "coordinator.daemon") for t in imported)
    }
    assert users <= {"coordinator.service"}


def test_the_worker_sdk_imports_only_what_it_needs() -> None:
    """At import; a function may load more when it is called (the CLI reads the shared
    configuration file to find the socket)."""
    table = modules(at_import=True)
    bad = [
        f"{owner} imports {target}"
        for owner in SDK
        for target in table[owner]
        if not any(under(target, allowed) for allowed in SDK)
    ]
    assert bad == []


def test_import_of_the_worker_sdk_leaves_the_database_stack_out() -> None:
    code = (
        "import sys, coordinator.worker\n"
        "heavy = [m for m in ('asyncpg', 'trio_asyncio', 'croniter', 'coordinator.client',"
        " 'coordinator.db') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


def test_the_package_exports_load_lazily_and_all_resolve() -> None:
    code = (
        "import sys, coordinator\n"
        "assert 'asyncpg' not in sys.modules, 'import coordinator loaded asyncpg'\n"
        "for name in coordinator.__all__: getattr(coordinator, name)\n"
        "assert 'asyncpg' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
