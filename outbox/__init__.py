"""A generic transactional outbox for RabbitMQ on SQLAlchemy (SQLite and PostgreSQL).

Write messages with :func:`enqueue` / :func:`enqueue_many` in the same transaction as the
business rows they belong to; a :class:`Relay` publishes them after the commit with
publisher confirms, at least once. See ``docs/outbox.md``.

The errors are imported at once; everything else on first use, because importing any
submodule (``outbox.errors``, ``outbox.message``) runs this file first and must not pull in
SQLAlchemy, psycopg or pika. The errors descend from the project's one root,
:class:`condmsg.CondmsgError`, which lives in condmsg's pure core (``docs/layout.md``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from outbox.errors import (
    BrokerError,
    CondmsgError,
    OutboxError,
    OutboxTimeout,
    OutboxTypeError,
    OutboxValueError,
    StoreError,
)

if TYPE_CHECKING:
    from outbox.config import RelayConfig
    from outbox.enqueueing import enqueue, enqueue_all, enqueue_fanouts, enqueue_many
    from outbox.message import Fanout, OutboxMessage, StoredMessage
    from outbox.metrics import RelayMetrics
    from outbox.publish_pika import COPY_HEADER, ROW_ID_HEADER
    from outbox.relay import Relay
    from outbox.relay_health import RelayStats
    from outbox.store import FailedRow, OutboxStatus, OutboxStore
    from outbox.table import DEFAULT_TABLE_NAME, create_tables, metadata, outbox_table

#: The module that defines each name exported on first use.
_DEFINED_IN = {
    **dict.fromkeys(("enqueue", "enqueue_all", "enqueue_fanouts", "enqueue_many"), "enqueueing"),
    **dict.fromkeys(("Fanout", "OutboxMessage", "StoredMessage"), "message"),
    "RelayConfig": "config",
    "RelayMetrics": "metrics",
    **dict.fromkeys(("COPY_HEADER", "ROW_ID_HEADER"), "publish_pika"),
    "Relay": "relay",
    "RelayStats": "relay_health",
    **dict.fromkeys(("FailedRow", "OutboxStatus", "OutboxStore"), "store"),
    **dict.fromkeys(("DEFAULT_TABLE_NAME", "create_tables", "metadata", "outbox_table"), "table"),
}


def __getattr__(name: str) -> Any:
    module = _DEFINED_IN.get(name)
    if module is None:
        raise AttributeError(f"module 'outbox' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"outbox.{module}"), name)
    globals()[name] = value  # found directly from now on
    return value


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
    "BrokerError",
    "CondmsgError",
    "OutboxError",
    "OutboxTimeout",
    "OutboxTypeError",
    "OutboxValueError",
    "StoreError",
]
