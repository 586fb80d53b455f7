"""The relay's link to RabbitMQ: one :class:`Publisher` at a time, opened again with backoff
after it dies, given up on when RabbitMQ keeps refusing the login.

A broker restart never refuses a login; a wrong password does, for ever: after
:data:`AUTH_REFUSALS_BEFORE_GIVING_UP` refusals in a row the link records why in
:attr:`BrokerLink.fatal` and the relay stops, where any other failure is retried.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from condmsg.infra.backoff import Backoff
from outbox.config import RelayConfig
from outbox.errors import AUTH_REFUSALS_BEFORE_GIVING_UP, BrokerAuthError, BrokerError
from outbox.metrics import RelayMetrics
from outbox.publish_confirms import Publisher, publishing_for
from outbox.relay_health import RelayCounts, RelayProblems

log = logging.getLogger("outbox.relay")


class BrokerLink:
    """Opens and reopens the relay's :class:`Publisher`; see the module docstring.

    Called from the relay's loop thread only; ``alive`` and ``fatal`` are plain attributes
    that a health endpoint's thread reads without a lock. ``on_done`` is handed to each
    publisher: it runs when a batch is settled (it wakes the relay's loop).
    """

    def __init__(
        self,
        config: RelayConfig,
        *,
        metrics: RelayMetrics,
        problems: RelayProblems,
        counts: RelayCounts,
        on_done: Callable[[], None],
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._problems = problems
        self._counts = counts
        self._on_done = on_done
        # Chosen once: a forced publishing this pika cannot run fails here, not at connect.
        self._publishing = publishing_for(config.publishing)
        self._backoff = Backoff(0.2, 10.0)
        self._next_connect_at = 0.0
        self._ever_connected = False
        self._refusals = 0
        #: The open publisher (None: not connected, or its connection died).
        self.publisher: Publisher | None = None
        #: Why the link gave up (None: it did not): RabbitMQ refused its login
        #: :data:`AUTH_REFUSALS_BEFORE_GIVING_UP` times in a row.
        self.fatal: str | None = None

    @property
    def alive(self) -> bool:
        """Whether a publisher is open and its connection alive."""
        publisher = self.publisher
        return publisher is not None and publisher.alive

    def restart(self) -> None:
        """Forget an earlier run's refusals (the relay starts again)."""
        self.fatal = None
        self._refusals = 0

    def connect(self) -> bool:
        """Close a dead publisher and open one if its backoff allows: True if one opened.

        Call it only with no batch in flight: the dead connection's batches come back first.
        """
        self._metrics.connected.set(0)
        dead, self.publisher = self.publisher, None
        if dead is not None:
            if dead.last_error:
                self._problems.failed(dead.last_error, "broker")
            dead.close()
        now = time.monotonic()
        if now < self._next_connect_at:
            return False
        try:
            self.publisher = Publisher(
                self._config.amqp_url,
                on_done=self._on_done,
                connection_name=self._config.connection_name,
                publishing=self._publishing,
            ).start()
        except BrokerError as exc:
            self._problems.failed(str(exc), "broker")
            self._next_connect_at = now + self._backoff.next_delay()
            self._refusals = self._refusals + 1 if isinstance(exc, BrokerAuthError) else 0
            if self._refusals >= AUTH_REFUSALS_BEFORE_GIVING_UP:
                self.fatal = f"{exc} (refused {self._refusals} times)"
            return False
        if self._ever_connected:
            self._counts.reconnected()
            if self._problems.broker is None:
                log.info("outbox relay: reconnected to RabbitMQ")
        self._problems.answered("broker")  # says so if connecting had failed
        self._ever_connected = True
        self._backoff.reset()
        self._metrics.connected.set(1)
        return True

    def close(self) -> None:
        """Close the publisher, if any (the relay stops)."""
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None
