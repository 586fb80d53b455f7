"""Which path runs where a fast one leans on a library's internals.

Two paths go beneath a library's public API to save time: the relay's own
``basic.publish`` frames, written through pika's private write hook
(:mod:`outbox.publish_frames`), and the receiver's PostgreSQL statements sent through
psycopg's libpq layer (:mod:`ackd.fastpath`). Each is right only for the releases it was
tested with, so each is gated at run time: by default (``auto``) it runs where the library
is a tested release and has the internals the path uses, and the plain path (the library's
public API) runs everywhere else, so newer releases of either library work, only slower.
A forced choice is for the tests of both paths and for trying a new release: ``fast``
runs the fast path on an untested release too (with a warning) as long as the internals
are there; ``plain`` never runs it.

The path in use is logged once per process (INFO), with the reason when it is the plain one.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

#: The logger operators filter on for the choice of path (docs/operations.md names it): a
#: name of its own, not this module's, so that their logging configuration need not follow
#: the code's layout.
log = logging.getLogger("outbox.fast_paths")

#: ``auto``: the fast path where it was tested; ``fast`` or ``plain``: forced.
Mode = Literal["auto", "fast", "plain"]
MODES: tuple[Mode, ...] = ("auto", "fast", "plain")

_told: set[tuple[str, str]] = set()
_told_lock = threading.Lock()


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: ``"3.3.9"`` -> (3, 3, 9), ``"1.5.0b1"``
    -> (1, 5, 0) (a pre-release counts as its release: untested before it is out)."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


@dataclass(frozen=True, slots=True)
class Gate:
    """What a fast path needs of ``library``: a release in ``tested`` (from, up to but
    excluding) and the internals it uses, of which ``missing`` are not there."""

    library: str
    version: str
    tested: tuple[tuple[int, ...], tuple[int, ...]]
    missing: tuple[str, ...] = ()

    @classmethod
    def check(
        cls,
        library: str,
        version: str,
        tested: tuple[tuple[int, ...], tuple[int, ...]],
        internals: Iterable[tuple[str, object, str]],
    ) -> Gate:
        """The gate of ``library`` at ``version``; ``internals`` are (what, owner,
        attribute) triples, each missing when ``owner`` has no ``attribute``."""
        missing = tuple(what for what, owner, name in internals if not hasattr(owner, name))
        return cls(library, version, tested, missing)

    @property
    def tested_release(self) -> bool:
        low, high = self.tested
        return low <= release(self.version) < high

    def untested(self) -> str | None:
        """Why ``auto`` takes the plain path (None: it takes the fast one)."""
        if self.missing:
            return f"{self.library} {self.version} lacks {', '.join(self.missing)}"
        if not self.tested_release:
            low, high = (".".join(map(str, r)) for r in self.tested)
            return (
                f"{self.library} {self.version} is not a release it was tested with "
                f"({low} to before {high})"
            )
        return None


def use_fast(what: str, mode: str, gate: Gate) -> bool:
    """Whether ``what`` (e.g. "outbox relay publishing") takes its fast path under
    ``mode`` (one of :data:`MODES`); logged once per process and choice. Forcing the fast
    path where the internals are missing raises ``ValueError``."""
    if mode not in MODES:
        raise ValueError(f"{what}: the path must be one of {', '.join(MODES)}, got {mode!r}")
    reason = gate.untested()
    if mode == "fast":
        if gate.missing:
            raise ValueError(f"{what}: the fast path cannot run: {reason}; choose auto or plain")
        if reason is not None:
            _once(
                what, "fast-untested", logging.WARNING, "%s: fast path, forced although %s", reason
            )
        else:
            _once(
                what, "fast", logging.INFO, "%s: fast path (%s)", f"{gate.library} {gate.version}"
            )
        return True
    if mode == "plain":
        _once(what, "plain", logging.INFO, "%s: plain path (%s)", "forced")
        return False
    if reason is None:
        _once(what, "fast", logging.INFO, "%s: fast path (%s)", f"{gate.library} {gate.version}")
        return True
    _once(what, "plain", logging.INFO, "%s: plain path (%s)", reason)
    return False


def _once(what: str, choice: str, level: int, text: str, detail: str) -> None:
    with _told_lock:
        if (what, choice) in _told:
            return
        _told.add((what, choice))
    log.log(level, text, what, detail)
