"""The package's shape, as a new maintainer meets it: data flows one way (no import circle but
``WhisperaneModel.transcribe``'s lazy import of the entry point), no module imports another's underscore names,
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
ALLOWED_BACK_EDGES = {("whisperane.runtime.model", "whisperane.transcribe")}  # lazy, inside model.transcribe


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


def imports(module: str, path: Path) -> list[tuple[str, list[str], bool]]:
    """(imported module, names taken from it, whether the import is inside a function) of every import."""
    tree = ast.parse(path.read_text())
    in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found.append((imported_from(module, path, node), [a.name for a in node.names], id(node) in in_function))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], id(node) in in_function) for a in node.names]
    return found


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for source, names, lazy in imports(module, path):
            targets = [source, *(f"{source}.{n}" for n in names)]
            for target in targets:
                if target not in MODULES or target == module:
                    continue
                if path.name == "__init__.py" and target.startswith(module + "."):
                    continue  # a package's own modules
                if lazy and (module, target) in ALLOWED_BACK_EDGES:
                    continue
                graph[module].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_checker_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle():
    graph = import_graph()
    assert "whisperane.longform.seek" in graph["whisperane.transcribe"]  # the walk sees the imports
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_no_module_imports_another_modules_private_names():
    private = [f"{path.relative_to(REPO)}: from {source} import {name}"
               for module, path in MODULES.items() for source, names, _ in imports(module, path)
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
