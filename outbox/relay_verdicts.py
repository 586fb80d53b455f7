"""What becomes of a batch's messages once RabbitMQ has answered, short of the confirmed
ones (deleted): a refused message (unroutable, no such exchange) is parked as failed at
once, since sending it again changes nothing; a nacked one is tried again after a delay
that doubles with its row's attempts, and parked once it is out of attempts.

Pure: the caller passes the time; the relay writes the verdicts in one settle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from condmsg.infra.backoff import retry_delay_s
from outbox.config import RelayConfig
from outbox.message import StoredMessage
from outbox.publish_confirms import BatchResult
from outbox.store import Key


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdicts:
    """``parked``: the reason per message parked as failed. ``retry``: the reason and the
    time (UTC) from which each nacked message may go out again. ``gave_up``: how many of
    the parked were nacked out of attempts (the rest were refused)."""

    parked: dict[Key, str]
    retry: dict[Key, tuple[str, datetime]]
    gave_up: int


def judge(
    rows: Sequence[StoredMessage], result: BatchResult, config: RelayConfig, now: datetime
) -> Verdicts:
    """The verdicts on ``result``, the answer for a batch of ``rows``, at ``now`` (UTC)."""
    parked: dict[Key, str] = dict(result.refused.items())
    retry: dict[Key, tuple[str, datetime]] = {}
    gave_up = 0
    attempts = {row.id: row.attempts for row in rows}
    for key, reason in result.nacked.items():
        tries = attempts[key[0]] + 1
        if tries >= config.max_attempts:
            parked[key] = f"{reason}; gave up after {tries} attempts"
            gave_up += 1
        else:
            delay = retry_delay_s(
                tries, initial_s=config.retry_initial_s, maximum_s=config.retry_max_s
            )
            retry[key] = (reason, now + timedelta(seconds=delay))
    return Verdicts(parked=parked, retry=retry, gave_up=gave_up)
