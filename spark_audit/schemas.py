"""Spark schemas of the input tables (derived from :mod:`condmsg.archive_layout`)."""

from __future__ import annotations

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from condmsg.archive_layout import OUTCOME_COLUMNS, TABLES, ColumnType, Table

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


SCHEMAS: dict[str, T.StructType] = {t.name: struct_type(t) for t in TABLES}

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
