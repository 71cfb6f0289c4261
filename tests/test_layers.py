"""The import graph of `nasplat/`, read with `ast`: no circle, and no import from a lower layer to a higher one.

The layers are listed once, here, lowest first (docs/design.md draws them). A module may import from a lower
layer, or from its own package; two packages of one layer do not import each other. Every import counts: at
module level, inside a function, or under `TYPE_CHECKING`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "nasplat"

LAYERS: list[tuple[str, ...]] = [
    ("core",),                                  # checks, row schema and statuses, registry, trees, Pareto math
    ("space",),                                 # domains, Space, conversion from Tune and Optuna
    ("storage", "trainer"),                     # files, folders, URIs, checkpoints; the Trainer contract
    ("controllers", "distributed", "oneshot"),  # search strategies; data-parallel backends; supernets
    ("schedulers",),                            # ASHA, Hyperband, median: wrap a controller
    ("executors",),                             # where trials run: local, processes, simulated, Ray (gangs)
    ("engine",),                                # the loop, outbox, replay, records, the result read back
    ("integrations",),                          # Tune, Optuna, MLflow, TensorBoard, Ray dashboard, export
    ("experiment", "report"),                   # building and running an experiment; the HTML report
    ("cli", ""),                                # the command line and the package's public face
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The nasplat modules `name` imports: `from a import b` names the module `a.b` where that is one, else `a`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {target for target in found if target in known and target != name}


def layer_of(name: str) -> tuple[int, str]:
    """(layer index, top package) of a module of nasplat."""
    top = name.split(".")[1] if "." in name else ""
    for index, packages in enumerate(LAYERS):
        if top in packages:
            return index, top
    raise AssertionError(f"{name} is in no layer: add its package to LAYERS (and to docs/design.md)")


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def test_every_module_is_in_a_layer_and_imports_only_down_or_within_its_package() -> None:
    upward = []
    for source, targets in graph().items():
        low, top = layer_of(source)
        for target in targets:
            level, package = layer_of(target)
            if level > low or (level == low and package != top):
                upward.append(f"{source} (layer {low}) imports {target} (layer {level})")
    assert not upward, "imports that run up or across layers:\n" + "\n".join(sorted(upward))


def test_the_import_graph_has_no_circle() -> None:
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    circles: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not circles, "import circles:\n" + "\n".join(circles)


@pytest.mark.parametrize("source, expected", [
    ("from nasplat.engine.loop import Engine", {"nasplat.engine.loop"}),
    ("from nasplat.report import plots", {"nasplat.report.plots"}),
    ("from . import loop\nfrom .records import Budget", {"nasplat.engine.loop", "nasplat.engine.records"}),
    ("def f():\n    import nasplat.core.checks", {"nasplat.core.checks"}),
])
def test_the_reader_sees_every_kind_of_import(tmp_path: Path, source: str, expected: set[str]) -> None:
    """The checks above are only as good as this reader: absolute, relative and deferred imports all count."""
    fake = PACKAGE / "engine" / "outbox.py"
    probe = tmp_path / "probe.py"
    probe.write_text(source)
    known = set(modules())
    assert imports("nasplat.engine.outbox", probe if probe.exists() else fake, known) == expected


def test_an_upward_import_is_caught() -> None:
    """A core module importing the engine would be reported (the layer check is not vacuous)."""
    low, _ = layer_of("nasplat.core.checks")
    high, _ = layer_of("nasplat.engine.loop")
    assert low < high and layer_of("nasplat")[0] == len(LAYERS) - 1
