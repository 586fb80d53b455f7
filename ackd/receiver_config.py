"""``ReceiverConfig``: how a ``Receiver`` connects, retries and waits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ackd.attempts import DEFAULT_BACKOFF, DEFAULT_BACKOFF_MAX, DEFAULT_MAX_ATTEMPTS, RetryPolicy
from condmsg.core import protocol
from condmsg.core.errors import ConfigError
from condmsg.runtime.credentials import checked_secret
from condmsg.runtime.settings import Settings

#: How long the first part of an incomplete Message Sequence waits for the others.
DEFAULT_SEQUENCE_TIMEOUT = timedelta(minutes=5)
#: How long ``read`` sleeps between two looks at an empty queue (seconds).
DEFAULT_POLL_INTERVAL_S = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiverConfig:
    """The settings of a ``Receiver`` (its recipient identity, engine, store and clock
    are arguments of its own).

    ``db_url`` may be None when the receiver is given an engine. ``secret``, when given,
    makes the receiver verify each copy's token. ``receiver_id`` (default: host, process
    and recipient) names this consumer in the RLOG and its acks.

    A message whose transactional processing failed is held back before it comes back:
    ``retry_backoff`` after the first failure, doubling after each further one up to
    ``retry_backoff_max``; after ``max_attempts`` failures (counted across redeliveries
    and receiver processes by message id) it goes to ``invalid_queue``. The defaults ride
    out about 3 s of a failing database.

    The store must hold the schema this release expects (``condmsg db upgrade --store
    receiver``); ``create_schema=True`` creates one that does not exist yet (quick starts,
    tests).
    """

    # Not in the repr: URLs may carry passwords, and the secret keys the tokens.
    amqp_url: str = field(repr=False)
    db_url: str | None = field(default=None, repr=False)
    secret: bytes | None = field(default=None, repr=False)
    receiver_id: str | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry_backoff: timedelta = DEFAULT_BACKOFF
    retry_backoff_max: timedelta = DEFAULT_BACKOFF_MAX
    sequence_timeout: timedelta = DEFAULT_SEQUENCE_TIMEOUT
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    invalid_queue: str = protocol.INVALID_MESSAGE_QUEUE
    create_schema: bool = False

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError("max_attempts must be at least 1")
        if self.retry_backoff < timedelta(0) or self.retry_backoff_max < self.retry_backoff:
            raise ConfigError("retry_backoff must be >= 0 and at most retry_backoff_max")
        if self.secret is not None:
            checked_secret(self.secret, "the receiver's secret")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> ReceiverConfig:
        """The connection settings and secret from the environment (``CONDMSG_AMQP_URL``,
        ``CONDMSG_DB_URL``, ``CONDMSG_SECRET``), the rest from ``overrides`` or the
        defaults."""
        return cls(**(Settings.from_env(environ).endpoint_options() | overrides))

    @property
    def retry(self) -> RetryPolicy:
        return RetryPolicy(self.max_attempts, self.retry_backoff, self.retry_backoff_max)
