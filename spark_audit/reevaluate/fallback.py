"""Re-evaluation with ``condmsg.evaluate`` itself.

Used for every condition the compiled path does not cover (see
:mod:`spark_audit.transforms.conditions`), and to write the reasons of every discrepancy.
On the executors (:func:`python_verdicts`, ``mapInArrow``) each row handed to Python is
one CM with its acks collected into an array, so no grouping happens in Python and a
batch holds many CMs; a few CMs are judged on the driver (:func:`judge_rows`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from condmsg.core.acks import Ack, AckKind
from condmsg.core.condition_codec import condition_from_json
from condmsg.core.conditions import Condition
from condmsg.core.errors import CondmsgError
from condmsg.core.evaluation import evaluate

RESULT_SCHEMA = T.StructType(
    [
        T.StructField("cm_id", T.StringType()),
        T.StructField("py_verdict", T.StringType()),
        T.StructField("py_verdict_all", T.StringType()),
        T.StructField("py_reasons", T.ArrayType(T.StringType())),
        T.StructField("py_error", T.StringType()),
    ]
)

#: The fields of one ack handed to Python (``counted``: judged for the stored verdict).
ACK_FIELDS = ("destination", "recipient", "kind", "read_at", "committed_at", "counted")


@lru_cache(maxsize=4096)
def _condition(text: str) -> Condition:
    return condition_from_json(text)


def acks_of(rows: Iterable[dict[str, Any]]) -> list[Ack]:
    """The :class:`Ack` of each ack row (``destination, recipient, kind, read_at,
    committed_at``; other fields are ignored); a bad ``kind`` raises ``ValueError``."""
    return [
        Ack(
            destination=a["destination"],
            kind=AckKind(a["kind"]),
            read_at=a["read_at"],
            committed_at=a["committed_at"],
            recipient=a["recipient"],
        )
        for a in rows
    ]


def evaluate_row(
    condition_json: str, sent_at: Any, at: Any, acks: Iterable[dict[str, Any]] | None
) -> tuple[str | None, list[str], str | None]:
    """``(verdict, reasons, error)`` for one CM; errors are reported, never raised."""
    try:
        condition = _condition(condition_json)
        result = evaluate(condition, sent_at, acks_of(acks or ()), at)
    except (CondmsgError, ValueError) as exc:
        return None, [], f"{type(exc).__name__}: {exc}"
    return result.verdict.value, list(result.reasons), None


def judge_row(row: dict[str, Any]) -> dict[str, Any]:
    """One CM (``cm_id, condition_json, sent_at, at, acks``) -> a :data:`RESULT_SCHEMA` row:
    the verdict over the counted acks (with reasons) and over every ack."""
    acks = row["acks"] or []
    counted = [a for a in acks if a["counted"]]
    verdict, reasons, error = evaluate_row(
        row["condition_json"], row["sent_at"], row["at"], counted
    )
    verdict_all = verdict
    if error is None and len(counted) < len(acks):
        verdict_all, _, error = evaluate_row(row["condition_json"], row["sent_at"], row["at"], acks)
    return {
        "cm_id": row["cm_id"],
        "py_verdict": verdict,
        "py_verdict_all": verdict_all,
        "py_reasons": reasons,
        "py_error": error,
    }


def judge_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [judge_row(row) for row in rows]


def _evaluate_batches(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    schema = to_arrow_schema(RESULT_SCHEMA)
    for batch in batches:
        yield pa.RecordBatch.from_pylist(judge_rows(batch.to_pylist()), schema=schema)


def collected_acks(acks: DataFrame) -> DataFrame:
    """``cm_id, acks``: the acks (``cm_id`` + :data:`ACK_FIELDS`) collected per CM."""
    return acks.groupBy("cm_id").agg(F.collect_list(F.struct(*ACK_FIELDS)).alias("acks"))


def python_verdicts(cases: DataFrame, acks: DataFrame) -> DataFrame:
    """:data:`RESULT_SCHEMA` rows for ``cases`` (``cm_id, condition_json, sent_at, at``),
    judged by ``condmsg.evaluate`` over ``acks`` (``cm_id`` + :data:`ACK_FIELDS`)."""
    mine = acks.join(cases.select("cm_id"), "cm_id", "left_semi")
    rows = cases.select("cm_id", "condition_json", "sent_at", "at").join(
        collected_acks(mine), "cm_id", "left"
    )
    return rows.mapInArrow(_evaluate_batches, RESULT_SCHEMA)
