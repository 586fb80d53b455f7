"""Spark audit of condmsg acknowledgment logs (DESIGN section 1, item 6).

Reads a sender store (PostgreSQL through JDBC, or the Parquet layout written by
``condmsg export``), computes latencies, deadline misses, outcome rates, anomalies, relay
lag and clock-skew bounds, re-evaluates every decided conditional message with
``condmsg.evaluate``'s semantics, and writes Parquet detail tables, ``summary.json`` and a
self-contained ``report.html``.

Importing this package does not import pyspark. The Parquet layout it reads is
:mod:`condmsg.archive.layout` (``condmsg export``, SQLAlchemy + pyarrow, writes it without a
JVM). The entry points: :func:`audit` (frames, for notebooks and programs), the command
line (:mod:`spark_audit.cli`), :mod:`spark_audit.job` and :mod:`spark_audit.generate`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from condmsg.archive.layout import LAYOUT_VERSION, TABLES
from spark_audit.versions import SUMMARY_VERSION

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_audit.notebook import Audit


def audit(spark: SparkSession, source: Any, **options: Any) -> Audit:
    """The audit of ``source`` as frames: :func:`spark_audit.notebook.audit`."""
    from spark_audit.notebook import audit as run

    return run(spark, source, **options)


__all__ = ["LAYOUT_VERSION", "SUMMARY_VERSION", "TABLES", "audit"]
