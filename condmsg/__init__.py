"""condmsg: conditional messaging for RabbitMQ.

The public facade. Conditions and their pure evaluation::

    from condmsg import Destination, DestinationSet, Ack, AckKind, Verdict, evaluate

It exports what this package owns; the receiver side is its own package
(``from ackd import Receiver, Message``), which imports this one, never the reverse.
"""

import importlib
from typing import TYPE_CHECKING, Any

from condmsg.acks import Ack, AckKind
from condmsg.condition_codec import condition_from_json, condition_to_json
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
    from condmsg.sender import Sender


def __getattr__(name: str) -> Any:
    # The Sender pulls in pika and SQLAlchemy. It is imported on first use so that the
    # pure model (``import condmsg.conditions``) stays free of I/O libraries, which the
    # Spark audit's Python workers and the property tests rely on.
    if name == "Sender":
        return importlib.import_module("condmsg.sender").Sender
    raise AttributeError(f"module 'condmsg' has no attribute {name!r}")


__all__ = [
    # conditions
    "Condition",
    "Delivery",
    "Destination",
    "DestinationSet",
    "Kind",
    "condition_from_json",
    "condition_to_json",
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
    # sending
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
