"""The errors the outbox raises.

They descend from the project's one root, :class:`condmsg.CondmsgError`, defined in the pure
core (:mod:`condmsg.core.errors`), the only part of condmsg the outbox imports.
:class:`BrokerError` and :class:`StoreError` are the core's, shared with the sender, the
receiver and the evaluator; they are re-exported here because the outbox raises them too.

Driver errors (pika, SQLAlchemy, psycopg) are translated into these at the edge of the
package, with messages a user can act on. Messages never contain passwords: URLs are shown
through :func:`condmsg.infra.urls.redact_url`.
"""

from __future__ import annotations

from condmsg.core.errors import BrokerAuthError, BrokerError, CondmsgError, StoreError

__all__ = [
    "AUTH_REFUSALS_BEFORE_GIVING_UP",
    "BrokerAuthError",
    "BrokerError",
    "CondmsgError",
    "OutboxError",
    "OutboxTimeout",
    "OutboxTypeError",
    "OutboxValueError",
    "StoreError",
]


#: Refusals of the login in a row after which a service (the relay, the evaluator) stops
#: with a non-zero exit instead of retrying: a few seconds of backoff, long enough for a
#: broker that is still setting up its users. A broker restart never refuses a login.
AUTH_REFUSALS_BEFORE_GIVING_UP = 5


class OutboxError(CondmsgError):
    """Misuse of the outbox: a message it cannot carry, a relay started twice, a wait that
    ran out of time."""


class OutboxTypeError(OutboxError, TypeError):
    """An argument of the wrong type (e.g. a message body that is not ``bytes``)."""


class OutboxValueError(OutboxError, ValueError):
    """An argument of the right type but an impossible value (e.g. priority 300)."""


class OutboxTimeout(OutboxError, TimeoutError):
    """A wait with a deadline (``drain``, ``run_until_idle``) ran out of time."""
