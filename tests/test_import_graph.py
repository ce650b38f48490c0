"""The import graph of the installed packages, read statically from the sources (no import runs).

Two rules: no cycle among the modules of ``lookupspec/``, ``gateway/`` and ``kernels/`` (installed as
``lookupspec.gateway`` and ``lookupspec.kernels``), counting the imports a module runs when it is
imported (its top level, class bodies and ``if``/``try`` blocks there; not function bodies, not
``if TYPE_CHECKING:`` blocks); and the core (``lookupspec`` less its front ends: ``commands``,
``integrations``, ``examples``) imports neither the gateway nor FastAPI, at any depth of its
module-level imports, nor anywhere in its own code.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# source folder -> the package it installs as (pyproject.toml's package-dir)
PACKAGES = {"lookupspec": "lookupspec", "gateway": "lookupspec.gateway", "kernels": "lookupspec.kernels"}
FRONT_ENDS = ("lookupspec.commands", "lookupspec.integrations", "lookupspec.examples")
FORBIDDEN_IN_CORE = ("lookupspec.gateway", "fastapi")


def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (source file, whether it is a package's ``__init__``)."""
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            init = parts[-1] == "__init__"
            if init:
                parts = parts[:-1]
            out[".".join([package, *parts])] = (path, init)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module, module_level: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of a module: those its import runs (``module_level``), or all."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not module_level:
                    visit(node.body)
            elif isinstance(node, ast.If) and module_level and _is_type_checking(node.test):
                visit(node.orelse)
            else:
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    for child in getattr(node, field, None) or []:
                        visit(getattr(child, "body", None) if isinstance(child, (ast.ExceptHandler,
                                                                                  ast.match_case))
                              else [child])

    visit(tree.body)
    return found


def _targets(node: ast.Import | ast.ImportFrom, name: str, init: bool, known: set[str]) -> list[str]:
    """The modules an import statement in module ``name`` names: ``import a.b`` -> a.b;
    ``from a import b`` -> a.b where that is a module, else a (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = name.split(".") if init else name.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    subs = [f"{base}.{alias.name}" for alias in node.names]
    return [s if s in known else base for s in subs]


def _graph(module_level: bool = True) -> dict[str, set[str]]:
    """Module -> the modules its imports name (modules of these packages, and outside ones by name)."""
    mods = _modules()
    known = set(mods)
    graph: dict[str, set[str]] = {}
    for name, (path, init) in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        graph[name] = {t for node in _imports(tree, module_level) for t in _targets(node, name, init, known)}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue  # outside these packages
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def _in(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_graph_reader_sees_this_repositorys_imports() -> None:
    """The reader resolves absolute, relative and package imports (else the checks below pass on
    an empty graph)."""
    graph = _graph()
    assert {"lookupspec.engine", "lookupspec.gateway.app", "lookupspec.kernels"} <= set(graph)
    assert "lookupspec.engine" in graph["lookupspec.scheduler"]
    assert "lookupspec.index.lookup" in graph["lookupspec.index.context"]  # from .lookup import ...
    assert "lookupspec.kernels" in graph["lookupspec.engine"]  # from lookupspec import kernels
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    cycles = _cycles(_graph())
    assert cycles == [], "import cycles (module-level imports):\n" + "\n".join(" <-> ".join(c)
                                                                             for c in cycles)


def test_the_core_imports_neither_the_gateway_nor_fastapi() -> None:
    graph = _graph()
    everywhere = _graph(module_level=False)
    core = [m for m in graph if m.startswith("lookupspec") and not _in(m, FRONT_ENDS)
            and not _in(m, ("lookupspec.gateway",))]
    assert "lookupspec.engine" in core and "lookupspec.kernels.dispatch" in core
    bad = []
    for start in core:
        direct = sorted(t for t in everywhere[start] if _in(t, FORBIDDEN_IN_CORE))
        if direct:
            bad.append(f"{start} imports {', '.join(direct)}")
        seen, todo = {start}, [start]
        while todo:  # what importing the module imports, at any depth
            for t in graph.get(todo.pop(), ()):
                if _in(t, FORBIDDEN_IN_CORE) and t not in direct:
                    bad.append(f"{start} reaches {t} through its module-level imports")
                if t in graph and t not in seen and not _in(t, FORBIDDEN_IN_CORE):
                    seen.add(t)
                    todo.append(t)
    assert bad == [], "\n".join(sorted(set(bad)))
