"""What an evaluator service is configured with, checked when it is built.

:class:`EvaluatorConfig` holds the settings of one evaluator (plain values, no open
connections); :meth:`EvaluatorConfig.from_env` reads the deployment's ``CONDMSG_*``
settings. The runtime collaborators (an engine, a metrics registry, a clock) are given to
:class:`evaluator.service.Evaluator` beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from condmsg.core.errors import ConfigError
from condmsg.runtime.credentials import checked_secret
from condmsg.runtime.settings import (
    DEFAULT_ACK_GRACE,
    DEFAULT_CLOCK_SKEW,
    DEFAULT_RETENTION_INTERVAL_S,
    Settings,
)
from condmsg.runtime.topology import checked_sender_name
from evaluator.retention import DEFAULT_BATCH as DEFAULT_RETENTION_BATCH
from evaluator.retention import RetentionPolicy


@dataclass(frozen=True, slots=True, kw_only=True)
class EvaluatorConfig:
    """The settings of an evaluator for the sender ``sender`` (ack queue
    ``condmsg.<sender>.ack``); invalid combinations raise :class:`ConfigError` here.

    Acks are taken in ``batch_size`` at a time with ``prefetch`` deliveries outstanding;
    ``store_threads`` threads store and decide the batches, one transaction each, while
    the consuming thread takes in the next. ``intake_processes`` above 1 adds that many
    minus one worker processes (PostgreSQL only; they connect to ``db_url`` themselves).

    An ack whose times are off by more than ``clock_skew`` (read before its CM's
    ``sent_at``, or read or committed after its receipt) is a ``clock_skew`` anomaly.

    With ``retention`` (and ``retention_archive``), CMs decided longer ago than that are
    archived to Parquet under ``retention_archive`` and deleted, every
    ``retention_interval_s`` seconds, ``retention_batch`` CMs per archive. Disabled by
    default: the store keeps everything.

    With ``freeze_gc``, :meth:`Evaluator.run` moves the objects the process holds by then
    to the garbage collector's permanent generation (``gc.freeze()``): intake allocates
    many short-lived objects, and each full collection would otherwise walk that whole
    heap again. It acts on the whole process, so it is off by default (an evaluator
    embedded in an application would freeze the application's objects too) and on in
    ``condmsg evaluator``, which is a process of its own.
    """

    #: The broker, or a cluster's nodes comma-separated (each connection goes to the first
    #: that answers); the ack queue is read and the outbox relay publishes there.
    amqp_url: str = field(repr=False)
    #: The sender whose CMs are decided.
    sender: str
    #: The sender store; None when the evaluator is given an engine (and runs no workers).
    db_url: str | None = field(default=None, repr=False)
    #: The key of the copies' tokens; None: the store's own (read when it is prepared).
    secret: bytes | None = field(default=None, repr=False)
    #: How long after a deadline acks that were read in time may still arrive.
    ack_grace: timedelta = DEFAULT_ACK_GRACE
    #: How far a receiver's clock may be from the evaluator's.
    clock_skew: timedelta = DEFAULT_CLOCK_SKEW
    #: Acks per batch (one transaction each).
    batch_size: int = 500
    #: Deliveries the broker may have outstanding on the consuming channel.
    prefetch: int = 1000
    #: Threads storing and deciding batches while the next is consumed.
    store_threads: int = 2
    #: The longest wait between deadline sweeps, in seconds (each also runs when the
    #: earliest pending CM falls due: see :mod:`evaluator.sweep_timer`).
    sweep_interval_s: float = 1.0
    #: CMs claimed per sweep transaction.
    sweep_batch: int = 500
    #: Seconds between refreshes of the store and ack-queue gauges (and of what
    #: ``/readyz`` knows about reaching the database and RabbitMQ).
    gauge_interval_s: float = 15.0
    #: Seconds between the INFO lines summing up decisions, pending and overdue CMs (0: none;
    #: logged by the instance that sweeps).
    summary_interval_s: float = 60.0
    #: Whether the deadline sweeps run in this service (an intake worker runs none).
    sweeps: bool = True
    #: Whether an in-process outbox relay publishes the outcomes (else `condmsg relay`).
    relay: bool = True
    #: The name this evaluator stamps on its decisions; None: ``host:pid``.
    instance: str | None = None
    #: Decided CMs older than this are archived and deleted; None keeps everything.
    retention: timedelta | None = None
    #: Where retention writes its Parquet archives (required with ``retention``).
    retention_archive: Path | None = None
    #: Seconds between retention passes.
    retention_interval_s: float = DEFAULT_RETENTION_INTERVAL_S
    #: CMs per retention archive.
    retention_batch: int = DEFAULT_RETENTION_BATCH
    #: ``gc.freeze()`` before running (a process of its own only).
    freeze_gc: bool = False
    #: Processes taking in acks: this one and ``intake_processes - 1`` workers.
    intake_processes: int = 1
    #: How the intake workers log: the service's ``--log-level`` and ``--log-format`` (None:
    #: ``CONDMSG_LOG_LEVEL`` and ``CONDMSG_LOG_FORMAT``, else INFO and text).
    log_level: str | None = None
    log_format: str | None = None
    #: Whether a store that does not exist yet is created (``--create-schema``; quick starts
    #: and tests). Off, a missing store is refused with the command that creates it.
    create: bool = False
    #: What a retention pass archives and deletes (from the ``retention_*`` fields); None
    #: without ``retention``.
    retention_policy: RetentionPolicy | None = field(init=False, default=None, compare=False)

    def __post_init__(self) -> None:
        checked_sender_name(self.sender)
        if self.secret is not None:
            checked_secret(self.secret, "the evaluator's secret")
        if self.retention is not None:
            if self.retention_archive is None:
                raise ConfigError(
                    "retention needs an archive directory (--archive, CONDMSG_ARCHIVE_DIR)"
                )
            if self.retention_interval_s <= 0:
                raise ConfigError("the retention interval must be positive seconds")
            policy = RetentionPolicy(  # checks the period and the batch
                older_than=self.retention,
                archive=Path(self.retention_archive),
                batch=self.retention_batch,
            )
            object.__setattr__(self, "retention_policy", policy)  # frozen: set once here
        if self.clock_skew < timedelta(0):
            raise ConfigError("the clock-skew tolerance must not be negative")
        if self.gauge_interval_s <= 0:
            raise ConfigError("the gauge interval must be positive seconds")
        if self.summary_interval_s < 0:
            raise ConfigError("the summary interval must not be negative (0: no summary)")
        if self.store_threads < 1:
            raise ConfigError("store_threads must be at least 1")
        if self.intake_processes < 1:
            raise ConfigError("intake_processes must be at least 1")
        if self.intake_processes > 1:
            self._check_workers_can_connect()

    def _check_workers_can_connect(self) -> None:
        if self.db_url is None:
            # The workers connect themselves: an engine's options beyond its URL (connect
            # arguments, events, a creator) cannot follow them, so the URL must be given.
            raise ConfigError("several intake processes need db_url (the workers connect to it)")
        if sa.engine.make_url(self.db_url).get_backend_name() != "postgresql":
            raise ConfigError(
                "several intake processes need PostgreSQL (SQLite takes one writer at a time)"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **fields: Any) -> EvaluatorConfig:
        """The deployment's settings (``CONDMSG_AMQP_URL``, ``CONDMSG_DB_URL``,
        ``CONDMSG_SECRET``, ``CONDMSG_ACK_GRACE_MS``, ``CONDMSG_CLOCK_SKEW_MS``,
        ``CONDMSG_RETENTION``, ``CONDMSG_ARCHIVE_DIR``, ``CONDMSG_RETENTION_INTERVAL_S``),
        with the ``fields`` given (``sender`` at least) taking precedence over them."""
        settings = Settings.from_env(environ)
        from_settings = {
            "amqp_url": settings.amqp_url,
            "db_url": settings.db_url,
            "secret": settings.secret,
            "ack_grace": settings.ack_grace,
            "clock_skew": settings.clock_skew,
            "retention": settings.retention,
            "retention_archive": settings.archive_dir,
            "retention_interval_s": settings.retention_interval_s,
        }
        return cls(**(from_settings | fields))
