"""House rules on the tests' own layout (docs/layout.md, "The tests").

- ``tests/integration/`` holds its shared fixtures (``conftest.py``) and helper modules;
  every test module sits in the folder of its component, so that a change's tests are
  found in one place and a folder can be run alone.
- Every folder of ``tests/`` that holds tests or fixtures is a package (an
  ``__init__.py``): pytest then names each module by its whole path
  (``tests.integration.receiver.test_...``), two folders may hold modules of the same
  name, and a test imports a helper by that name. (A folder put on a child process's
  ``PYTHONPATH``, such as ``e2e/tracing_site/``, is not one.)
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_integration_tests_sit_in_the_folder_of_their_component() -> None:
    integration = TESTS / "integration"
    flat = sorted(p.name for p in integration.glob("test_*.py"))
    assert flat == [], f"move these into a component folder of tests/integration/: {flat}"
    folders = sorted(p.parent.name for p in integration.glob("*/test_*.py"))
    assert folders, "tests/integration/ has no component folder"


def test_every_folder_of_tests_is_a_package() -> None:
    held = [*TESTS.rglob("test_*.py"), *TESTS.rglob("conftest.py")]
    folders = {p.parent for p in held if "__pycache__" not in p.parts}
    missing = sorted(str(f.relative_to(TESTS)) for f in folders if not (f / "__init__.py").exists())
    assert missing == [], f"add an __init__.py to: {missing}"
