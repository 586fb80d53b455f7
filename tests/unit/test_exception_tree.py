"""DESIGN section 4: one exception tree, rooted at ``CondmsgError``, each error defined once.

Every module of our packages is imported and every exception class it defines is checked,
so a new error that forgets the root (or a second root) fails here. The ``__main__``
modules run their command when imported and define no class, so they are skipped.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path

import pytest

import condmsg
import outbox
from condmsg.core.errors import CondmsgError

ROOT = Path(__file__).resolve().parents[2]
OURS = ("condmsg", "outbox", "ackd", "evaluator", "spark_audit")


def _module_names() -> list[str]:
    names = []
    for package in OURS:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _exceptions_defined_in(module_name: str) -> list[type[BaseException]]:
    module = importlib.import_module(module_name)
    return [
        value
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == module_name
    ]


@pytest.mark.parametrize("package", OURS)
def test_every_exception_we_define_descends_from_condmsg_error(package: str) -> None:
    if package == "spark_audit":
        pytest.importorskip("pyspark")
    strays = [
        f"{error.__module__}.{error.__qualname__}"
        for name in _module_names()
        if name.split(".")[0] == package
        for error in _exceptions_defined_in(name)
        if not issubclass(error, CondmsgError)
    ]
    assert strays == []


def test_the_root_and_the_shared_errors_are_one_class_each() -> None:
    assert condmsg.CondmsgError is outbox.CondmsgError is CondmsgError
    assert condmsg.BrokerError is outbox.BrokerError
    assert condmsg.StoreError is outbox.StoreError
    assert issubclass(outbox.OutboxError, CondmsgError)


def test_no_error_name_is_defined_twice() -> None:
    defined: dict[str, list[str]] = {}
    for name in _module_names():
        if name.startswith("spark_audit") and importlib.util.find_spec("pyspark") is None:
            continue
        for error in _exceptions_defined_in(name):
            defined.setdefault(error.__name__, []).append(error.__module__)
    assert {name: where for name, where in defined.items() if len(where) > 1} == {}
