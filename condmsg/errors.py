"""One exception tree for the whole project, rooted at :class:`CondmsgError`.

Driver errors (pika, psycopg, SQLAlchemy) are translated into these only inside adapters,
with messages a user can act on. Messages never contain secrets or credentials.
"""

from __future__ import annotations


class CondmsgError(Exception):
    """Base of every error condmsg raises on purpose."""


class ConditionError(CondmsgError, ValueError):
    """An invalid condition tree, or an invalid argument to its evaluation.

    The message names the offending node (its path such as ``root[1][0]``, or its queue
    name) and the attribute.
    """


class AckError(CondmsgError, ValueError):
    """An acknowledgment that cannot be valid (wrong kind/timestamps, naive datetimes)."""


class ProtocolError(CondmsgError, ValueError):
    """A message on the wire that does not follow the condmsg protocol."""


class ConfigError(CondmsgError, ValueError):
    """A setting is missing or malformed; the message names the environment key."""


class BrokerError(CondmsgError):
    """RabbitMQ could not be reached or refused an operation."""


class StoreError(CondmsgError):
    """The database could not be reached or refused an operation."""
