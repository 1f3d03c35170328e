"""The package's modules import each other without a circle.

Every ``import``/``from ... import`` inside python/symmem (at module level or
inside a function: a deferred import is still a dependency) is read with ast
and the graph of package-internal edges must have no cycle."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "symmem"


def module_name(path):
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def internal_imports(path, modules):
    """The package modules that path imports."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # "from . import x" names module x, or a name of the package's
            # __init__ (an edge to the package itself).
            for a in node.names:
                if f"{target}.{a.name}" in modules:
                    found.add(f"{target}.{a.name}")
                elif target in modules:
                    found.add(target)
            if target in modules and node.module is not None:
                found.add(target)
    found.discard(me)
    return found


def import_graph():
    files = sorted(PKG.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): internal_imports(f, modules) for f in files}


def find_cycle(graph):
    """One cycle as a list of modules, or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                cycle = visit(n)
                if cycle:
                    return cycle
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def test_graph_sees_the_package():
    graph = import_graph()
    assert "symmem._lib" in graph["symmem.allocator"]
    assert "symmem.errors" in graph["symmem._lib"]
    assert "symmem._lib" not in graph["symmem.errors"]


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
