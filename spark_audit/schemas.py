"""Spark schemas of the input tables (derived from :mod:`condmsg.archive.layout`)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from condmsg.archive.layout import ALL_TABLES, OUTCOME_COLUMNS, ColumnType, Table

_SPARK_TYPES: dict[ColumnType, T.DataType] = {
    "string": T.StringType(),
    "timestamp": T.TimestampType(),
    "long": T.LongType(),
    "int": T.IntegerType(),
    "bool": T.BooleanType(),
}


def struct_type(table: Table) -> T.StructType:
    """The explicit Spark schema of ``table``."""
    return T.StructType(
        [T.StructField(c.name, _SPARK_TYPES[c.type], c.nullable) for c in table.columns]
    )


SCHEMAS: dict[str, T.StructType] = {t.name: struct_type(t) for t in ALL_TABLES}

OUTCOMES_SCHEMA = T.StructType([f for f in SCHEMAS["cms"].fields if f.name in OUTCOME_COLUMNS])


def conform(frame: DataFrame, table: Table) -> DataFrame:
    """``frame`` with exactly ``table``'s columns, in order, cast to their types.

    Readers call this at the edge so every source yields the same schema whatever its
    driver made of the types (JDBC ``NUMERIC`` ids, ``VARCHAR`` lengths, and so on).
    """
    present = set(frame.columns)
    columns: list[SparkColumn] = []
    for column in table.columns:
        spark_type = _SPARK_TYPES[column.type]
        value = F.col(column.name) if column.name in present else F.lit(None)
        columns.append(value.cast(spark_type).alias(column.name))
    return frame.select(*columns)


def local_frame(spark: SparkSession, rows: list[dict[str, Any]], schema: T.StructType) -> DataFrame:
    """A small frame of driver-side ``rows`` (dicts) with ``schema``, built through Arrow.

    The rows reach the JVM as one Arrow stream: no Python worker has to start to unpickle
    them (the first one is slow to start on a cold session).
    """
    table = pa.Table.from_pylist(rows, schema=to_arrow_schema(schema, timezone="UTC"))
    return spark.createDataFrame(table, schema)
