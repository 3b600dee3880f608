"""The package's imports run one way (README, "How the collection is built"): no circle among the modules of
helpers/, counting imports inside functions too (a type-checking import is not one), the base, which
every notebook, test and the grader import first, imports nothing above it, at most three imports run up the
README's layers, and no module of helpers/ is over 800 lines."""
from __future__ import annotations

import ast
from pathlib import Path

HELPERS = Path(__file__).resolve().parent.parent / "helpers"
BASE = {"helpers.env", "helpers.events", "helpers.files", "helpers.processes", "helpers.device", "helpers.bench",
        "helpers.checks", "helpers.manifest", "helpers.notebooks"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in HELPERS.rglob("*.py"):
        name = ".".join(path.relative_to(HELPERS.parent).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _type_checking_nodes(tree) -> set[int]:
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
            for n in ast.walk(node)}


# the README's layers, bottom up, by the module's name under helpers (its package for a subpackage's modules);
# a module not named is a topic module
LAYERS = {"env": 0, "events": 0, "files": 0, "processes": 0, "device": 1, "bench": 2, "manifest": 2, "checks": 2,
          "notebooks": 2, "interactive": 4, "progress": 4, "colab": 4, "doctor": 4, "runner": 5, "validation": 5,
          "capstone": 5, "capstone_timing": 5, "grading": 5, "__main__": 6}
TOPIC = 3
MOST_ARROWS_UP = 3
MOST_LINES = 800


def layer(module: str) -> int:
    return LAYERS.get(module.split(".")[1], TOPIC) if "." in module else 0   # the package: imported first


def import_graph() -> dict[str, set[str]]:
    """module -> the helpers modules it imports (`from package import submodule` names the submodule)."""
    modules, graph = _modules(), {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        skip, edges = _type_checking_nodes(tree), set()
        for node in ast.walk(tree):
            if id(node) in skip or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = package
                for _ in range(max(node.level - 1, 0)):
                    base = base.rpartition(".")[0]
                source = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
                submodules = [f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in modules]
                targets = submodules if len(submodules) == len(node.names) else submodules + [source]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target != "helpers":
                    edges.add(target)
        graph[name] = edges
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                on_stack.discard(w)
                component.append(w)
            on_stack.discard(v)
            if component:
                found.append(sorted(component + [v]))
    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_circle_among_the_modules():
    graph = import_graph()
    assert len(graph) > 50 and sum(map(len, graph.values())) > 150    # the graph is read, not empty
    assert _circles(graph) == []


def test_a_circle_is_found_where_there_is_one():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_base_imports_nothing_above_it():
    graph = import_graph()
    assert BASE <= set(graph)
    assert {m: sorted(graph[m] - BASE) for m in BASE if graph[m] - BASE} == {}


def test_few_imports_run_up_the_layers():
    """Today one: the package's __init__ subscribes the learner's log when a kernel starts (helpers.progress)."""
    graph = import_graph()
    up = sorted((a, b) for a, targets in graph.items() for b in targets if layer(b) > layer(a))
    assert ("helpers", "helpers.progress") in up and len(up) <= MOST_ARROWS_UP, up


def test_no_module_is_over_800_lines():
    long = {str(p.relative_to(HELPERS)): n for p in HELPERS.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MOST_LINES}
    assert long == {}, long
