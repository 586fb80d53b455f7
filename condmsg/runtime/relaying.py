"""In-process outbox relays for the endpoints that own a store (sender, receiver)."""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy.engine import Engine

from outbox.config import RelayConfig
from outbox.relay import Relay


def relay_for(engine: Engine, amqp_url: str, connection_name: str, **settings: Any) -> Relay:
    """A relay (not started) for the outbox in ``engine``'s database, publishing to
    ``amqp_url`` as ``connection_name``; ``settings``: further :class:`RelayConfig` fields."""
    config = RelayConfig(amqp_url=amqp_url, connection_name=connection_name)
    return Relay(engine, dataclasses.replace(config, **settings))


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
        return relay_for(self.engine, self.amqp_url, self._relay_name, **settings)

    def start_relay(self, **settings: Any) -> Relay:
        """Start :meth:`relay` in a background thread; call ``stop()`` when done."""
        return self.relay(**settings).start()
