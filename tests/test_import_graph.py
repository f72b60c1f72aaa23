"""The product packages import each other without a cycle and only downwards through the declared layers
(imports inside functions included, and modules named by a dotted string, as importlib loads them); the
layers below the serving layer never import Ray."""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

from repository_loader.ensemble_rules import find_cycle

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("repository_loader", "deployments", "ensembles", "bench")

# The declared layers, lowest first. A module may import modules of its own unit, of any unit in a lower
# layer, and of the units of its own layer that SAME_LAYER allows; never upwards. A unit is a package
# or module and everything below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    # config vocabulary, errors, storage, validation, the deployment plan
    ("repository_loader",),
    # what an inference is, tensors, the server's settings, the custom metric families, tracing
    (
        "deployments.tensors",
        "deployments.inference",
        "deployments.settings",
        "deployments.custom_metrics",
        "deployments.tracing",
        "deployments.timeouts",
    ),
    # the execution layer: a backend per framework and the registry of them
    ("deployments.backends",),
    # a model in a process: schedulers, statistics, metrics; it creates backends through the registry
    ("deployments.runtime",),
    # an ensemble backend runs hosted composing models through the runtime, so ensembles sit above it
    # (they register their backend with the registry, which names no ensembles module)
    ("ensembles",),
    # front ends (HTTP, gRPC, /metrics) over the data plane; model control and the repository index
    ("deployments.protocol", "deployments.control"),
    # the data plane a model replica serves, over its runtime
    ("deployments.replica",),
    # everything Ray Serve, uvicorn or HAProxy
    ("deployments.serve",),
    # the triton-serve command (validate, serve)
    ("deployments.cli", "deployments.__main__"),
)
# (importer, imported) units of one layer that may depend on each other in that direction
SAME_LAYER: frozenset[tuple[str, str]] = frozenset(
    {
        ("deployments.inference", "deployments.tensors"),
        ("deployments.inference", "deployments.tracing"),  # a request's place in its trace
        ("deployments.settings", "deployments.tracing"),  # --trace-config
        ("deployments.control", "deployments.protocol"),
        ("deployments.__main__", "deployments.cli"),
    }
)
# Outside the product layers: may import anything (tools/ is not walked at all).
UNLAYERED = ("bench",)
# A package made of units: its own __init__ imports nothing, and importing it names no layer.
PACKAGE_ROOTS = ("deployments",)
# Every unit below deployments.serve is Ray-free.
RAY_FREE = tuple(unit for layer in LAYERS[: LAYERS.index(("deployments.serve",))] for unit in layer)

# (module, imported module) pairs that break the layers today, each to be fixed and removed from here;
# the test fails on any other violation, and on an entry that no longer occurs.
KNOWN_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()


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


def _imported_names(module: str, path: Path, modules: Collection[str] = ()) -> list[str]:
    """Every name ``module`` imports, and each string constant that is the dotted name of one of ``modules``
    (a module loaded by name: ``importlib.import_module("deployments.backends.python")``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "." in node.value and node.value in modules:
                names.append(node.value)
        elif isinstance(node, ast.Import):
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
    """Module -> the product modules it imports or names (a parent package, which runs anyway, left out)."""
    modules = _modules()
    edges: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = {_resolve(name, modules) for name in _imported_names(module, path, modules)}
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


def _within(module: str, unit: str) -> bool:
    return module == unit or module.startswith(f"{unit}.")


def _layer_of() -> dict[str, int]:
    return {unit: level for level, layer in enumerate(LAYERS) for unit in layer}


def _unit(module: str) -> str | None:
    """The declared unit ``module`` belongs to (the longest that holds it), None where none does."""
    units = [unit for unit in _layer_of() if _within(module, unit)]
    return max(units, key=len) if units else None


def _may_import(importer: str, imported: str) -> bool:
    layer = _layer_of()
    return (
        importer == imported
        or layer[imported] < layer[importer]
        or (layer[imported] == layer[importer] and (importer, imported) in SAME_LAYER)
    )


def layer_violations() -> set[tuple[str, str]]:
    """Every (module, imported module) that imports upwards or across the declared layers."""
    found = set()
    for module, targets in import_graph().items():
        if module.startswith(UNLAYERED) or module in PACKAGE_ROOTS:
            continue
        importer = _unit(module)
        assert importer is not None, f"{module} belongs to no declared layer: add it to LAYERS"
        for target in targets - set(PACKAGE_ROOTS):
            imported = _unit(target)
            assert imported is not None, f"{target} (imported by {module}) belongs to no declared layer"
            if not _may_import(importer, imported):
                found.add((module, target))
    return found


def test_the_layer_table_is_consistent() -> None:
    units = [unit for layer in LAYERS for unit in layer]
    assert len(units) == len(set(units))
    for importer, imported in SAME_LAYER:
        assert _layer_of()[importer] == _layer_of()[imported], (importer, imported)
        assert (imported, importer) not in SAME_LAYER
    # every module of the product packages belongs to a unit, or is outside the layers
    for module in import_graph():
        assert module.startswith(UNLAYERED) or module in PACKAGE_ROOTS or _unit(module), module


def test_package_roots_import_nothing() -> None:
    edges = import_graph()
    for root in PACKAGE_ROOTS:
        assert not edges[root], f"{root}/__init__.py imports {sorted(edges[root])}"


def test_imports_follow_the_declared_layers() -> None:
    found = layer_violations()
    new = sorted(found - KNOWN_VIOLATIONS)
    assert not new, "imports against the declared layers (lower may not import higher):\n" + "\n".join(
        f"  {module} -> {target}" for module, target in new
    )
    gone = sorted(KNOWN_VIOLATIONS - found)
    assert not gone, f"fixed, remove from KNOWN_VIOLATIONS: {gone}"


def test_the_check_sees_an_upward_import() -> None:
    assert not _may_import("deployments.backends", "deployments.runtime")
    assert not _may_import("repository_loader", "ensembles")
    assert not _may_import("deployments.protocol", "deployments.control")
    assert not _may_import("deployments.runtime", "deployments.serve")
    assert _may_import("deployments.runtime", "deployments.backends")
    assert _may_import("ensembles", "deployments.runtime")
    assert _unit("deployments.serve.model_app") == "deployments.serve"
    assert _unit("deployments.serve_x") is None


def _ray_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found += [f"{path.relative_to(ROOT)}:{node.lineno} {name}" for name in names if _within(name, "ray")]
    return found


def test_the_layers_below_serve_never_import_ray() -> None:
    found = [
        place
        for module, path in _modules().items()
        if any(_within(module, unit) for unit in RAY_FREE)
        for place in _ray_imports(path)
    ]
    assert not found, "Ray imported below deployments.serve:\n" + "\n".join(found)
    assert "deployments.runtime" in RAY_FREE and "deployments.serve" not in RAY_FREE
