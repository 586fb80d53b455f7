"""Spark audit of condmsg acknowledgment logs (DESIGN section 1, item 6).

Reads a sender store (PostgreSQL through JDBC, or the Parquet layout written by
``condmsg export``), computes latencies, deadline misses, outcome rates, anomalies, relay
lag and clock-skew bounds, re-evaluates every decided conditional message with
``condmsg.evaluate``'s semantics, and writes Parquet detail tables, ``summary.json`` and a
self-contained ``report.html``.

Importing this package does not import pyspark. The Parquet layout it reads is
:mod:`condmsg.archive_layout` (``condmsg export``, SQLAlchemy + pyarrow, writes it without a
JVM). The Spark entry points live in
:mod:`spark_audit.job` and :mod:`spark_audit.generate`.
"""

from __future__ import annotations

from condmsg.archive_layout import LAYOUT_VERSION, TABLES

#: Version of ``summary.json`` (see :mod:`spark_audit.summary`).
SUMMARY_VERSION = 1

__all__ = ["LAYOUT_VERSION", "SUMMARY_VERSION", "TABLES"]
