"""condmsg's test kit: an application's sender, receivers and evaluator in one process,
over SQLite stores and an in-memory broker, on a virtual clock (docs/testing.md).

``from condmsg.testing import Kit``; under pytest, the ``condmsg_kit`` fixture gives a
fresh kit per test (:mod:`condmsg.testing.plugin`, registered as a pytest plugin).

The names are looked up on first use, as ``condmsg``'s own facade does: pytest imports
the plugin, and so this package, in every test run of a project that has condmsg
installed, and the kit's modules (the receiver, the evaluator, SQLAlchemy) need load only
in the runs that use it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from condmsg.testing.clock import VirtualClock
    from condmsg.testing.kit import HandlerCall, Kit, KitError
    from condmsg.testing.memory_broker import MemoryBroker
    from condmsg.testing.receivers import KitReceiver, KitTransaction

#: The module that defines each name exported on first use.
_DEFINED_IN = {
    "Kit": "condmsg.testing.kit",
    "KitError": "condmsg.testing.kit",
    "HandlerCall": "condmsg.testing.kit",
    "KitReceiver": "condmsg.testing.receivers",
    "KitTransaction": "condmsg.testing.receivers",
    "VirtualClock": "condmsg.testing.clock",
    "MemoryBroker": "condmsg.testing.memory_broker",
}


def __getattr__(name: str) -> Any:
    module = _DEFINED_IN.get(name)
    if module is None:
        raise AttributeError(f"module 'condmsg.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found directly from now on
    return value


__all__ = [
    "Kit",
    "KitReceiver",
    "KitTransaction",
    "HandlerCall",
    "KitError",
    "VirtualClock",
    "MemoryBroker",
]
