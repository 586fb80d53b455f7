"""condmsg: conditional messaging for RabbitMQ.

The public facade. Conditions and their pure evaluation::

    from condmsg import Destination, DestinationSet, Ack, AckKind, Verdict, evaluate
"""

import importlib
from typing import TYPE_CHECKING, Any

from condmsg.acks import Ack, AckKind
from condmsg.conditions import Condition, Delivery, Destination, DestinationSet, Kind
from condmsg.errors import (
    AckError,
    BrokerError,
    ConditionError,
    CondmsgError,
    ConfigError,
    ProtocolError,
    StoreError,
)
from condmsg.evaluation import (
    ConstraintResult,
    DestinationFacts,
    EvaluationResult,
    Truth,
    Verdict,
    evaluate,
    evaluation_deadline,
)
from condmsg.settings import Settings

__version__ = "0.1.0"

if TYPE_CHECKING:
    from ackd.message import Message
    from ackd.receiver import Receiver
    from condmsg.sender import Sender

# Sender and Receiver pull in pika and SQLAlchemy. They are imported on first use so that
# the pure model (``import condmsg.conditions``) stays free of I/O libraries, which the
# Spark audit's Python workers and the property tests rely on.
_LAZY = {
    "Sender": ("condmsg.sender", "Sender"),
    "Receiver": ("ackd.receiver", "Receiver"),
    "Message": ("ackd.message", "Message"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'condmsg' has no attribute {name!r}")


__all__ = [
    # conditions
    "Condition",
    "Delivery",
    "Destination",
    "DestinationSet",
    "Kind",
    # acknowledgments and evaluation
    "Ack",
    "AckKind",
    "ConstraintResult",
    "DestinationFacts",
    "EvaluationResult",
    "Truth",
    "Verdict",
    "evaluate",
    "evaluation_deadline",
    # sending and receiving
    "Message",
    "Receiver",
    "Sender",
    # settings
    "Settings",
    # errors
    "AckError",
    "BrokerError",
    "CondmsgError",
    "ConditionError",
    "ConfigError",
    "ProtocolError",
    "StoreError",
    "__version__",
]
