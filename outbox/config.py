"""What a relay is configured with (:class:`RelayConfig`), checked when it is built.

The outbox is a package of its own (it imports nothing of condmsg), so
:meth:`RelayConfig.from_env` reads the environment keys itself: ``CONDMSG_AMQP_URL``, the
broker URL every condmsg service and ``condmsg relay`` read, and
``CONDMSG_RELAY_PUBLISHING``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from outbox.table import DEFAULT_TABLE_NAME

ENV_AMQP_URL = "CONDMSG_AMQP_URL"
ENV_PUBLISHING = "CONDMSG_RELAY_PUBLISHING"
#: How the relay puts messages on the channel (see :mod:`outbox.publish_pika`): ``frames``
#: encoded by the outbox, ``pika``'s ``basic_publish``, or ``auto``: the frames where this
#: pika is a release they were tested with, else ``pika`` (see :mod:`condmsg.infra.fastpaths.gate`).
PUBLISHING_CHOICES = ("auto", "frames", "pika")
#: The broker of a development machine (the same default as ``condmsg.runtime.settings``).
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayConfig:
    """The settings of a :class:`outbox.Relay`; durations are in seconds.

    The relay claims ``batch_size`` rows at a time and keeps up to
    ``max_batches_in_flight`` batches awaiting publisher confirms.
    """

    #: The broker the rows are published to, or a cluster's nodes comma-separated: each
    #: connection goes to the first that answers (see :mod:`outbox.publish_confirms`).
    amqp_url: str = field(repr=False)
    #: The outbox table to publish.
    table_name: str = DEFAULT_TABLE_NAME
    #: Rows per claim.
    batch_size: int = 500
    #: Batches awaiting confirms at once.
    max_batches_in_flight: int = 4
    #: Seconds between claims when nothing wakes the relay; None: 1 s where NOTIFY wakes
    #: it (PostgreSQL), 0.25 s where only polling does (SQLite).
    poll_interval_s: float | None = None
    #: Whether to LISTEN for the table's NOTIFY (PostgreSQL only; ignored elsewhere).
    listen: bool = True
    #: Seconds a claim may sit idle in its transaction before PostgreSQL ends it (a relay
    #: that stopped talking releases its rows).
    lease_timeout_s: float = 60.0
    #: Seconds to wait for the confirm of the oldest batch before reconnecting.
    confirm_timeout_s: float = 30.0
    #: Publishing attempts of a nacked row before it is parked as failed.
    max_attempts: int = 10
    #: Seconds before the first retry of a nacked row (doubled per attempt).
    retry_initial_s: float = 1.0
    #: The longest wait between retries of a nacked row, in seconds.
    retry_max_s: float = 300.0
    #: Seconds between claims from the lowest id (rows that committed late, leases let go).
    rescan_interval_s: float = 2.0
    #: Seconds between refreshes of the table's status (backlog, failed rows).
    status_interval_s: float = 5.0
    #: Seconds a graceful stop waits for confirms in flight.
    stop_timeout_s: float = 10.0
    #: The RabbitMQ connection name (shown in the management UI).
    connection_name: str = "outbox-relay"
    #: How messages are put on the channel: one of :data:`PUBLISHING_CHOICES`.
    publishing: str = "auto"

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.max_batches_in_flight < 1:
            raise ValueError("batch_size and max_batches_in_flight must be at least 1")
        if self.publishing not in PUBLISHING_CHOICES:
            raise ValueError(
                f"publishing must be one of {', '.join(PUBLISHING_CHOICES)}, "
                f"got {self.publishing!r}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **fields: Any) -> RelayConfig:
        """The broker from ``CONDMSG_AMQP_URL`` (default: a development machine's) and the
        publishing from ``CONDMSG_RELAY_PUBLISHING`` (default ``auto``), with the
        ``fields`` given taking precedence."""
        env = os.environ if environ is None else environ
        found: dict[str, Any] = {"amqp_url": env.get(ENV_AMQP_URL, DEFAULT_AMQP_URL)}
        publishing = env.get(ENV_PUBLISHING)
        if publishing is not None and "publishing" not in fields:
            if publishing not in PUBLISHING_CHOICES:
                raise ValueError(
                    f"{ENV_PUBLISHING} must be one of {', '.join(PUBLISHING_CHOICES)}, "
                    f"got {publishing!r}"
                )
            found["publishing"] = publishing
        return cls(**(found | fields))
