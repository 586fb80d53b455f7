"""One exception tree for the whole project, rooted at :class:`CondmsgError`.

The root, :class:`BrokerError` and :class:`StoreError` are defined in :mod:`outbox.errors`,
the lowest layer, so that the outbox's errors descend from it too; they are re-exported
here, so ``condmsg.errors.CondmsgError`` is the same class. Driver errors (pika, psycopg,
SQLAlchemy) are translated into these only inside adapters, with messages a user can act
on. Messages never contain secrets or credentials.
"""

from __future__ import annotations

from outbox.errors import BrokerAuthError, BrokerError, CondmsgError, StoreError

__all__ = [
    "AckError",
    "BrokerAuthError",
    "BrokerError",
    "ConditionError",
    "CondmsgError",
    "ConfigError",
    "ProtocolError",
    "SphereError",
    "StoreError",
]


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


class SphereError(CondmsgError):
    """A Dependency-Sphere used against its rules (sending through one that has ended,
    committing twice or after an abort, nesting, a bad timeout, an unknown handler, a
    participant a database cannot serve). Nothing was sent or changed by the call."""
