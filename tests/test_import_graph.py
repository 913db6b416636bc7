"""No import cycle among the product modules, counted on the static import graph.

Every `import` and `from ... import` of harness/, runners/, attacks/ and metrics/ is an edge, a function-local
one as much as a module-level one: a function-local import hides a cycle from Python's import order, not
from the design (docs/architecture.md, "Layers"). An edge goes to the module an import names (`from
harness import configurations`: harness.configurations; `from runners.report import main`: the package's
__init__), not to the packages Python initialises on the way. Lazy imports of heavy libraries (torch,
transformers) are not product modules and stay as they are.
"""
from __future__ import annotations

import ast
from pathlib import Path

from harness import systems

from .conftest import REPO

PACKAGES = ("harness", "runners", "attacks", "metrics")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _module(name: str, modules: dict[str, Path]) -> set[str]:
    """The product module `name` names: itself, or the longest product package or module it lies in (an
    attribute of a module: `from harness.results import RunDir` names harness.results); none outside."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in modules:
            return {".".join(parts[:i])}
    return set()


def import_graph() -> dict[str, set[str]]:
    """module → the product modules it imports (anywhere in the file)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    edges |= _module(alias.name, modules)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in node.names:   # `from harness import configurations` imports a module
                    edges |= _module(f"{base}.{alias.name}", modules)
        edges.discard(module)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(component, graph) for component in sorted(components)]


def _cycle_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first inside the component)."""
    start, inside = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & inside):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {component}")


def test_the_graph_sees_function_local_imports_and_cycles():
    """The checker itself: it finds a module-level and a function-local edge, and the cycle they close."""
    graph = import_graph()
    assert "harness.configurations" in graph["harness.schema"]       # module level: from harness import configurations
    assert "harness.workloads" in graph["harness.schema"]            # function-local, in _check_input_files
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_product_modules():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_metrics_import_no_system_library():
    """metrics/ holds what any system can use: it imports no system's package (harness.collab, ...)."""
    packages = {f"harness.{name}" for name in systems.NAMES}
    graph = import_graph()
    offenders = sorted(f"{m} -> {t}" for m, targets in graph.items() if m.startswith("metrics")
                       for t in targets if any(t == p or t.startswith(p + ".") for p in packages))
    assert not offenders, offenders


def _system_of(module: str, layers: tuple[str, ...] = ("harness",)) -> str | None:
    """The system a module of `layers` belongs to (harness.collab.engine: collab; runners.splitee.fidelity and
    runners.sanitize: splitee, sanitize), None for the shared floor and the other layers."""
    parts = module.split(".")
    return parts[1] if parts[0] in layers and len(parts) > 1 and parts[1] in systems.NAMES else None


def test_no_harness_system_imports_another_systems_library():
    """A shared piece lives on the shared floor (harness/architectures.py, harness/partition.py,
    harness/token_embeddings.py), so each system's library can be read, tested or removed alone: no module of
    harness/<system>/ imports another system's. (Its attacks and runners: the next test.)"""
    graph = import_graph()
    offenders = sorted(f"{m} -> {t}" for m, targets in graph.items() if _system_of(m)
                       for t in targets if _system_of(t) not in (None, _system_of(m)))
    assert not offenders, offenders
    assert _system_of("harness.collab.engine") == "collab" and _system_of("harness.partition") is None


def test_no_attack_or_runner_of_a_system_imports_another_systems_module():
    """attacks/<system>/ and a system's runners (runners/<system>.py, runners/<system>/) import no module of
    another system, in any layer: what the gradient attackers of split FT and of the gradient audit share (BiSR(b)'s
    label matching, the constant-guess floor) is attacks/labels.py, and what fidelity needs of a sanitiser run
    (its point label) is runners/common.py's. Fails on the tree before issue 53 (attacks.grad_audit.bisr_backward
    -> attacks.splitft.bisr_backward, runners.splitee.fidelity -> harness.sanitize.config)."""
    layers = ("harness", "attacks", "runners")
    graph = import_graph()
    offenders = sorted(f"{m} -> {t}" for m, targets in graph.items() if _system_of(m, ("attacks", "runners"))
                       for t in targets if _system_of(t, layers) not in (None, _system_of(m, layers)))
    assert not offenders, offenders
    assert _system_of("attacks.splitft.label", layers) == "splitft" and _system_of("attacks.labels", layers) is None
    assert _system_of("runners.sanitize", layers) == "sanitize" and _system_of("runners.report.collab", layers) is None


def test_metrics_import_nothing_from_the_floors_above():
    """metrics/ is the ground floor: it imports nothing from harness/, attacks/ or runners/. What a metric needs
    of splitbench comes in as an argument (the cache folder metrics/semantic.py extracts a model into), and its
    errors are its own, which the caller maps to a user error (SemanticModelError -> UserError in
    runners/common.py). Fails on the tree before issue 53 (metrics.semantic -> harness.errors, harness.models)."""
    graph = import_graph()
    offenders = sorted(f"{m} -> {t}" for m, targets in graph.items() if m.split(".")[0] == "metrics"
                       for t in targets if t.split(".")[0] != "metrics")
    assert not offenders, offenders
