"""The relay: claims pending rows, publishes them with confirms, settles them; repeat.

One loop thread does all database work; the publisher's I/O thread talks to RabbitMQ and
the listener thread turns NOTIFYs into wake-ups. The loop keeps up to
``max_batches_in_flight`` batches of ``batch_size`` rows awaiting confirms, so the broker
always has work while the database settles earlier batches.

When to claim and from which id is :class:`~outbox.claim_schedule.ClaimSchedule`'s to say
(its module tells why); keeping a publisher open is
:class:`~outbox.relay_link.BrokerLink`'s. The relay makes the claims and settles them.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from types import TracebackType

from prometheus_client import CollectorRegistry
from sqlalchemy.engine import Engine

from outbox import publish_spans
from outbox.claim_schedule import ClaimSchedule
from outbox.config import RelayConfig
from outbox.errors import OutboxError, OutboxTimeout, StoreError
from outbox.metrics import RelayMetrics
from outbox.notify import Listener
from outbox.publish_confirms import PendingBatch
from outbox.relay_health import RelayCounts, RelayProblems, RelayStats
from outbox.relay_link import BrokerLink
from outbox.relay_verdicts import judge
from outbox.relay_window import InFlight
from outbox.store import Claim, OutboxStatus, OutboxStore

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

        self._wake_event = threading.Event()
        self._stop_event = threading.Event()
        # Set by request_stop, which a signal handler may call: a plain attribute, no lock.
        self._stop_requested = False
        # Guards the schedule's wake-ups and proofs of idleness, which other threads take;
        # drain() waits on it for a proof.
        self._cond = threading.Condition()
        self._schedule = ClaimSchedule(
            batch_size=config.batch_size,
            poll_interval_s=self.poll_interval_s,
            rescan_interval_s=config.rescan_interval_s,
            locking=self.store.locking,
            clock=time.monotonic,
        )
        self._thread: threading.Thread | None = None
        self._running = False
        self._listener: Listener | None = None
        self._inflight = InFlight(self.metrics)
        self._next_status_at = 0.0
        self._counts = RelayCounts(self.metrics)
        self._problems = RelayProblems(self.metrics)
        self._link = BrokerLink(
            config,
            metrics=self.metrics,
            problems=self._problems,
            counts=self._counts,
            on_done=self._wake_event.set,
        )
        self._status: OutboxStatus | None = None
        self._stepped_at = time.monotonic()

    # -- public control -------------------------------------------------------------------

    def wake(self) -> None:
        """Ask for a claim now (e.g. right after committing rows, where there is no NOTIFY)."""
        with self._cond:
            self._schedule.wake()
        self._wake_event.set()

    def start(self) -> Relay:
        """Run the relay in a background thread until :meth:`stop`."""
        if self._thread is not None:
            raise OutboxError("this relay is already running")
        self._stop_event.clear()
        self._stop_requested = False
        self._link.restart()
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

    @property
    def fatal(self) -> str | None:
        """Why the relay gave up by itself (None: it did not): RabbitMQ refused its login
        :data:`~outbox.errors.AUTH_REFUSALS_BEFORE_GIVING_UP` times in a row."""
        return self._link.fatal

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
            while not self._schedule.idle_since(target):
                if time.monotonic() > deadline:
                    raise self._timeout(timeout_s)
                self._step()
                if not self._schedule.idle_since(target):
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
            while not self._schedule.idle_since(target):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._timeout(timeout_s)
                self._cond.wait(remaining)
        return self.stats()

    def stats(self) -> RelayStats:
        """Counters since creation (no database access)."""
        return RelayStats(
            published=self._counts.published,
            failed=self._counts.failed,
            retried=self._counts.retried,
            reconnects=self._counts.reconnects,
            in_flight=self._inflight.messages,
            connected=self._link.alive,
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
        if not self._link.alive:
            problem = self._problems.broker or "connecting"
            return f"the outbox relay is not connected to RabbitMQ: {problem}"
        if self._problems.store is not None:
            return f"the outbox table does not answer: {self._problems.store}"
        return None

    # -- loop -----------------------------------------------------------------------------

    def _bump(self) -> int:
        """Request proof of idleness: a claim from the head that starts after this call."""
        with self._cond:
            return self._schedule.want_idle()

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
        timeout = min(max_s, 0.5, self._schedule.until_poll_s())
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
        if self._link.alive:
            return True
        if self._inflight:  # let the dead connection's batches come back first
            return False
        if not self._link.connect():
            if self._link.fatal is not None:
                self.request_stop()
            return False
        self._schedule.restart()
        return True

    def _claim_more(self) -> None:
        publisher = self._link.publisher
        assert publisher is not None
        most = self.config.max_batches_in_flight
        while len(self._inflight) < most and not self._stopping():
            with self._cond:
                planned = self._schedule.next_claim(len(self._inflight))
            if planned is None:
                return
            try:
                claim = self.store.claim(self.config.batch_size, after_id=planned.after_id)
            except StoreError as exc:
                self._problems.failed(str(exc), "store")
                self._schedule.claim_failed(planned)
                return
            self._problems.answered("store")
            with self._cond:
                proved = self._schedule.claimed(
                    planned,
                    rows=len(claim.rows),
                    last_id=claim.last_id,
                    in_flight=len(self._inflight),
                )
                if proved:
                    self._cond.notify_all()
            if not claim.rows:
                return
            self._inflight.add(claim, publisher.submit(claim.rows))

    def _settle_done(self) -> None:
        for claim, batch in self._inflight.finished():
            self._settle(claim, batch)

    def _settle(self, claim: Claim, batch: PendingBatch) -> None:
        result = batch.result
        if result.error is not None:
            self.store.release(claim)
            self._problems.failed(str(result.error), "broker")
            self._counts.given_back(claim.messages)
            self._schedule.restart()
            return
        self.metrics.batch_confirm.observe(
            time.monotonic() - batch.submitted_at, publish_spans.exemplar_of(claim.rows)
        )
        verdicts = judge(claim.rows, result, self.config, datetime.now(UTC))
        self.metrics.failed_nacked.inc(verdicts.gave_up)
        parked = verdicts.parked
        try:
            self.store.settle(
                claim, published=result.published, parked=parked, retry=verdicts.retry
            )
        except StoreError as exc:
            # The rows stay pending and go out again: a duplicate, never a loss.
            self._problems.failed(str(exc), "store")
            self._schedule.rescan()
            return
        self._counts.settled(
            published=len(result.published),
            refused=len(result.refused),
            parked=len(parked),
            retried=len(verdicts.retry),
        )
        publish_spans.record_publishes(claim.rows, result.published, batch.submitted_at)
        for parked_key, reason in parked.items():
            row_id, copy = parked_key if isinstance(parked_key, tuple) else (parked_key, None)
            which = f"row {row_id}" if copy is None else f"copy {copy} of row {row_id}"
            log.warning("outbox relay: parked %s as failed: %s", which, reason)

    def _check_overdue(self) -> None:
        publisher = self._link.publisher
        if publisher is not None and self._inflight.overdue(self.config.confirm_timeout_s):
            publisher.abort(
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
                self._inflight.wait_oldest(min(0.1, max(0.0, deadline - time.monotonic())))
        self._link.close()
        self._settle_done()  # batches the close failed: give their rows back
        for claim in self._inflight.abandon():
            self.store.release(claim)
        self.metrics.connected.set(0)
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
        self._running = False
