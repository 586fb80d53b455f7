"""The root of the project's exception tree, and the errors the outbox raises.

:class:`CondmsgError` is defined here, in the lowest layer, because the outbox may import
nothing of ours (DESIGN section 4) and its errors must still descend from the one root;
:mod:`condmsg.errors` re-exports it with the rest of the tree. :class:`BrokerError` and
:class:`StoreError` live here for the same reason: the outbox raises them, and so do the
sender, the receiver and the evaluator.

Driver errors (pika, SQLAlchemy, psycopg) are translated into these at the edge of the
package, with messages a user can act on. Messages never contain passwords: URLs are shown
through :func:`outbox.urls.redact_url`.
"""

from __future__ import annotations


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
    does not mend it (a service gives up after :data:`AUTH_REFUSALS_BEFORE_GIVING_UP`
    tries in a row rather than retrying for ever)."""


#: Refusals of the login in a row after which a service (the relay, the evaluator) stops
#: with a non-zero exit instead of retrying: a few seconds of backoff, long enough for a
#: broker that is still setting up its users. A broker restart never refuses a login.
AUTH_REFUSALS_BEFORE_GIVING_UP = 5


class StoreError(CondmsgError):
    """The database could not be reached or refused an operation."""


class OutboxError(CondmsgError):
    """Misuse of the outbox: a message it cannot carry, a relay started twice, a wait that
    ran out of time."""


class OutboxTypeError(OutboxError, TypeError):
    """An argument of the wrong type (e.g. a message body that is not ``bytes``)."""


class OutboxValueError(OutboxError, ValueError):
    """An argument of the right type but an impossible value (e.g. priority 300)."""


class OutboxTimeout(OutboxError, TimeoutError):
    """A wait with a deadline (``drain``, ``run_until_idle``) ran out of time."""
