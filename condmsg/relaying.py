"""In-process outbox relays for the endpoints that own a store (sender, receiver)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine

from outbox.relay import Relay


class OwnsOutbox:
    """``relay()`` / ``start_relay()`` for a class with ``engine``, ``amqp_url`` and a
    ``_relay_name`` (the RabbitMQ connection name of its relay)."""

    engine: Engine
    amqp_url: str

    @property
    def _relay_name(self) -> str:
        raise NotImplementedError

    def relay(self, **options: Any) -> Relay:
        """An in-process relay for this store's outbox, not started yet.

        ``with x.relay() as relay:`` runs it in a background thread for the block;
        ``condmsg relay`` is the stand-alone alternative. Options go to ``outbox.Relay``.
        """
        options.setdefault("connection_name", self._relay_name)
        return Relay(self.engine, self.amqp_url, **options)

    def start_relay(self, **options: Any) -> Relay:
        """Start :meth:`relay` in a background thread; call ``stop()`` when done."""
        return self.relay(**options).start()
