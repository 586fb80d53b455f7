"""Waiting in tests: poll a condition until it holds or its deadline passes.

Tests talk to real services that answer in their own time, so a test waits for the state
it needs rather than sleeping for a guessed while. On timeout the failure names what was
awaited: ``what`` if the caller gave it, else the condition's own source text (a lambda's
expression, a function's name), with the condition's last value.
"""

from __future__ import annotations

import ast
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition a test waited for did not hold within its deadline."""


def wait_for(
    condition: Callable[[], T],
    timeout: float = 10.0,
    what: str | None = None,
    *,
    interval: float = 0.02,
) -> T:
    """Call ``condition`` every ``interval`` seconds until it returns something truthy, and
    return that; raise :class:`WaitTimeout` naming ``what`` after ``timeout`` seconds.

    The condition is called once more after the deadline, so a slow last poll is not
    mistaken for a timeout.
    """
    deadline = time.monotonic() + timeout
    while True:
        past_deadline = time.monotonic() > deadline
        value = condition()
        if value:
            return value
        if past_deadline:
            awaited = what or describe(condition)
            raise WaitTimeout(
                f"timed out after {timeout:g} s waiting for {awaited} (last value: {value!r})"
            )
        time.sleep(interval)


def describe(condition: Callable[..., object]) -> str:
    """The source of a lambda (``lambda: ...``) if it can be found, else the callable's name."""
    code = getattr(condition, "__code__", None)
    name = getattr(condition, "__qualname__", None) or repr(condition)
    if code is None or getattr(condition, "__name__", None) != "<lambda>":
        return name
    found = [
        text
        for line, text in _lambdas(code.co_filename)
        if line == code.co_firstlineno and text is not None
    ]
    if len(found) == 1:
        return " ".join(found[0].split())
    return f"{name} at {Path(code.co_filename).name}:{code.co_firstlineno}"


@functools.cache
def _lambdas(filename: str) -> tuple[tuple[int, str | None], ...]:
    """(first line, source) of every lambda in the file, or nothing if it cannot be read."""
    try:
        source = Path(filename).read_text()
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return ()
    return tuple(
        (node.lineno, ast.get_source_segment(source, node))
        for node in ast.walk(tree)
        if isinstance(node, ast.Lambda)
    )
