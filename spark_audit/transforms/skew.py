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
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_audit.transforms.latency import ACCURACY


def receiver_clocks(ack_facts: DataFrame) -> DataFrame:
    """Per receiver: acks, skew bounds (ms) and relay-lag percentiles (ms)."""
    relay = F.percentile_approx("relay_ms", [0.5, 0.9, 0.99], ACCURACY)
    return (
        ack_facts.groupBy("receiver")
        .agg(
            F.count(F.lit(1)).alias("acks"),
            F.min("pickup_ms").alias("offset_upper_ms"),
            # relay_ms = received_at - event, so event - received_at = -relay_ms.
            F.max(-F.col("relay_ms")).alias("offset_lower_ms"),
            relay[0].alias("relay_p50_ms"),
            relay[1].alias("relay_p90_ms"),
            relay[2].alias("relay_p99_ms"),
        )
        .withColumn("behind_by_at_least_ms", F.greatest(F.lit(0.0), -F.col("offset_upper_ms")))
        .withColumn("ahead_by_at_least_ms", F.greatest(F.lit(0.0), F.col("offset_lower_ms")))
        .withColumn(
            "skew_proved",
            (F.col("behind_by_at_least_ms") > 0) | (F.col("ahead_by_at_least_ms") > 0),
        )
        .orderBy("receiver")
    )
