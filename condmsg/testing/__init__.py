"""condmsg's test kit: an application's sender, receivers and evaluator in one process,
over SQLite stores and an in-memory broker, on a virtual clock (docs/testing.md).

``from condmsg.testing import Kit``; under pytest, the ``condmsg_kit`` fixture gives a
fresh kit per test (:mod:`condmsg.testing.plugin`, registered as a pytest plugin).
"""

from condmsg.testing.clock import VirtualClock
from condmsg.testing.kit import HandlerCall, Kit, KitError
from condmsg.testing.memory_broker import MemoryBroker
from condmsg.testing.receivers import KitReceiver, KitTransaction

__all__ = [
    "Kit",
    "KitReceiver",
    "KitTransaction",
    "HandlerCall",
    "KitError",
    "VirtualClock",
    "MemoryBroker",
]
