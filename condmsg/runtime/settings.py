"""Typed settings read from the environment.

Connection URLs come from here (or explicit arguments), never from code. The defaults
point at the local services of a development machine.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from condmsg.core.errors import ConfigError
from condmsg.infra.urls import redact_url
from condmsg.runtime.credentials import ENV_AMQP_URL as ENV_AMQP_URL
from condmsg.runtime.credentials import ENV_DB_URL as ENV_DB_URL
from condmsg.runtime.credentials import ENV_SECRET as ENV_SECRET
from condmsg.runtime.credentials import amqp_url_from_env, db_url_from_env, secret_from_env

ENV_ACK_GRACE_MS = "CONDMSG_ACK_GRACE_MS"
ENV_TEST_PG_URL = "CONDMSG_TEST_PG_URL"
ENV_RETENTION = "CONDMSG_RETENTION"
ENV_ARCHIVE_DIR = "CONDMSG_ARCHIVE_DIR"
ENV_RETENTION_INTERVAL_S = "CONDMSG_RETENTION_INTERVAL_S"
ENV_CLOCK_SKEW_MS = "CONDMSG_CLOCK_SKEW_MS"
ENV_DESTINATION_QUEUE_TYPE = "CONDMSG_DESTINATION_QUEUE_TYPE"

#: The destination queue types a deployment may choose (see :mod:`condmsg.runtime.topology`).
QUEUE_TYPES = ("classic", "quorum")
DEFAULT_QUEUE_TYPE = "classic"

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
DEFAULT_DB_URL = "sqlite:///condmsg.db"
DEFAULT_TEST_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_ACK_GRACE = timedelta(milliseconds=250)
DEFAULT_RETENTION_INTERVAL_S = 3600.0
#: How far a receiver's clock may be from the evaluator's before its acks' times are
#: implausible (read before the CM was sent, or after the ack was received).
DEFAULT_CLOCK_SKEW = timedelta(milliseconds=1000)


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Deployment settings. ``secret`` keys the HMAC tokens of copies and acks.

    ``retention`` (None: keep everything) is how long the evaluator keeps a decided CM
    before archiving it to Parquet under ``archive_dir`` and deleting it; its job runs
    every ``retention_interval_s`` seconds.

    ``clock_skew`` is the evaluator's tolerance for receivers' clocks: an ack read before
    its CM's ``sent_at - clock_skew``, or read or committed after its receipt ``+
    clock_skew``, is a ``clock_skew`` anomaly and does not count.

    ``amqp_url`` names one broker or several (a cluster's nodes), comma-separated; every
    component connects to the first that answers and moves to another when its node goes.
    ``destination_queue_type`` is ``classic`` or ``quorum`` (:mod:`condmsg.runtime.topology`).
    """

    amqp_url: str = DEFAULT_AMQP_URL
    db_url: str = DEFAULT_DB_URL
    secret: bytes | None = None
    ack_grace: timedelta = DEFAULT_ACK_GRACE
    test_pg_url: str = DEFAULT_TEST_PG_URL
    retention: timedelta | None = None
    archive_dir: Path | None = None
    retention_interval_s: float = DEFAULT_RETENTION_INTERVAL_S
    clock_skew: timedelta = DEFAULT_CLOCK_SKEW
    destination_queue_type: str = DEFAULT_QUEUE_TYPE

    def __repr__(self) -> str:  # never print the secret
        return (
            f"Settings(amqp_url={redact_url(self.amqp_url)!r}, db_url={redact_url(self.db_url)!r}, "
            f"secret={'<set>' if self.secret else None}, ack_grace={self.ack_grace!r}, "
            f"destination_queue_type={self.destination_queue_type!r})"
        )

    def endpoint_options(self) -> dict[str, Any]:
        """What a ``Sender`` or ``Receiver`` takes from the settings (``from_env``)."""
        return {"amqp_url": self.amqp_url, "db_url": self.db_url, "secret": self.secret}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings of the environment. The secret and the URLs' passwords may come
        from files (``CONDMSG_SECRET_FILE``, ``CONDMSG_DB_PASSWORD_FILE``, ...:
        :mod:`condmsg.runtime.credentials`); a placeholder or short secret is refused."""
        env = os.environ if environ is None else environ
        grace_raw = env.get(ENV_ACK_GRACE_MS)
        ack_grace = DEFAULT_ACK_GRACE if grace_raw is None else _millis(grace_raw, ENV_ACK_GRACE_MS)
        skew_raw = env.get(ENV_CLOCK_SKEW_MS)
        clock_skew = (
            DEFAULT_CLOCK_SKEW if skew_raw is None else _millis(skew_raw, ENV_CLOCK_SKEW_MS)
        )
        retention = env.get(ENV_RETENTION)
        archive_dir = env.get(ENV_ARCHIVE_DIR)
        interval = env.get(ENV_RETENTION_INTERVAL_S)
        return cls(
            amqp_url=amqp_url_from_env(env) or DEFAULT_AMQP_URL,
            db_url=db_url_from_env(env) or DEFAULT_DB_URL,
            secret=secret_from_env(env),
            ack_grace=ack_grace,
            clock_skew=clock_skew,
            destination_queue_type=destination_queue_type(env),
            test_pg_url=env.get(ENV_TEST_PG_URL, DEFAULT_TEST_PG_URL),
            retention=parse_duration(retention, ENV_RETENTION) if retention else None,
            archive_dir=Path(archive_dir) if archive_dir else None,
            retention_interval_s=(
                _positive_seconds(interval, ENV_RETENTION_INTERVAL_S)
                if interval
                else DEFAULT_RETENTION_INTERVAL_S
            ),
        )


def destination_queue_type(environ: Mapping[str, str] | None = None) -> str:
    """``CONDMSG_DESTINATION_QUEUE_TYPE`` (default ``classic``); :class:`ConfigError` naming
    the key for anything but ``classic`` or ``quorum``."""
    env = os.environ if environ is None else environ
    value = env.get(ENV_DESTINATION_QUEUE_TYPE, DEFAULT_QUEUE_TYPE).strip().lower()
    if value not in QUEUE_TYPES:
        raise ConfigError(
            f"{ENV_DESTINATION_QUEUE_TYPE} must be one of {', '.join(QUEUE_TYPES)}, "
            f"got {env.get(ENV_DESTINATION_QUEUE_TYPE)!r}"
        )
    return value


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, key: str = "duration") -> timedelta:
    """``"7d"``, ``"12h"``, ``"90m"``, ``"30s"``, ``"500ms"``, ``"2w"`` (a positive number
    and one unit) as a ``timedelta``; :class:`ConfigError` naming ``key`` otherwise."""
    match = _DURATION.fullmatch(text)
    if match is None or float(match[1]) <= 0:
        raise ConfigError(
            f"{key} must be a positive duration with a unit (ms, s, m, h, d, w), "
            f"such as 7d or 12h; got {text!r}"
        )
    return timedelta(seconds=float(match[1]) * _UNIT_SECONDS[match[2]])


def _millis(text: str, key: str) -> timedelta:
    """A non-negative whole number of milliseconds; :class:`ConfigError` naming ``key``."""
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{key} must be a whole number of milliseconds, got {text!r}") from None
    if value < 0:
        raise ConfigError(f"{key} must not be negative, got {text!r}")
    return timedelta(milliseconds=value)


def _positive_seconds(text: str, key: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{key} must be a number of seconds, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{key} must be a positive number of seconds, got {text!r}")
    return value
