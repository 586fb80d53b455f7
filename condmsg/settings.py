"""Typed settings read from the environment.

Connection URLs come from here (or explicit arguments), never from code. The defaults
point at the local services of a development machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from condmsg.errors import ConfigError

ENV_AMQP_URL = "CONDMSG_AMQP_URL"
ENV_DB_URL = "CONDMSG_DB_URL"
ENV_SECRET = "CONDMSG_SECRET"
ENV_ACK_GRACE_MS = "CONDMSG_ACK_GRACE_MS"
ENV_TEST_PG_URL = "CONDMSG_TEST_PG_URL"

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
DEFAULT_DB_URL = "sqlite:///condmsg.db"
DEFAULT_TEST_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_ACK_GRACE = timedelta(milliseconds=250)


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Deployment settings. ``secret`` keys the HMAC tokens of copies and acks."""

    amqp_url: str = DEFAULT_AMQP_URL
    db_url: str = DEFAULT_DB_URL
    secret: bytes | None = None
    ack_grace: timedelta = DEFAULT_ACK_GRACE
    test_pg_url: str = DEFAULT_TEST_PG_URL

    def __repr__(self) -> str:  # never print the secret
        return (
            f"Settings(amqp_url={_redact(self.amqp_url)!r}, db_url={_redact(self.db_url)!r}, "
            f"secret={'<set>' if self.secret else None}, ack_grace={self.ack_grace!r})"
        )

    def endpoint_options(self) -> dict[str, Any]:
        """What a ``Sender`` or ``Receiver`` takes from the settings (``from_env``)."""
        return {"amqp_url": self.amqp_url, "db_url": self.db_url, "secret": self.secret}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        grace_raw = env.get(ENV_ACK_GRACE_MS)
        ack_grace = DEFAULT_ACK_GRACE
        if grace_raw is not None:
            try:
                grace_ms = int(grace_raw)
            except ValueError:
                raise ConfigError(
                    f"{ENV_ACK_GRACE_MS} must be a whole number of milliseconds"
                ) from None
            if grace_ms < 0:
                raise ConfigError(f"{ENV_ACK_GRACE_MS} must not be negative")
            ack_grace = timedelta(milliseconds=grace_ms)
        secret = env.get(ENV_SECRET)
        return cls(
            amqp_url=env.get(ENV_AMQP_URL, DEFAULT_AMQP_URL),
            db_url=env.get(ENV_DB_URL, DEFAULT_DB_URL),
            secret=secret.encode() if secret else None,
            ack_grace=ack_grace,
            test_pg_url=env.get(ENV_TEST_PG_URL, DEFAULT_TEST_PG_URL),
        )


def _redact(url: str) -> str:
    """Hide the password of a URL (``scheme://user:***@host``)."""
    head, sep, tail = url.partition("://")
    if not sep or "@" not in tail:
        return url
    creds, _, rest = tail.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{head}://{user}:***@{rest}" if ":" in creds else url
