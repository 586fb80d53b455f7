"""ackd: the receiver side of condmsg (automatic read and commit acks, RLOG, cancel-out)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ackd.message import Message
from ackd.outage import StoreUnavailable
from ackd.receiver import Receiver, ReceiverStats, ReceiverTransaction

if TYPE_CHECKING:
    from ackd.async_receiver import AsyncReceiver, AsyncReceiverTransaction

__all__ = [
    "Message",
    "Receiver",
    "ReceiverStats",
    "ReceiverTransaction",
    "StoreUnavailable",
    # asyncio (the ``asyncio`` extra: aio-pika, greenlet)
    "AsyncReceiver",
    "AsyncReceiverTransaction",
]


def __getattr__(name: str) -> Any:
    # Loaded on first use: aio-pika is an optional extra the sync receiver does not need.
    if name in ("AsyncReceiver", "AsyncReceiverTransaction"):
        from ackd import async_receiver

        return getattr(async_receiver, name)
    raise AttributeError(f"module 'ackd' has no attribute {name!r}")
