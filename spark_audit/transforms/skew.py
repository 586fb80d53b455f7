"""Clock-skew bounds and relay lag per receiver.

Let θ be a receiver's clock minus the sender's (the reference clock: ``sent_at`` and the
evaluator's ``received_at`` are written on the sender side). Two facts bound θ without any
extra measurement:

* a copy cannot be read before its CM was recorded, so for every ack
  ``θ <= read_at - sent_at``: an ack whose ``read_at`` is before its CM's ``sent_at``
  *proves* the receiver is behind, by at least ``sent_at - read_at``;
* an ack cannot be received before it was made, so ``θ >= event - received_at`` (event =
  ``committed_at`` for a COMMIT ack, else ``read_at``): an ack stamped after its own
  arrival proves the receiver is ahead.

``offset_upper_ms``/``offset_lower_ms`` are the tightest such bounds over the receiver's
acks; ``behind_by_at_least_ms``/``ahead_by_at_least_ms`` are the proven skew (0 when the
bounds are consistent with a correct clock). A lower bound above the upper one means the
sender's and the evaluator's clocks disagree with each other as well.

The bounds (``facts``, ``min_pickup_us``, ``min_relay_us`` per receiver) and the relay
percentiles come from the latency histogram (:class:`spark_audit.transforms.latency.Histograms`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def receiver_rows(
    metrics: Iterable[Mapping[str, Any]], relay: Mapping[str, Mapping[str, float | None]]
) -> list[dict[str, Any]]:
    """The ``receivers`` table: per receiver with well-formed acks of known CMs."""
    rows = []
    for m in metrics:
        if not m["facts"]:
            continue
        upper = m["min_pickup_us"] / 1000.0
        # relay = received_at - event, so event - received_at = -relay.
        lower = -m["min_relay_us"] / 1000.0
        behind, ahead = max(0.0, -upper), max(0.0, lower)
        percentiles = relay.get(m["receiver"], {})
        rows.append(
            {
                "receiver": m["receiver"],
                "acks": m["facts"],
                "offset_upper_ms": upper,
                "offset_lower_ms": lower,
                "relay_p50_ms": percentiles.get("relay_p50_ms"),
                "relay_p90_ms": percentiles.get("relay_p90_ms"),
                "relay_p99_ms": percentiles.get("relay_p99_ms"),
                "behind_by_at_least_ms": behind,
                "ahead_by_at_least_ms": ahead,
                "skew_proved": behind > 0 or ahead > 0,
            }
        )
    return sorted(rows, key=lambda r: str(r["receiver"]))
