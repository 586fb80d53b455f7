"""Prometheus metrics of one relay, in a registry the caller owns (no global state).

Names (all prefixed ``outbox_``; every series carries the label ``table``):

* ``outbox_published_total`` counter: messages confirmed by RabbitMQ and deleted.
* ``outbox_failed_total`` counter (label ``reason``: ``refused`` for unroutable or missing
  exchange, ``nacked`` for nacks out of attempts): rows parked as failed.
* ``outbox_retried_total`` counter (label ``reason``: ``nacked``, ``broker``): rows given
  back for another attempt.
* ``outbox_reconnects_total`` counter: RabbitMQ connections opened after the first.
* ``outbox_backlog`` gauge: pending rows; ``outbox_failed_rows`` gauge: parked rows;
  ``outbox_oldest_pending_age_seconds`` gauge; refreshed every status interval.
* ``outbox_in_flight`` gauge: messages published and awaiting their confirm.
* ``outbox_broker_connected`` gauge: 1 while the relay holds a confirm-mode channel.
* ``outbox_batch_confirm_seconds`` histogram: submit-to-last-confirm time of a batch.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class RelayMetrics:
    """The metric objects of one relay, registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry, *, table: str) -> None:
        self.registry = registry
        labels = ["table"]
        self._published = Counter(
            "outbox_published_total", "Messages confirmed by RabbitMQ", labels, registry=registry
        )
        self._failed = Counter(
            "outbox_failed_total", "Rows parked as failed", [*labels, "reason"], registry=registry
        )
        self._retried = Counter(
            "outbox_retried_total",
            "Rows given back for another attempt",
            [*labels, "reason"],
            registry=registry,
        )
        self._reconnects = Counter(
            "outbox_reconnects_total", "RabbitMQ reconnections", labels, registry=registry
        )
        self._backlog = Gauge("outbox_backlog", "Pending rows", labels, registry=registry)
        self._failed_rows = Gauge(
            "outbox_failed_rows", "Rows parked as failed", labels, registry=registry
        )
        self._oldest = Gauge(
            "outbox_oldest_pending_age_seconds",
            "Age of the oldest pending row",
            labels,
            registry=registry,
        )
        self._in_flight = Gauge(
            "outbox_in_flight", "Messages awaiting their confirm", labels, registry=registry
        )
        self._connected = Gauge(
            "outbox_broker_connected", "1 while connected to RabbitMQ", labels, registry=registry
        )
        self._confirm = Histogram(
            "outbox_batch_confirm_seconds",
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
        self.backlog = self._backlog.labels(table)
        self.failed_rows = self._failed_rows.labels(table)
        self.oldest_pending_age = self._oldest.labels(table)
        self.in_flight = self._in_flight.labels(table)
        self.connected = self._connected.labels(table)
        self.batch_confirm = self._confirm.labels(table)
