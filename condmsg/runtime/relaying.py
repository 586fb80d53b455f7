"""In-process outbox relays for the endpoints that own a store (sender, receiver)."""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy.engine import Engine

from outbox.config import RelayConfig
from outbox.relay import Relay


class OwnsOutbox:
    """``relay()`` / ``start_relay()`` for a class with ``engine``, ``amqp_url`` and a
    ``_relay_name`` (the RabbitMQ connection name of its relay)."""

    engine: Engine
    amqp_url: str

    @property
    def _relay_name(self) -> str:
        raise NotImplementedError

    def relay(self, **settings: Any) -> Relay:
        """An in-process relay for this store's outbox, not started yet.

        ``with x.relay() as relay:`` runs it in a background thread for the block;
        ``condmsg relay`` is the stand-alone alternative. ``settings`` are
        :class:`outbox.RelayConfig` fields beyond this store's broker and relay name.
        """
        config = RelayConfig(amqp_url=self.amqp_url, connection_name=self._relay_name)
        return Relay(self.engine, dataclasses.replace(config, **settings))

    def start_relay(self, **settings: Any) -> Relay:
        """Start :meth:`relay` in a background thread; call ``stop()`` when done."""
        return self.relay(**settings).start()
