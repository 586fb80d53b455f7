"""DESIGN section 4: which of our packages each layer may import, and no import cycles.

Checked on the source (every ``import`` and ``from ... import``, at any depth), so a lazy
import inside a function counts too; imports under ``if TYPE_CHECKING:`` do not, since they
never run. ``condmsg.core`` is the bottom layer, ``condmsg.infra`` (the shared
infrastructure) the one above it, and ``condmsg``'s command line, demo and conformance
harness are layers of their own: the application on top of the library, which
starts the services and so may import them. docs/layout.md draws the layers.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("condmsg", "outbox", "ackd", "evaluator", "spark_audit")
#: The pure core: the condition model, evaluation, the wire protocol, outcomes and the
#: error root. It imports nothing outside itself, neither of ours nor an I/O library.
CORE = "condmsg.core"
#: The shared infrastructure every process runs on (backoff, repeated failures, URLs, store
#: adapters' choice, tracing, the fast paths' gate): on the core only, below the outbox.
INFRA = "condmsg.infra"
#: The application layers inside condmsg, which start the services and so may import them:
#: the command line, the demo and the conformance harness. The rest of condmsg is the library.
#: The test kit is one too: it runs the receiver and the evaluator in the test's process.
APPLICATION = ("condmsg.cli", "condmsg.demo", "condmsg.conformance", "condmsg.testing")
EVERYTHING = {*OURS, CORE, INFRA, *APPLICATION}
ALLOWED = {
    CORE: set(),
    INFRA: {CORE},
    "condmsg": {CORE, INFRA, "outbox"},
    "condmsg.cli": EVERYTHING,
    "condmsg.demo": EVERYTHING,
    "condmsg.conformance": EVERYTHING,
    "condmsg.testing": EVERYTHING,
    "outbox": {CORE, INFRA},
    "ackd": {"condmsg", CORE, INFRA, "outbox"},
    "evaluator": {"condmsg", CORE, INFRA, "outbox"},
    "spark_audit": {"condmsg", CORE},
}
#: What spark_audit may use of condmsg beyond the core: the facade (which loads only the
#: core) and the layout of the archives it reads.
SPARK_AUDIT_CONDMSG = {"condmsg", "condmsg.archive", "condmsg.archive.layout"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {
    _module_name(path): path for package in OURS for path in sorted((ROOT / package).rglob("*.py"))
}


def _layer(module: str) -> str:
    for layer in (CORE, INFRA, *APPLICATION):
        if module == layer or module.startswith(f"{layer}."):
            return layer
    return module.split(".")[0]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(nodes: Iterable[ast.AST]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``nodes`` that can run, at any depth."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            yield from _import_nodes(node.orelse)
        else:
            yield from _import_nodes(ast.iter_child_nodes(node))


def _resolve(name: str) -> str:
    """The module ``name`` loads: itself, or the module that defines the attribute."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports(module: str) -> set[str]:
    """Our modules that ``module`` imports (a name imported from a module counts as that
    module, a submodule imported from a package as the submodule)."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    found: set[str] = set()
    for node in _import_nodes(tree.body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif node.module and node.level == 0:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {_resolve(name) for name in found if name.split(".")[0] in OURS}


GRAPH = {module: imports(module) - {module} for module in MODULES}


@pytest.mark.parametrize("layer", ALLOWED)
def test_each_layer_imports_only_what_design_section_4_allows(layer: str) -> None:
    wrong = []
    for module, imported in sorted(GRAPH.items()):
        if _layer(module) != layer:
            continue
        for name in sorted(imported):
            target = _layer(name)
            if target != layer and target not in ALLOWED[layer]:
                wrong.append(f"{module} imports {name}")
            elif layer == "spark_audit" and target == "condmsg" and name not in SPARK_AUDIT_CONDMSG:
                wrong.append(f"{module} imports {name} (not the core or the archive layout)")
    assert wrong == []


def _imported_roots(path: Path) -> set[str]:
    """The top-level names of every module ``path`` imports that can run (relative imports
    count as their own package's)."""
    tree = ast.parse(path.read_text(), str(path))
    roots = set()
    for node in _import_nodes(tree.body):
        if isinstance(node, ast.Import):
            roots.update(alias.name for alias in node.names)
        elif node.level:
            roots.add(_module_name(path))
        elif node.module:
            roots.update(f"{node.module}.{alias.name}" for alias in node.names)
    return roots


def test_the_core_imports_nothing_outside_itself() -> None:
    """Only the standard library and other core modules: no I/O library, no third-party
    package, no other part of condmsg (not even its facade)."""
    wrong = []
    for module, path in sorted(MODULES.items()):
        if _layer(module) != CORE:
            continue
        for name in sorted(_imported_roots(path)):
            top = name.split(".")[0]
            inside = name == CORE or name.startswith(f"{CORE}.")
            if not inside and (top in OURS or top not in sys.stdlib_module_names):
                wrong.append(f"{module} imports {name}")
    assert wrong == []


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path = [start]
        on_path = {start}
        branches = [iter(sorted(graph[start]))]
        while branches:
            following = next(branches[-1], None)
            if following is None:
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                branches.pop()
            elif following in on_path:
                return [*path[path.index(following) :], following]
            elif following not in done:
                path.append(following)
                on_path.add(following)
                branches.append(iter(sorted(graph[following])))
    return None


def test_no_import_cycle_between_modules() -> None:
    cycle = _cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
