"""ackd: the receiver side of condmsg (automatic read and commit acks, RLOG, cancel-out)."""

from ackd.message import Message
from ackd.outage import StoreUnavailable
from ackd.receiver import Receiver, ReceiverStats, ReceiverTransaction

__all__ = ["Message", "Receiver", "ReceiverStats", "ReceiverTransaction", "StoreUnavailable"]
