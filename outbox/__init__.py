"""A generic transactional outbox for RabbitMQ on SQLAlchemy (SQLite and PostgreSQL).

Write messages with :func:`enqueue` / :func:`enqueue_many` in the same transaction as the
business rows they belong to; a :class:`Relay` publishes them after the commit with
publisher confirms, at least once. See ``docs/outbox.md``.
"""

from __future__ import annotations

from outbox.config import RelayConfig
from outbox.enqueue import enqueue, enqueue_all, enqueue_fanouts, enqueue_many
from outbox.errors import (
    BrokerUnavailable,
    OutboxError,
    OutboxTimeout,
    OutboxTypeError,
    OutboxValueError,
    StoreUnavailable,
)
from outbox.message import Fanout, OutboxMessage, StoredMessage
from outbox.metrics import RelayMetrics
from outbox.publisher import COPY_HEADER, ROW_ID_HEADER
from outbox.relay import Relay, RelayStats
from outbox.store import FailedRow, OutboxStatus, OutboxStore
from outbox.table import DEFAULT_TABLE_NAME, create_tables, metadata, outbox_table

__all__ = [
    # writing
    "Fanout",
    "OutboxMessage",
    "enqueue",
    "enqueue_all",
    "enqueue_fanouts",
    "enqueue_many",
    # schema
    "DEFAULT_TABLE_NAME",
    "create_tables",
    "metadata",
    "outbox_table",
    # relaying
    "COPY_HEADER",
    "ROW_ID_HEADER",
    "Relay",
    "RelayConfig",
    "RelayMetrics",
    "RelayStats",
    # operating
    "FailedRow",
    "OutboxStatus",
    "OutboxStore",
    "StoredMessage",
    # errors
    "BrokerUnavailable",
    "OutboxError",
    "OutboxTimeout",
    "OutboxTypeError",
    "OutboxValueError",
    "StoreUnavailable",
]
