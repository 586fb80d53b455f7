"""Write requirements.lock: every distribution the image installs, pinned to the version
this environment resolved (``make dev`` installs it), so that ``docker build`` installs
the same releases today and next year.

The lock holds the closure of condmsg's runtime dependencies and of its ``audit`` and
``console`` extras (the image's ``EXTRAS``), never the ``dev`` extra's test tools. The
Dockerfile gives it to pip as constraints: a pin of a distribution an image does not need
installs nothing.

    .venv/bin/python tools/lock_requirements.py        # rewrite requirements.lock
    .venv/bin/python tools/lock_requirements.py --check  # exit 1 if it is not current
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
EXTRAS = ("audit", "console")
HEADER = """\
# The releases the image installs (Dockerfile: pip install --constraint requirements.lock).
# Generated from the development environment's resolution by tools/lock_requirements.py:
# condmsg's dependencies and those of its audit and console extras, not the dev tools.
# Regenerate after changing pyproject.toml's dependencies: tests/unit/test_deploy_files.py
# checks that every dependency is pinned and that each pin satisfies pyproject.toml.
"""


def closure(root: str, extras: tuple[str, ...]) -> dict[str, str]:
    """Canonical name -> installed version of ``root``'s dependencies (with ``extras``),
    recursively, as the markers of this interpreter select them; ``root`` left out."""
    pinned: dict[str, str] = {}
    todo = [(root, frozenset(extras))]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, wanted = todo.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        dist = metadata.distribution(name)
        if canonicalize_name(name) != canonicalize_name(root):
            pinned[canonicalize_name(name)] = dist.version
        for line in dist.requires or []:
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) == canonicalize_name(root):
                continue  # an extra that names the package itself (dev = condmsg[audit])
            markers = [{"extra": extra} for extra in wanted] or [{"extra": ""}]
            if requirement.marker is None or any(requirement.marker.evaluate(m) for m in markers):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return pinned


def render() -> str:
    pins = closure("condmsg", EXTRAS)
    return HEADER + "".join(f"{name}=={pins[name]}\n" for name in sorted(pins))


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        current = LOCK.read_text() if LOCK.exists() else ""
        if current != text:
            print("requirements.lock is not current: run tools/lock_requirements.py")
            return 1
        return 0
    LOCK.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
