"""The relay: claims pending rows, publishes them with confirms, settles them; repeat.

One loop thread does all database work; the publisher's I/O thread talks to RabbitMQ and
the listener thread turns NOTIFYs into wake-ups. The loop keeps up to
``max_batches_in_flight`` batches of ``batch_size`` rows awaiting confirms, so the broker
always has work while the database settles earlier batches.

Where the next claim starts: while draining a backlog the relay claims behind its previous
batch (``id > cursor``), so it never re-walks the index entries of rows it just deleted.
After catching up, after a broker failure, and every ``rescan_interval_s`` it starts again
from the lowest id, which picks up rows that committed late (a lower id committing after a
higher one), rows a crashed relay let go, and nacked rows whose retry time has come. On
SQLite that rescan waits until nothing is in flight, because without row locks a rescan
would otherwise claim rows the relay is still publishing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from datetime import UTC, datetime, timedelta
from types import TracebackType

from prometheus_client import CollectorRegistry
from sqlalchemy.engine import Engine

from condmsg.infra.backoff import Backoff, retry_delay_s
from outbox import publish_spans
from outbox.config import RelayConfig
from outbox.errors import (
    AUTH_REFUSALS_BEFORE_GIVING_UP,
    BrokerAuthError,
    BrokerError,
    OutboxError,
    OutboxTimeout,
    StoreError,
)
from outbox.metrics import RelayMetrics
from outbox.notify import Listener
from outbox.publish_confirms import PendingBatch, Publisher, publishing_for
from outbox.relay_health import RelayProblems, RelayStats
from outbox.store import Claim, Key, OutboxStatus, OutboxStore

log = logging.getLogger(__name__)

#: How long the loop may go without turning before :meth:`Relay.liveness` reports it stuck
#: (seconds): well above a slow claim or settle, so that a busy database is not a restart.
LIVE_STALL_S = 60.0


class Relay:
    """Publishes the rows of one outbox table to RabbitMQ; see the module docstring.

    Run it in the background (``start()``/``stop()`` or ``with Relay(...)``), in the
    current thread until ``stop()`` (``run()``), or until nothing is left to publish
    (``run_until_idle()``; ``drain()`` waits for that on a started relay). Its settings
    are a :class:`RelayConfig`; ``registry`` receives its metrics. Where only polling
    wakes it (SQLite), call :meth:`wake` after a commit.
    """

    def __init__(
        self, engine: Engine, config: RelayConfig, *, registry: CollectorRegistry | None = None
    ) -> None:
        self.config = config
        self.store = OutboxStore(
            engine, table_name=config.table_name, lease_timeout_s=config.lease_timeout_s
        )
        self.listen = config.listen and self.store.locking
        self.poll_interval_s = config.poll_interval_s or (1.0 if self.listen else 0.25)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = RelayMetrics(self.registry, table=config.table_name)
        # Chosen once: a forced publishing this pika cannot run fails here, not at connect.
        self._publishing = publishing_for(config.publishing)

        self._wake_event = threading.Event()
        self._stop_event = threading.Event()
        # Set by request_stop, which a signal handler may call: a plain attribute, no lock.
        self._stop_requested = False
        #: Why the relay gave up by itself (None: it did not): RabbitMQ refused its login
        #: :data:`AUTH_REFUSALS_BEFORE_GIVING_UP` times in a row.
        self.fatal: str | None = None
        self._refusals = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._running = False
        self._listener: Listener | None = None
        self._publisher: Publisher | None = None
        self._inflight: deque[tuple[Claim, PendingBatch]] = deque()
        self._broker_backoff = Backoff(0.2, 10.0)
        self._store_backoff = Backoff(0.2, 10.0)
        self._next_connect_at = 0.0
        self._next_claim_at = 0.0
        self._next_poll_at = 0.0
        self._next_status_at = 0.0
        self._last_rescan_at = 0.0
        self._cursor = 0
        self._rescan = True
        self._more = True
        # Wake-ups are counted, not flagged, so one arriving during a claim is never lost.
        self._wake_seq = 0
        self._seen_seq = 0
        self._idle_through = -1
        self._drain_target = -1
        self._ever_connected = False
        self._published = self._failed = self._retried = self._reconnects = 0
        self._problems = RelayProblems(self.metrics)
        self._status: OutboxStatus | None = None
        self._stepped_at = time.monotonic()

    # -- public control -------------------------------------------------------------------

    def wake(self) -> None:
        """Ask for a claim now (e.g. right after committing rows, where there is no NOTIFY)."""
        with self._cond:
            self._wake_seq += 1
        self._wake_event.set()

    def start(self) -> Relay:
        """Run the relay in a background thread until :meth:`stop`."""
        if self._thread is not None:
            raise OutboxError("this relay is already running")
        self._stop_event.clear()
        self._stop_requested = False
        self.fatal = None
        self._refusals = 0
        self._thread = threading.Thread(target=self.run, name="outbox-relay", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop gracefully: no new claims; wait for confirms in flight; settle; close."""
        self._stop_event.set()
        self._wake_event.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s if timeout_s is not None else self.config.stop_timeout_s + 15.0)

    def request_stop(self) -> None:
        """Ask :meth:`run` to stop, as :meth:`stop` does, without waiting and without
        taking a lock: safe in a signal handler (``threading.Event.set`` is not, when the
        interrupted frame is waiting on that event). The loop sees it within half a second."""
        self._stop_requested = True

    def _stopping(self) -> bool:
        return self._stop_requested or self._stop_event.is_set()

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def run(self) -> None:
        """Run in the current thread until :meth:`stop` (from another thread or a signal)."""
        self._open()
        try:
            while not self._stopping():
                self._step()
                self._wait()
        finally:
            self._close()

    def run_until_idle(self, timeout_s: float = 30.0) -> RelayStats:
        """Run in the current thread until nothing claimable is left and nothing is in
        flight; raise :class:`OutboxTimeout` after ``timeout_s``."""
        if self._thread is not None:
            return self.drain(timeout_s)
        target = self._bump()
        deadline = time.monotonic() + timeout_s
        self._open()
        try:
            while self._idle_through < target:
                if time.monotonic() > deadline:
                    raise self._timeout(timeout_s)
                self._step()
                if self._idle_through < target:
                    self._wait(max_s=max(0.0, deadline - time.monotonic()))
        finally:
            self._close()
        return self.stats()

    def drain(self, timeout_s: float = 30.0) -> RelayStats:
        """Wait until the running relay has nothing claimable left and nothing in flight."""
        if self._thread is None:
            return self.run_until_idle(timeout_s)
        target = self._bump()
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._idle_through < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._timeout(timeout_s)
                self._cond.wait(remaining)
        return self.stats()

    def stats(self) -> RelayStats:
        """Counters since creation (no database access)."""
        return RelayStats(
            published=self._published,
            failed=self._failed,
            retried=self._retried,
            reconnects=self._reconnects,
            in_flight=sum(c.messages for c, _ in list(self._inflight)),
            connected=self._publisher is not None and self._publisher.alive,
            last_error=self._problems.last,
            status=self._status,
        )

    def status(self) -> OutboxStatus:
        """A fresh snapshot of the table (pending, failed, oldest pending age)."""
        return self.store.status()

    def liveness(self, stall_s: float = LIVE_STALL_S) -> str | None:
        """None while the relay's loop turns (it does at least every half second unless
        a database or broker call hangs), else why not: for a ``/healthz`` check."""
        if not self._running:
            return "the outbox relay is not running"
        stalled = time.monotonic() - self._stepped_at
        if stalled > stall_s:
            return f"the outbox relay's loop has not turned for {stalled:.0f} s"
        return None

    def readiness(self) -> str | None:
        """None while the relay can publish (connected to RabbitMQ, its table answering),
        else why not, in one line: for a ``/readyz`` check."""
        if not self._running:
            return "the outbox relay is not running"
        publisher = self._publisher
        if publisher is None or not publisher.alive:
            problem = self._problems.broker or "connecting"
            return f"the outbox relay is not connected to RabbitMQ: {problem}"
        if self._problems.store is not None:
            return f"the outbox table does not answer: {self._problems.store}"
        return None

    # -- loop -----------------------------------------------------------------------------

    def _bump(self) -> int:
        """Request proof of idleness: a claim from the head that starts after this call."""
        with self._cond:
            self._wake_seq += 1
            self._drain_target = max(self._drain_target, self._wake_seq)
            return self._wake_seq

    def _timeout(self, timeout_s: float) -> OutboxTimeout:
        stats = self.stats()
        detail = f"; last error: {stats.last_error}" if stats.last_error else ""
        return OutboxTimeout(
            f"the outbox relay did not become idle within {timeout_s:g} s "
            f"({stats.in_flight} messages in flight){detail}"
        )

    def _open(self) -> None:
        if self._running:
            raise OutboxError("this relay is already running")
        self._running = True
        self._stepped_at = time.monotonic()
        if self.listen:
            try:
                channel = self.store.notify_channel()
            except StoreError as exc:
                self._problems.failed(str(exc), "store")
                channel = None
            if channel is not None:
                self._listener = Listener(self.store.engine, channel, self.wake).start()

    def _wait(self, max_s: float = 0.5) -> None:
        now = time.monotonic()
        timeout = min(max_s, 0.5, max(0.0, self._next_poll_at - now))
        self._wake_event.wait(timeout)

    def _step(self) -> None:
        self._stepped_at = time.monotonic()
        self._wake_event.clear()
        self._settle_done()
        self._check_overdue()
        self._refresh_status()
        if self._stopping() or not self._ensure_publisher():
            return
        self._claim_more()

    def _ensure_publisher(self) -> bool:
        if self._publisher is not None and self._publisher.alive:
            return True
        if self._inflight:  # let the dead connection's batches come back first
            return False
        self.metrics.connected.set(0)
        if self._publisher is not None:
            if self._publisher.last_error:
                self._problems.failed(self._publisher.last_error, "broker")
            self._publisher.close()
            self._publisher = None
        now = time.monotonic()
        if now < self._next_connect_at:
            return False
        try:
            self._publisher = Publisher(
                self.config.amqp_url,
                on_done=self._wake_event.set,
                connection_name=self.config.connection_name,
                publishing=self._publishing,
            ).start()
        except BrokerError as exc:
            self._problems.failed(str(exc), "broker")
            self._next_connect_at = now + self._broker_backoff.next_delay()
            self._refusals = self._refusals + 1 if isinstance(exc, BrokerAuthError) else 0
            if self._refusals >= AUTH_REFUSALS_BEFORE_GIVING_UP:
                # A broker restart never refuses a login; a wrong password does, for ever.
                self.fatal = f"{exc} (refused {self._refusals} times)"
                self.request_stop()
            return False
        if self._ever_connected:
            self._reconnects += 1
            self.metrics.reconnects.inc()
            if self._problems.broker is None:
                log.info("outbox relay: reconnected to RabbitMQ")
        self._problems.answered("broker")  # says so if connecting had failed
        self._ever_connected = True
        self._broker_backoff.reset()
        self.metrics.connected.set(1)
        self._rescan = self._more = True
        return True

    def _claim_more(self) -> None:
        publisher = self._publisher
        assert publisher is not None
        most = self.config.max_batches_in_flight
        while len(self._inflight) < most and not self._stopping():
            now = time.monotonic()
            if now < self._next_claim_at:
                return
            with self._cond:
                seq = self._wake_seq
                # Someone waits in drain(): once nothing is in flight, prove idleness with
                # an empty claim from the head.
                proving = not self._inflight and self._idle_through < self._drain_target
                wanted = self._more or seq != self._seen_seq or now >= self._next_poll_at
            if proving:
                self._rescan = True
            if not (wanted or proving):
                return
            if now - self._last_rescan_at >= self.config.rescan_interval_s:
                self._rescan = True
            if self._rescan and self._cursor and (self.store.locking or not self._inflight):
                self._cursor = 0
            from_head = self._cursor == 0
            try:
                claim = self.store.claim(self.config.batch_size, after_id=self._cursor)
            except StoreError as exc:
                self._problems.failed(str(exc), "store")
                self._next_claim_at = now + self._store_backoff.next_delay()
                return
            self._store_backoff.reset()
            self._problems.answered("store")
            self._seen_seq = seq
            if from_head:
                self._rescan = False
                self._last_rescan_at = now
                self._next_poll_at = now + self.poll_interval_s
            self._more = len(claim.rows) == self.config.batch_size
            if not claim.rows:
                if from_head and not self._inflight:
                    with self._cond:
                        self._idle_through = max(self._idle_through, seq)
                        self._cond.notify_all()
                else:
                    self._rescan = True
                return
            if not self._more:
                self._rescan = True
            self._cursor = claim.last_id
            self._inflight.append((claim, publisher.submit(claim.rows)))
            self.metrics.in_flight.inc(claim.messages)

    def _settle_done(self) -> None:
        keep: deque[tuple[Claim, PendingBatch]] = deque()
        while self._inflight:
            claim, batch = self._inflight.popleft()
            if not batch.done.is_set():
                keep.append((claim, batch))
                continue
            self.metrics.in_flight.dec(claim.messages)
            self._settle(claim, batch)
        self._inflight = keep

    def _settle(self, claim: Claim, batch: PendingBatch) -> None:
        result = batch.result
        if result.error is not None:
            self.store.release(claim)
            self._problems.failed(str(result.error), "broker")
            self._retried += claim.messages
            self.metrics.retried_broker.inc(claim.messages)
            self._rescan = self._more = True
            return
        self.metrics.batch_confirm.observe(
            time.monotonic() - batch.submitted_at, publish_spans.exemplar_of(claim.rows)
        )
        parked: dict[Key, str] = dict(result.refused.items())
        retry: dict[Key, tuple[str, datetime]] = {}
        now = datetime.now(UTC)
        attempts = {row.id: row.attempts for row in claim.rows}
        for key, reason in result.nacked.items():
            tries = attempts[key[0]] + 1
            if tries >= self.config.max_attempts:
                parked[key] = f"{reason}; gave up after {tries} attempts"
                self.metrics.failed_nacked.inc()
            else:
                delay = retry_delay_s(
                    tries, initial_s=self.config.retry_initial_s, maximum_s=self.config.retry_max_s
                )
                retry[key] = (reason, now + timedelta(seconds=delay))
        try:
            self.store.settle(claim, published=result.published, parked=parked, retry=retry)
        except StoreError as exc:
            # The rows stay pending and go out again: a duplicate, never a loss.
            self._problems.failed(str(exc), "store")
            self._rescan = True
            return
        self._published += len(result.published)
        self.metrics.published.inc(len(result.published))
        publish_spans.record_publishes(
            claim.rows,
            len(result.published),
            publish_spans.epoch_ns_of_monotonic(batch.submitted_at),
        )
        self._failed += len(parked)
        self.metrics.failed_refused.inc(len(result.refused))
        self._retried += len(retry)
        self.metrics.retried_nacked.inc(len(retry))
        for parked_key, reason in parked.items():
            row_id, copy = parked_key if isinstance(parked_key, tuple) else (parked_key, None)
            which = f"row {row_id}" if copy is None else f"copy {copy} of row {row_id}"
            log.warning("outbox relay: parked %s as failed: %s", which, reason)

    def _check_overdue(self) -> None:
        if not self._inflight or self._publisher is None:
            return
        _, oldest = self._inflight[0]
        if time.monotonic() - oldest.submitted_at > self.config.confirm_timeout_s:
            self._publisher.abort(
                f"no publisher confirm from RabbitMQ within {self.config.confirm_timeout_s:g} s "
                "(is the broker blocked by a resource alarm?); reconnecting"
            )

    def _refresh_status(self) -> None:
        now = time.monotonic()
        if now < self._next_status_at:
            return
        self._next_status_at = now + self.config.status_interval_s
        try:
            status = self.store.status()
        except StoreError as exc:
            self._problems.failed(str(exc), "store")
            return
        self._problems.answered("store")
        self._status = status
        self.metrics.backlog.set(status.pending)
        self.metrics.failed_rows.set(status.failed)
        self.metrics.oldest_pending_age.set(status.oldest_pending_age_s or 0.0)

    def _close(self) -> None:
        deadline = time.monotonic() + self.config.stop_timeout_s
        while self._inflight and time.monotonic() < deadline:
            self._settle_done()
            if self._inflight:
                self._inflight[0][1].wait(min(0.1, max(0.0, deadline - time.monotonic())))
        if self._publisher is not None:
            self._publisher.close()
            self._publisher = None
        self._settle_done()  # batches the close failed: give their rows back
        for claim, _ in self._inflight:
            self.store.release(claim)
        self._inflight.clear()
        self.metrics.in_flight.set(0)
        self.metrics.connected.set(0)
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
        self._running = False
