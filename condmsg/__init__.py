"""condmsg: conditional messaging for RabbitMQ.

The public facade. Conditions and their pure evaluation::

    from condmsg import Destination, DestinationSet, Ack, AckKind, Verdict, evaluate

It exports what this package owns; the receiver side is its own package
(``from ackd import Receiver, Message``), which imports this one, never the reverse.

Importing it loads the pure core (:mod:`condmsg.core`) and nothing else: the outbox imports
the core's error root, and the Spark audit's Python workers and the property tests import the
model, none of which may pull in pika or SQLAlchemy. The names it exports from the rest of
condmsg, :class:`Sender`, :class:`AsyncSender` (asyncio; the ``asyncio`` extra),
:class:`Outgoing` (one message of ``Sender.send_many``) and :class:`Settings`, are loaded on
first use (``docs/layout.md``).
"""

import importlib
from typing import TYPE_CHECKING, Any

from condmsg.core.acks import Ack, AckKind
from condmsg.core.condition_codec import condition_from_json, condition_to_json
from condmsg.core.conditions import Condition, Delivery, Destination, DestinationSet, Kind
from condmsg.core.errors import (
    AckError,
    BrokerError,
    ConditionError,
    CondmsgError,
    ConfigError,
    ProtocolError,
    StoreError,
)
from condmsg.core.evaluation import (
    ConstraintResult,
    DestinationFacts,
    EvaluationResult,
    Truth,
    Verdict,
    evaluate,
    evaluation_deadline,
)
from condmsg.core.outcome import Outcome

__version__ = "0.1.0"

if TYPE_CHECKING:
    from condmsg.runtime.settings import Settings
    from condmsg.sending.async_sender import AsyncSender
    from condmsg.sending.outgoing import Outgoing
    from condmsg.sending.sender import Sender

#: The module that defines each name exported on first use.
_DEFINED_IN = {
    "Sender": "condmsg.sending.sender",
    "AsyncSender": "condmsg.sending.async_sender",  # needs the asyncio extra
    "Outgoing": "condmsg.sending.outgoing",
    "Settings": "condmsg.runtime.settings",
}


def __getattr__(name: str) -> Any:
    module = _DEFINED_IN.get(name)
    if module is None:
        raise AttributeError(f"module 'condmsg' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found directly from now on
    return value


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
    "AsyncSender",
    "Outgoing",
    "Outcome",
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
