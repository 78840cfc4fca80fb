"""The package's shape, as a new maintainer meets it: data flows one way (no import circle, imports inside functions
counted), no module imports another's underscore names,
short functions and modules, a README for users whose layout section names the package's modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "whisperane"
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 480  # the house rule is ~450; the longest modules (convert/sources.py, decoding.py) sit just above
MAX_README_LINES = 260
# Import circles allowed, as edges (importer, imported) taken out of the graph before it is searched, each with its
# reason: none. An entry would have to be an import made inside a function.
ALLOWED_CIRCLE_EDGES: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_from(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute name of the module an ``import from`` statement reads."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def type_checking_only(tree: ast.AST) -> set[int]:
    """The nodes inside the body of an ``if TYPE_CHECKING:`` (never executed; its ``else`` is)."""
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and is_type_checking(node.test)
            for statement in node.body for n in ast.walk(statement)}


def imports(module: str, path: Path, type_checking: bool = False) -> list[tuple[str, list[str], bool]]:
    """(imported module, names taken from it, whether the import is inside a function) of every import statement
    anywhere in the file (module level, functions, methods, try blocks); those under ``if TYPE_CHECKING:`` only
    with ``type_checking``: they never execute, so they cannot close a circle."""
    tree = ast.parse(path.read_text())
    in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f)}
    skipped = set() if type_checking else type_checking_only(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            found.append((imported_from(module, path, node), [a.name for a in node.names], id(node) in in_function))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], id(node) in in_function) for a in node.names]
    return found


def import_edges() -> dict[tuple[str, str], bool]:
    """Every import between whisperane's modules, (importer, imported) -> whether every such import is inside a
    function. ``from P import n`` reads submodule P.n where n is one, else P (a package's ``__init__``);
    ``import a.b`` reads a.b. The parent packages an import initializes on the way are not edges (every module
    would then sit in a circle with ``whisperane/__init__``); an explicit import of a package is."""
    edges: dict[tuple[str, str], bool] = {}
    for module, path in MODULES.items():
        for source, names, lazy in imports(module, path):
            submodules = [f"{source}.{n}" for n in names if f"{source}.{n}" in MODULES]
            targets = submodules + ([source] if len(submodules) < len(names) or not names else [])
            for target in targets:
                if target in MODULES and target != module:
                    edges[module, target] = edges.get((module, target), True) and lazy
    return edges


def import_graph(allowed=ALLOWED_CIRCLE_EDGES) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for importer, imported in import_edges():
        if (importer, imported) not in allowed:
            graph[importer].add(imported)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one node (a module cannot import itself here), each
    sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def shortest_circle(start: str, graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from ``start`` back to itself (breadth first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node]):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    return []


def describe(component: list[str], graph: dict[str, set[str]]) -> str:
    inside = set(component)
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & inside)]
    return (f"circle of {len(component)} modules: " + ", ".join(component)
            + "\n    e.g. " + " -> ".join(shortest_circle(component[0], graph)) + "\n    edges: " + "; ".join(edges))


def test_the_checker_finds_circles():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "a"}}) == [["a", "b"], ["c", "d"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []
    assert shortest_circle("a", {"a": {"b", "c"}, "b": {"d"}, "c": {"a"}, "d": {"a"}}) == ["a", "c", "a"]


def test_the_walk_sees_every_kind_of_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nimport x.y\nfrom . import sub, name\n"
                      "if TYPE_CHECKING:\n    import hidden\nelse:\n    import shown\n"
                      "def f():\n    from ..up import thing\n")
    found = imports("pkg.inner.m", source)
    assert ("x.y", [], False) in found and ("pkg.inner", ["sub", "name"], False) in found
    assert ("pkg.up", ["thing"], True) in found and ("shown", [], False) in found
    assert not any(name == "hidden" for name, _, _ in found)
    edges = import_edges()
    assert ("whisperane.transcribe", "whisperane.longform.seek") in edges  # module level
    assert edges[("whisperane.transcribe", "whisperane.diarize.pipeline")]  # inside a function
    assert ("whisperane.longform.seek", "whisperane.vad.stream") not in edges  # under TYPE_CHECKING only


def test_no_import_circle():
    """Imports inside functions count: a lazy import only moves the circle from import time to call time."""
    edges = import_edges()
    for edge, reason in ALLOWED_CIRCLE_EDGES.items():
        assert edges.get(edge), f"allowed edge {edge} ({reason}) is gone or no longer lazy: take it off the list"
    graph = import_graph()
    circles = strongly_connected(graph)
    assert circles == [], "import circles:\n  " + "\n  ".join(describe(c, graph) for c in circles)


def test_no_module_imports_another_modules_private_names():
    private = [f"{path.relative_to(REPO)}: from {source} import {name}"
               for module, path in MODULES.items() for source, names, _ in imports(module, path, type_checking=True)
               for name in names
               if source.startswith("whisperane") and name.startswith("_") and not name.startswith("__")]
    assert private == []


@pytest.mark.parametrize("folder", ["tests", "benchmarks"])
def test_tests_and_benchmarks_use_public_names(folder):
    private = [f"{path.name}: from {node.module} import {a.name}"
               for path in sorted((REPO / folder).glob("*.py"))
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("whisperane")
               for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert private == []


def test_functions_are_short():
    long = [(node.end_lineno - node.lineno + 1, f"{path.relative_to(REPO)}:{node.name}")
            for path in MODULES.values() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def test_modules_are_short():
    long = [(n, str(path.relative_to(REPO))) for path in MODULES.values()
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert long == []


def test_readme_is_short_and_its_layout_names_the_packages_modules():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) < MAX_README_LINES
    layout = text[text.index("## Layout"):]
    named = set(re.findall(r"[\w]+\.py|[\w]+/", layout))
    top_level = {p.name for p in PACKAGE.glob("*.py")} | {p.name + "/" for p in PACKAGE.iterdir()
                                                          if p.is_dir() and (p / "__init__.py").exists()}
    assert top_level - {"__main__.py"} <= named, top_level - named
    for package in ("runtime", "longform", "vad", "ray_batch"):
        assert {p.name for p in (PACKAGE / package).glob("*.py")} - {"__init__.py", "__main__.py"} <= named, package
    assert named & {"chunked.py", "vad_graph.py", "batch_shards.py", "bundle.py"} <= {"bundle.py"}


def test_design_references_resolve():
    design = (REPO / "docs" / "DESIGN.md").read_text()
    sections = set(re.findall(r"^## (\d+)\.", design, re.M))
    cited = {(str(path.relative_to(REPO)), n)
             for path in [*MODULES.values(), *(REPO / "tests").glob("*.py")]
             for ref in re.findall(r"DESIGN\.md (§[\d§, -]+)", path.read_text())
             for n in re.findall(r"\d+", ref)}
    assert cited and {n for _, n in cited} <= sections, sorted(c for c in cited if c[1] not in sections)
    assert all("docs/DESIGN.md" in path.read_text() for path in MODULES.values() if "DESIGN.md" in path.read_text())

