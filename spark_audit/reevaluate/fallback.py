"""Re-evaluation with ``condmsg.evaluate`` itself, over Arrow batches (``mapInArrow``).

Used for every condition the native path does not cover (nested sets, topic
destinations), and to write the reasons of every discrepancy. Each row handed to Python is
one CM with its acks collected into an array, so no grouping happens in Python and a
batch holds many CMs.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from condmsg.acks import Ack, AckKind
from condmsg.conditions import Condition
from condmsg.errors import CondmsgError
from condmsg.evaluation import evaluate

RESULT_SCHEMA = T.StructType(
    [
        T.StructField("cm_id", T.StringType()),
        T.StructField("verdict", T.StringType()),
        T.StructField("reasons", T.ArrayType(T.StringType())),
        T.StructField("error", T.StringType()),
    ]
)

ACK_FIELDS = ("destination", "recipient", "kind", "read_at", "committed_at")


@lru_cache(maxsize=4096)
def _condition(text: str) -> Condition:
    return Condition.from_json(text)


def evaluate_row(
    condition_json: str, sent_at: Any, at: Any, acks: list[dict[str, Any]] | None
) -> tuple[str | None, list[str], str | None]:
    """``(verdict, reasons, error)`` for one CM; errors are reported, never raised."""
    try:
        condition = _condition(condition_json)
        parsed = [
            Ack(
                destination=a["destination"],
                kind=AckKind(a["kind"]),
                read_at=a["read_at"],
                committed_at=a["committed_at"],
                recipient=a["recipient"],
            )
            for a in acks or ()
        ]
        result = evaluate(condition, sent_at, parsed, at)
    except (CondmsgError, ValueError) as exc:
        return None, [], f"{type(exc).__name__}: {exc}"
    return result.verdict.value, list(result.reasons), None


def _evaluate_batches(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    schema = to_arrow_schema(RESULT_SCHEMA)
    for batch in batches:
        out: dict[str, list[Any]] = {"cm_id": [], "verdict": [], "reasons": [], "error": []}
        for row in batch.to_pylist():
            verdict, reasons, error = evaluate_row(
                row["condition_json"], row["sent_at"], row["at"], row["acks"]
            )
            out["cm_id"].append(row["cm_id"])
            out["verdict"].append(verdict)
            out["reasons"].append(reasons)
            out["error"].append(error)
        yield pa.RecordBatch.from_pydict(out, schema=schema)


def python_verdicts(cases: DataFrame, acks: DataFrame) -> DataFrame:
    """``cm_id, verdict, reasons, error`` for ``cases`` (``cm_id, condition_json, sent_at,
    at``), judged by ``condmsg.evaluate`` over ``acks``."""
    # Only the acks of these cases travel to Python (a semi-join first: the cases are often
    # a small fraction, e.g. the discrepancies or the non-native conditions).
    mine = acks.join(cases.select("cm_id"), "cm_id", "left_semi")
    grouped = mine.groupBy("cm_id").agg(
        F.collect_list(F.struct(*ACK_FIELDS)).alias("acks"),
    )
    rows = cases.select("cm_id", "condition_json", "sent_at", "at").join(grouped, "cm_id", "left")
    return rows.mapInArrow(_evaluate_batches, RESULT_SCHEMA)
