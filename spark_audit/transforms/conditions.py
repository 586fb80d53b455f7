"""Condition plans in Spark: one :func:`spark_audit.plans.plan_of` per distinct condition.

Conditions repeat (an application sends the same few shapes), so the Python decode runs on
``cms.select("condition_json").distinct()`` through ``mapInArrow`` and the result is
joined back: the per-CM cost is a join, not a Python call.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from spark_audit.plans import plan_of

_MEMBER = T.StructType(
    [
        T.StructField("name", T.StringType()),
        T.StructField("recipient", T.StringType()),
        T.StructField("own_pickup_ms", T.LongType()),
        T.StructField("own_process_ms", T.LongType()),
    ]
)
_DEADLINES = T.StructType(
    [
        T.StructField("destination", T.StringType()),
        T.StructField("recipient", T.StringType()),
        T.StructField("is_topic", T.BooleanType()),
        T.StructField("required", T.BooleanType()),
        T.StructField("pickup_ms", T.LongType()),
        T.StructField("process_ms", T.LongType()),
    ]
)
PLAN_SCHEMA = T.StructType(
    [
        T.StructField("condition_json", T.StringType()),
        T.StructField("valid", T.BooleanType()),
        T.StructField("error", T.StringType()),
        T.StructField("shape", T.StringType()),
        T.StructField("eval_window_ms", T.LongType()),
        T.StructField("native", T.BooleanType()),
        T.StructField("members", T.ArrayType(_MEMBER)),
        T.StructField("set_pickup_ms", T.LongType()),
        T.StructField("set_process_ms", T.LongType()),
        T.StructField("min_pickup", T.LongType()),
        T.StructField("max_pickup", T.LongType()),
        T.StructField("min_process", T.LongType()),
        T.StructField("max_process", T.LongType()),
        T.StructField("destinations", T.ArrayType(_DEADLINES)),
    ]
)


def _plan_batches(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    schema = to_arrow_schema(PLAN_SCHEMA)
    for batch in batches:
        rows = [plan_of(text).as_row() for text in batch.column(0).to_pylist()]
        yield pa.RecordBatch.from_pylist(rows, schema=schema)


def condition_plans(cms: DataFrame) -> DataFrame:
    """One row per distinct ``condition_json`` of ``cms``, with :data:`PLAN_SCHEMA`."""
    distinct = cms.select("condition_json").distinct()
    return distinct.mapInArrow(_plan_batches, PLAN_SCHEMA)


def with_plans(cms: DataFrame, plans: DataFrame) -> DataFrame:
    """``cms`` with the plan columns (``shape``, ``native``, ``eval_window_ms``, ...).

    ``plans`` has one row per *distinct* condition, normally a handful (applications send
    a few condition templates), so it is broadcast rather than shuffled with the CMs.
    """
    return cms.join(F.broadcast(plans), "condition_json", "left")
