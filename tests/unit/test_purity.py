"""The core (``condmsg/core/``) is pure (DESIGN section 4, STYLE 2).

Its modules import no I/O library, and, but for :mod:`condmsg.core.timeutil`, read no clock;
evaluation does not touch its inputs. So the evaluator, the receiver and the Spark audit
share one semantics. ``tests/unit/test_layering.py`` holds that the core imports nothing
outside itself.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from condmsg import Ack, AckKind, Destination, DestinationSet, evaluate
from condmsg.core.condition_codec import condition_to_dict
from tests.unit.strategies import SENT_AT

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "condmsg" / "core"
PURE_MODULES = tuple(sorted(path.stem for path in CORE.glob("*.py") if path.stem != "__init__"))
IO_LIBRARIES = ("pika", "sqlalchemy", "apscheduler", "pyspark", "psycopg")

SEC = timedelta(seconds=1)


def test_importing_the_pure_modules_loads_no_io_library() -> None:
    # The facade and the outbox's errors too: both load the core, and only the core.
    imports = ", ".join(["condmsg", "outbox.errors", *(f"condmsg.core.{m}" for m in PURE_MODULES)])
    script = (
        f"import {imports}\n"
        "import sys\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {IO_LIBRARIES!r})\n"
        "print(','.join(heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"I/O libraries imported: {done.stdout.strip()}"


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_modules_neither_import_io_nor_read_the_clock(module: str) -> None:
    source = (CORE / f"{module}.py").read_text()
    tree = ast.parse(source)
    forbidden = {*IO_LIBRARIES, "socket", "ssl", "http", "urllib", "requests", "asyncio"}
    forbidden |= {"subprocess", "sqlite3", "threading", "time", "os", "random"}
    imported = set()
    clock_calls = []
    for found in ast.walk(tree):
        if isinstance(found, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in found.names)
        elif isinstance(found, ast.ImportFrom) and found.module and found.level == 0:
            imported.add(found.module.split(".")[0])
        elif isinstance(found, ast.Attribute) and found.attr in {"now", "utcnow", "today"}:
            clock_calls.append(found.lineno)
    assert not imported & forbidden
    if module != "timeutil":  # timeutil.utcnow() is the one clock, used by services only
        assert clock_calls == [], f"condmsg/core/{module}.py reads the clock at lines {clock_calls}"


CONDITION = DestinationSet(
    Destination("a", process_within=5 * SEC),
    Destination("b"),
    pickup_within=3 * SEC,
    evaluation_timeout=10 * SEC,
)


def _acks() -> list[Ack]:
    return [
        Ack(
            destination="a",
            kind=AckKind.COMMIT,
            read_at=SENT_AT + SEC,
            committed_at=SENT_AT + 2 * SEC,
        ),
        Ack(destination="zz", kind=AckKind.READ, read_at=SENT_AT),
    ]


def test_evaluate_is_deterministic_and_leaves_its_inputs_alone() -> None:
    acks = _acks()
    snapshot = list(acks)
    first = evaluate(CONDITION, SENT_AT, acks, SENT_AT + 2 * SEC)
    second = evaluate(CONDITION, SENT_AT, acks, SENT_AT + 2 * SEC)
    assert first == second
    assert acks == snapshot
    assert condition_to_dict(CONDITION)["condition"]["evaluation_timeout_ms"] == 10_000


def test_evaluate_consumes_any_iterable_of_acks_once() -> None:
    from_list = evaluate(CONDITION, SENT_AT, _acks(), SENT_AT + 2 * SEC)
    from_generator = evaluate(CONDITION, SENT_AT, (a for a in _acks()), SENT_AT + 2 * SEC)
    assert from_generator == from_list
    # b has not read yet; a's deadline passing changes nothing; the timeout decides.
    assert from_list.next_check_at == SENT_AT + 10 * SEC


def test_results_are_immutable() -> None:
    from dataclasses import FrozenInstanceError

    result = evaluate(CONDITION, SENT_AT, _acks(), SENT_AT)
    with pytest.raises(FrozenInstanceError):
        result.verdict = result.verdict  # type: ignore[misc]
    assert isinstance(result.reasons, tuple)
    assert isinstance(result.constraints, tuple)
    assert isinstance(result.destinations, tuple)
