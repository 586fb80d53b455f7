"""condmsg: conditional messaging for RabbitMQ.

The public facade. Conditions and their pure evaluation::

    from condmsg import Destination, DestinationSet, Ack, AckKind, Verdict, evaluate
"""

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
