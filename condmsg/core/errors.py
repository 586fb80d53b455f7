"""One exception tree for the whole project, rooted at :class:`CondmsgError`.

The root lives here, in the pure core, because everything else stands on the core: the
outbox imports this module (and nothing else of condmsg) so that its errors descend from the
same root, and :mod:`outbox` re-exports :class:`BrokerError` and :class:`StoreError`, which
it raises, as part of its own API. Driver errors (pika, psycopg, SQLAlchemy) are translated
into these only inside adapters, with messages a user can act on. Messages never contain
secrets or credentials.
"""

from __future__ import annotations

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


class CondmsgError(Exception):
    """Base of every error condmsg raises on purpose."""


class BrokerError(CondmsgError):
    """RabbitMQ could not be reached, refused an operation, or the connection or channel
    broke.

    The relay treats this as transient: rows in flight go back to the table and are
    published again after a backoff.
    """


class BrokerAuthError(BrokerError):
    """RabbitMQ refused the credentials, or the user's access to the virtual host: waiting
    does not mend it (the relay and the evaluator give up after a few refusals in a row
    rather than retrying for ever)."""


class StoreError(CondmsgError):
    """The database could not be reached or refused an operation."""


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
