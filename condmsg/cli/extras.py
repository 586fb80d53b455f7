"""The commands that need the ``audit`` extra, and the one line that names it.

``pip install condmsg`` gives the sender, the receiver, the relay, the evaluator and the
command line. ``pip install 'condmsg[audit]'`` adds PySpark, pyarrow and pandas: the Spark
audit needs all three, ``condmsg export`` and retention's Parquet archives need pyarrow.
:func:`require_extra` runs before such a command starts any work, so a missing extra costs
one line on stderr (exit code 2), not a traceback halfway through.
"""

from __future__ import annotations

import importlib.util

from condmsg.core.errors import CondmsgError

#: What installs the ``audit`` extra (quoted, since shells expand square brackets).
AUDIT_INSTALL = "pip install 'condmsg[audit]'"

#: Each command that needs the extra: what the message calls its work, and the modules of
#: the extra that work imports.
NEEDS_AUDIT_EXTRA = {
    "audit": ("the audit", ("pyspark", "pyarrow", "pandas")),
    "export": ("the export", ("pyarrow",)),
    "retention": ("retention (its Parquet archives)", ("pyarrow",)),
}


class MissingExtraError(CondmsgError):
    """The installation lacks the optional part that a command needs."""


def missing(modules: tuple[str, ...]) -> list[str]:
    """Those of ``modules`` that cannot be imported. Looked up without importing them, so
    the check costs no start-up time."""
    absent = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken installation, or a module set to None
            found = False
        if not found:
            absent.append(name)
    return absent


def require_extra(command: str | None) -> None:
    """Raise :class:`MissingExtraError` if ``command`` needs a module of the ``audit``
    extra that is not installed; its message names the extra and how to install it."""
    if command not in NEEDS_AUDIT_EXTRA:
        return
    work, modules = NEEDS_AUDIT_EXTRA[command]
    absent = missing(modules)
    if absent:
        raise MissingExtraError(
            f"{work} needs the audit extra ({', '.join(absent)} not installed); "
            f"install it with: {AUDIT_INSTALL}"
        )
