"""The product packages import each other without a cycle (imports inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path

from repository_loader.ensemble_rules import find_cycle

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("repository_loader", "deployments", "ensembles", "bench")


def _modules() -> dict[str, Path]:
    """Module name -> source file, for every module of the product packages (generated code left out)."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "_pb2" in path.name:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ``modules`` that ``name`` (a module or a name inside one) belongs to."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported_names(module: str, path: Path) -> list[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the product modules it imports (a parent package, which runs anyway, left out)."""
    modules = _modules()
    edges: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = {_resolve(name, modules) for name in _imported_names(module, path)}
        edges[module] = {
            t for t in targets if t is not None and t != module and not module.startswith(f"{t}.")
        }
    return edges


def test_the_walk_sees_the_packages_and_their_imports() -> None:
    edges = import_graph()
    assert {m.split(".")[0] for m in edges} == set(PACKAGES)
    assert "repository_loader.model" in edges["ensembles.graph"]
    assert "deployments.runtime.model" in edges["ensembles.backend"]


def test_no_import_cycle() -> None:
    edges = import_graph()
    cycle = find_cycle(lambda module: edges[module], edges)
    assert not cycle, "import cycle: " + " -> ".join(cycle)
