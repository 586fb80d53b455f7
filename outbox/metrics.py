"""Prometheus metrics of one relay, in a registry the caller owns (no global state).

Names (all prefixed ``condmsg_outbox_``; every series carries the label ``table``):

* ``condmsg_outbox_published_total`` counter: messages confirmed by RabbitMQ and deleted.
* ``condmsg_outbox_failed_total`` counter (label ``reason``: ``refused`` for unroutable or
  missing exchange, ``nacked`` for nacks out of attempts): rows this relay parked.
* ``condmsg_outbox_retried_total`` counter (label ``reason``: ``nacked``, ``broker``): rows
  given back for another attempt.
* ``condmsg_outbox_reconnects_total`` counter: RabbitMQ connections opened after the first.
* ``condmsg_outbox_errors_total`` counter (label ``source``: ``broker``, ``store``):
  failures met and retried with backoff (each distinct one is logged once).
* ``condmsg_outbox_backlog_rows`` gauge: pending rows; ``condmsg_outbox_failed_rows``
  gauge: rows parked in the table (by any relay); ``condmsg_outbox_oldest_pending_age_seconds``
  gauge; refreshed every status interval.
* ``condmsg_outbox_in_flight_messages`` gauge: messages published and awaiting their confirm.
* ``condmsg_outbox_broker_connected`` gauge: 1 while the relay holds a confirm-mode channel.
* ``condmsg_outbox_batch_confirm_seconds`` histogram: submit-to-last-confirm time of a batch.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
PREFIX = "condmsg_outbox_"


class RelayMetrics:
    """The metric objects of one relay, registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry, *, table: str) -> None:
        self.registry = registry
        labels = ["table"]
        self._published = Counter(
            f"{PREFIX}published_total",
            "Messages confirmed by RabbitMQ and deleted from the outbox",
            labels,
            registry=registry,
        )
        self._failed = Counter(
            f"{PREFIX}failed_total",
            "Rows this relay parked as failed since it started, by reason",
            [*labels, "reason"],
            registry=registry,
        )
        self._retried = Counter(
            f"{PREFIX}retried_total",
            "Rows given back for another attempt, by reason",
            [*labels, "reason"],
            registry=registry,
        )
        self._reconnects = Counter(
            f"{PREFIX}reconnects_total",
            "RabbitMQ connections opened after the first",
            labels,
            registry=registry,
        )
        self._errors = Counter(
            f"{PREFIX}errors_total",
            "Broker and database failures met and retried with backoff, by source",
            [*labels, "source"],
            registry=registry,
        )
        self._backlog = Gauge(
            f"{PREFIX}backlog_rows",
            "Rows pending in the outbox table (refreshed every status interval)",
            labels,
            registry=registry,
        )
        self._failed_rows = Gauge(
            f"{PREFIX}failed_rows",
            "Rows parked in the outbox table now, by any relay, awaiting requeue or deletion",
            labels,
            registry=registry,
        )
        self._oldest = Gauge(
            f"{PREFIX}oldest_pending_age_seconds",
            "Age of the oldest pending row (0 without any)",
            labels,
            registry=registry,
        )
        self._in_flight = Gauge(
            f"{PREFIX}in_flight_messages",
            "Messages published and awaiting their publisher confirm",
            labels,
            registry=registry,
        )
        self._connected = Gauge(
            f"{PREFIX}broker_connected",
            "1 while the relay holds a confirm-mode channel to RabbitMQ, else 0",
            labels,
            registry=registry,
        )
        self._confirm = Histogram(
            f"{PREFIX}batch_confirm_seconds",
            "Submit-to-last-confirm time of a batch",
            labels,
            buckets=_BUCKETS,
            registry=registry,
        )
        self.published = self._published.labels(table)
        self.failed_refused = self._failed.labels(table, "refused")
        self.failed_nacked = self._failed.labels(table, "nacked")
        self.retried_nacked = self._retried.labels(table, "nacked")
        self.retried_broker = self._retried.labels(table, "broker")
        self.reconnects = self._reconnects.labels(table)
        self.broker_errors = self._errors.labels(table, "broker")
        self.store_errors = self._errors.labels(table, "store")
        self.backlog = self._backlog.labels(table)
        self.failed_rows = self._failed_rows.labels(table)
        self.oldest_pending_age = self._oldest.labels(table)
        self.in_flight = self._in_flight.labels(table)
        self.connected = self._connected.labels(table)
        self.batch_confirm = self._confirm.labels(table)
