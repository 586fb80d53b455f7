"""Independent re-evaluation of every decided CM, compared with the stored verdict.

DESIGN section 6: the stored verdict equals ``evaluate`` over the acks received before the
decision, at the decision's effective time. The audit takes the acks the evaluator says it
counted (``status = 'counted'``; whether those labels agree with ``received_at`` and
``decided_at`` is a separate check in :mod:`spark_audit.transforms.anomalies`), judges
each decided CM at its ``effective_at`` with Spark expressions compiled from its
condition's skeleton (:mod:`.compiled`) or, for the rest, with ``condmsg.evaluate`` itself
(:mod:`.fallback`), and reports every CM whose recomputed verdict differs, with
``evaluate``'s reasons as evidence. :func:`spark_audit.reevaluate.recompute.recompute`
judges arbitrary cases (the generator and the tests use it).
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

VERDICTS = ("satisfied", "violated")


def well_formed(prefix: str = "") -> Column:
    """An ack row ``condmsg.Ack`` accepts (malformed rows are reported, never judged)."""
    kind = F.col(f"{prefix}kind")
    read, committed = F.col(f"{prefix}read_at"), F.col(f"{prefix}committed_at")
    destination, recipient = F.col(f"{prefix}destination"), F.col(f"{prefix}recipient")
    return (
        read.isNotNull()
        & destination.isNotNull()
        & (destination != "")
        & (recipient.isNull() | (recipient != ""))
        & (
            ((kind == "read") & committed.isNull())
            | ((kind == "commit") & committed.isNotNull() & (committed >= read))
        )
    )
