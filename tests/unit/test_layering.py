"""DESIGN section 4: which of our packages each package may import.

Checked on the source (every ``import`` and ``from ... import``, at any depth), so a lazy
import inside a function counts too. ``condmsg``'s command line and demo are the
application on top of the library: they start the services, so they may import them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("condmsg", "outbox", "ackd", "evaluator", "spark_audit")
ALLOWED = {
    "condmsg": {"outbox"},
    "outbox": set(),
    "ackd": {"condmsg", "outbox"},
    "evaluator": {"condmsg", "outbox"},
    "spark_audit": {"condmsg"},
}
#: The application layer inside condmsg: entry points that run the other packages, and
#: the facade's lazy ``condmsg.Receiver`` (issue 4 asks for it; imported on first use).
APPLICATION = ("condmsg/cli.py", "condmsg/commands/", "condmsg/demo", "condmsg/__init__.py")
#: What spark_audit may use of condmsg: the model, the pure evaluation and their helpers.
SPARK_AUDIT_CONDMSG = {
    "condmsg",
    "condmsg.acks",
    "condmsg.archive_layout",
    "condmsg.condition_codec",
    "condmsg.conditions",
    "condmsg.errors",
    "condmsg.evaluation",
    "condmsg.protocol",
    "condmsg.timeutil",
}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {name for name in found if name.split(".")[0] in OURS}


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", OURS)
def test_each_package_imports_only_what_design_section_4_allows(package: str) -> None:
    wrong = []
    for path in _modules(package):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(APPLICATION):
            continue
        for name in _imports(path):
            top = name.split(".")[0]
            if top != package and top not in ALLOWED[package]:
                wrong.append(f"{relative} imports {name}")
            elif package == "spark_audit" and top == "condmsg" and name not in SPARK_AUDIT_CONDMSG:
                wrong.append(f"{relative} imports {name} (not the model or pure evaluation)")
    assert wrong == []
