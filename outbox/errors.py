"""The outbox's own exception tree, rooted at :class:`OutboxError`.

Driver errors (pika, SQLAlchemy, psycopg) are translated into these at the edge of the
package, with messages a user can act on. Messages never contain passwords: URLs are shown
through :func:`outbox.urls.redact_url`.
"""

from __future__ import annotations


class OutboxError(Exception):
    """Base of every error the outbox raises on purpose."""


class OutboxTypeError(OutboxError, TypeError):
    """An argument of the wrong type (e.g. a message body that is not ``bytes``)."""


class OutboxValueError(OutboxError, ValueError):
    """An argument of the right type but an impossible value (e.g. priority 300)."""


class BrokerUnavailable(OutboxError):
    """RabbitMQ could not be reached, or the connection or channel broke.

    The relay treats this as transient: rows in flight go back to the table and are
    published again after a backoff.
    """


class StoreUnavailable(OutboxError):
    """The database could not be reached or refused an operation."""


class OutboxTimeout(OutboxError, TimeoutError):
    """A wait with a deadline (``drain``, ``run_until_idle``) ran out of time."""
