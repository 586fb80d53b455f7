"""House rules on the shape of the code: small modules, classes and functions, no module
loops.

- Every module of our packages has at most 500 lines, and every function or method at most
  80 (from its ``def`` line to its last line, decorators aside).
- Generated Alembic migrations (any ``migrations/versions/`` directory) are aside: Alembic
  generates them, their length follows the schema change they carry, and a released one is
  never edited.
- Pure declarations are aside, because their length is the number of things they declare,
  not logic to follow, and splitting one scatters a single table over several places:

  - a *declaration function* is one whose body, its docstring aside, is a straight line of
    assignments (``x = ...``, ``self.x = ...``), bare calls (``parser.add_argument(...)``)
    and at most a final ``return``, where no expression branches (no ``if``-expression,
    ``and``/``or``, lambda, walrus, or comprehension with an ``if`` clause), e.g. an
    ``argparse`` option list or the metric objects of a service;
  - a *declaration statement* at module level is an assignment whose value does not branch
    (a ``Table(...)``, a dict literal), or a class with no method, whose body holds only
    fields and constants (a dataclass, an enum, a ``TypedDict``); its lines do not count
    towards the module's 500.

- Every module has at most 600 physical lines, declarations included: the 500 above count
  the logic a reader follows, and a fifth more is room for the tables, option lists and
  metric objects set aside there (the longest declaration blocks today run to about 130
  lines); a module longer than that is no longer read as one, whatever fills it.
- Every class has at most 20 methods and 20 attributes. A method is a ``def`` in the class
  body (properties and dunders too); an attribute is a name its methods assign on ``self``,
  the state that any method may read or change, so that a reader holds all of it to follow
  one method. Names declared in the class body (a dataclass's fields, constants) are aside:
  each is declared once, in one place, like a table's columns; and so are the attributes
  of a class whose only method is a declaration function (a service's metric objects).
  Twenty of either is about what one holds while reading a class through; nineteen
  classes in twenty of the house have at most 17 methods and 11 attributes. A class over
  a limit today is named in ``CLASS_OUTLIERS`` with the reason and its size, which it may
  not outgrow; an entry that no longer exceeds a limit must go.
- No import cycle between the modules of one package (``condmsg`` with its subpackages is
  one package), counting every import: lazy ones inside functions and those under ``if
  TYPE_CHECKING:`` too. ``test_layering`` checks the layers on the imports that run; a
  type-only import still ties two modules together for a reader, who must read both to
  follow either, so a loop closed by one is a loop here.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("condmsg", "ackd", "evaluator", "outbox", "spark_audit")
MAX_MODULE_LINES = 500
MAX_PHYSICAL_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_CLASS_METHODS = 20
MAX_CLASS_ATTRIBUTES = 20

#: The classes over a limit today: (methods, attributes) they may not outgrow, and why.
CLASS_OUTLIERS: dict[str, tuple[int, int, str]] = {
    "outbox.relay.Relay": (
        28,
        21,
        "the relay's loop, its claims and their settlement behind the documented API (14 "
        "public methods: run, drain, stop, health, stats, the context manager); when and "
        "where to claim, the broker link and the confirm window are classes of their own",
    ),
    "outbox.publish_confirms.Publisher": (
        30,
        25,
        "the confirm window, its connection and the fast path on pika's internals in one; "
        "a pure confirm ledger and the exchange check would split off",
    ),
    "ackd.broker.Broker": (
        23,
        18,
        "the books of one receiver channel: get, consume, every settlement (ack, deferred "
        "ack, delayed requeue) and the invalid queue's copies; looked at with the relay",
    ),
    "condmsg.sending.sender.Sender": (
        23,
        11,
        "the public face of sending: one method per documented operation (docs/sending.md)",
    ),
    "condmsg.testing.kit.Kit": (
        26,
        12,
        "the test kit's public face: one method per thing a user's test does (docs/testing.md)",
    ),
    "condmsg.conformance.world.World": (
        26,
        18,
        "the conformance harness's world: one method per step its scenarios call",
    ),
}

#: Expressions that branch, which a declaration may not hold.
_BRANCHING = (ast.IfExp, ast.BoolOp, ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield)


def _generated(path: Path) -> bool:
    return "/migrations/versions/" in path.as_posix()


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if _generated(path):
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _flat(expression: ast.AST | None) -> bool:
    """Whether ``expression`` builds a value without branching."""
    if expression is None:
        return True
    for node in ast.walk(expression):
        if isinstance(node, _BRANCHING) or (isinstance(node, ast.comprehension) and node.ifs):
            return False
    return True


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


def is_declaration_function(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = [s for s in function.body if not _is_docstring(s)]
    for index, statement in enumerate(body):
        builds = isinstance(statement, ast.Assign | ast.AnnAssign) or (
            isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
        )
        returns = isinstance(statement, ast.Return) and index == len(body) - 1
        if not (builds or returns) or not _flat(getattr(statement, "value", None)):
            return False
    return True


def is_declaration_statement(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.Assign | ast.AnnAssign):
        return _flat(statement.value)
    if isinstance(statement, ast.ClassDef):
        return all(
            _is_docstring(s)
            or isinstance(s, ast.Pass)
            or (isinstance(s, ast.Assign | ast.AnnAssign) and _flat(s.value))
            for s in statement.body
        )
    return False


def _span(node: ast.stmt) -> tuple[int, int]:
    """First and last line of ``node``, its decorators included."""
    decorators = getattr(node, "decorator_list", [])
    first = min([node.lineno, *(d.lineno for d in decorators)])
    return first, node.end_lineno or node.lineno


def counted_lines(tree: ast.Module, source: str) -> int:
    """The module's lines, less those of its module-level declaration statements."""
    declared: set[int] = set()
    for statement in tree.body:
        if is_declaration_statement(statement):
            first, last = _span(statement)
            declared.update(range(first, last + 1))
    return len(source.splitlines()) - len(declared)


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method of ``tree`` with its dotted name inside the module."""

    def walk(
        node: ast.AST, prefix: str
    ) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    yield name, child
                yield from walk(child, f"{name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def test_every_module_has_at_most_500_lines() -> None:
    long = []
    for name, path in MODULES.items():
        lines = counted_lines(TREES[name], path.read_text())
        if lines > MAX_MODULE_LINES:
            long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert long == []


def test_every_module_has_at_most_600_physical_lines() -> None:
    long = []
    for path in MODULES.values():
        lines = len(path.read_text().splitlines())
        if lines > MAX_PHYSICAL_LINES:
            long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert long == []


def test_every_function_has_at_most_80_lines() -> None:
    long = []
    for name, path in MODULES.items():
        for function_name, function in _functions(TREES[name]):
            lines = (function.end_lineno or function.lineno) - function.lineno + 1
            if lines > MAX_FUNCTION_LINES and not is_declaration_function(function):
                long.append(f"{path.relative_to(ROOT)}:{function.lineno} {function_name}: {lines}")
    assert long == []


def _imported(module: str) -> set[str]:
    """Our modules that ``module`` imports anywhere in its source (TYPE_CHECKING too)."""
    is_package = MODULES[module].name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: None if is_package else -1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.update(f"{base}.{alias.name}" for alias in node.names)
    resolved = set()
    for name in found:
        while name not in MODULES and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in MODULES and name != module:
            resolved.add(name)
    return resolved


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_between_the_modules_of_a_package(package: str) -> None:
    ours = {m for m in MODULES if m.split(".")[0] == package}
    graph = {m: {i for i in _imported(m) if i in ours} for m in sorted(ours)}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as cycle:
        pytest.fail("import cycle: " + " -> ".join(cycle.args[1]), pytrace=False)


def _function(source: str) -> ast.FunctionDef:
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


def test_what_counts_as_a_declaration_function() -> None:
    declares = "def f(p):\n    '''Doc.'''\n    g = p.group()\n    g.add(1, help=f'{x}')\n"
    assert is_declaration_function(_function(declares))
    assert is_declaration_function(_function("def f():\n    return T(a=[D(i) for i in r])"))
    assert not is_declaration_function(_function("def f(p):\n    if p:\n        p.add(1)"))
    assert not is_declaration_function(_function("def f(p):\n    p.add(x or 1)"))
    assert not is_declaration_function(_function("def f():\n    return [i for i in r if i]"))
    assert not is_declaration_function(_function("def f():\n    return 1\n    g()"))
    assert not is_declaration_function(_function("def f(p):\n    for x in p:\n        g(x)"))


def test_what_counts_as_a_declaration_statement() -> None:
    def first(source: str) -> ast.stmt:
        return ast.parse(source).body[0]

    assert is_declaration_statement(first("t = Table('t', Column('a', Integer))"))
    assert is_declaration_statement(first("class E(Enum):\n    '''Doc.'''\n    A = 'a'"))
    assert is_declaration_statement(first("@dataclass\nclass D:\n    a: int = 0"))
    assert not is_declaration_statement(first("class D:\n    def f(self): pass"))
    assert not is_declaration_statement(first("x = a if b else c"))
    assert not is_declaration_statement(first("def f(): pass"))
    source = "'''Doc.'''\nA = {\n    1: 2,\n}\n\n\ndef f():\n    pass\n"
    assert counted_lines(ast.parse(source), source) == 8 - 3


def class_size(node: ast.ClassDef) -> tuple[int, int]:
    """The methods of ``node`` and the attributes its methods assign on ``self``
    (``self.x = ...``, ``self.x: T = ...``, ``self.x += ...``, ``self.x, self.y = ...``);
    none for a class whose one method is a declaration function."""
    methods = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    if len(methods) == 1 and is_declaration_function(methods[0]):
        return 1, 0
    attributes: set[str] = set()
    for method in methods:
        for statement in ast.walk(method):
            if isinstance(statement, ast.Assign):
                targets = statement.targets
            elif isinstance(statement, ast.AnnAssign | ast.AugAssign):
                targets = [statement.target]
            else:
                continue
            for target in targets:
                for found in ast.walk(target):
                    if (
                        isinstance(found, ast.Attribute)
                        and isinstance(found.value, ast.Name)
                        and found.value.id == "self"
                    ):
                        attributes.add(found.attr)
    return len(methods), len(attributes)


def _classes() -> dict[str, tuple[int, int]]:
    """Every class of our packages (nested ones too) by dotted name, with its size."""
    found = {}
    for module, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found[f"{module}.{node.name}"] = class_size(node)
    return found


CLASSES = _classes()


def test_every_class_has_at_most_20_methods_and_20_attributes() -> None:
    large = []
    for name, (methods, attributes) in CLASSES.items():
        most_methods, most_attributes = MAX_CLASS_METHODS, MAX_CLASS_ATTRIBUTES
        if name in CLASS_OUTLIERS:
            most_methods, most_attributes, _ = CLASS_OUTLIERS[name]
        if methods > most_methods or attributes > most_attributes:
            large.append(f"{name}: {methods} methods, {attributes} attributes")
    assert large == []


@pytest.mark.parametrize("name", sorted(CLASS_OUTLIERS))
def test_a_class_outlier_still_exceeds_a_limit(name: str) -> None:
    assert name in CLASSES, f"{name} is gone: take it off CLASS_OUTLIERS"
    methods, attributes = CLASSES[name]
    assert methods > MAX_CLASS_METHODS or attributes > MAX_CLASS_ATTRIBUTES, (
        f"{name} is within the limits ({methods} methods, {attributes} attributes): "
        "take it off CLASS_OUTLIERS"
    )


def test_what_counts_in_a_class_size() -> None:
    def size(source: str) -> tuple[int, int]:
        node = ast.parse(source).body[0]
        assert isinstance(node, ast.ClassDef)
        return class_size(node)

    source = (
        "class C:\n"
        "    x: int = 0\n"
        "    def __init__(self):\n"
        "        self.a = 1\n"
        "        self.b: int = 2\n"
        "        self.c, (self.d, e) = 3, (4, 5)\n"
        "    @property\n"
        "    def p(self):\n"
        "        self.a += 1\n"
        "        other.z = 1\n"
        "        return self.q\n"
    )
    assert size(source) == (2, 4)
    assert size("class M:\n    def __init__(self, r):\n        self.a = C(r)\n") == (1, 0)
    branching = "class M:\n    def __init__(self, r):\n        if r:\n            self.a = 1\n"
    assert size(branching) == (1, 1)
